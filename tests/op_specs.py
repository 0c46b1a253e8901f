"""One spec per op of torch_reduce, in the spirit of PyTorch's OpInfo: our callable, torch's callable with the
same arguments, and sample inputs. tests/test_op_contract.py runs every contract over every spec.

TORCH_REDUCE_SELF_CHECK=1 puts torch's callable in place of ours, to check the tests themselves: every test
must then pass (tests that need our registered ops skip), so a failure without it is the implementation's.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

import torch_reduce
from norm_reference import layer_norm_formula, rms_norm_formula

SELF_CHECK = os.environ.get("TORCH_REDUCE_SELF_CHECK") == "1"

Sample = tuple[tuple, dict]  # (args, kwargs): the call is op(*args, **kwargs)


@dataclass(frozen=True)
class OpSpec:
    name: str
    ours: Callable
    torch: Callable
    sample_inputs: Callable[..., Iterator[Sample]]  # (device, dtype, requires_grad) -> (args, kwargs), ...
    # OpInfo's reference_inputs: more samples, for the float64-reference test only: misaligned storage offsets,
    # empty tensors and 0-size dims, scalars, odd sizes on other kernel paths. (device, dtype, requires_grad).
    reference_inputs: Optional[Callable[..., Iterator[Sample]]] = None
    # OpInfo's error_inputs: bad calls and the exception they raise. (device) -> ErrorInput, ...
    error_inputs: Optional[Callable[..., Iterator["ErrorInput"]]] = None
    # Inputs large enough to spread over many blocks of a GPU (float32 unless the sample says otherwise): the
    # determinism, side-stream, CUDA-graph and two-GPU contracts run these. (device) -> (args, kwargs), ...
    multi_block_inputs: Optional[Callable[..., Iterator[Sample]]] = None
    # More than 2^31 elements (GPU only; 2 to 4 GiB each, made one at a time). (device) -> (args, kwargs), ...
    large_inputs: Optional[Callable[..., Iterator[Sample]]] = None
    deterministic: bool = True  # the same call gives the same bits every time (on the GPU too)
    compile_samples: Optional[int] = None  # compile only the first n samples (samples that differ only in size)
    # The float64 reference where the op rounds an intermediate to the inputs' dtype that matters, or where torch's
    # op is not exact (the norms: their formulas, norm_reference.py): (dtype) -> a function like `torch` on float64
    # leaves. Default: `torch` itself.
    float64_reference: Optional[Callable[[torch.dtype], Callable]] = None

    @property
    def op(self) -> Callable:
        """The callable under test: ours, or torch's under TORCH_REDUCE_SELF_CHECK=1."""
        return self.torch if SELF_CHECK else self.ours

    def samples(self, device, dtype=torch.float64, requires_grad=False) -> list[Sample]:
        return list(self.sample_inputs(device, dtype, requires_grad))

    def reference_samples(self, device, dtype, requires_grad=False) -> list[Sample]:
        """sample_inputs and reference_inputs."""
        more = self.reference_inputs(device, dtype, requires_grad) if self.reference_inputs else ()
        return self.samples(device, dtype, requires_grad) + list(more)


@dataclass(frozen=True)
class ErrorInput:
    """op(*args, **kwargs) raises ``error`` with a message that ``match`` (a regex) finds; match=None: the first
    line of torch's own message, exactly. torch raises the same type, unless ours_only (our own check of what torch
    accepts, or raises as another type: skipped under TORCH_REDUCE_SELF_CHECK). meta: the fake kernels (the call
    on meta tensors) raise the same type."""
    args: tuple
    kwargs: dict
    error: Union[type, tuple]
    match: Optional[str] = None
    ours_only: bool = False
    ours_message: bool = False  # torch raises the same type in its own words: under SELF_CHECK only the type counts
    meta: bool = True


