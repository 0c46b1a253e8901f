"""The distributed training check (python -m torch_reduce.bench.distributed) on the CPU: two processes on gloo
train a converted decoder beside the unconverted one under DDP and FSDP2, in float32 and under bf16 autocast,
and every check must pass: the same losses and parameters within the tolerances of tests/test_training.py."""
import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import subprocess_env
from torch_reduce.bench.distributed import MODES, STRATEGIES

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="this torch build has no torch.distributed with the gloo backend")

# A small decoder, so two processes on two cores finish in well under a minute.
MODEL = ["--vocab", "61", "--width", "32", "--heads", "4", "--layers", "2", "--context", "16", "--batch", "2"]


def test_converted_decoder_trains_as_unconverted_under_ddp_and_fsdp2(tmp_path, fresh_seed):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "torch_reduce.bench.distributed", "--device", "cpu", "--parts", "train", "--steps", "20",
               "--seed", str(fresh_seed), "--out", str(tmp_path), *MODEL]
    run = subprocess.run(command, env=subprocess_env(OMP_NUM_THREADS="1"), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    output = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, f"exit status {run.returncode}:\n{output}"
    report = json.loads((tmp_path / "distributed_training.json").read_text())
    checks = {(r["strategy"], r["mode"]): r for r in report["records"]}
    assert set(checks) == {(s, m) for s in STRATEGIES for m in MODES}
    for (strategy, mode), record in checks.items():
        assert record["layernorms_converted"] == 5 and record["layernorms_left"] == 0, (strategy, mode)
        assert record["passed"], (f"{strategy} {mode}: losses {record['loss_rel_diff_max']:.2e}, parameters "
                                  f"{record['parameters_rel_diff']:.2e}, {record['worst_parameter']} "
                                  f"{record['worst_parameter_rel_diff']:.2e}")
    assert report["meta"]["passed"] and report["meta"]["world_size"] == 2 and report["meta"]["backend"] == "gloo"
