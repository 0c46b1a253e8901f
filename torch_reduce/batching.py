"""vmap batching rules for torch_reduce's ops (torch.func.vmap, and what builds on it: jacrev, jacfwd, hessian,
per-sample gradients); importing this module registers them with torch.library.register_vmap.

Without a rule, vmap runs an op once per sample (torch's fallback, which warns "There is a performance drop"). With
one, the batch is one more dim of the same call, moved to the front:

- ``sum``, ``mean``, ``amax``, ``amin``, ``prod``, ``vector_norm``, ``var_mean``: the sample's dims shifted past the
  batch dim (None and () are every dim of the sample, not the batch's; a 0-dim sample reduces nothing).
- ``layer_norm_fwd``, ``rms_norm_fwd``, ``add_layer_norm_fwd``, ``add_rms_norm_fwd``: the batch is more rows (an
  unbatched residual is expanded beside a batched input, and the other way round); with a batched weight or bias
  (an ensemble's parameters) each sample is one call, as the fallback does, without its warning.

Every rule first runs the op on a meta tensor of one sample's shape: its errors are the op's own, for the sample.
The backward ops, the gradient norms and the ladder keep torch's fallback: under vmap with a gradient transform the
ops take torch's composite path (csrc/autograd_util.h, needs_composite), and the ladder reduces whole tensors.
"""
from __future__ import annotations

import torch

from .ops import DIM_REDUCTIONS, bound_arguments, op_name


def _sample(t: torch.Tensor, batch_dim) -> torch.Tensor:
    """A meta tensor of one sample of t."""
    shape = list(t.shape)
    if batch_dim is not None:
        del shape[batch_dim]
    return torch.empty(shape, dtype=t.dtype, device="meta")


def _dim_reduction(op, info, in_dims, *args, **kwargs):
    a = bound_arguments(op, args, kwargs)
    input_name = "input" if "input" in a else "self"
    x = a[input_name]
    op(**{**a, input_name: _sample(x, in_dims[0])})  # the op's errors for one sample
    x = x.movedim(in_dims[0], 0)
    sample_dims = x.dim() - 1
    if sample_dims == 0:  # a 0-dim sample: dim 0 and -1 name it; the reduction of one element is itself
        x, dims, keepdim = x.unsqueeze(1), [1], False
    else:
        dim = a["dim"]
        dims = [d % sample_dims + 1 for d in dim] if dim else list(range(1, sample_dims + 1))
        keepdim = a["keepdim"]
    out = op(**{**a, input_name: x, "dim": dims, "keepdim": keepdim})
    return out, (0, 0) if isinstance(out, tuple) else 0


# The tensors of each row norm that have the input's rows; the others (weight, bias) are parameters.
_ROWS = {"layer_norm_fwd": ("input",), "rms_norm_fwd": ("input",), "add_layer_norm_fwd": ("input", "residual"),
         "add_rms_norm_fwd": ("input", "residual")}


def _row_norm(op, info, in_dims, *args, **kwargs):
    a = bound_arguments(op, args, kwargs)
    batch_dims = dict(zip((arg.name for arg in op._schema.arguments), in_dims))
    op(**{name: _sample(v, batch_dims.get(name)) if isinstance(v, torch.Tensor) else v for name, v in a.items()})
    rows = _ROWS[op_name(op)]
    for name in rows:  # every row tensor batched, at the front
        v, d = a[name], batch_dims.get(name)
        a[name] = v.movedim(d, 0) if d is not None else v.expand(info.batch_size, *v.shape)
    batched_params = [name for name, v in a.items()
                      if name not in rows and isinstance(v, torch.Tensor) and batch_dims.get(name) is not None]
    if not batched_params:
        out = op(**a)
    else:  # one call a sample: the kernels take one weight (bias) for every row
        for name in batched_params:
            a[name] = a[name].movedim(batch_dims[name], 0)
        samples = [op(**{name: v[i] if name in rows or name in batched_params else v for name, v in a.items()})
                   for i in range(info.batch_size)]
        out = tuple(torch.stack(parts) for parts in zip(*samples))
    return out, (0,) * len(out)


for _row in DIM_REDUCTIONS:
    _op = getattr(torch.ops.reduce, _row.name).default
    torch.library.register_vmap(_op, lambda info, in_dims, *args, _op=_op, **kwargs:
                                _dim_reduction(_op, info, in_dims, *args, **kwargs))
for _name in ("var_mean", *_ROWS):
    _op = getattr(torch.ops.reduce, _name).default
    _rule = _dim_reduction if _name == "var_mean" else _row_norm
    torch.library.register_vmap(_op, lambda info, in_dims, *args, _op=_op, _rule=_rule, **kwargs:
                                _rule(_op, info, in_dims, *args, **kwargs))
