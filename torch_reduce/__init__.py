"""torch_reduce: the parallel-reduction lessons as PyTorch ops, carried to the memory-bandwidth limit.

``import torch_reduce`` loads the compiled extension, which registers ``torch.ops.reduce.*``.
"""
import torch  # noqa: F401  (the extension links against torch's libraries)

from . import _C  # noqa: F401  registers torch.ops.reduce
from . import ops  # noqa: F401  fake kernels and autograd
from . import nn  # noqa: F401
from . import distributed  # noqa: F401  (torch.distributed need not be initialised; arms the DTensor rules)
from .functional import layer_norm, var_mean  # noqa: F401
from .ladder import LADDER, Variant  # noqa: F401
from .reductions import amax, amin, mean, sum  # noqa: A004  (torch's names, on purpose)

__all__ = ["LADDER", "Variant", "sum", "mean", "amax", "amin", "var_mean", "layer_norm", "nn", "distributed"]