def make(shape, device, dtype, requires_grad=False, layout="contiguous"):
    """A fresh random leaf tensor of ``shape`` stored as ``layout``: contiguous, transposed (every dim's
    order reversed), stepped (every other element of its last dim), expanded (dim 0 is a stride-0 broadcast) or
    offset (contiguous, one element into its storage: misaligned for vector loads).
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
    elif layout == "offset":
        t = randn(math.prod(shape) + 1)[1:].view(shape)
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


def without_bias(norm_samples):
    """LayerNorm's samples as RMSNorm's: the same inputs, weights and eps, no bias."""
    def samples(*args):
        for sample_args, kwargs in norm_samples(*args):
            yield sample_args[:3], kwargs

    return samples


# The residual of each fused add + norm sample: contiguous, or (the first input's rows in turn) misaligned and
# transposed, so that a kernel reading the two inputs with different layouts is tested.
RESIDUAL_LAYOUTS = ("contiguous", "offset", "transposed", "broadcast")


def with_residual(norm_samples):
    """A norm's samples with a residual after the input: the add + norm's samples. The residual has the input's
    shape in a layout of RESIDUAL_LAYOUTS, or ("broadcast") the shape of its last dim, which torch's x + r
    broadcasts over the rows."""
    def samples(device, dtype, requires_grad):
        for i, (args, kwargs) in enumerate(norm_samples(device, dtype, requires_grad)):
            x = args[0]
            layout = RESIDUAL_LAYOUTS[i % len(RESIDUAL_LAYOUTS)]
            if layout == "broadcast":
                residual = make(x.shape[-1:], device, x.dtype, requires_grad)
            else:
                residual = make(x.shape, device, x.dtype, requires_grad, layout)
            yield (x, residual, *args[1:]), kwargs

    return samples


def describe(args, kwargs) -> str:
    """A sample in one line: tensors as dtype[shape] (with 'view' when non-contiguous), the rest as given."""
    def one(a):
        if isinstance(a, torch.Tensor) and a.layout != torch.strided:
            return f"{str(a.dtype)[6:]}{list(a.shape)} {str(a.layout)[6:]}"
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
    # Values near 1 for the negative order: its gradient holds |x|^(p - 2), past float16's range below |x| ~ 0.01,
    # where torch's CUDA backward and ours round their intermediates at different steps (inf against finite).
    yield (make_near_one((4, 7), device, dtype, requires_grad, "expanded"), -1.5, (0,)), {"keepdim": True}
    yield (t(()), 2), {}
    yield (t((1001,)), 2, 0), {}
    yield (t((2, 3)), 2.5, None, True), {}
    yield (t((5, 3)), 2, 1), {"dtype": torch.float64}


# ------------------------------------------------------------------------------- reference inputs ----
# The odd cases, against a float64 reference only: misaligned storage offsets, empty tensors and 0-size dims,
# scalars, and odd sizes on other kernel paths (long rows, columns, several dims).

def ladder_reference_inputs(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((0,)),), {}
    yield (t((0, 5)),), {"block_size": 64}
    yield (t((7, 0, 3)),), {}
    yield (t((1000,), "offset"),), {}
    yield (t((257, 33), "transposed"),), {"block_size": 32}
    yield (t((65537,), "offset"),), {"block_size": 1024}


def reduction_reference_inputs(name):
    def samples(device, dtype, requires_grad):
        t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
        yield (t((0, 4)), 1), {}
        yield (t((3, 0, 2)), 0), {"keepdim": True}
        yield (t((5, 1000), "offset"), 1), {}
        yield (t((1000, 5), "offset"), 0), {}
        yield (t((7, 9, 11), "offset"), (0, 2), True), {}
        yield (t(()), 0), {}
        yield (t(()), (), True), {}
        yield (t((3, 3001)), -1), {}
        yield (t((2, 65, 3), "stepped"), 1), {}
        yield (t((33, 65), "transposed"), (0, 1)), {}
        if name in ("sum", "mean"):  # an empty reduction has an identity (0; mean: NaN)
            yield (t((0,)),), {}
            yield (t((0, 4)), 0), {}
            yield (t((3, 0, 2)), (0, 1)), {}

    return samples


def var_mean_reference_inputs(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((5, 0)), -1), {}  # empty rows: NaN
    yield (t((0, 5)), -1), {}
    yield (t(()), None), {"correction": 0}
    yield (t((7, 2048), "offset"), -1), {}
    yield (t((64, 301), "transposed"), -1), {}
    yield (t((3, 4097)), -1), {}
    yield (t((5, 2)), -1), {"correction": 2}  # N - correction = 0: infinite variance
    yield (t((5, 1)), -1), {}  # 0 / 0: NaN


def layer_norm_reference_inputs(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731

    def weight(shape, layout="contiguous"):
        w = make(shape, device, dtype, False, layout)
        return w.mul_(0.3).add_(1).requires_grad_(requires_grad)

    yield (t((0, 6)), (6,), weight((6,)), t((6,))), {}
    yield (t((7, 64), "offset"), (64,), weight((64,), "offset"), t((64,), "offset")), {}
    yield (t((7, 2048), "offset"), (2048,), weight((2048,)), t((2048,))), {}
    yield (t((3, 1)), (1,), weight((1,)), t((1,))), {}  # one element a row: variance 0, the output is the bias
    yield (t((5, 2, 3), "transposed"), (3,)), {}
    yield (t((40, 65), "stepped"), (65,), weight((65,)), t((65,))), {}


def prod_reference_inputs(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make_near_one(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((0, 3)), 0), {}
    yield (t((0,)),), {}
    yield (t((3, 0)), 1), {}
    yield (t(()), 0), {}
    yield (t((5, 300), "offset"), 1), {}
    yield (t((300, 5), "offset"), 0), {}
    yield (t((7, 9, 11), "transposed"), 1, True), {}


def vector_norm_reference_inputs(device, dtype, requires_grad):
    t = lambda shape, layout="contiguous": make(shape, device, dtype, requires_grad, layout)  # noqa: E731
    yield (t((0, 3)), 2, 0), {}
    yield (t((0, 3)), 1, 1), {}
    yield (t(()), 3), {}
    yield (t((5, 3000), "offset"), 2, 1), {}
    yield (t((3000, 5), "offset"), 3, 0), {}
    yield (t((7, 9, 11), "offset"), float("inf"), (0, 2)), {}
    yield (t((2, 65, 3), "stepped"), 0.5, 1), {}
    yield (t((1001,)), 0), {}


# ----------------------------------------------------------------------------------- error inputs ----

def ladder_error_inputs(device):
    x = torch.randn(8, device=device)
    for dtype in (torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64):
        yield ErrorInput((torch.ones(8, dtype=dtype).to(device),), {}, NotImplementedError, "unsupported dtype",
                         ours_only=True)
    for block in (0, 16, 48, 100, 2048, -256):
        yield ErrorInput((x,), {"block_size": block}, RuntimeError, r"power of two in \[32, 1024\]",
                         ours_only=True)
    # Depending on the torch version the dispatcher refuses a sparse tensor, or the op's own check does.
    yield ErrorInput((x.to_sparse(),), {}, (NotImplementedError, RuntimeError), "(?i)sparse", ours_only=True,
                     meta=False)
    # A sparse compressed tensor: our kernel's error, which names the layout.
    yield ErrorInput((x.view(2, 4).to_sparse_csr(),), {}, RuntimeError, "expected a dense .* SparseCsr",
                     ours_only=True, meta=False)


def reduction_error_inputs(name):
    def errors(device):
        x, scalar = torch.randn(3, 4, device=device), torch.tensor(2.0, device=device)
        yield ErrorInput((x, 2), {}, IndexError, "out of range")
        yield ErrorInput((x, (0, -3)), {}, IndexError, "out of range")
        yield ErrorInput((x, (0, -2)), {}, RuntimeError, "appears multiple times")
        yield ErrorInput((x, (0, 0)), {}, RuntimeError, "appears multiple times")
        yield ErrorInput((scalar, 1), {}, IndexError, "out of range")
        yield ErrorInput((scalar, (0, -1)), {}, RuntimeError, "appears multiple times")
        # A bool or a float is not a dim (the op's schema would read True as 1).
        for dim in (True, [True], 1.0):
            yield ErrorInput((x, dim), {}, TypeError, "must be tuple of ints", ours_message=True)
        # A C type is named with its module, as torch's parser names it (numpy's bool is not Python's bool).
        yield ErrorInput((x, 1), {"keepdim": np.bool_(True)}, TypeError, "'keepdim' must be bool, not numpy\\.bool_?$",
                         ours_message=True)
        yield ErrorInput((x, np.float64(1.0)), {}, TypeError, "must be tuple of ints, not numpy\\.float64$",
                         ours_message=True)
        if name in ("sum", "mean"):  # a dtype's name is not a dtype (the op's schema would raise a RuntimeError)
            yield ErrorInput((x, 1), {"dtype": "float64"}, TypeError, "argument 'dtype' must be torch.dtype",
                             ours_message=True)
        if name != "vector_norm":  # torch's CPU kernels do not sum or multiply complex32 either
            yield ErrorInput((torch.ones(3, dtype=torch.complex32, device=device),), {}, NotImplementedError,
                             "unsupported dtype", ours_only=True)
        if name in ("amax", "amin"):  # torch has no max or min of complex numbers either
            yield ErrorInput((torch.ones(3, dtype=torch.complex64, device=device),), {}, NotImplementedError,
                             "not implemented for 'ComplexFloat'")
        if name == "mean":
            yield ErrorInput((x.long(),), {}, RuntimeError, "could not infer output dtype")
            yield ErrorInput((x, None, False), {"dtype": torch.int64}, RuntimeError,
                             "Optional dtype must be either a floating point")
        if name in ("amax", "amin"):
            empty = torch.empty(0, 4, device=device)
            yield ErrorInput((empty,), {}, RuntimeError, "Expected reduction dim to be specified")
            yield ErrorInput((empty, 0), {}, IndexError, "Expected reduction dim 0 to have non-zero size")

    return errors


def var_mean_error_inputs(device):
    x = torch.randn(3, 4, device=device)
    yield ErrorInput((torch.arange(10, device=device),), {}, RuntimeError, "floating point")
    # A floating dtype without kernels: NotImplementedError, the class of torch's CPU refusal ("std_cpu").
    yield ErrorInput((torch.ones(10, device=device).to(torch.float8_e4m3fn),), {}, NotImplementedError,
                     "has no kernel for Float8_e4m3fn", ours_only=True)
    yield ErrorInput((x, 2), {}, IndexError, "out of range")
    yield ErrorInput((x, (1, -1)), {}, RuntimeError, "appears multiple times")
    yield ErrorInput((x, [True]), {}, TypeError, "must be tuple of ints", ours_message=True)
    yield ErrorInput((x, 1.0), {}, TypeError, "must be tuple of ints", ours_message=True)
    yield ErrorInput((x, 1), {"keepdim": np.bool_(True)}, TypeError, "'keepdim' must be bool, not numpy\\.bool_?$",
                     ours_message=True)
    yield ErrorInput((x, 1), {"correction": "1"}, TypeError, "argument 'correction' must be Number", ours_message=True)


def layer_norm_error_inputs(device):
    x, w = torch.randn(4, 6, device=device), torch.ones(6, device=device)
    ours_message = dict(error=RuntimeError, ours_message=True)
    yield ErrorInput((x, (5,)), {}, match="does not match the input's trailing dims", **ours_message)
    yield ErrorInput((x, (2, 4, 6)), {}, match="does not match the input's trailing dims", **ours_message)
    yield ErrorInput((x, (6,), torch.ones(5, device=device)), {}, match="weight must have shape", **ours_message)
    yield ErrorInput((x, (6,), w, torch.zeros(5, device=device)), {}, match="bias must have shape",
                     **ours_message)
    yield ErrorInput((x, (6,), w, torch.zeros(6, device=device, dtype=torch.float64)), {}, RuntimeError,
                     "bias must have the input's dtype", ours_only=True)  # torch's CUDA kernel may cast
    # torch takes a negative eps (a NaN waiting to happen) and raises NotImplementedError for integers.
    yield ErrorInput((x, (6,)), {"eps": -1.0}, RuntimeError, "eps must be non-negative", ours_only=True)
    yield ErrorInput((torch.ones(4, 6, dtype=torch.int32, device=device), (6,)), {}, NotImplementedError,
                     "expected a float32", ours_only=True)
    yield ErrorInput((x, (6,)), {"eps": None}, TypeError, "argument 'eps' must be float", ours_message=True)
    yield ErrorInput((x[:, :1], True), {}, TypeError, "must be tuple of ints", ours_message=True)  # not a shape
    # Wrong types: torch's TypeErrors (the op's schema would raise RuntimeErrors).
    yield ErrorInput((x, (6,)), {"eps": "1e-5"}, TypeError, "argument 'eps' must be float", ours_message=True)
    yield ErrorInput((x, (6,), [1.0] * 6), {}, TypeError, "argument 'weight' must be Tensor", ours_message=True)
    yield ErrorInput((x, None), {}, TypeError, "must be tuple of ints", ours_message=True)


def rms_norm_error_inputs(device):
    x, w = torch.randn(4, 6, device=device), torch.ones(6, device=device)
    ours_message = dict(error=RuntimeError, ours_message=True)
    yield ErrorInput((x, (5,)), {}, match="does not match the input's trailing dims", **ours_message)
    # Fewer input dims than normalized_shape: torch's ValueError ("Input tensor must have at least 3 dimensions").
    yield ErrorInput((x, (2, 4, 6)), {}, ValueError, "does not match the input's trailing dims", ours_message=True)
    yield ErrorInput((x, (6,), torch.ones(5, device=device)), {}, match="weight must have shape", **ours_message)
    # torch multiplies by a weight of any dtype; ours takes any floating one (cast as torch computes) and refuses
    # an integer one.
    yield ErrorInput((x, (6,), w.int()), {}, RuntimeError, "weight must have the input's dtype", ours_only=True)
    yield ErrorInput((x, (6,)), {"eps": -1.0}, RuntimeError, "eps must be non-negative", ours_only=True)
    yield ErrorInput((x[:, :1], (True,)), {}, TypeError, "must be tuple of ints", ours_message=True)  # not a shape
    yield ErrorInput((x, (6,)), {"eps": "1e-5"}, TypeError, "argument 'eps' must be float", ours_message=True)
    yield ErrorInput((x, (6,), [1.0] * 6), {}, TypeError, "argument 'weight' must be Tensor", ours_message=True)
    # torch raises NotImplementedError for integers.
    yield ErrorInput((torch.ones(4, 6, dtype=torch.int32, device=device), (6,)), {}, NotImplementedError,
                     "expected a float32", ours_only=True)


def add_norm_error_inputs(device):
    x, w = torch.randn(4, 6, device=device), torch.ones(6, device=device)
    # A residual that torch's x + r cannot broadcast (torch: "The size of tensor a (6) must match ...").
    yield ErrorInput((x, torch.randn(5, device=device), (6,)), {}, RuntimeError, "broadcast", ours_message=True)
    yield ErrorInput((x, x, (5,)), {}, match="does not match the input's trailing dims", error=RuntimeError,
                     ours_message=True)
    yield ErrorInput((x, x, (6,), torch.ones(5, device=device)), {}, match="weight must have shape",
                     error=RuntimeError, ours_message=True)
    yield ErrorInput((x, x, (6,), w), {"eps": -1.0}, RuntimeError, "eps must be non-negative", ours_only=True)
    yield ErrorInput((x.int(), x.int(), (6,)), {}, NotImplementedError, "expected a float32", ours_only=True)
    yield ErrorInput((x, None, (6,)), {}, TypeError, "argument 'residual' must be Tensor", ours_message=True)


def like_torch_error_inputs(name):
    """Errors with torch's own type and first line of message (match=None)."""
    def errors(device):
        x, empty = torch.randn(3, 4, device=device), torch.empty(0, 3, device=device)
        if name != "prod":  # dtype= complex for a complex input, real for a real one (torch's messages)
            yield ErrorInput((x.to(torch.complex64),), {"dtype": torch.float64}, RuntimeError)
            yield ErrorInput((x,), {"dtype": torch.complex128}, RuntimeError)
        for dim in (True, [True], 1.0):  # not dims (the op's schema would read True as 1)
            yield ErrorInput((x, dim) if name == "prod" else (x, 2, dim), {}, TypeError, "must be tuple of ints",
                             ours_message=True)
        # a dtype's name, an order's name: TypeErrors (the op's schema would raise RuntimeErrors)
        yield ErrorInput((x, 1) if name == "prod" else (x, 2, 1), {"dtype": "float64"}, TypeError,
                         "argument 'dtype' must be torch.dtype", ours_message=True)
        if name != "prod":
            yield ErrorInput((x, "fro"), {}, TypeError, "argument 'ord' must be Number", ours_message=True)
        if name == "prod":
            for args in ((x, 2), (x, -3), (torch.tensor(2.0, device=device), 1)):
                yield ErrorInput(args, {}, (RuntimeError, IndexError))
            return
        inf = float("inf")
        for args, kwargs in [((x.long(),), {}), ((x.int(), 1), {}), ((x, 2, None, False), {"dtype": torch.int64}),
                             ((x, 2), {"dtype": torch.float16}), ((x.double(), 2), {"dtype": torch.float32}),
                             ((empty, inf), {}), ((empty, -inf), {}), ((empty, -1), {}), ((empty, -0.5, 0), {}),
                             ((empty, inf, (1, 0)), {}), ((x, 2, 2), {}), ((x, 2, (0, 0)), {}),
                             ((x, 2, (0, -3)), {})]:
            yield ErrorInput(args, kwargs, (RuntimeError, IndexError))

    return errors


