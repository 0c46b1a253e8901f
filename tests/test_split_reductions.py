"""Reduced dims that lie apart in memory (NCHW over (0, 2, 3): BatchNorm's statistics; channels_last;
permuted views) are read in place, one reduced run per launch (dim_reduce.h, Stage), instead of copied.

Each case is checked against torch in float64 on fresh inputs, for every op and stage structure: two and three
reduced runs, the largest run not the innermost, integer and 16-bit inputs (their intermediates are int64 and
float32), and ops whose last stage projects (mean's factor is 1 / the count over every stage, a norm's root).
On the GPU: no copy of the input is made, and the result is the same bits on every run.
"""
import math

import pytest
import torch

import torch_reduce
from conftest import DEVICES, random_tensor, requires_cuda

# (shape, memory layout, dims): "contiguous", "channels_last" (NHWC memory) or a permutation of a contiguous
# tensor of the permuted shape.
CASES = [
    ((4, 6, 5, 7), "contiguous", (0, 2, 3)),    # BatchNorm: two runs, the inner one largest
    ((9, 6, 2, 3), "contiguous", (0, 2, 3)),    # the outer run largest
    ((4, 6, 5, 7), "contiguous", (0, 2)),       # two runs, a kept run between and after
    ((4, 6, 5, 7), "contiguous", (1, 3)),
    ((3, 4, 5, 6, 7), "contiguous", (0, 2, 4)),  # three runs
    ((4, 6, 5, 7), "channels_last", (0, 2, 3)),  # one run in NHWC memory: no stages
    ((4, 6, 5, 7), "channels_last", (1, 2)),     # C and H apart in NHWC memory
    ((5, 4, 6), (2, 0, 1), (0, 2)),              # a permuted view: memory order (6, 5, 4)
    ((1, 6, 1, 7), "contiguous", (0, 3)),        # size-1 dims drop out: one run
    ((4, 1, 5, 1, 7), "contiguous", (0, 2, 4)),  # kept dims of size 1 only: the reduced runs merge
]

FLOATS = [torch.float32, torch.float64, torch.bfloat16]


def _prod(t, dims, keepdim):
    for d in sorted((d % t.dim() for d in dims), reverse=True):
        t = t.prod(d, keepdim=True)
    return t if keepdim else t.squeeze(tuple(sorted(d % t.dim() for d in dims)))


# name: (ours, torch's, dtypes)
OPS = {
    "sum": (torch_reduce.sum, torch.sum, FLOATS + [torch.int32, torch.int8, torch.bool]),
    "mean": (torch_reduce.mean, torch.mean, FLOATS),
    "amax": (torch_reduce.amax, torch.amax, FLOATS + [torch.int32]),
    "amin": (torch_reduce.amin, torch.amin, FLOATS + [torch.int16]),
    "prod": (torch_reduce.prod, _prod, [torch.float32, torch.float64, torch.int32]),
    **{f"vector_norm_{p:g}": (lambda x, d, k, p=p: torch_reduce.vector_norm(x, p, d, k),
                              lambda x, d, k, p=p: torch.linalg.vector_norm(x, p, d, k), FLOATS)
       for p in (2, 1, 0, math.inf, -math.inf, 0.5)},
}

# (relative to |result|, relative to the sum of |x| over the reduced dims): float32 sums in any fixed order
# stay within a few ulps of the sum of magnitudes; 16-bit results are rounded once at the end.
TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-6, 1e-6), torch.bfloat16: (2**-8, 1e-5)}


def _make(shape, layout, dtype, device):
    if layout == "contiguous":
        return random_tensor(shape, dtype, device)
    if layout == "channels_last":
        return random_tensor(shape, dtype, device).contiguous(memory_format=torch.channels_last)
    stored = random_tensor([shape[i] for i in layout], dtype, device)
    return stored.permute([layout.index(i) for i in range(len(shape))])  # a view of shape `shape`


