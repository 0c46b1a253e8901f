"""Expanded (stride-0) inputs: every drop-in reduction and var_mean reads a repeated slice once (a reduced
repeat folds into the result, a kept one is expanded back) instead of copying the expanded tensor. Results
against torch and a float64 reference over expanded dims reduced, kept and mixed with ordinary, permuted,
channels_last and stepped dims, every dtype; memory against the dense size on the CPU (a child process's peak
resident memory) and on the GPU (torch.cuda.max_memory_allocated)."""
import json
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_reduce
from conftest import (ALL_DTYPES, DEVICES, FLOAT_DTYPES, random_tensor, requires_cuda, seed_torch,
                      subprocess_env)

OPS = ["sum", "mean", "amax", "amin", "prod", "vector_norm", "var_mean"]

ORDS = [2, 1, 0, float("inf"), float("-inf"), 3, 0.5, -1.5]


def expanded(device, dtype):
    """(name, tensor, dims) over expanded layouts; dims None is every dim."""
    t = lambda *shape: random_tensor(shape, dtype, device)  # noqa: E731
    cl = torch.channels_last
    yield "scalar", t(1).expand(1000), [None, 0]
    yield "zero-dim", random_tensor((), dtype, device).expand(3, 5), [None, 0, 1]
    yield "rows", t(1, 7).expand(5, 7), [None, 0, 1, (0, 1)]
    yield "columns", t(5, 1).expand(5, 6), [None, 0, 1]
    yield "mixed", t(1, 3, 1, 4).expand(2, 3, 5, 4), [None, (0, 2), (1, 3), 0, 2, (2, 3), (0, 1), (1, 2, 3)]
    yield "kept and reduced", t(1, 5, 1).expand(3, 5, 4), [0, 2, (0, 1), (1, 2), 1]
    yield "unsqueezed", t(6, 4).unsqueeze(1).expand(6, 9, 4), [1, (0, 1), 2, (0, 2)]
    yield "channels_last", t(2, 1, 4, 5).contiguous(memory_format=cl).expand(2, 3, 4, 5), [1, (0, 2, 3), (2, 3), None]
    yield "channels_last batch", t(1, 3, 4, 5).contiguous(memory_format=cl).expand(6, 3, 4, 5), [(0, 2, 3), 1, 0]
    yield "permuted", t(4, 1, 6).permute(2, 1, 0).expand(6, 7, 4), [1, (0, 2), (1, 2), 0]
    yield "stepped", t(6, 8)[:, ::2].unsqueeze(0).expand(3, 6, 4), [0, (0, 2), 1, None]
    yield "empty kept", t(1, 0).expand(4, 0), [0]
    yield "empty reduced", t(1, 0).expand(4, 0), [1, None]
    yield "expanded to empty", t(1, 5).expand(0, 5), [0, 1]


def reduce_torch(name, x, dim, keepdim, ord=2, **kwargs):
    """torch's result; prod (torch.prod takes one dim) one dim at a time, exact for integers (mod 2^64)."""
    if name == "vector_norm":
        return torch.linalg.vector_norm(x, ord, dim, keepdim, **kwargs)
    if name == "var_mean":
        return torch.var_mean(x, dim, keepdim=keepdim, **kwargs)
    if name == "prod" and not isinstance(dim, int) and (dim is not None or keepdim):
        dims = sorted(d % x.dim() for d in (range(x.dim()) if dim is None else dim))
        result = x
        for d in dims:
            result = result.prod(d, keepdim=True, **kwargs)
        return result if keepdim else result.squeeze(dims)
    if dim is None:
        return getattr(torch, name)(x, **kwargs) if not keepdim else getattr(torch, name)(
            x, tuple(range(x.dim())), keepdim=True, **kwargs)
    return getattr(torch, name)(x, dim, keepdim, **kwargs)


def reduce_ours(name, x, dim, keepdim, ord=2, **kwargs):
    if name == "vector_norm":
        return torch_reduce.vector_norm(x, ord, dim, keepdim, **kwargs)
    if name == "var_mean":
        return torch_reduce.var_mean(x, dim, keepdim=keepdim, **kwargs)
    if dim is None and keepdim:
        dim = tuple(range(x.dim()))
    return getattr(torch_reduce, name)(x, dim, keepdim, **kwargs)