# ------------------------------------------------------------------------------- many blocks, > 2^31 ----

FULL_NUMEL = 3 * 2**20 + 17  # hundreds of blocks (the single-pass kernel's ticket), an odd tail
# (shape, dim): full reductions, then the dim kernels: lanes a row, a block a row, few long rows split over
# blocks, a middle dim and dim 0 (the column kernel), few outputs (the reduced extent split over blocks).
MULTI_BLOCK_SHAPES = [((2**22,), None), ((FULL_NUMEL,), None), ((2**20, 32), 0), ((32, 2**20), 1), ((2**20, 32), 1),
                      ((4096, 768), 0), ((3000, 5000), 1), ((8192, 20), -1), ((2048, 1000), -1), ((8, 2**19), -1),
                      ((32, 1000, 48), 1), ((300, 2000), 0), ((2**16, 96), 0)]


def ladder_multi_block_inputs(device):
    yield (torch.randn(FULL_NUMEL, device=device),), {}
    yield (torch.randn(FULL_NUMEL, device=device),), {"block_size": 64}
    yield (torch.randint(-100, 100, (FULL_NUMEL,), dtype=torch.int8, device=device),), {}
    yield (torch.randn(2**24 + 3, device=device),), {}


def reduction_multi_block_inputs(name):
    norm_orders = [2, float("inf"), 3, 1]  # vector_norm: each shape with one of these orders in turn

    def samples(device):
        for i, (shape, dim) in enumerate(MULTI_BLOCK_SHAPES):
            x = torch.randn(shape, device=device)
            if name == "prod":  # about 1 +- 0.001: products of 2^22 elements stay in range, every bit counts
                x = x.mul_(1e-3).add_(1)
            if name == "vector_norm":
                yield (x, norm_orders[i % len(norm_orders)], dim), {}
            elif dim is not None:
                yield (x, dim), {}
            elif name == "prod":
                yield (x,), {}
            else:
                yield (x, None if name in ("sum", "mean") else ()), {}

    return samples


