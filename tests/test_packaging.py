"""Packaging guards that need no GPU: the torch-version check made before torch_reduce._C loads, and the version."""
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import torch_reduce
from conftest import subprocess_env
from torch_reduce._check_torch import torch_mismatch


def test_matching_torch_loads():
    assert torch_mismatch("2.14.1+cu130", "13.0", "2.14.1+cu130", "13.0") is None
    assert torch_mismatch("2.14.1+cu130", "13.0", "2.14.1", "13.2") is None  # local label, CUDA minor
    assert torch_mismatch("2.14.1+cu130", None, "2.14.1+cpu", None) is None  # CPU kernels only: any 2.14.1


@pytest.mark.parametrize("installed, cuda, why", [
    ("2.11.0+cu130", "13.0", "torch 2.11.0+cu130 is installed"),
    ("2.14.1+cpu", None, "has no CUDA"),
    ("2.14.1+cu128", "12.8", "uses CUDA 12.8"),
])
def test_other_torch_names_both_versions(installed, cuda, why):
    message = torch_mismatch("2.14.1+cu130", "13.0", installed, cuda)
    assert "built against torch 2.14.1+cu130 (CUDA 13.0)" in message and why in message
    assert "pip install torch==2.14.1" in message


def test_import_with_another_torch_fails_before_loading_the_extension():
    if importlib.util.find_spec("torch_reduce._build_info") is None:
        pytest.skip("no build record: this in-place _C was built before setup.py wrote one (rebuild)")
    package_root = str(Path(torch_reduce.__file__).parent.parent)  # the child imports this same torch_reduce
    code = (f"import sys; sys.path.insert(0, {package_root!r})\n"
            "import torch\n"
            "torch.__version__ = '2.0.0'\n"
            "try:\n"
            "    import torch_reduce\n"
            "except ImportError as error:\n"
            "    print(error)\n"
            "assert 'torch_reduce._C' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "but torch 2.0.0 is installed" in result.stdout and "was built against torch " in result.stdout


def test_version_is_the_installed_metadata():
    try:
        installed = importlib.metadata.version("torch_reduce")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch_reduce is on the path, not installed")
    assert torch_reduce.__version__ == installed


def test_sdist_carries_every_source(tmp_path):
    """The source distribution builds on its own: every file under csrc/ (headers and .cu files included, which
    setuptools leaves out of a CPU-only build's sdist) is in it."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "setup.py").exists():
        pytest.skip("not a source checkout")
    env = {**os.environ, "TORCH_REDUCE_CPU_ONLY": "1"}
    # --egg-base: a fresh file list, not one an earlier build left in the tree.
    command = [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "sdist", "-d", str(tmp_path)]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        packed = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    sources = {str(p.relative_to(root)) for p in (root / "csrc").rglob("*") if p.is_file()}
    assert sources <= packed, sorted(sources - packed)


IMPORT_ORDER_SCRIPT = """
import sys
import torch
if sys.argv[1] == "dynamo first":
    import torch._dynamo
import torch_reduce
if sys.argv[1] == "torch_reduce first":
    heavy = [m for m in ("torch._dynamo", "torch.distributed.tensor") if m in sys.modules]
    assert not heavy, f"import torch_reduce imported {heavy}"
compiled = torch.compile(lambda x: torch_reduce.sum(x, 1) + torch_reduce.layer_norm(x, (3,)).sum(1),
                         fullgraph=True, backend="eager")
x = torch.randn(2, 3)
torch.testing.assert_close(compiled(x), x.sum(1) + torch.nn.functional.layer_norm(x, (3,)).sum(1))
if torch.distributed.is_available():
    import torch.distributed.tensor
    assert "torch_reduce.dtensor" in sys.modules, "the DTensor rules were not registered on DTensor's import"
print("ok")
"""


@pytest.mark.parametrize("order", ["torch_reduce first", "dynamo first"])
def test_import_waits_for_the_program_to_import_dynamo_and_dtensor(order):
    """import torch_reduce imports neither TorchDynamo nor DTensor (1.2 s of a 1.25 s import before, on a
    2-core CPU machine): the entry points' substitutes for torch.compile and the DTensor rules register when the program imports
    them, or at once if it has."""
    result = subprocess.run([sys.executable, "-c", IMPORT_ORDER_SCRIPT, order], capture_output=True, text=True,
                            env=subprocess_env(), timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
