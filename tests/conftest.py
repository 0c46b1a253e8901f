import os
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

import torch_reduce  # registers torch.ops.reduce

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU")
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Fresh random inputs every run; the seed is printed with any failure so it can be replayed."""
    seed = int(os.environ.get("TORCH_REDUCE_SEED", int.from_bytes(os.urandom(4), "little")))
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield seed


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        for name, value in item.user_properties:
            if name == "seed":
                print(f"\n[replay with TORCH_REDUCE_SEED={value}]")


def seed_torch(data):
    """Seeds torch with a number hypothesis draws (``data``: st.data()), so that an example's random tensors are part
    of the example: printed with a failing one, replayed and shrunk with it (hypothesis replays an example to confirm
    it; with torch's generator running on, the replay draws other tensors and reports a flaky test instead)."""
    torch.manual_seed(data.draw(st.integers(0, 2**32 - 1), label="torch seed"))


def random_tensor(shape, dtype, device="cpu"):
    """Random values of every kind a dtype holds (never zeros): normals, small integers, coin flips."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, device=device, dtype=dtype)


def subprocess_env(**extra) -> dict:
    """os.environ for a child Python that must import this torch_reduce (an in-place build is not installed)."""
    package_root = str(Path(torch_reduce.__file__).resolve().parents[1])
    return {**os.environ, **extra,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