def var_mean_multi_block_inputs(device):
    yield (torch.randn(3, 2_000_003, device=device), -1), {}
    yield (torch.randn(3, 2_000_003, device=device),), {}
    for shape, dim in MULTI_BLOCK_SHAPES[1:]:
        yield (torch.randn(shape, device=device), dim), {}


# (rows, width, dtype): short rows (a warp a row), rows in a block's registers, unaligned rows (element by
# element), rows the backward reads twice (up to 20480), rows wider than 20480 (streamed; the backward's column
# sums in global scratch), and bfloat16 in registers and streamed both ways.
LAYER_NORM_MULTI_BLOCK = [(4099, 768, torch.float32), (4099, 4097, torch.float32), (4096, 64, torch.float32),
                          (1024, 1001, torch.float32), (1024, 4096, torch.float32), (128, 20000, torch.float32),
                          (128, 24576, torch.float32), (1024, 4096, torch.bfloat16), (96, 40000, torch.bfloat16)]


def layer_norm_multi_block_inputs(device):
    for rows, width, dtype in LAYER_NORM_MULTI_BLOCK:
        x = torch.randn(rows, width, device=device).to(dtype)
        weight = torch.randn(width, device=device).mul_(0.3).add_(1).to(dtype)
        yield (x, (width,), weight, torch.randn(width, device=device).to(dtype)), {}