def check(name, x, dim, keepdim, **kwargs):
    """Ours against torch (the same error type where torch raises) and, for floating results, within
    torch's own distance from the float64 reference of the same computation plus a rounding allowance."""
    if name in ("amax", "amin") and dim is None:
        dim = ()
    try:
        want = reduce_torch(name, x, dim, keepdim, **kwargs)
    except (RuntimeError, IndexError) as error:
        with pytest.raises(type(error)):
            reduce_ours(name, x, dim, keepdim, **kwargs)
        return
    got = reduce_ours(name, x, dim, keepdim, **kwargs)
    if name == "var_mean":
        for g, w, part in zip(got, want, ("var_mean.var", "var_mean.mean")):
            compare(part, x, g, w, dim, keepdim, kwargs)
        return
    compare(name, x, got, want, dim, keepdim, kwargs)


def compare(name, x, got, want, dim, keepdim, kwargs):
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    assert got.is_contiguous()
    if not (got.dtype.is_floating_point or got.dtype.is_complex) or name in ("amax", "amin"):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        return
    dtype = kwargs.get("dtype")
    source = x.to(dtype) if dtype is not None else x
    wide = {k: v for k, v in kwargs.items() if k != "dtype"}
    if got.is_complex():
        got, want, source = torch.view_as_real(got), torch.view_as_real(want), torch.view_as_real(source)
        dim = tuple(range(source.dim() - 1)) if dim is None else dim
    part = {"var_mean.var": 0, "var_mean.mean": 1}.get(name)
    base = "var_mean" if part is not None else name
    exact = reduce_torch(base, source.double(), dim, keepdim, **wide)
    scale = reduce_torch(base, source.double().abs(), dim, keepdim, **wide)
    if part is not None:  # var: its rounding scales with the squares
        exact, scale = exact[part], (scale[part] if part == 1 else source.double().square().amax() if source.numel() else torch.zeros(()))
    # A float64 result's reference is torch's float64 reduction, itself off by up to n u for n elements a result
    # (torch's 455,625-element p=0.5 norm: 1.2e-12 of the value, and not the same bits from run to run)
    count = source.numel() // max(want.numel(), 1)
    rtol = torch.finfo(torch.float64).eps * max(count, 4096) if got.dtype == torch.float64 else 1e-5
    # + tiny: below the normal range a result has no relative precision left, and the order of the roundings
    # decides it (a prod of 1632 repeats, its slice's product raised to the repeats' power: 0 where a serial product
    # ended on 5e-324; the exact value is closer to 0).
    bound = (rtol * scale.abs() + torch.finfo(got.dtype).eps * exact.abs() + (want.double() - exact).abs()
             + torch.finfo(got.dtype).tiny)
    g = got.double()
    ok = ((g - exact).abs() <= bound) | (g == exact) | (g.isnan() & exact.isnan())
    if name == "prod":
        # Where the float64 reference's or torch's partial products left the range (0, inf, or NaN from 0 * inf:
        # drawn inputs repeat a few values thousands of times), the order decides which of those comes out.
        w = want.double()
        ranged = ~exact.isfinite() | (exact == 0) | ~w.isfinite() | (w == 0)
        ok |= ranged & (g.isnan() | g.isinf() | (g == 0))
    assert bool(ok.all()), (name, x.dtype, x.shape, x.stride(), dim, kwargs, (g - exact).abs().max(), bound.max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "prod"])
