"""vmap batching rules (torch_reduce/batching.py): torch.func.vmap of each drop-in reduction and row norm gives
what one call a sample gives, over every batch-dim position, dim form, keepdim and dtype, nested vmaps and 0-dim
samples, without torch's fallback (switched off here: a call that needs it raises); a sample's errors are the op's
own; and the transforms built on vmap (jacrev, hessian, per-sample gradients) give torch's values."""
import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, hessian, jacrev, vmap

import torch_reduce
from conftest import DEVICES, random_tensor


@pytest.fixture(autouse=True)
def no_fallback():
    """torch's loop over samples, switched off: an op without a rule raises."""
    torch._C._functorch._set_vmap_fallback_enabled(False)
    try:
        yield
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(True)


def each_sample(f, x, batch_dim, *others):
    """f once a sample, the results stacked: what vmap means."""
    outs = [f(x.select(batch_dim, i), *[o[i] if o is not None else None for o in others])
            for i in range(x.shape[batch_dim])]
    return tuple(torch.stack(p) for p in zip(*outs)) if isinstance(outs[0], tuple) else torch.stack(outs)


def assert_same(got, want, exact):
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, equal_nan=True, **({"atol": 0, "rtol": 0} if exact else {}))


REDUCTIONS = {
    "sum": lambda t, dim, keepdim: torch_reduce.sum(t, dim, keepdim),
    "mean": lambda t, dim, keepdim: torch_reduce.mean(t, dim, keepdim),
    "amax": lambda t, dim, keepdim: torch_reduce.amax(t, () if dim is None else dim, keepdim),
    "amin": lambda t, dim, keepdim: torch_reduce.amin(t, () if dim is None else dim, keepdim),
    "prod": lambda t, dim, keepdim: torch_reduce.prod(t, dim, keepdim),
    "vector_norm": lambda t, dim, keepdim: torch_reduce.vector_norm(t, 3, dim, keepdim),
    "var_mean": lambda t, dim, keepdim: torch_reduce.var_mean(t, dim, keepdim=keepdim, correction=0),
    "sum dtype=": lambda t, dim, keepdim: torch_reduce.sum(t, dim, keepdim, dtype=torch.float64),
}
FLOATING_ONLY = ("mean", "vector_norm", "var_mean")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions(device, dtype, name):
    f = REDUCTIONS[name]
    x = random_tensor((3, 4, 5), dtype, device)
    if name in FLOATING_ONLY and not dtype.is_floating_point:
        with pytest.raises(RuntimeError, match="floating point"):  # as torch's mean, vector_norm and var_mean
            vmap(lambda t: f(t, -1, False))(x)
        return
    exact = not dtype.is_floating_point
    for batch_dim in (0, 1, -1):
        for dim in (None, 0, -1, (0, 1), [1]):
            for keepdim in (False, True):
                got = vmap(lambda t: f(t, dim, keepdim), in_dims=batch_dim)(x)
                assert_same(got, each_sample(lambda t: f(t, dim, keepdim), x, batch_dim), exact)


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction_edges(name):
    """0-dim samples (dim 0 and -1 name them), nested vmaps, out_dims, and a sample's own errors."""
    f = REDUCTIONS[name]
    x = torch.randn(6, dtype=torch.float64)
    for dim in (None, 0, -1):
        for keepdim in (False, True):
            assert_same(vmap(lambda t: f(t, dim, keepdim))(x), each_sample(lambda t: f(t, dim, keepdim), x, 0), False)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    nested = vmap(vmap(lambda t: f(t, None, False), in_dims=1), in_dims=0)(x)
    assert_same(nested, each_sample(lambda t: each_sample(lambda u: f(u, None, False), t, 1), x, 0), False)
    moved = vmap(lambda t: f(t, -1, True), out_dims=1)(x)
    want = each_sample(lambda t: f(t, -1, True), x, 0)
    assert_same(moved, tuple(w.movedim(0, 1) for w in want) if isinstance(want, tuple) else want.movedim(0, 1), False)
    with pytest.raises(IndexError, match=r"range of \[-2, 1\], but got 2"):
        vmap(lambda t: f(t, 2, False))(x)
    with pytest.raises(RuntimeError, match="dim 1 appears multiple times"):
        vmap(lambda t: f(t, (1, -1), False))(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_row_norms(device, dtype, name):
    """Batched input; a batched or unbatched residual beside it (or the input unbatched); batched parameters (an
    ensemble's): each as one call a sample."""
    x = torch.randn(4, 3, 8, device=device).to(dtype)
    other = torch.randn(4, 3, 8, device=device).to(dtype)
    weight, bias = torch.randn(8, device=device).to(dtype), torch.randn(8, device=device).to(dtype)
    weights, biases = torch.randn(4, 8, device=device).to(dtype), torch.randn(4, 8, device=device).to(dtype)
    fused = name.startswith("add_")
    op = getattr(torch_reduce, name)

    def call(t, r, w, b):
        params = (w, b) if "layer" in name else (w,)
        return op(t, r, [8], *params) if fused else op(t, [8], *params)

    cases = [((0, None, None, None), (x, other[0], weight, bias)), ((1, None, None, None), (x.transpose(0, 1), other[0],
             weight, bias)), ((0, None, 0, 0), (x, other[0], weights, biases))]
    if fused:
        cases += [((0, 0, None, None), (x, other, weight, bias)), ((None, 0, None, None), (x[0], other, weight, bias))]
    for in_dims, args in cases:
        got = vmap(call, in_dims=in_dims)(*args)
        samples = [call(*[a.select(d, i) if d is not None else a for a, d in zip(args, in_dims)]) for i in range(4)]
        want = tuple(torch.stack(p) for p in zip(*samples)) if fused else torch.stack(samples)
        assert_same(got, want, False)


def test_transforms_on_vmap():
    """jacrev and hessian (vmap over vjp) and per-sample gradients, against torch's own ops."""
    x = torch.randn(5, 6, dtype=torch.float64)
    w, b = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(jacrev(lambda t: torch_reduce.layer_norm(t, [6], w, b))(x[0]),
                               jacrev(lambda t: F.layer_norm(t, [6], w, b))(x[0]))
    torch.testing.assert_close(hessian(lambda t: torch_reduce.vector_norm(t, 3))(x[0]),
                               hessian(lambda t: torch.linalg.vector_norm(t, 3))(x[0]))
    loss = lambda norm, sum_: lambda w, t: sum_(norm(t, [6], w, b) ** 2)  # noqa: E731
    torch.testing.assert_close(vmap(grad(loss(torch_reduce.layer_norm, torch_reduce.sum)), in_dims=(None, 0))(w, x),
                               vmap(grad(loss(F.layer_norm, torch.sum)), in_dims=(None, 0))(w, x))
