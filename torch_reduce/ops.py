"""Python side of the registered ops: fake (meta) kernels for torch.compile, and autograd."""
from __future__ import annotations

import torch

from .ladder import LADDER


def _sum_result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.int64


def _register_ladder(name: str) -> None:
    qualname = f"reduce::{name}"

    @torch.library.register_fake(qualname)
    def _fake(t, block_size=256):
        return t.new_empty((), dtype=_sum_result_dtype(t.dtype))

    def _setup_context(ctx, inputs, output):
        ctx.input_shape = inputs[0].shape

    def _backward(ctx, grad):
        # d(sum t)/dt = 1 for every element: the incoming gradient, expanded to the input's shape.
        return grad.expand(ctx.input_shape), None

    torch.library.register_autograd(qualname, _backward, setup_context=_setup_context)


for _variant in LADDER:
    _register_ladder(_variant.name)
