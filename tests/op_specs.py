"""One spec per op of torch_reduce, in the spirit of PyTorch's OpInfo: our callable, torch's callable with the
same arguments, and sample inputs. tests/test_op_contract.py runs every contract over every spec.

TORCH_REDUCE_SELF_CHECK=1 puts torch's callable in place of ours, to check the tests themselves: every test
must then pass (tests that need our registered ops skip), so a failure without it is the implementation's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

import torch_reduce

SELF_CHECK = os.environ.get("TORCH_REDUCE_SELF_CHECK") == "1"

Sample = tuple[tuple, dict]  # (args, kwargs): the call is op(*args, **kwargs)


@dataclass(frozen=True)
class OpSpec:
    name: str
    ours: Callable
    torch: Callable
    sample_inputs: Callable[..., Iterator[Sample]]  # (device, dtype, requires_grad) -> (args, kwargs), ...

    @property
    def op(self) -> Callable:
        """The callable under test: ours, or torch's under TORCH_REDUCE_SELF_CHECK=1."""
        return self.torch if SELF_CHECK else self.ours

    def samples(self, device, dtype=torch.float64, requires_grad=False) -> list[Sample]:
        return list(self.sample_inputs(device, dtype, requires_grad))


def make(shape, device, dtype, requires_grad=False, layout="contiguous"):
    """A fresh random leaf tensor of ``shape`` stored as ``layout``: contiguous, transposed (every dim's
    order reversed), stepped (every other element of its last dim) or expanded (dim 0 is a stride-0 broadcast).
    In float32/float64 no two elements tie (amax/amin gradients are unambiguous), except an expanded
    tensor's copies; 16-bit rounding makes ties, which amax/amin share as torch does."""
    shape = tuple(shape)
    randn = lambda *size: torch.randn(size, device=device).to(dtype)  # noqa: E731  (16-bit: rounded normals)
    if layout == "transposed" and len(shape) >= 2:
        t = randn(*shape[::-1]).permute(*reversed(range(len(shape))))
    elif layout == "stepped" and shape:
        t = randn(*shape[:-1], 2 * shape[-1])[..., ::2]
    elif layout == "expanded" and shape:
        t = randn(1, *shape[1:]).expand(shape)
    else:
        t = randn(*shape)
    return t.detach().requires_grad_(requires_grad)  # a leaf that keeps the view's strides


# ------------------------------------------------------------------------------------------ samples ----

def ladder_samples(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((1001,)),), {}
    yield (t((3, 5, 7), "transposed"),), {"block_size": 32}
    yield (t((6, 9), "stepped"),), {"block_size": 1024}
    yield (t((4, 7), "expanded"),), {}
    yield (t(()),), {}
    yield (t((2, 300)),), {"block_size": 64}


def reduction_samples(name):
    """sum/mean (dim may be None; dtype=) and amax/amin (dim=() means every dim)."""

    def samples(device, dtype, requires_grad):
        t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
        yield (t((3, 5, 7)),), {}
        yield (t((3, 5, 7)), 1), {}
        yield (t((3, 5, 7)), (0, 2), True), {}
        yield (t((3, 5, 7), "transposed"), -1), {"keepdim": True}
        yield (t((6, 9), "stepped"), 0), {}
        yield (t((4, 7), "expanded"), 1), {}
        yield (t((4, 7), "expanded"), (0,)), {"keepdim": True}
        yield (t(()),), {}
        yield (t((1001,)), 0), {}
        if name in ("sum", "mean"):
            yield (t((2, 3)), None, True), {}
            yield (t((5, 3)), 1), {"dtype": torch.float64}
        else:
            yield (t((2, 3)), ()), {"keepdim": True}

    return samples


def var_mean_samples(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((3, 5, 7)),), {}
    yield (t((3, 5, 7)), 1), {}
    yield (t((3, 5, 7)), (0, 2)), {"correction": 0, "keepdim": True}
    yield (t((3, 5, 7), "transposed"), -1), {"correction": 2}
    yield (t((6, 9), "stepped"), 0), {}
    yield (t((4, 7), "expanded"), 1), {"keepdim": True}
    yield (t((1001,)),), {}
    yield (t((2, 3)), None), {"correction": 0}


