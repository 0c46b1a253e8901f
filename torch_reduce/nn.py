"""torch.nn.LayerNorm on the fused kernels, and a converter for whole models."""
from __future__ import annotations

import torch

from .functional import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with torch_reduce's kernels: the same constructor, parameters, state_dict keys,
    reset_parameters and repr (it is a subclass), so torch checkpoints load unchanged."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


def _converted(norm: torch.nn.LayerNorm) -> LayerNorm:
    """A LayerNorm holding the very same Parameter objects (so optimizers and tied weights still see them)."""
    new = LayerNorm(norm.normalized_shape, norm.eps, elementwise_affine=False)  # no parameters of its own
    new.elementwise_affine = norm.elementwise_affine
    new.weight, new.bias = norm.weight, norm.bias
    new.train(norm.training)
    return new


def convert_layernorm(module: torch.nn.Module) -> torch.nn.Module:
    """Replace every torch.nn.LayerNorm inside ``module`` in place; returns ``module`` (or, when ``module``
    is itself a LayerNorm, its replacement)."""
    if isinstance(module, torch.nn.LayerNorm) and not isinstance(module, LayerNorm):
        return _converted(module)
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.LayerNorm) and not isinstance(child, LayerNorm):
                setattr(parent, name, _converted(child))
    return module