def test_like_torch(name, dtype, device):
    for _, x, dims in expanded(device, dtype):
        if name == "prod" and dtype.is_floating_point:
            x = x.clamp(-2, 2) / 1.5  # most products of up to 1000 factors stay in range
        for dim in dims:
            for keepdim in (False, True):
                check(name, x, dim, keepdim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("ord", ORDS, ids=str)
def test_vector_norm_like_torch(ord, dtype, device):
    for _, x, dims in expanded(device, dtype):
        for dim in dims:
            for keepdim in (False, True):
                check("vector_norm", x, dim, keepdim, ord=ord)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_var_mean_like_torch(dtype, device):
    for _, x, dims in expanded(device, dtype):
        for dim in dims:
            for keepdim in (False, True):
                for correction in (0, 1, 2.5):
                    check("var_mean", x, dim, keepdim, correction=correction)


@st.composite
def drawn(draw, device):
    """A random base of 1..4 dims (sizes 0..6, some 1), permuted, expanded in its size-1 dims to 1..40."""
    shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
    ones = draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    shape = [1 if one else size for one, size in zip(ones, shape)]
    dtype = draw(st.sampled_from(ALL_DTYPES))
    order = draw(st.permutations(range(len(shape))))
    base = random_tensor([shape[d] for d in order], dtype, device).permute(*[order.index(d) for d in range(len(shape))])
    sizes = [draw(st.integers(1, 40)) if size == 1 else size for size in shape]
    return base.expand(sizes)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_drawn_like_torch(device, data):
    seed_torch(data)
    x = data.draw(drawn(device))
    name = data.draw(st.sampled_from(OPS))
    dims = data.draw(st.lists(st.integers(0, x.dim() - 1), min_size=1, max_size=x.dim(), unique=True))
    dim = None if data.draw(st.booleans()) else tuple(dims)
    keepdim = data.draw(st.booleans())
    if name == "prod" and x.dtype.is_floating_point:
        x = x.clamp(-2, 2) / 1.5
    kwargs = {"ord": data.draw(st.sampled_from(ORDS))} if name == "vector_norm" else {}
    if name == "var_mean":
        kwargs["correction"] = data.draw(st.sampled_from([0, 1]))
    check(name, x, dim, keepdim, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_argument(device):
    small = random_tensor((1, 5, 1), torch.int8, device).expand(3, 5, 4)
    half = random_tensor((1, 5, 1), torch.float16, device).expand(3, 5, 4)
    for x, name, dtype in [(small, "sum", torch.float32), (small, "sum", torch.int8), (small, "prod", torch.int16),
                           (small, "mean", torch.float64), (half, "sum", torch.float64), (half, "mean", torch.float32),
                           (half, "prod", torch.float64), (half, "vector_norm", torch.float32)]:
        for dim in ((0,), (0, 2), 1, None):
            check(name, x, dim, False, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_complex(device):
    x = torch.randn(1, 4, 1, dtype=torch.complex64, device=device).expand(3, 4, 5)
    for name in ("sum", "mean"):
        for dim in (0, (0, 2), 1, None):
            check(name, x, dim, False)
    check("sum", x.real.to(torch.float16), (0, 2), False, dtype=torch.complex64)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_inf_and_zero_repeated(device):
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, -3.0], device=device)
    x = x.unsqueeze(0).expand(5, 6)
    for name in ("sum", "mean", "amax", "amin", "prod"):
        check(name, x, 0, False)
    for ord in ORDS:
        check("vector_norm", x, 0, False, ord=ord)
    check("var_mean", x[:, 2:], 0, False)
    for got, dense in zip(torch_reduce.var_mean(x, 0), torch_reduce.var_mean(x.contiguous(), 0)):
        torch.testing.assert_close(got, dense, rtol=0, atol=0, equal_nan=True)  # (an infinite mean: inf, torch NaN)
    odd = torch.tensor([-2.0, -0.0], device=device).unsqueeze(0)  # signs of odd and even powers
    for k in (3, 4):
        check("prod", odd.expand(k, 2), 0, False)


@pytest.mark.parametrize("device", DEVICES)
def test_integer_wraparound(device):
    # int64 sums and products wrap modulo 2^64 as torch's do, whatever the repeat count.
    x = torch.tensor([2**62 + 3, -(2**61) - 7, 3], device=device).unsqueeze(0)
    for k in (2, 5, 2**40 + 1):
        big = x.expand(k, 3)
        assert torch.equal(torch_reduce.sum(big, 0), (x[0] * k))
        want = torch.ones_like(x[0])
        base, e = x[0].clone(), k
        while e:  # x^k mod 2^64 by squaring
            if e & 1:
                want = want * base
            base, e = base * base, e >> 1
        assert torch.equal(torch_reduce.prod(big, 0), want)
    u = torch.tensor([4_000_000_000], dtype=torch.uint32, device=device).expand(3)
    assert torch_reduce.sum(u).item() == 12_000_000_000


@pytest.mark.parametrize("device", DEVICES)
def test_repeats_beyond_int32(device):
    # 2^40 repeats of one element: no memory, the count exact in a mean and a sum.
    one = torch.full((1,), 0.5, device=device).expand(2**40)
    assert torch_reduce.sum(one).item() == 2.0**39
    assert torch_reduce.mean(one).item() == 0.5
    assert torch_reduce.vector_norm(one).item() == pytest.approx(0.5 * 2.0**20)
    assert torch_reduce.prod(torch.full((1,), -1.0, device=device).expand(2**40 + 1)).item() == -1.0
    var, mean = torch_reduce.var_mean(one)
    assert var.item() == 0 and mean.item() == 0.5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "prod", "vector_norm"])