def add_norm_multi_block_inputs(norm_inputs):
    def samples(device):
        for args, kwargs in norm_inputs(device):
            yield (args[0], torch.randn_like(args[0]), *args[1:]), kwargs

    return samples


def large_inputs(name):
    """More than 2^31 elements: int8 where the result is exact (sums, extremes, products of +-1), 16-bit floats
    otherwise; rows whose elements lie past 2^31 need 64-bit offsets."""
    def samples(device):
        if name.startswith("sum_"):
            yield (torch.randint(-100, 100, (2**31 + 3 * 2**20 + 5,), dtype=torch.int8, device=device),), {}
            return
        if name in ("sum", "amax", "amin", "prod"):
            x = torch.randint(-100, 100, (2**20 + 1, 2**11 + 3), dtype=torch.int8, device=device)
            if name == "prod":
                x = x.sign_().add_(x.eq(0).to(torch.int8))  # +-1: exact products
            yield (x, 0), {}
            yield (x, 1), {}
            yield ((x,) if name == "prod" else (x, None if name == "sum" else ())), {}
            return
        rows, width = 2**21 + 1, 1024  # 2^31 + 1024 elements
        norms = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")
        dtype = torch.bfloat16 if name in norms else torch.float16
        x = torch.empty(rows, width, device=device, dtype=dtype).normal_()
        if name in norms:
            residual = (torch.empty_like(x).normal_(),) if name.startswith("add_") else ()
            yield (x, *residual, (width,), torch.randn(width, device=device, dtype=dtype)), {}
        elif name == "vector_norm":
            yield (x, 2, -1), {}
            yield (x, 2), {}
            yield (x, float("inf")), {}
        else:  # mean, var_mean
            yield (x, -1), {}
            yield (x,), {}

    return samples


