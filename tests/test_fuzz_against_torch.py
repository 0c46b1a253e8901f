"""A short run of each kind of call of scripts/fuzz_against_torch.py, with the test's fresh seed: norms, reductions,
clipping (with foreach_norm) and the other autograd modes, each against torch and float64 (the script runs them
for minutes; this keeps the script itself working and every CI run drawing new cases)."""
import importlib.util
from pathlib import Path

import pytest

from conftest import DEVICES

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fuzz_against_torch.py"
_spec = importlib.util.spec_from_file_location("fuzz_against_torch", _SCRIPT)
fuzz_against_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_against_torch)

CALLS = {"norm": 100, "reduction": 600, "clip": 60, "autograd_modes": 600}


@pytest.mark.filterwarnings("ignore")  # var_mean's degrees-of-freedom warnings, torch's and ours alike
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(CALLS))
def test_fuzz_finds_nothing(kind, device, fresh_seed):
    fuzz = fuzz_against_torch.Fuzz(device, fresh_seed)
    for _ in range(CALLS[kind]):
        getattr(fuzz, kind)()
    assert not fuzz.failures, "\n".join(fuzz.failures[:10])
    assert sum(fuzz.counts.values()) > 0  # the calls were judged, not all refused