def test_gradient_reaches_the_unexpanded_base(name, device):
    base = torch.randn(1, 4, 1, device=device, dtype=torch.float64).add_(2)
    grads = []
    for fn in (getattr(torch_reduce, name), torch.linalg.vector_norm if name == "vector_norm" else getattr(torch, name)):
        leaf = base.clone().requires_grad_()
        out = fn(leaf.expand(3, 4, 5), dim=2)  # a repeated dim reduced, one kept
        (out * torch.arange(12, device=device).view(3, 4)).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1])


# ------------------------------------------------------------------------------------------- memory ----

MEMORY_SCRIPT = r"""
import json, resource, sys
import torch, torch_reduce
n = 2**28
cases = {
    "sum half": lambda: torch_reduce.sum(torch.ones(1).half().expand(n)),
    "sum float": lambda: torch_reduce.sum(torch.ones(1).expand(n)),
    "sum int8 dim": lambda: torch_reduce.sum(torch.ones(4, 1, dtype=torch.int8).expand(4, n // 4), 1),
    "sum dtype=float64": lambda: torch_reduce.sum(torch.ones(1).half().expand(n), dtype=torch.float64),
    "mean": lambda: torch_reduce.mean(torch.ones(1, 1).expand(2**14, 2**14), 0),
    "amax": lambda: torch_reduce.amax(torch.ones(1).expand(n)),
    "amin": lambda: torch_reduce.amin(torch.ones(1).expand(n)),
    "prod": lambda: torch_reduce.prod(torch.ones(1).expand(n)),
    "vector_norm": lambda: torch_reduce.vector_norm(torch.ones(1).expand(n)),
    "vector_norm 3": lambda: torch_reduce.vector_norm(torch.ones(1).expand(n), 3),
    "var_mean": lambda: torch_reduce.var_mean(torch.ones(1).expand(n)),
    "var_mean dim": lambda: torch_reduce.var_mean(torch.ones(1, 1).expand(2**14, 2**14), 1),
    "kept": lambda: torch_reduce.sum(torch.ones(1, 8, 1).expand(2**4, 8, 2**21), 1),
}
name = sys.argv[1]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cases[name]()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grown_bytes": (after - before) * 1024}))
"""

# The dense float32 input is 1 GiB (the half one 512 MiB); the kept case's result is 128 MiB, its input 1 GiB.
MEMORY_CASES = {"sum half": 0, "sum float": 0, "sum int8 dim": 0, "sum dtype=float64": 0, "mean": 0, "amax": 0,
                "amin": 0, "prod": 0, "vector_norm": 0, "vector_norm 3": 0, "var_mean": 0, "var_mean dim": 0,
                "kept": 2**27}


@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_cpu_memory_stays_far_below_the_dense_size(case):
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, case], capture_output=True, text=True,
                         env=subprocess_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    grown = json.loads(run.stdout.strip().splitlines()[-1])["grown_bytes"]
    assert grown <= MEMORY_CASES[case] + 48 * 2**20, (case, grown)


@requires_cuda
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "prod", "vector_norm", "var_mean"])
def test_cuda_memory_stays_far_below_the_dense_size(name):
    torch.cuda.synchronize()
    x = torch.ones(1, device="cuda").half().expand(2**30)  # 2 GiB dense
    kept = torch.ones(1, 8, 1, device="cuda").expand(2**4, 8, 2**21)  # 1 GiB dense, result 128 MiB
    results = 2 if name == "var_mean" else 1
    for call, allowed in [(lambda: getattr(torch_reduce, name)(x), 0),
                          (lambda: getattr(torch_reduce, name)(kept, 1) if name != "vector_norm"
                           else torch_reduce.vector_norm(kept, 2, 1), results * 2**27)]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before <= allowed + 2**20, name
    assert torch_reduce.sum(x, dtype=torch.float32).item() == 2.0**30