def layer_norm_samples(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731

    def weight(shape, layout="contiguous"):  # around 1, so no output is near 0 by accident
        w = make(shape, device, dtype, False, layout)
        return w.mul_(0.3).add_(1).requires_grad_(requires_grad)

    yield (t((4, 7)), (7,), weight((7,)), t((7,))), {}
    yield (t((2, 3, 5)), (3, 5), weight((3, 5))), {}
    yield (t((3, 6)), [6]), {}
    yield (t((3, 6)), (6,), None, t((6,))), {}
    yield (t((5,)), (5,), weight((5,)), t((5,))), {"eps": 1e-3}
    yield (t((4, 7), "transposed"), (7,), weight((7,), "stepped"), t((7,), "stepped")), {}
    yield (t((4, 6), "expanded"), (6,), weight((6,)), t((6,))), {}
    yield (t((3, 257)), (257,), weight((257,)), t((257,))), {}


# ---------------------------------------------------------------------------------------------- specs ----

def _ladder_spec(variant) -> OpSpec:
    def ref(t, block_size=256):
        return torch.sum(t)

    return OpSpec(variant.name, variant.op, ref, ladder_samples)


SPECS: list[OpSpec] = [_ladder_spec(v) for v in torch_reduce.LADDER] + [
    OpSpec(name, getattr(torch_reduce, name), getattr(torch, name), reduction_samples(name))
    for name in ("sum", "mean", "amax", "amin")
] + [
    OpSpec("var_mean", torch_reduce.var_mean, torch.var_mean, var_mean_samples),
    OpSpec("layer_norm", torch_reduce.layer_norm, F.layer_norm, layer_norm_samples),
]
BY_NAME = {s.name: s for s in SPECS}


def describe(args, kwargs) -> str:
    """A sample in one line: tensors as dtype[shape] (with 'view' when non-contiguous), the rest as given."""
    def one(a):
        if isinstance(a, torch.Tensor):
            view = "" if a.is_contiguous() else " view" + str(tuple(a.stride()))
            return f"{str(a.dtype)[6:]}{list(a.shape)}{view}"
        return repr(a)

    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


# ----------------------------------------------------------------------------------- prod, vector_norm ----

def make_near_one(shape, device, dtype, requires_grad=False, layout="contiguous"):
    """make()'s tensor with its values mapped to about 1 +- 0.3, so products of many elements stay in range."""
    t = make(shape, device, dtype, False, layout)
    with torch.no_grad():  # the whole storage, through one dense view (an expanded tensor refuses in-place ops)
        storage = t.untyped_storage().nbytes() // t.element_size()
        t.as_strided((storage,), (1,), 0).mul_(0.3).add_(1)
    return t.requires_grad_(requires_grad)


def prod_samples(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make_near_one(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((3, 5, 7)),), {}
    yield (t((3, 5, 7)), 1), {}
    yield (t((3, 5, 7)), 2, True), {}
    yield (t((3, 5, 7), "transposed"), -1), {"keepdim": True}
    yield (t((6, 9), "stepped"), 0), {}
    yield (t((4, 7), "expanded"), 1), {}
    yield (t((4, 7), "expanded"), 0), {"keepdim": True}
    yield (t(()),), {}
    yield (t((1001,)), 0), {}
    yield (t((5, 3)), 1), {"dtype": torch.float64}


def vector_norm_samples(device, dtype, requires_grad):
    """Every order but 0 (its gradient and tangents are 0; tests/test_prod_norm.py covers it)."""
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((3, 5, 7)),), {}
    yield (t((3, 5, 7)), 1, 1), {}
    yield (t((3, 5, 7)), float("inf"), (0, 2), True), {}
    yield (t((3, 5, 7), "transposed"), -float("inf"), -1), {"keepdim": True}
    yield (t((6, 9), "stepped"), 3, 0), {}
    yield (t((4, 7), "expanded"), 0.5, 1), {}
    yield (t((4, 7), "expanded"), -1.5, (0,)), {"keepdim": True}
    yield (t(()), 2), {}
    yield (t((1001,)), 2, 0), {}
    yield (t((2, 3)), 2.5, None, True), {}
    yield (t((5, 3)), 2, 1), {"dtype": torch.float64}


def _torch_prod(input, dim=None, keepdim=False, *, dtype=None):
    """torch.prod with torch_reduce.prod's signature (torch.prod has no dim=None)."""
    if dim is not None:
        return torch.prod(input, dim, keepdim, dtype=dtype)
    out = torch.prod(input, dtype=dtype)
    return out.reshape([1] * input.dim()) if keepdim else out


SPECS += [
    OpSpec("prod", torch_reduce.prod, _torch_prod, prod_samples),
    OpSpec("vector_norm", torch_reduce.vector_norm, torch.linalg.vector_norm, vector_norm_samples),
]
BY_NAME = {s.name: s for s in SPECS}
