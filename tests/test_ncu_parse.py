"""The Nsight Compute side of the analyzer without a GPU: the launch plan, the raw-page CSV parser and the
comparison, on synthetic ncu output; and the SASS filter of scripts/ncu_check.py on synthetic cuobjdump output."""
import importlib.util
import json
from pathlib import Path

import pytest

from torch_reduce.analysis import ncu

METRIC_COLUMNS = list(ncu.METRICS)


def raw_csv(rows):
    """ncu --csv --page raw as printed into --log-file: messages, header, units row, one row per launch."""
    header = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC", *METRIC_COLUMNS]
    units = [""] * 11 + ["", "", "", "", "", "", "", "", "", "thread"]

    def line(cells):
        return ",".join(f'"{cell}"' for cell in cells)

    text = ["==PROF== Connected to process 4242 (/usr/bin/python3.12)", line(header), line(units)]
    for index, values in rows:
        text.append(line([index, 4242, "python3.12", "gpu", "void ladder_pass_kernel<StridedTree, 0, 0u, float, float>",
                          1, 7, "(256, 1, 1)", f"({values[ncu.GRID_SIZE]}, 1, 1)", 0, "9.0",
                          *(values[metric] for metric in METRIC_COLUMNS)]))
    text.append("==PROF== Disconnected from process 4242")
    return "\n".join(text) + "\n"


def measured_as_predicted(launch):
    values = {metric: f"{value:,}" for metric, value in ncu.predict(launch).items()}  # "6,080": as ncu groups digits
    values.update({ncu.PRED_ON_RATIO: "12.34", ncu.DIVERGENT_TARGETS: "0", ncu.GRID_SIZE: str(launch.pass_grid),
                   ncu.BLOCK_SIZE: str(launch.block_size)})
    return values


@pytest.fixture
def strided_256():
    return ncu.launches(ncu.plan(variants=("sum_strided",), block_sizes=(256,)))


def test_plan_covers_every_shared_memory_variant_block_and_grid():
    calls = ncu.plan()
    assert [c.variant for c in calls[::6]] == ["sum_interleaved", "sum_strided", "sum_seq", "sum_first_add",
                                              "sum_warp_unrolled", "sum_unrolled", "sum_multi"]
    assert [(c.block_size, c.grid) for c in calls[:6]] == [(128, 1), (128, 64), (256, 1), (256, 64), (512, 1), (512, 64)]
    # n = grid * block * loads per thread; a 64-block first pass leaves 64 partials: one more one-block pass.
    first_add = next(c for c in calls if c.variant == "sum_first_add" and c.block_size == 256 and c.grid == 64)
    assert first_add.n == 64 * 256 * 2
    assert [(l.pass_index, l.pass_n, l.pass_grid) for l in first_add.launches] == [(0, 32768, 64), (1, 64, 1)]
    assert len(ncu.launches(calls)) == 7 * 3 * (1 + 2)


