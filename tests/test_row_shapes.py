"""The reductions over one dim at the shapes with their own kernel paths: narrow rows (a few elements: on the GPU
folded in registers where they divide a 16-byte vector or are two of them, else read as tiles of whole rows through
shared memory), few long rows over dim 0 (the column kernel with one or two slices of the reduced extent), and any
shape and set of dims (hypothesis), against torch in float64.
"""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_reduce
from conftest import DEVICES, random_tensor, requires_cuda, seed_torch

TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}


def _check_sum_like(x, dim, got_sum, got_amax):
    source = x.double()
    want = source.sum(dim)
    scale = source.abs().sum(dim)
    assert got_sum.shape == want.shape and got_sum.dtype == x.dtype
    assert bool(((got_sum.double() - want).abs() <= TOL[x.dtype] * (scale + want.abs())).all()), (x.shape, dim)
    assert torch.equal(got_amax, torch.amax(x, dim)), (x.shape, dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("K", [1, 2, 3, 4, 5, 7, 8, 15, 16, 31])
def test_narrow_rows(K, dtype, device):
    """Rows counts around a tile's (hundreds of rows), the last tile partial, and odd ones (rows that divide a
    vector leave 1 to 7 rows past the last whole vector); and an input 4 bytes past a 16-byte boundary (the tiles
    and the vectors need aligned loads: the row-group kernel takes it). mean too: its factor is applied per row."""
    storage = random_tensor((4099 * K + 1,), dtype, device)
    inputs = [random_tensor((rows, K), dtype, device) for rows in (1, 5, 271, 4099, 20011)]
    for x in inputs + [storage[1:].view(4099, K)]:
        _check_sum_like(x, -1, torch_reduce.sum(x, -1), torch_reduce.amax(x, -1))
        want = x.double().mean(-1)
        scale = x.double().abs().mean(-1)
        assert bool(((torch_reduce.mean(x, -1).double() - want).abs() <= TOL[dtype] * (scale + want.abs())).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize("K", [1, 2, 3, 4, 7, 8, 13, 16, 32])
def test_narrow_integer_rows(K, dtype, device):
    x = random_tensor((9001, K), dtype, device)
    assert torch.equal(torch_reduce.sum(x, -1), torch.sum(x, -1))
    assert torch.equal(torch_reduce.amin(x, -1), torch.amin(x, -1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K", [1, 2, 3, 4, 5, 7, 8, 9, 33])
@pytest.mark.parametrize("N", [1, 3, 4, 1000, 4096])
def test_few_rows_over_dim_0(K, N, device):
    x = random_tensor((K, N), torch.float32, device)
    _check_sum_like(x, 0, torch_reduce.sum(x, 0), torch_reduce.amax(x, 0))
    assert torch.allclose(torch_reduce.mean(x, 0).double(), x.double().mean(0), rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=5), data=st.data())
def test_any_shape_layout_and_dims(shape, data):
    """Random shapes, dims and layouts (contiguous, permuted, a step in one dim) against torch in float64."""
    seed_torch(data)
    device = data.draw(st.sampled_from(DEVICES))
    ndim = len(shape)
    dims = tuple(sorted(data.draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim))))
    order = data.draw(st.permutations(range(ndim)))
    step_dim = data.draw(st.sampled_from([None, *range(ndim)]))  # every other element of one dim: a gap
    stored = [shape[i] * (2 if i == step_dim else 1) for i in range(ndim)]
    x = random_tensor([stored[i] for i in order], torch.float32, device).permute([order.index(i) for i in range(ndim)])
    if step_dim is not None:
        x = x[tuple(slice(None, None, 2) if i == step_dim else slice(None) for i in range(ndim))]
    keepdim = data.draw(st.booleans())
    source = x.double()
    for name in ("sum", "mean", "amax"):
        got = getattr(torch_reduce, name)(x, dims, keepdim)
        want = getattr(torch, name)(source, dims, keepdim)
        scale = source.abs().sum(dims, keepdim) / (math.prod(x.shape[d] for d in dims) if name == "mean" else 1)
        assert got.shape == want.shape, (name, x.shape, dims)
        assert bool(((got.double() - want).abs() <= 2e-6 * (scale + want.abs())).all()), (name, x.shape, dims)


@requires_cuda
def test_narrow_rows_deterministic_and_large():
    """(2^27, 2) and (2^20, 7) over dim -1: right, and the same bits on every run."""
    for shape in ((2**27, 2), (2**20, 7)):
        x = torch.randn(shape, device="cuda")
        first = torch_reduce.sum(x, -1)
        assert torch.equal(first, torch_reduce.sum(x, -1))
        assert torch.allclose(first.double(), x.double().sum(-1), rtol=1e-6, atol=1e-6)


@pytest.mark.large
@requires_cuda
def test_narrow_rows_past_2_to_the_31():
    """More than 2^31 elements in rows of 2 bfloat16 (the vector kernel's 64-bit indices; 3 rows past the last
    vector): each row's sum is its two elements added in float32 and rounded once."""
    x = torch.randn(2**30 + 3, 2, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2**31
    got = torch_reduce.sum(x, -1)
    assert torch.equal(got, (x[:, 0].float() + x[:, 1].float()).bfloat16())


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_rows_a_warp_each(dtype):
    """Rows of 257 to 1024 16-byte vectors take a warp each where there are at least as many rows as the GPU holds
    warps (H200: 8,448), else a block each: both sides of the row count and of the length (1024 vectors and one
    more), an odd length (its head and tail elements around the vectors), and a view 2 bytes past 16-byte
    alignment."""
    per_vector = 16 // (4 if dtype == torch.float32 else 2)
    for rows in (20011, 3001):
        for K in (257 * per_vector, 3136, 3137, 1024 * per_vector, 1024 * per_vector + 1):
            x = random_tensor((rows, K), dtype, "cuda")
            _check_sum_like(x, -1, torch_reduce.sum(x, -1), torch_reduce.amax(x, -1))
    storage = random_tensor((20011 * 3136 + 1,), dtype, "cuda")
    x = storage[1:].view(20011, 3136)
    _check_sum_like(x, -1, torch_reduce.sum(x, -1), torch_reduce.amax(x, -1))
    assert torch.equal(torch_reduce.sum(x, -1), torch_reduce.sum(x, -1))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8], ids=str)