def _check(name, x, dims, keepdim):
    ours, theirs, _ = OPS[name]
    if name == "prod":  # factors near 1 (a product of 100+ normals under- or overflows), in place: same layout
        x = x.mul_(0.01).add_(1) if x.dtype.is_floating_point else x.clamp_(-2, 2)
    got = ours(x, dims, keepdim)
    if not x.dtype.is_floating_point:
        want = theirs(x, dims, keepdim)
        assert got.dtype == want.dtype and torch.equal(got, want), f"{name} over {dims}: got {got}, want {want}"
        return
    source = x.double()
    want = theirs(source, dims, keepdim)
    assert got.shape == want.shape and got.dtype == x.dtype, (got.shape, want.shape, got.dtype)
    if name in ("sum", "mean"):
        scale = torch.sum(source.abs(), dims, keepdim) / (math.prod(x.shape[d] for d in dims) if name == "mean" else 1)
    else:
        scale = want.abs()
    rtol, stol = TOL[x.dtype]
    diff = (got.double() - want).abs()
    ok = (diff <= rtol * want.abs() + stol * scale) | (got.double() == want) | (got.double().isnan() & want.isnan())
    assert bool(ok.all()), f"{name} over {dims}: max error {diff.max().item():.3g}, got {got}, want {want}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("name", list(OPS))
def test_dims_apart_in_memory(name, case, keepdim, device):
    shape, layout, dims = case
    for dtype in OPS[name][2]:
        _check(name, _make(shape, layout, dtype, device), dims, keepdim)


@pytest.mark.parametrize("device", DEVICES)
def test_a_mean_divides_by_the_count_over_every_stage(device):
    """A constant input: each stage's own count (5 or 7) would give 1/7 or 1/5 of the mean, not the mean."""
    x = torch.full((4, 6, 5, 7), 3.0, device=device)
    assert torch.equal(torch_reduce.mean(x, (0, 2, 3)), torch.full((6,), 3.0, device=device))
    assert torch.equal(torch_reduce.vector_norm(x, 2, (0, 2, 3)),
                       torch.full((6,), 3.0 * math.sqrt(4 * 5 * 7), device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape, dims", [((257, 1031), -1), ((1031, 257), 0), ((6, 33, 5, 7), (0, 2, 3))])
def test_a_mean_is_its_sum_times_one_factor(shape, dims, device):
    """A mean is its sum (the same kernels, the same order) times 1/K rounded once, as torch's CUDA mean computes it:
    the same bits. The quotient by K rounded once (in float64, then to float32) differs in the last bit at some of
    these outputs. (torch's CUDA division by a number multiplies by its reciprocal, so it cannot tell them apart.)"""
    x = random_tensor(shape, torch.float32, device)
    total = torch_reduce.sum(x, dims)
    count = x.numel() // total.numel()
    factor = torch.tensor(1.0 / count, dtype=torch.float32, device=device)
    assert torch.equal(torch_reduce.mean(x, dims), total * factor)
    assert not torch.equal((total.double() / count).float(), total * factor)


@requires_cuda
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_batchnorm_statistics_read_in_place(memory_format):
    """(64, 256, 56, 56) over (0, 2, 3): no copy of the input (205 MB) is made, the result is right and the same
    bits on every run."""
    x = torch.randn(64, 256, 56, 56, device="cuda").contiguous(memory_format=memory_format)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    first = torch_reduce.sum(x, (0, 2, 3))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < x.numel() * x.element_size() // 16, f"{extra} bytes allocated for a {x.nbytes}-byte input"
    want = x.double().sum((0, 2, 3))
    assert torch.allclose(first.double(), want, rtol=1e-5, atol=1e-5 * x.abs().double().sum((0, 2, 3)).max().item())
    for op in (torch_reduce.sum, torch_reduce.mean, torch_reduce.amax):
        results = [op(x, (0, 2, 3)) for _ in range(3)]
        assert all(torch.equal(results[0], r) for r in results[1:]), op.__name__


@pytest.mark.large
@requires_cuda
def test_more_than_2_31_elements_over_dims_apart():
    """int8 (2049, 4, 2^18 + 3) over (0, 2): 2.15e9 elements, two stages, exact against torch."""
    x = torch.randint(-100, 100, (2049, 4, 2**18 + 3), dtype=torch.int8, device="cuda")
    assert x.numel() > 2**31
    assert torch.equal(torch_reduce.sum(x, (0, 2)), torch.sum(x, (0, 2)))
    assert torch.equal(torch_reduce.amax(x, (0, 2)), torch.amax(x, (0, 2)))