def test_prediction_is_one_blocks_trace_times_the_grid(strided_256):
    one, many, partials = strided_256
    assert ncu.predict(one)["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == 95
    assert ncu.predict(one)["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 70
    assert ncu.predict(one)["smsp__inst_executed_op_shared_st.sum"] == 72
    assert ncu.predict(many) == {metric: 64 * value for metric, value in ncu.predict(one).items()}
    assert ncu.predict(partials) == ncu.predict(one)


def test_parser_skips_messages_and_units_and_reads_grouped_numbers(strided_256):
    rows = ncu.parse_raw_csv(raw_csv([(1, measured_as_predicted(strided_256[1])),
                                      (0, measured_as_predicted(strided_256[0]))]))
    assert [row["ID"] for row in rows] == ["0", "1"]  # by ncu's ID, whatever the printed order
    assert rows[1]["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"] == "6,080"
    assert ncu.metric_value("6,080") == 6080 and ncu.metric_value("12.34") == 12.34
    assert ncu.metric_value("n/a") is None and ncu.metric_value(None) is None
    assert ncu.parse_raw_csv("==ERROR== ERR_NVGPUCTRPERM\n") == []


def test_matching_counters_and_the_summary(strided_256):
    rows = ncu.parse_raw_csv(raw_csv([(i, measured_as_predicted(launch)) for i, launch in enumerate(strided_256)]))
    comparisons, extra = ncu.compare(strided_256, rows)
    counts = ncu.summary(comparisons, extra)
    assert counts["counters_matched"] == counts["counters_compared"] == 3 * 6
    assert counts["order_mismatches"] == counts["extra_rows"] == 0 and counts["mismatches_by_metric"] == {}
    assert ncu.summary_line(counts) == "ncu: 3/3 launches profiled; 18/18 shared-memory counters match the model"


def test_a_mismatch_a_missing_row_and_a_shifted_order_are_reported(strided_256):
    wrong = measured_as_predicted(strided_256[0])
    wrong["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] = "36"
    shifted = measured_as_predicted(strided_256[2])  # the one-block pass where the 64-block pass should be
    comparisons, extra = ncu.compare(strided_256, ncu.parse_raw_csv(raw_csv([(0, wrong), (1, shifted)])))
    counts = ncu.summary(comparisons, extra)
    assert [c.profiled for c in comparisons] == [True, True, False]
    assert [c.order_ok for c in comparisons[:2]] == [True, False]
    assert comparisons[0].matched == 5 and not comparisons[0].matches("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")
    assert counts["launches_profiled"] == 2 and counts["order_mismatches"] == 1
    assert counts["mismatches_by_metric"]["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] == 2
    line = ncu.summary_line(counts)
    assert line.startswith("ncu: 2/3 launches profiled; 5/12 shared-memory counters match the model")
    assert "launch order" in line

    _, extra = ncu.compare(strided_256[:1], ncu.parse_raw_csv(raw_csv([(0, wrong), (1, shifted)])))
    assert extra == 1


def test_markdown_and_json_carry_every_launch(strided_256):
    rows = ncu.parse_raw_csv(raw_csv([(0, measured_as_predicted(strided_256[0]))]))
    comparisons, extra = ncu.compare(strided_256, rows)
    counts = ncu.summary(comparisons, extra)
    markdown = ncu.format_markdown(comparisons, counts, "ncu ...")
    assert "| sum_strided | 256 | 1 | 0 | 1 | 95 / 95 | 55 / 55 | 70 / 70 | 35 / 35 | 129 / 129 | 72 / 72 | 6/6 |" in markdown
    assert "| sum_strided | 256 | 64 | 1 | 1 | 95 / - |" in markdown and "no row" in markdown
    assert "| sum_strided | 256 | 1 | 0 | 12.34 | 0 | 5.08 | s=1:16 s=2:8 s=4:4" in markdown
    document = json.loads(json.dumps(ncu.to_json(comparisons, counts, ncu_rc=0)))
    assert len(document["launches"]) == 3 and document["launches"][0]["match"]["smsp__inst_executed_op_shared_ld.sum"]
    assert ncu.format_plan(ncu.plan(variants=("sum_strided",), block_sizes=(256,))).count("\n") == 3


def load_script():
    spec = importlib.util.spec_from_file_location("ncu_check", Path(__file__).parents[1] / "scripts" / "ncu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sass_filter_keeps_the_float_ladder_kernels_only():
    float_kernel = ("_ZN12torch_reduce4cuda46_GLOBAL__N__cf31287a_9_ladder_cu_cf11d4c2_685818ladder_pass_kernel"
                    "INS1_11StridedTreeELNS1_4LoadE0ELj0EffEEvPKT2_lPT3_")  # as in _C*.so
    half_kernel = float_kernel.replace("ffEEv", "N3c104HalfEfEEv")
    sass = "\n".join([
        "\tcode for sm_90",
        f"\t\tFunction : {float_kernel}",
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        "        /*0010*/              @P0 LDS R2, [R3] ;",
        f"\t\tFunction : {half_kernel}",
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        "\t\tFunction : _ZN12torch_reduce4cuda5otherEv",
        "        /*0000*/                   EXIT ;",
    ])
    kept = load_script().ladder_sass(sass)
    assert "@P0 LDS R2" in kept and half_kernel not in kept and "EXIT" not in kept
    assert kept.count(f"Function : {float_kernel}") == 1


def test_dry_run_prints_the_plan_and_the_ncu_command(capsys):
    assert load_script().main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "42 op calls, 63 launches" in out
    assert "--csv --page raw" in out and "-k regex:ladder_pass_kernel" in out and "--driver" in out


def test_sass_loops_finds_the_row_loop_and_counts_its_opcodes():
    spec = importlib.util.spec_from_file_location("sass_loops", Path(__file__).parents[1] / "scripts" / "sass_loops.py")
    sass_loops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass_loops)
    text = "\n".join([
        "\tcode for sm_90",
        "\t\tFunction : _Z6kernelPf",
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        "        /*0010*/                   FADD R2, R2, R3 ;",
        "        /*0020*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;",
        "        /*0030*/                   FADD R2, R2, R4 ;",
        "        /*0040*/               @P1 BRA 0x10 ;",
        "        /*0050*/                   EXIT ;",
        "        /*0060*/                   BRA 0x60;",
        "        /* 0x000fc00000000000 */",
        "\t\tFunction : _Z5otherv",
        "        /*0000*/                   EXIT ;",
    ])
    found = sass_loops.functions(text)
    assert list(found) == ["_Z6kernelPf", "_Z5otherv"] and len(found["_Z6kernelPf"]) == 7
    assert sass_loops.loops(found["_Z6kernelPf"]) == [(0x10, 0x40, 4)]  # not the branch to itself after EXIT
    assert sass_loops.opcode("@!P0 LDG.E.128 R4, desc[UR4][R2.64]") == "LDG"
    report = sass_loops.report("kernel(float*)", found["_Z6kernelPf"])
    assert "instructions 7" in report and "loop 0x0010..0x0040: 4 instructions" in report
    assert "longest loop: FADD 2, LDG 1, BRA 1" in report


@pytest.mark.parametrize("doc", ["docs/why.md", "README.md"])
def test_docs_carry_the_committed_results(doc):
    """The docs' measured values (MEASURED markers) are those of the committed H200 results: scripts/fill_docs.py
    refills them after a GPU run, and a new ladder.json or ncu_compare.json without the refill fails here."""
    root = Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location("fill_docs", root / "scripts" / "fill_docs.py")
    fill_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fill_docs)
    assert fill_docs.main(["--check", "--doc", str(root / doc)]) == 0