def test_few_long_rows_split_over_blocks(dtype):
    """Long rows split over blocks: where the grid is one wave (one row to 64 here), a row's blocks share one
    grid-stride loop over it, else (300 rows) each folds a run of it; the last to finish folds their partials; 700
    rows fill half the GPU's blocks and are not split. Row lengths with and without head and tail elements (a row
    of an odd length starts misaligned), a view one element past alignment; sum, amax, mean and prod; bitwise the
    same on a second call."""
    def check(x):
        if dtype.is_floating_point:
            _check_sum_like(x, -1, torch_reduce.sum(x, -1), torch_reduce.amax(x, -1))
            source = x.double()
            mean = torch_reduce.mean(x, -1).double()
            assert bool(((mean - source.mean(-1)).abs() <= TOL[dtype] * source.abs().mean(-1)).all()), x.shape
        else:
            assert torch.equal(torch_reduce.sum(x, -1), torch.sum(x, -1)), x.shape
            assert torch.equal(torch_reduce.amax(x, -1), torch.amax(x, -1)), x.shape
        assert torch.equal(torch_reduce.sum(x, -1), torch_reduce.sum(x, -1))

    for rows, K in ((1, 2**22 + 3), (3, 2**21 + 5), (8, 2**20), (64, 2**18 + 1), (300, 2**16 + 3), (700, 2**16)):
        check(random_tensor((rows, K), dtype, "cuda"))
        if dtype in (torch.float32, torch.float64):  # factors whose product stays near 1
            logs = (torch.rand(rows, K, device="cuda", dtype=torch.float64) - 0.5) * 2**-10
            factors = logs.exp().to(dtype)
            want = factors.double().log().sum(-1).exp()
            got = torch_reduce.prod(factors, -1).double()
            assert bool(((got - want).abs() <= 4 * TOL[dtype] * want).all()), (rows, K)
    check(random_tensor((5 * 2**20 + 1,), dtype, "cuda")[1:].view(5, 2**20))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int8], ids=str)
@pytest.mark.parametrize("N", [1, 4, 7, 8, 12, 24])
def test_column_widths(N, dtype, device):
    """Over a middle dim the GPU gives a thread 4 adjacent columns where N and the address allow, else 1; every
    width, from an aligned start and from one element past it, with reduced extents of one partial round of
    loads and of many, and with the extent split over blocks (a long one beside few columns)."""
    for K in (5, 131, 20000):
        storage = random_tensor((3 * K * N + 1,), dtype, device)
        for x in (storage[:-1].view(3, K, N), storage[1:].view(3, K, N)):
            _check_columns(x)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8, torch.float32], ids=str)
def test_wide_columns(dtype):
    """Column groups that fill the GPU alone (3 x 2^21 columns; 16-bit and byte inputs take 8 columns a thread
    there, stored as one 16-byte result) take the reduced extent in one slice: an extent of one partial round of
    loads (5), of several rounds and a partial one (37), and one split over blocks (64 rows, columns for one to
    two waves of blocks); one element past alignment they take 1 column a thread."""
    for shape in ((3, 5, 2**21), (1, 37, 2**22), (1, 64, 800_000)):
        storage = random_tensor((math.prod(shape) + 1,), dtype, "cuda")
        for x in (storage[:-1].view(shape), storage[1:].view(shape)):
            _check_columns(x)


def _check_columns(x):
    if x.dtype == torch.int8:
        assert torch.equal(torch_reduce.sum(x, 1), torch.sum(x, 1))
        assert torch.equal(torch_reduce.amax(x, 1), torch.amax(x, 1))
    else:
        _check_sum_like(x, 1, torch_reduce.sum(x, 1), torch_reduce.amax(x, 1))