# ---------------------------------------------------------------------------------------------- specs ----

def _ladder_spec(variant) -> OpSpec:
    def ref(t, block_size=256):
        return torch.sum(t)

    return OpSpec(variant.name, variant.op, ref, ladder_samples, ladder_reference_inputs, ladder_error_inputs,
                  ladder_multi_block_inputs, large_inputs(variant.name),
                  compile_samples=3)  # the samples of one ladder op are alike: three are enough to compile


def _torch_prod(input, dim=None, keepdim=False, *, dtype=None):
    """torch.prod with torch_reduce.prod's signature (torch.prod has no dim=None)."""
    if dim is not None:
        return torch.prod(input, dim, keepdim, dtype=dtype)
    out = torch.prod(input, dtype=dtype)
    return out.reshape([1] * input.dim()) if keepdim else out


def _torch_add_layer_norm(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    total = input + residual
    return F.layer_norm(total, normalized_shape, weight, bias, eps), total


def _torch_add_rms_norm(input, residual, normalized_shape, weight=None, eps=None):
    total = input + residual
    return F.rms_norm(total, normalized_shape, weight, eps), total


def _rounded_sum_reference(norm):
    """A fused add + norm on float64 leaves as the op and torch's add in the inputs' dtype define it: the sum
    rounded to `dtype`, its gradient passed through unrounded, then the norm in float64. A row whose rounded sum is
    nearly constant amplifies that rounding by rstd, which an unrounded float64 sum would count as the op's error."""
    def reference(dtype):
        def rounded(input, residual, *args, **kwargs):
            total = input + residual
            total = total + (total.to(dtype).to(total.dtype) - total).detach()
            return norm(total, *args, **kwargs), total
        return rounded
    return reference


SPECS: list[OpSpec] = [_ladder_spec(v) for v in torch_reduce.LADDER] + [
    OpSpec(name, getattr(torch_reduce, name), getattr(torch, name), reduction_samples(name),
           reduction_reference_inputs(name), reduction_error_inputs(name), reduction_multi_block_inputs(name),
           large_inputs(name))
    for name in ("sum", "mean", "amax", "amin")
] + [
    OpSpec("var_mean", torch_reduce.var_mean, torch.var_mean, var_mean_samples, var_mean_reference_inputs,
           var_mean_error_inputs, var_mean_multi_block_inputs, large_inputs("var_mean")),
    OpSpec("layer_norm", torch_reduce.layer_norm, F.layer_norm, layer_norm_samples, layer_norm_reference_inputs,
           layer_norm_error_inputs, layer_norm_multi_block_inputs, large_inputs("layer_norm"),
           float64_reference=lambda dtype: layer_norm_formula),
    OpSpec("rms_norm", torch_reduce.rms_norm, F.rms_norm, without_bias(layer_norm_samples),
           without_bias(layer_norm_reference_inputs), rms_norm_error_inputs,
           without_bias(layer_norm_multi_block_inputs), large_inputs("rms_norm"),
           float64_reference=lambda dtype: rms_norm_formula),
    OpSpec("add_layer_norm", torch_reduce.add_layer_norm, _torch_add_layer_norm, with_residual(layer_norm_samples),
           with_residual(layer_norm_reference_inputs), add_norm_error_inputs,
           add_norm_multi_block_inputs(layer_norm_multi_block_inputs), large_inputs("add_layer_norm"),
           float64_reference=_rounded_sum_reference(layer_norm_formula)),
    OpSpec("add_rms_norm", torch_reduce.add_rms_norm, _torch_add_rms_norm,
           with_residual(without_bias(layer_norm_samples)), with_residual(without_bias(layer_norm_reference_inputs)),
           add_norm_error_inputs,
           add_norm_multi_block_inputs(without_bias(layer_norm_multi_block_inputs)), large_inputs("add_rms_norm"),
           float64_reference=_rounded_sum_reference(rms_norm_formula)),
    OpSpec("prod", torch_reduce.prod, _torch_prod, prod_samples, prod_reference_inputs,
           like_torch_error_inputs("prod"), reduction_multi_block_inputs("prod"), large_inputs("prod")),
    OpSpec("vector_norm", torch_reduce.vector_norm, torch.linalg.vector_norm, vector_norm_samples,
           vector_norm_reference_inputs, like_torch_error_inputs("vector_norm"),
           reduction_multi_block_inputs("vector_norm"), large_inputs("vector_norm")),
]
BY_NAME = {s.name: s for s in SPECS}
