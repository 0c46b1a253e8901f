"""Drop-in reductions with torch's semantics: ``torch_reduce.sum/mean/amax/amin/prod/vector_norm`` take the
arguments of ``torch.sum/mean/amax/amin/prod`` and ``torch.linalg.vector_norm`` and give the same results and
errors (dims as an int, a tuple, negative, None or (), keepdim, dtype=, out=, empty tensors, NaN). Each calls
its registered op ``torch.ops.reduce.<name>`` (CPU and CUDA kernels, autograd and autocast in csrc/, fake
kernels in ops.py); one wrapper per row of ops.DIM_REDUCTIONS, whose signature decides the arguments. out= is
the wrappers' own: the op's result is written into it with torch's rules (_write_out). The names exported are
the rows' C entry points (csrc/fast_call.cpp), which call the op directly for the common call and the wrapper
for every other.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import operator
import warnings
from typing import Callable, Optional, Sequence, Union

import torch

from . import _entry_points
from .ops import DIM_REDUCTIONS, DimReduction, _c10_name, _can_cast, _result_dtype

Dims = Union[int, Sequence[int], None]

# How torch's out= messages name dtypes (their C++ types).
_CPP_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
              torch.bfloat16: "c10::BFloat16", torch.int8: "signed char", torch.uint8: "unsigned char",
              torch.int16: "short int", torch.int32: "int", torch.int64: "long int", torch.bool: "bool",
              torch.complex64: "c10::complex<float>", torch.complex128: "c10::complex<double>",
              torch.uint16: "short unsigned int", torch.uint32: "unsigned int", torch.uint64: "long unsigned int"}


def _out_dtype_error(expected: torch.dtype, got: torch.dtype) -> RuntimeError:
    return RuntimeError(f"Expected out tensor to have dtype {_CPP_NAMES.get(expected, expected)}, but got "
                        f"{_CPP_NAMES.get(got, got)} instead")


def _write_out(name: str, input: torch.Tensor, out: torch.Tensor, compute: Callable, dtype) -> torch.Tensor:
    """torch's out= for the reduction `name`: `compute(dtype)` is the op's result with that dtype= (None: the
    op's own). sum, prod and mean run in out's dtype (mean's own result dtype must cast to it), amax/amin and
    vector_norm's must equal it; out is resized as aten's resize_output does (a warning if it had elements)."""
    if torch.is_grad_enabled() and (input.requires_grad or out.requires_grad):
        raise RuntimeError(f"{'linalg_vector_norm' if name == 'vector_norm' else name}(): functions with out=... "
                           "arguments don't support automatic differentiation, but one of the arguments requires grad.")
    if out.device != input.device:
        raise RuntimeError(f"Attempting to copy from device {input.device} to device {out.device}, but cross-device "
                           "copies are not allowed!")
    if name in ("amax", "amin"):
        if out.dtype != input.dtype:
            raise RuntimeError(f"Expected the dtype for input and out to match, but got {_c10_name(input.dtype)} for "
                               f"input's dtype and {_c10_name(out.dtype)} for out's dtype.")
        result = compute(None)
    else:
        own = _result_dtype(name, input, dtype)  # the op's dtype errors first, as torch's
        if dtype is not None and out.dtype != dtype and name != "vector_norm":
            raise _out_dtype_error(dtype, out.dtype)
        if name == "vector_norm" and out.dtype != own:  # the result's dtype: dtype='s, made real
            raise _out_dtype_error(own, out.dtype)
        if name == "mean" and not _can_cast(own, out.dtype):
            raise RuntimeError(f"result type {_c10_name(own)} can't be cast to the desired output type "
                               f"{_c10_name(out.dtype)}")
        # vector_norm's out has its result's (real) dtype; its dtype= (a complex input's is complex) stays the call's
        result = compute(dtype if name == "vector_norm" else out.dtype)
    if out.shape != result.shape:
        if out.numel() != 0:
            warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                          f"which does not match the required output shape {list(result.shape)}. This behavior is "
                          "deprecated, and in a future PyTorch release outputs will not be resized unless they have "
                          "zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                          "elements with t.resize_(0).", UserWarning, stacklevel=3)
        out.resize_(result.shape)
    return out.copy_(result)


# The ints torch's argument parser takes: a dim or a size an int64, a Scalar (an order, a correction) also a uint64.
_SCALAR_INTS = range(-2**63, 2**64)


def _index(value):
    """An int as torch's parser takes it (numpy's, a 0-dim integer tensor: operator.index). A size that
    torch.compile traces (a SymInt, which TorchDynamo also calls an int) stays symbolic: operator.index, or a
    `range` membership test, would make the compiled code hold only the traced value (a recompile per size)."""
    return value if type(value) is int or isinstance(value, torch.SymInt) else operator.index(value)


def _is_int64(index) -> bool:
    return -2**63 <= index < 2**63  # comparisons: a symbolic size stays symbolic


def _type_name(value) -> str:
    """A value's type as torch's argument errors name it (the C type's tp_name): a class defined in Python by its
    name alone, a C type outside builtins with its module (numpy.bool, torch.Size)."""
    cls = type(value)
    if cls.__flags__ & _HEAP_TYPE or cls.__module__ == "builtins":
        return cls.__name__
    return f"{cls.__module__}.{cls.__name__}"


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class statement's type, whose tp_name is its bare name


def _number(name: str, value, argument: str, kind: str = "Number", optional: bool = True):
    """A number as the op's schema takes it (vector_norm's ord, var_mean's correction, the norms' eps): a 0-dim tensor
    or a numpy scalar becomes its Python number, as torch's argument parser takes them for a Scalar; anything else that
    is not a number raises torch's TypeError (the schema's would be a RuntimeError), None too unless optional (a
    correction's default, rms_norm's eps)."""
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        return value.item()
    if kind == "Number" and type(value) is int and value not in _SCALAR_INTS:  # torch's Scalar: int64 or uint64
        raise OverflowError("int too big to convert" if value > 0 else "can't convert negative int to unsigned")
    if isinstance(value, numbers.Number) or (value is None and optional):
        return value
    raise TypeError(f"{name}(): argument '{argument}' must be {kind}, not {_type_name(value)}")


def _dtype(name: str, value):
    """dtype=: None or a torch.dtype, with torch's TypeError for anything else."""
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"{name}(): argument 'dtype' must be torch.dtype, not {_type_name(value)}")
    return value


