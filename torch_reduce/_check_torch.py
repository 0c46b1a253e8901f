"""Imported before torch_reduce._C: raises ImportError, naming both torch versions, when the installed torch is
not the one _C was compiled against. _C links against torch's C++ libraries, whose ABI changes with every
release (loading it with another torch fails with an undefined symbol), and a CUDA build also against torch's
CUDA libraries, of one CUDA major version."""
from __future__ import annotations

from typing import Optional

import torch

from ._version import __version__


def torch_mismatch(built_torch: str, built_cuda: Optional[str], torch_version: str,
                   torch_cuda: Optional[str]) -> Optional[str]:
    """Why a _C built against (built_torch, built_cuda) cannot load with (torch_version, torch_cuda); None when
    it can. CUDA versions are None for CPU-only builds; local labels (+cu130) alone may differ."""
    if built_torch.split("+")[0] != torch_version.split("+")[0]:
        found = f"torch {torch_version} is installed"
    elif built_cuda is not None and torch_cuda is None:
        found = f"the installed torch {torch_version} has no CUDA"
    elif built_cuda is not None and built_cuda.split(".")[0] != torch_cuda.split(".")[0]:
        found = f"the installed torch {torch_version} uses CUDA {torch_cuda}"
    else:
        return None
    built = f"torch {built_torch}" + (f" (CUDA {built_cuda})" if built_cuda else "")
    return (f"torch_reduce {__version__} was built against {built}, but {found}. Install the torch it was built "
            f"against (pip install torch=={built_torch.split('+')[0]}), or rebuild torch_reduce against this "
            "torch from its source (pip install --no-build-isolation ., or make build).")


try:
    from ._build_info import CUDA_VERSION, TORCH_VERSION
except ImportError:  # an in-place _C built before setup.py wrote this record: nothing to compare with
    pass
else:
    _problem = torch_mismatch(TORCH_VERSION, CUDA_VERSION, torch.__version__, torch.version.cuda)
    if _problem:
        raise ImportError(_problem)
