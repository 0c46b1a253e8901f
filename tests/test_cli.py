"""``python -m torch_reduce``: the analyzer's commands print what analysis/ computes, and bad input exits cleanly;
the benchmark's no-GPU paths (``python -m torch_reduce.bench``), the host section's CPU part and the norm sections'
correctness check and streaming reference."""
import subprocess
import sys

import pytest
import torch

from torch_reduce.__main__ import main


def run(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_analyze_strided_256_prints_the_traced_totals(capsys):
    lines = run(capsys, "analyze", "sum_strided", "--block-size", "256").splitlines()
    assert lines[0] == "sum_strided, one block of 256 threads, 4-byte sdata elements"
    assert lines[-3:] == [  # the numbers tests/test_trace.py derives by hand
        "shared loads:  129 warp instructions, 95 wavefronts, 70 bank conflicts",
        "shared stores: 72 warp instructions, 55 wavefronts, 35 bank conflicts",
        "mean active lanes per instruction: 5.08 of 32",
    ]


def test_analyze_with_doubles(capsys):
    assert run(capsys, "analyze", "sum_seq", "--block-size", "64", "--dtype-bytes", "8").splitlines()[0] == (
        "sum_seq, one block of 64 threads, 8-byte sdata elements")


@pytest.mark.parametrize("stride, answer", [(3, "conflict-free"), (2, "2-way conflict"), (32, "32-way conflict")])
def test_banks_stride(capsys, stride, answer):
    assert run(capsys, "banks", "--stride", str(stride)).splitlines()[0].split(None, 1) == ["answer", answer]


def test_banks_padding_turns_32_way_into_conflict_free(capsys):
    rows = run(capsys, "banks", "--padding").splitlines()[1:]
    assert "float tile[32][32]" in rows[0] and "32-way conflict" in rows[0]
    assert "float tile[32][33]" in rows[1] and "conflict-free" in rows[1]


def test_banks_question_bank_answers_every_question(capsys):
    text = run(capsys, "banks", "--question-bank")
    assert "float array, stride 2" in text and "12-byte struct, field .x" in text


@pytest.mark.parametrize("argv", [
    ["analyze", "sum_nope"],  # no such variant
    ["analyze", "sum_vec"],  # no shared-memory tree
    ["analyze", "sum_seq", "--block-size", "48"],  # not a power of two
    ["banks"],  # one of --stride, --padding, --question-bank is required
    ["analyze", "sum_seq", "--what"],
    [],
])
def test_bad_input_exits_with_a_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_bench_gets_the_arguments_after_bench(monkeypatch):
    import torch_reduce.bench.__main__ as bench

    received = []
    monkeypatch.setattr(bench, "main", lambda argv: received.append(argv) or 0)
    assert main(["bench", "--quick", "--sections", "ladder"]) == 0
    assert received == [["--quick", "--sections", "ladder"]]


def test_module_runs_as_a_program():
    done = subprocess.run([sys.executable, "-m", "torch_reduce", "analyze", "sum_nope"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice: 'sum_nope'" in done.stderr and "Traceback" not in done.stderr


def test_without_numpy_banks_run_and_analyze_names_the_extra():
    """numpy comes with the analysis extra: without it, banks and --help still run, and analyze says what to install
    (it was an import traceback for every command)."""
    blocked = ("import sys; sys.modules['numpy'] = None; from torch_reduce.__main__ import main; "
               "sys.exit(main(sys.argv[1:]))")
    run = [sys.executable, "-c", blocked]
    done = subprocess.run(run + ["banks", "--stride", "3"], capture_output=True, text=True)
    assert done.returncode == 0 and "colliding lanes none" in done.stdout, done.stderr
    assert subprocess.run(run + ["--help"], capture_output=True, text=True).returncode == 0
    done = subprocess.run(run + ["analyze", "sum_seq", "--block-size", "64"], capture_output=True, text=True)
    assert done.returncode == 2 and "torch_reduce[analysis]" in done.stderr and "Traceback" not in done.stderr


def test_bench_without_a_gpu_runs_the_cpu_part_of_named_sections(monkeypatch, capsys, tmp_path):
    import torch

    import torch_reduce.bench.__main__ as bench
    from torch_reduce.bench import host

    ran = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(host, "run", lambda ctx: ran.append(ctx) or "host table")
    assert bench.main(["--quick", "--sections", "ladder,host", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["No GPU found: the CPU part of host only.", "host table"]
    assert [(ctx.quick, ctx.out_dir) for ctx in ran] == [(True, tmp_path)]
    # Unnamed (the default run) or without a CPU part: the smoke test, as before.
    for argv in ([], ["--sections", "ladder"]):
        assert bench.main(argv) == 0
        assert capsys.readouterr().out.startswith("No GPU found: timings need an NVIDIA GPU")
    assert len(ran) == 1
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--sections", "hots"])
    assert exit_info.value.code == 2


def test_bench_host_cpu_part_writes_its_table_and_records(tmp_path):
    """The shape of the host section's output on CPU tensors (quick); the timings themselves are not checked."""
    import json

    from torch_reduce.bench import host
    from torch_reduce.bench.context import Context

    text = host.run(Context(quick=True, out_dir=tmp_path), devices=("cpu",))
    assert (tmp_path / "host.md").read_text() == text
    cases = [case for case in host.CASES if case.on_cpu]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "| cpu |" in line]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [case.name for case in cases]
    for row, case in zip(rows, cases):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 10 and cells[7] in ("PASS", "MISS") and cells[8:] == ["-", "-"]  # no GPU columns
        assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[5]) > 0
        assert (cells[4] == "-") == (case.direct_stmt is None)  # op-direct: the full sums only
    passed = sum("| PASS |" in row for row in rows)
    assert f"{passed} PASS, {len(rows) - passed} MISS" in text.splitlines()

    data = json.loads((tmp_path / "host.json").read_text())
    assert data["meta"]["devices"] == ["cpu"] and data["meta"]["quick"] is True
    want = [(case.name, impl) for case in cases
            for impl in ("torch", "torch_reduce", "op_direct")[:3 if case.direct_stmt else 2]]
    assert [(r["case"], r["impl"]) for r in data["records"]] == want
    for record in data["records"]:
        assert record["device"] == "cpu" and record["median_us"] > 0 and record["blocks"] > 0
        assert record["gpu_us"] is None and record["target_ratio"] == host.TARGET


def test_bench_check_compares_chunk_by_chunk_and_misses_nothing(monkeypatch):
    """The benchmark's correctness check compares CHECK_CHUNK elements at a time: one wrong element in the last,
    partial chunk of a result fails it, as does a shape that differs; equal results and empty ones pass."""
    from torch_reduce.bench import layernorm

    monkeypatch.setattr(layernorm, "CHECK_CHUNK", 7)
    x = torch.randn(5, 9, dtype=torch.bfloat16)
    layernorm._check((x, torch.empty(0)), (x.clone(), torch.empty(0)))
    wrong = x.clone()
    wrong[4, 8] += 3 * max(1.0, x.float().abs().max().item())
    with pytest.raises(AssertionError, match="result 2 of 2, from element 42"):
        layernorm._check((x, x), (x, wrong))
    with pytest.raises(AssertionError, match=r"shape \(5, 9\), torch's \(4, 9\)"):
        layernorm._check(x, x[:4])


@pytest.mark.parametrize("op, dim", [("sum", None), ("sum", 0), ("mean", (0, 1)), ("amax", -1), ("vector_norm", -1)])
def test_dropin_bench_times_no_result_off_torchs(op, dim):
    """The drop-in section checks each result against torch's before timing it: ours passes; one element off by
    100 times the bound's roundings, or a result of zeros, fails; so does another dtype."""
    import torch_reduce
    from torch_reduce.bench.dropin import _check_like_torch

    x = torch.randn(512, 64) + 0.5  # sums and means far from 0: a result of zeros is off by far more than the bound
    args = (3, dim) if op == "vector_norm" else () if dim is None else (dim,)
    theirs = getattr(torch.linalg if op == "vector_norm" else torch, op)
    ours, want = getattr(torch_reduce, op)(x, *args), theirs(x, *args)
    _check_like_torch(op, dim, x, ours, want)
    off = ours.clone()
    off.view(-1)[-1] += 1e-3 * (x.abs().sum().item() if op == "sum" else max(1.0, want.abs().max().item()))
    for wrong in (off, torch.zeros_like(ours), ours.double()):
        with pytest.raises(AssertionError):
            _check_like_torch(op, dim, x, wrong, want)


def test_bench_section_times_each_implementation_before_checking_it(monkeypatch, tmp_path, capsys):
    """Section.measure on CPU tensors, the clocks replaced: torch's call is timed and becomes the reference; the
    others are timed, then checked (the check's copies slowed the timing after them); a wrong result loses both
    figures and its error is kept; without torch's reference nothing is timed."""
    from torch_reduce.bench import layernorm
    from torch_reduce.bench.context import Context
    from torch_reduce.bench.timing import Timing

    events = []
    monkeypatch.setattr(layernorm, "time_graph", lambda fn, samples, **kw: events.append("graph") or Timing(1.0, 1, 1))
    monkeypatch.setattr(layernorm, "time_launches",
                        lambda fn, samples, **kw: events.append("eager") or Timing(2.0, 1, 1))
    check = layernorm._check
    monkeypatch.setattr(layernorm, "_check", lambda got, want: events.append("check") or check(got, want))
    section = layernorm.Section(Context(quick=True, out_dir=tmp_path), 1)
    x, errors = torch.randn(4, 8), {}
    reference, graph_ms, eager_ms = section.measure("w", "torch", lambda s: s * 2, lambda: [x], None, True, errors)
    assert events == ["graph", "eager"] and (graph_ms, eager_ms) == (1.0, 2.0) and torch.equal(reference, x * 2)
    events.clear()
    assert section.measure("w", "ours", lambda s: s + s, lambda: [x], reference, True, errors) == (reference, 1.0, 2.0)
    assert events == ["graph", "eager", "check"] and errors == {}
    events.clear()
    assert section.measure("w", "liger", lambda s: s * 3, lambda: [x], reference, False, errors)[1:] == (None, None)
    assert events == ["graph", "check"] and "result 1 of 1" in errors["liger"]
    events.clear()
    assert section.measure("w", "ours", lambda s: s, lambda: [x], None, True, errors)[1:] == (None, None)
    assert events == [] and "no reference" in errors["ours"]
    section.bar.close()


def test_bench_same_bytes_moves_each_modes_bytes_and_reaches_the_tables(monkeypatch, tmp_path):
    """SAME_BYTES, the norm sections' streaming reference: for every mode of the LayerNorm, RMSNorm and add + norm
    sections, its kernels read and write exactly the mode's passes x N elements (counted op by op under a dispatch
    mode, on CPU tensors); a record carries its time and % of the line, which the table and, beside a line target,
    the summary show."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from torch_reduce.bench import addnorm, layernorm
    from torch_reduce.bench.context import Context

    class Traffic(TorchDispatchMode):
        elements = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor) and t.dim()]
            self.elements += sum(t.numel() for t in tensors)
            return out

    a, b = torch.randn(3, 5), torch.randn(3, 5)
    for passes in {*layernorm.MODES.values(), *addnorm.MODES.values()}:
        with Traffic() as traffic:
            for kernel in layernorm.SAME_BYTES[passes]:
                kernel(a, b)
        assert traffic.elements == passes * a.numel(), passes

    ctx = Context(quick=True, out_dir=tmp_path)
    monkeypatch.setattr(type(ctx), "pct_of_line", lambda self, gbps: gbps / 10)
    section = layernorm.Section(ctx, 1)
    times = {"torch": 0.2, "ours": 0.1, "liger": None}
    section.add("layer_norm", "bwd", torch.bfloat16, (4096, 4096), 3, times, None, {}, same_bytes_ms=0.08)
    section.add("layer_norm", "bwd", torch.bfloat16, (1024, 768), 3, times, None, {})
    section.bar.close()
    done, small = section.records
    assert done["same_bytes_pct_of_line"] == pytest.approx(done["ours_pct_of_line"] / 0.8)
    assert small["same_bytes_ms"] is None and small["same_bytes_pct_of_line"] is None
    text = "\n".join(layernorm.summary(section.records) + layernorm.table(section.records))
    assert f"4096x4096 {done['ours_pct_of_line']:.0f}% (same bytes {done['same_bytes_pct_of_line']:.0f}%)" in text
    assert f"| 0.0800 ({done['same_bytes_pct_of_line']:.0f}%) |" in text and "| – |" in text