def _dims(name: str, dim, argument: str = "dim"):
    """dim as the op's schema takes it (None, an int, or a list of ints), with torch's TypeError for anything that is
    not an int or a sequence of ints. Ints of other types (numpy's, a 0-dim integer tensor) become ints, as torch
    takes them; a bool is not a dim (torch.sum(x, True) raises), though the schema would read it as 0 or 1. As
    torch's argument parser, only a sequence's first element is refused for being a bool (it takes (0, True))."""
    if dim is None:
        return None
    if not isinstance(dim, (tuple, list)):
        if isinstance(dim, bool) or not hasattr(type(dim), "__index__"):
            raise TypeError(f"{name}(): argument '{argument}' must be tuple of ints, not {_type_name(dim)}")
        if not _is_int64(index := _index(dim)):
            raise ValueError("Overflow when unpacking long long")
        return index
    indices = []
    for pos, d in enumerate(dim):
        if (pos == 0 and isinstance(d, bool)) or not hasattr(type(d), "__index__"):
            raise TypeError(f"{name}(): argument '{argument}' must be tuple of ints, but found element of type "
                            f"{_type_name(d)} at pos {pos}")
        if not _is_int64(index := _index(d)):
            raise TypeError(f"{name}(): argument '{argument}' failed to unpack the object at pos {pos + 1} with error "
                            '"Overflow when unpacking long long"')
        indices.append(index)
    return indices


def _input(name: str, value, argument: str = "input"):
    """The tensor an op reduces, with torch's TypeError for anything that is neither a tensor nor tensor-like (a
    __torch_function__ type, which the op's call hands to it); the op's schema would raise a RuntimeError."""
    if not torch.overrides.is_tensor_like(value):
        raise TypeError(f"{name}(): argument '{argument}' (position 1) must be Tensor, not {_type_name(value)}")
    return value


