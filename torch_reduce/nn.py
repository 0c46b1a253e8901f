"""torch.nn.LayerNorm on the fused kernels, and a converter for whole models."""
from __future__ import annotations

import torch

from .functional import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with torch_reduce's kernels: the same constructor, parameters, state_dict keys,
    reset_parameters and repr (it is a subclass), so torch checkpoints load unchanged."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


_CONVERTED_SUBCLASSES: dict[type, type] = {}


def _converted_class(cls: type) -> type | None:
    """The class a module of class ``cls`` becomes, or None when it stays as it is: torch.nn.LayerNorm becomes
    our LayerNorm; a subclass that keeps nn.LayerNorm's forward becomes a subclass of it with our forward (its
    own methods and isinstance kept); a subclass with a forward of its own is left alone, since we cannot know
    what that forward means (e.g. CLIP's LayerNorm that computes in float32 and casts back)."""
    if cls is torch.nn.LayerNorm:
        return LayerNorm
    if not issubclass(cls, torch.nn.LayerNorm) or cls.forward is not torch.nn.LayerNorm.forward:
        return None
    if cls not in _CONVERTED_SUBCLASSES:
        _CONVERTED_SUBCLASSES[cls] = type(cls.__name__, (cls,), {"forward": LayerNorm.forward,
                                                                  "__module__": cls.__module__,
                                                                  "__qualname__": cls.__qualname__})
    return _CONVERTED_SUBCLASSES[cls]


def convert_layernorm(module: torch.nn.Module) -> torch.nn.Module:
    """Switch every torch.nn.LayerNorm inside ``module`` (``module`` itself included) to torch_reduce's kernels,
    in place, and return ``module``.

    Each module keeps its identity: only its class changes, so its Parameter objects (seen by optimizers,
    tied weights), hooks, buffers, attributes and training mode all stay. Subclasses with a forward of their
    own are left alone (see ``_converted_class``).
    """
    for child in module.modules():
        cls = _converted_class(type(child))
        if cls is not None:
            child.__class__ = cls
    return module
