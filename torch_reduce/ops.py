"""Python side of the registered ops: fake (meta) kernels for torch.compile.

The ladder's autograd is registered in C++ (csrc/ladder_autograd.cpp), so a call pays no Python
autograd wrapper.
"""
from __future__ import annotations

import torch

from .ladder import LADDER


def _sum_result_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.int64


def _register_ladder_fake(name: str) -> None:
    @torch.library.register_fake(f"reduce::{name}")
    def _fake(t, block_size=256):
        return t.new_empty((), dtype=_sum_result_dtype(t.dtype))


for _variant in LADDER:
    _register_ladder_fake(_variant.name)
