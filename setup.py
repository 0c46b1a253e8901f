"""Build torch_reduce._C with torch.utils.cpp_extension.

A CUDAExtension whenever torch is a CUDA build and nvcc is found (no GPU is needed to compile), else a
CppExtension with the CPU kernels only. TORCH_REDUCE_CPU_ONLY=1 forces the CPU-only build (fast iteration).
"""
import glob
import os
import shutil

from setuptools import find_packages, setup

# torch looks for nvcc on PATH before /usr/local/cuda; a wrapper script on PATH would make it guess a wrong
# CUDA_HOME, so prefer the toolkit's own folder when the user has not chosen one.
if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")) and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    if os.environ.get("TORCH_REDUCE_CPU_ONLY", "0") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None and (
        shutil.which("nvcc") is not None or os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"))
    )


def _cuda_library_headers() -> list:
    """torch's CUDA headers include cuSPARSE, cuBLAS, ...; a minimal toolkit lacks them, but torch's own
    pip dependencies (the nvidia-* wheels) carry them: use those when the toolkit has none."""
    if os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "include", "cusparse.h")):
        return []
    try:
        import nvidia
    except ImportError:
        return []
    return sorted(
        d for root in nvidia.__path__ for d in glob.glob(os.path.join(root, "*", "include"))
        if os.path.exists(os.path.join(d, "cusparse.h"))
    )


def _extension():
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")) + glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    cxx = ["-O3"]  # the C++ standard is torch's choice (C++17 for 2.11, C++20 for 2.14)
    if not _want_cuda():
        return cpp_extension.CppExtension(
            "torch_reduce._C", sources, extra_compile_args={"cxx": cxx}, include_dirs=[os.path.join(ROOT, "csrc")]
        )
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        # No GPU to ask: build for Hopper (the project's target, H100/H200).
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo"]
    return cpp_extension.CUDAExtension(
        "torch_reduce._C",
        sources,
        extra_compile_args={"cxx": cxx + ["-DTORCH_REDUCE_WITH_CUDA"], "nvcc": nvcc + ["-DTORCH_REDUCE_WITH_CUDA"]},
        include_dirs=[os.path.join(ROOT, "csrc")] + _cuda_library_headers(),
    )


setup(
    name="torch_reduce",
    version="0.1.0",
    packages=find_packages(include=["torch_reduce", "torch_reduce.*"]),  # bench and analysis too
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
