"""The global gradient norm with torch's signatures: ``foreach_norm`` (torch._foreach_norm), ``get_total_norm``,
``clip_grads_with_norm_`` and ``clip_grad_norm_`` (torch.nn.utils'), on torch.ops.reduce.foreach_norm, total_norm
and clip_grads_ (csrc/grad_norm.h). ``clip_grad_norm_`` is a C entry point over its Python wrapper
(csrc/fast_call.cpp): the common call reads the gradients in C.

On the GPU each device's list takes two launches for its norm and one for the scaling, whatever its length, with
a fixed fold order: the same gradients give the same total, bit for bit, on every run. The clip coefficient is
computed on the device, so clipping never waits for the GPU unless ``error_if_nonfinite`` asks to (as torch's).
"""
from __future__ import annotations

import types
import warnings
from typing import Iterable, Optional, Sequence, Union

import torch

from . import _entry_points
from .reductions import _dtype, _number, _type_name

_Tensors = Union[torch.Tensor, Iterable[torch.Tensor]]


def foreach_norm(tensors: Sequence[torch.Tensor], ord: float = 2, dtype: Optional[torch.dtype] = None
                 ) -> tuple[torch.Tensor, ...]:
    """torch._foreach_norm: each tensor's vector norm of order ``ord`` (0, 1, 2, inf, -inf or any float), a 0-dim
    tensor in ``dtype`` (a floating dtype the tensor's reaches without narrowing), else in the tensor's dtype; a
    tuple, as torch's. Differentiable (torch's gradients). An empty list raises, as torch's does."""
    if not isinstance(tensors, (list, tuple)):  # torch's: a Tensor would iterate as its rows, a generator once
        raise TypeError("_foreach_norm(): argument 'self' (position 1) must be tuple of Tensors, not "
                        f"{_type_name(tensors)}")
    tensors = list(tensors)
    if len(tensors) == 0:  # the op cannot dispatch without a tensor
        raise RuntimeError("Tensor list must have at least one tensor.")
    ord, dtype = _number("_foreach_norm", ord, "ord", optional=False), _dtype("_foreach_norm", dtype)
    if isinstance(ord, bool):  # a Scalar, but torch's kernels take only an int or a float order
        raise RuntimeError("_foreach_norm expects ord to be an integer or a float, got a bool")
    return tuple(torch.ops.reduce.foreach_norm(tensors, float(ord), dtype))


def _check_foreach(tensors: list[torch.Tensor], foreach: Optional[bool]) -> bool:
    """foreach=True on a device type without torch's foreach kernels raises, as torch's does. Returns the route
    whose norms the ops give (their ``foreach``): torch's foreach route (None or True) or its per-tensor one (False).
    Ours are multi-tensor kernels either way; on CUDA the routes' norms differ where torch's _foreach_norm folds a
    one-element tensor's square in float32 (3e19 gives inf at order 2) and linalg.vector_norm gives its magnitude."""
    if foreach:
        for device in {t.device for t in tensors}:
            if device.type not in ("cpu", "cuda"):
                raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on {device.type} tensors")
    return foreach is not False


@torch.no_grad()
def get_total_norm(tensors: _Tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: Optional[bool] = None) -> torch.Tensor:
    """torch.nn.utils.get_total_norm: the norm of every element of ``tensors`` as one vector, on the first tensor's
    device, in their dtypes promoted (``torch.tensor(0.)`` for no tensors). For order 0, as torch, the number of
    tensors holding a non-zero element."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    norm_type = float(norm_type)
    if len(tensors) == 0:
        return torch.tensor(0.0)
    total_norm = torch.ops.reduce.total_norm(tensors, norm_type, _check_foreach(tensors, foreach))
    if error_if_nonfinite and torch.logical_or(total_norm.isnan(), total_norm.isinf()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                           "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`")
    return total_norm


@torch.no_grad()
def clip_grads_with_norm_(parameters: _Tensors, max_norm: float, total_norm: torch.Tensor,
                          foreach: Optional[bool] = None) -> None:
    """torch.nn.utils.clip_grads_with_norm_: each gradient times clamp(max_norm / (total_norm + 1e-6), max=1), in
    place, the coefficient computed on the device."""
    if not isinstance(total_norm, torch.Tensor):  # torch's clamp of it raises a TypeError too
        raise TypeError(f"clip_grads_with_norm_(): total_norm must be a Tensor, not {_type_name(total_norm)}")
    if total_norm.is_complex():
        raise NotImplementedError("clamp is not supported for complex types")  # torch's clamp of the coefficient
    if not total_norm.is_floating_point():  # torch's total_norm + 1e-6: the default dtype
        total_norm = total_norm.to(torch.get_default_dtype())
    parameters = [parameters] if isinstance(parameters, torch.Tensor) else parameters
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm = float(max_norm)  # torch's error for a max_norm that is not a number, gradients or none
    if len(grads) == 0:
        return
    _check_foreach(grads, foreach)
    torch.ops.reduce.clip_grads_(grads, total_norm, max_norm)


def clip_grad_norm_(parameters: _Tensors, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_: scales the gradients of ``parameters`` in place so that their total norm of
    order ``norm_type`` is at most ``max_norm``, and returns that total norm (before scaling). Every call runs the
    multi-tensor kernels; ``foreach`` picks whose norms they give, as in get_total_norm."""
    with torch.no_grad():  # not a decorator: torch.compile substitutes this function for the C entry point
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        else:
            is_generator = isinstance(parameters, types.GeneratorType)
            parameters = list(parameters)
            if is_generator and len(parameters) == 0:
                warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.", stacklevel=2)
        grads = [p.grad for p in parameters]
        grads = [g for g in grads if g is not None]
        if error_if_nonfinite or len(grads) == 0:
            total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
            max_norm = float(max_norm)  # after the norm's errors, as torch's
            if grads:
                torch.ops.reduce.clip_grads_(grads, total_norm, max_norm)
            return total_norm
        foreach = _check_foreach(grads, foreach)
        return torch.ops.reduce.clip_grad_norm_(grads, float(max_norm), float(norm_type), foreach)


_WRAPPERS = {"clip_grad_norm_": clip_grad_norm_}
clip_grad_norm_ = _entry_points.install(_WRAPPERS)["clip_grad_norm_"]
