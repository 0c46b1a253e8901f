"""Build torch_reduce._C with torch.utils.cpp_extension.

A CUDAExtension whenever torch is a CUDA build and nvcc is found (no GPU is needed to compile), else a
CppExtension with the CPU kernels only. TORCH_REDUCE_CPU_ONLY=1 forces the CPU-only build (fast iteration).

_C uses only Python's limited API (csrc/module.cpp, csrc/fast_call.cpp; the ops register through torch's
dispatcher), so one wheel serves every CPython >= 3.10 (abi3); it links libtorch_python for the one function that
wraps a tensor as a Python object (the drop-ins' C entry points, fast_call.cpp). It does depend on torch's C++
ABI, which changes with every torch release: the wheel requires the torch it was built against, exactly, and
torch_reduce/_build_info.py records that torch for the check at import (torch_reduce/_check_torch.py).
"""
import glob
import os
import re
import shutil

from setuptools import setup

# torch looks for nvcc on PATH before /usr/local/cuda; a wrapper script on PATH would make it guess a wrong
# CUDA_HOME, so prefer the toolkit's own folder when the user has not chosen one.
if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")) and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(ROOT, "torch_reduce")
INCLUDES = os.path.join(ROOT, "csrc")
# Ampere (A100, RTX 30xx), Ada (L4, L40, RTX 40xx), Hopper (H100, H200) as machine code, and PTX for Hopper
# that the driver compiles for newer GPUs; the kernels use nothing newer than Ampere's features.
DEFAULT_CUDA_ARCH_LIST = "8.0;8.6;8.9;9.0+PTX"


def _want_cuda() -> bool:
    if os.environ.get("TORCH_REDUCE_CPU_ONLY", "0") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None and (
        shutil.which("nvcc") is not None or os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"))
    )


WITH_CUDA = _want_cuda()
TORCH_PUBLIC_VERSION = torch.__version__.split("+")[0]  # 2.14.1+cu130 -> 2.14.1


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


def _compiled_cuda_archs() -> str:
    """The architectures nvcc will emit (sm_80 machine code, compute_90 PTX), as torch derives them from
    TORCH_CUDA_ARCH_LIST, joined by '/' (nvcc splits -D values at commas): named in the error for a GPU that
    has no kernel here (csrc/cuda/arch_check.cu)."""
    codes = (re.search(r",code=(\w+)", flag).group(1) for flag in cpp_extension._get_cuda_arch_flags())
    return "/".join(sorted(set(codes), key=lambda code: (code.startswith("compute"), code)))


def _extension():
    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")) + glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    # -g0: the interpreter's CFLAGS ask for host debug info, 27 of _C's 29 MB (nvcc's -lineinfo stays, below).
    # The C++ standard is torch's choice (C++17 for 2.11, C++20 for 2.14).
    cxx = ["-O3", "-g0"]
    # at::parallel_for is inline: with torch's OpenMP backend it splits work only where _OPENMP is defined, so the
    # CPU kernels' parallel loops ran on one thread without -fopenmp (2 threads, sum over dim 1 of (1000, 4000, 5):
    # 9.7 ms, torch 4.9). The libgomp this links is torch's, loaded first (same soname).
    link = []
    if torch.backends.openmp.is_available():
        cxx.append("-fopenmp")
        link.append("-fopenmp")
    if not WITH_CUDA:
        return cpp_extension.CppExtension(
            "torch_reduce._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=link,
            include_dirs=[INCLUDES], libraries=["torch_python"], py_limited_api=True,
        )
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        # No GPU to ask (a visible GPU makes torch build for that GPU alone).
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCH_LIST
    sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    # -lineinfo keeps source lines in the kernels for Nsight Compute and compute-sanitizer.
    nvcc = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", f"-DTORCH_REDUCE_CUDA_ARCHS={_compiled_cuda_archs()}"]
    return cpp_extension.CUDAExtension(
        "torch_reduce._C",
        sources,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=link,
        include_dirs=[INCLUDES] + _cuda_library_headers(),
        libraries=["torch_python"],  # torch leaves it out for py_limited_api; fast_call.cpp wraps tensors with it
        py_limited_api=True,
    )


def _write_build_info(folder: str) -> None:
    with open(os.path.join(folder, "_build_info.py"), "w") as f:
        f.write('"""Written by setup.py with torch_reduce._C: the torch it was compiled against."""\n'
                f"TORCH_VERSION = {torch.__version__!r}\n"
                f"CUDA_VERSION = {torch.version.cuda if WITH_CUDA else None!r}  # None: CPU kernels only\n")


class BuildExtension(cpp_extension.BuildExtension):
    """torch's build, plus torch_reduce/_build_info.py next to _C wherever _C goes: the build folder (a
    wheel's contents) and, for in-place and editable builds, the source tree."""

    def build_extension(self, ext):
        super().build_extension(ext)
        _write_build_info(os.path.dirname(self.get_ext_fullpath(ext.name)))

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        _write_build_info(PACKAGE)
        # Python imports _C.cpython-3XX-*.so before _C.abi3.so: drop one left by an older in-place build.
        built = os.path.basename(self.get_ext_filename("torch_reduce._C"))
        for stale in glob.glob(os.path.join(PACKAGE, "_C.*.so")):
            if os.path.basename(stale) != built:
                os.remove(stale)


setup(
    ext_modules=[_extension()],
    install_requires=[f"torch=={TORCH_PUBLIC_VERSION}"],
    cmdclass={"build_ext": BuildExtension},
    # abi3 from CPython 3.10: the Py_LIMITED_API that torch defines for py_limited_api (2.11 and 2.14 alike).
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