def _bool(name: str, value, argument: str = "keepdim") -> bool:
    """A bool argument (keepdim, unbiased) as torch's argument parser takes it: a Python bool alone (0, 1, None and
    numpy's bool raise its TypeError, where the op's schema would read them as bools)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}(): argument '{argument}' must be bool, not {_type_name(value)}")
    return value


def with_numpy_names(wrapper: Callable) -> Callable:
    """``wrapper`` taking NumPy's names for its arguments too, as torch's argument parser does (torch.sum(x, axis=1,
    keepdims=True), torch.linalg.vector_norm(a=x)): axis for dim, keepdims for keepdim, and input, x, a or x1 for
    the tensor (its first argument); a name and its alias together raise torch's TypeError."""
    tensor = next(iter(inspect.signature(wrapper).parameters))
    aliases = {"axis": "dim", "keepdims": "keepdim", **{n: tensor for n in ("input", "x", "a", "x1") if n != tensor}}

    @functools.wraps(wrapper)
    def reduction(*args, **kwargs):
        for alias in [k for k in kwargs if k in aliases]:
            if aliases[alias] in kwargs:
                raise TypeError(f"{wrapper.__name__}() got an unexpected keyword argument '{alias}'")
            kwargs[aliases[alias]] = kwargs.pop(alias)
        return wrapper(*args, **kwargs)

    return reduction


# sum/mean/prod's defaults of dim (None) and keepdim (False), told from the same values given: torch.sum(x,
# keepdim=True) raises where torch.sum(x, None, True) reduces every dim, since keepdim= (and sum's and prod's out=)
# belong to the overload with dim. Plain objects, which torch.compile traces as constants.
_NO_DIM, _NO_KEEPDIM = object(), object()


def _wrapper(row: DimReduction) -> Callable[..., torch.Tensor]:
    op = getattr(torch.ops.reduce, row.name)
    name = row.name
    if row.signature == "DimsDtype":
        def reduction(input: torch.Tensor, dim: Dims = _NO_DIM, keepdim: bool = _NO_KEEPDIM, *,
                      dtype: Optional[torch.dtype] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
            if dim is _NO_DIM:
                if keepdim is not _NO_KEEPDIM:
                    raise TypeError(f"{name}(): keepdim= needs dim (None: every dim), as torch.{name}'s does")
                if out is not None and name != "mean":  # torch.mean's first overload takes out=, sum's and prod's not
                    raise TypeError(f"{name}(): out= needs dim (None: every dim), as torch.{name}'s does")
                dim = None
            input, dim = _input(name, input), _dims(name, dim)
            keepdim, dtype = False if keepdim is _NO_KEEPDIM else _bool(name, keepdim), _dtype(name, dtype)
            if out is None:
                return op(input, dim, keepdim, dtype=dtype)
            return _write_out(name, input, out, lambda d: op(input, dim, keepdim, dtype=d), dtype)
    elif row.signature == "Dims":
        def reduction(input: torch.Tensor, dim: Dims = (), keepdim: bool = False, *,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
            input, dim, keepdim = _input(name, input), _dims(name, dim), _bool(name, keepdim)
            dim = () if dim is None else dim  # torch.amax(x, dim=None) reduces every dim, as dim=()
            if out is None:
                return op(input, dim, keepdim)
            return _write_out(name, input, out, lambda d: op(input, dim, keepdim), None)
    else:
        def reduction(x: torch.Tensor, ord: float = 2, dim: Dims = None, keepdim: bool = False, *,
                      dtype: Optional[torch.dtype] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
            x, dim, ord = _input(name, x, "x"), _dims(name, dim), _number(name, ord, "ord")
            keepdim = _bool(name, keepdim)
            dtype = _dtype(name, dtype)
            if out is None:
                return op(x, ord, dim, keepdim, dtype=dtype)
            return _write_out(name, x, out, lambda d: op(x, ord, dim, keepdim, dtype=d), dtype)
    reduction.__name__ = reduction.__qualname__ = row.name
    reduction.__doc__ = row.doc
    return reduction


_WRAPPERS = {row.name: with_numpy_names(_wrapper(row)) for row in DIM_REDUCTIONS}
_ENTRIES = _entry_points.install(_WRAPPERS)  # what torch_reduce.sum etc. are (csrc/fast_call.cpp)
sum = _ENTRIES["sum"]  # noqa: A001  (torch's names, on purpose)
mean = _ENTRIES["mean"]
amax = _ENTRIES["amax"]
amin = _ENTRIES["amin"]
prod = _ENTRIES["prod"]
vector_norm = _ENTRIES["vector_norm"]
__all__ = list(_WRAPPERS)
