"""torch_reduce: the parallel-reduction lessons as PyTorch ops, carried to the memory-bandwidth limit.

``import torch_reduce`` loads the compiled extension, which registers ``torch.ops.reduce.*``.
"""
import torch  # noqa: F401  (the extension links against torch's libraries)

from ._version import __version__  # noqa: F401
from . import _check_torch  # noqa: F401  before _C: a torch other than the build's raises, naming both versions
from . import _C  # noqa: F401  registers torch.ops.reduce
from . import ops  # noqa: F401  fake kernels (autograd and autocast are registered in C++)
from . import nn  # noqa: F401
from . import distributed  # noqa: F401  (torch.distributed need not be initialised; arms the DTensor rules)
from . import nested  # noqa: F401  jagged nested tensors in the ops
from . import batching  # noqa: F401  vmap rules
from .functional import add_layer_norm, add_rms_norm, layer_norm, rms_norm, var_mean  # noqa: F401
from .grad_norm import clip_grad_norm_, clip_grads_with_norm_, foreach_norm, get_total_norm  # noqa: F401
from .ladder import LADDER, Variant  # noqa: F401
from .reductions import amax, amin, mean, prod, sum, vector_norm  # noqa: A004  (torch's names, on purpose)

__all__ = ["LADDER", "Variant", "sum", "mean", "amax", "amin", "prod", "vector_norm", "var_mean", "layer_norm",
           "rms_norm", "add_layer_norm", "add_rms_norm", "nn", "distributed", "foreach_norm", "get_total_norm",
           "clip_grads_with_norm_", "clip_grad_norm_"]
