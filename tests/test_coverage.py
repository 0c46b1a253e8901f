"""torch's dtype and layout coverage for the drop-ins: signed zeros in amax/amin, amax/amin(dim=None),
uint16/uint32/uint64 and complex inputs, sparse layouts, out=. References are torch's results on float64 /
complex128 / int64 copies of fresh random inputs, odd sizes, non-contiguous views; every device."""
import math
import re
import warnings

import numpy as np
import pytest
import torch

import torch_reduce
from conftest import DEVICES, FLOAT_DTYPES, requires_cuda

WIDE_UNSIGNED = [torch.uint16, torch.uint32, torch.uint64]
COMPLEX = [torch.complex64, torch.complex128]
OUT_OPS = ["sum", "mean", "amax", "amin", "prod", "vector_norm"]


def torch_op(name):
    return torch.linalg.vector_norm if name == "vector_norm" else getattr(torch, name)


def ours(name):
    return getattr(torch_reduce, name)


def bits(t):
    """A float tensor's bits as integers: -0.0 differs from 0.0."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


# Shapes and dims that reach every kernel path: the whole tensor (long and short), short and long rows,
# columns (inner extent > 1; (70001, 3) split over CPU tasks), a reduced run in the middle, and copies of interleaved
# reduced dims.
PATHS = [((1,), None), ((2,), None), ((37,), None), ((4099,), None), ((70001,), None),
         ((5, 3), 1), ((9, 3001), 1), ((2, 100003), 1), ((3001, 7), 0), ((70001, 3), 0), ((257, 4), 0),
         ((3, 200, 5), 1), ((6, 5, 4), (0, 2)), ((33, 65), (0, 1))]


def signed_zero_input(shape, name, dtype, device):
    """±0 at random, mixed with values below (amax) or above (amin) zero, so most results are a zero."""
    zeros = torch.where(torch.rand(shape, device=device) < 0.5, -0.0, 0.0)
    others = torch.rand(shape, device=device) + 1
    others = -others if name == "amax" else others
    fraction = torch.rand((), device=device).item()  # some slices all zeros, some with few
    return torch.where(torch.rand(shape, device=device) < fraction, zeros, others).to(dtype)


def expected_signed_zero(name, x, dim):
    """torch's value, with the zero that IEEE 754-2019's maximum/minimum give: amax is +0 if a +0 is among the
    slice's zeros, amin -0 if a -0 is (whatever their order)."""
    dims = tuple(range(x.dim())) if dim is None else dim
    want = torch_op(name)(x.double(), dims)
    wanted_zero = (x == 0) & (torch.signbit(x) == (name == "amin"))
    has = wanted_zero.double().amax(dims).bool()
    zero = torch.zeros_like(want) if name == "amax" else -torch.zeros_like(want)
    return torch.where((want == 0) & has, zero, torch.where(want == 0, -zero, want))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_signed_zeros(name, dtype, device):
    for shape, dim in PATHS:
        x = signed_zero_input(shape, name, dtype, device)
        for view in (x, x.flip(list(range(x.dim())))):  # the same slices in the other order
            got = ours(name)(view, () if dim is None else dim)
            want = expected_signed_zero(name, view.cpu(), dim).to(dtype)
            assert torch.equal(bits(got.cpu()), bits(want)), (name, dtype, shape, dim)
        if x.dim() == 2:  # the transposed view: columns become rows and the kernel path changes
            t = x.t()
            d = None if dim is None else (1 - dim if isinstance(dim, int) else dim)
            got = ours(name)(t, () if d is None else d)
            assert torch.equal(bits(got.cpu()), bits(expected_signed_zero(name, t.cpu(), d).to(dtype)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_and_infinities(name, dtype, device):
    """NaN wins wherever it is in a slice, and ±inf are ordinary extremes, on every path (the CPU folds max and
    min in float32 and float64 as integer keys with a NaN flag beside them): torch's values, some slices with a NaN."""
    for shape, dim in PATHS:
        x = torch.randn(shape, device=device)
        r = torch.rand(shape, device=device)
        x = torch.where(r < 0.05, float("inf"), torch.where(r > 0.95, float("-inf"), x))
        x = torch.where(torch.rand(shape, device=device) < 0.5 / x.numel() ** 0.5, float("nan"), x).to(dtype)
        dims = tuple(range(x.dim())) if dim is None else dim
        for view in (x, x.flip(list(range(x.dim())))):
            got, want = ours(name)(view, () if dim is None else dim), torch_op(name)(view, dims)
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=str((name, shape, dim)))


@pytest.mark.parametrize("device", DEVICES)
def test_signed_zeros_short(device):
    """The issue's cases: the zero is the same in both orders (torch's CPU gives the first of equal zeros on
    short inputs and a lane-dependent one on long ones, so no fixed rule matches it everywhere)."""
    for pair in ([-0.0, 0.0], [0.0, -0.0]):
        x = torch.tensor(pair, device=device)
        assert not torch.signbit(torch_reduce.amax(x)) and torch.signbit(torch_reduce.amin(x))
        assert torch_reduce.amax(x) == torch.amax(x) and torch_reduce.amin(x) == torch.amin(x)
    x = torch.tensor([[-0.0, 0.0, float("nan")], [0.0, -0.0, -0.0]], device=device)
    assert torch.equal(torch_reduce.amax(x, 1).isnan(), torch.tensor([True, False], device=device))
    assert bits(torch_reduce.amax(x, 1)[1:]).item() == 0 and torch.signbit(torch_reduce.amin(x, 1)[1])
    assert torch_reduce.amax(torch.tensor([-0.0, float("nan"), 0.0], device=device)).isnan()


@pytest.mark.parametrize("device", DEVICES)
def test_order_free_whole_reductions(device):
    """max, min and integer sums and products of a whole tensor, which the CPU folds in lanes over parallel chunks
    of 2^16 (any order gives the same bits): torch's values, with a NaN in each chunk and at either end."""
    n = 3 * 2**16 + 5
    x = torch.randn(n, device=device, dtype=torch.float64)
    assert torch_reduce.amax(x) == x.max() and torch_reduce.amin(x) == x.min()
    assert torch_reduce.vector_norm(x, float("inf")) == x.abs().max()
    for where in (0, 2**16 - 1, 2**16, 2 * 2**16 + 3, n - 1):
        y = x.clone()
        y[where] = float("nan")
        assert torch_reduce.amax(y).isnan() and torch_reduce.amin(y).isnan(), where
        assert torch_reduce.vector_norm(y, float("-inf")).isnan(), where
    i = torch.randint(-2**40, 2**40, (n,), device=device)
    assert torch.equal(torch_reduce.sum(i), torch.sum(i))
    odd = torch.tensor([-1, 1, 3], device=device)[torch.randint(0, 3, (n,), device=device)]  # the product wraps
    assert torch.equal(torch_reduce.prod(odd), torch.prod(odd))
    u = torch.randint(0, 2**63 - 1, (n,)).to(torch.uint64).to(device)
    assert torch_reduce.amax(u).item() == max(u.tolist()) and torch_reduce.amin(u).item() == min(u.tolist())


@requires_cuda
@pytest.mark.parametrize("name", ["amax", "amin"])
def test_signed_zeros_cpu_cuda_bitwise(name):
    for shape, dim in PATHS:
        x = signed_zero_input(shape, name, torch.float32, "cuda")
        d = () if dim is None else dim
        assert torch.equal(bits(ours(name)(x, d).cpu()), bits(ours(name)(x.cpu(), d)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["amax", "amin"])
def test_amax_amin_dim_none(name, device):
    x = torch.randn(5, 7, 3, device=device)[:, ::2]
    for keepdim in (False, True):
        got = ours(name)(x, None, keepdim)
        want = torch_op(name)(x, dim=None, keepdim=keepdim)
        assert got.shape == want.shape and torch.equal(got, want)
        assert torch.equal(ours(name)(x, dim=None, keepdim=keepdim), want)
    assert ours(name)(torch.tensor(3.0, device=device), None).shape == ()
    empty = torch.empty(2, 0, device=device)
    with pytest.raises(RuntimeError, match=re.escape("Expected reduction dim to be specified for input.numel() == 0")):
        torch_op(name)(empty, dim=None)
    with pytest.raises(RuntimeError, match=re.escape("Expected reduction dim to be specified for input.numel() == 0")):
        ours(name)(empty, None)


# ----------------------------------------------------------------------------- uint16/uint32/uint64 ----

SIGNED_OF = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def wide_unsigned(shape, dtype, device):
    """Values over the dtype's whole range (uint64 above 2^63 included): the sums and products wrap. Made on
    the CPU (torch's CUDA kernels for these dtypes are few) and copied."""
    raw = torch.randint(-2**63, 2**63 - 1, shape, dtype=torch.int64)
    x = raw.view(torch.uint64) if dtype == torch.uint64 else (raw & (2**(8 * dtype.itemsize) - 1)).to(dtype)
    return x.to(device)


def unsigned_extreme(name, x, dim):
    """amax/amin of a uint16/32/64 tensor, which torch's CPU kernels lack: on int64 with the sign bit
    flipped (unsigned order as signed order), flipped back."""
    dims = tuple(range(x.dim())) if dim is None else dim
    if x.dtype != torch.uint64:
        return torch_op(name)(x.to(torch.int64), dims).to(x.dtype)
    flip = torch.tensor(-2**63)
    return (torch_op(name)(x.view(torch.int64) ^ flip, dims) ^ flip).view(torch.uint64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", WIDE_UNSIGNED)
def test_wide_unsigned(dtype, device):
    for shape, dim in PATHS + [((6, 9), (1, 0))]:
        x = wide_unsigned(shape, dtype, "cpu")
        # flip through the signed type of the same width: torch 2.11's CPU has no flip for these dtypes.
        flipped = x.view(SIGNED_OF[dtype]).flip(0).view(dtype)
        for view in (x.to(device), flipped.to(device)):
            for name in ("sum", "prod"):
                if name == "prod" and not (dim is None or isinstance(dim, int)):  # torch.prod takes one dim
                    continue
                got = ours(name)(view, dim)
                want = torch_op(name)(view.cpu(), dim) if dim is not None else torch_op(name)(view.cpu())
                assert got.dtype == torch.int64 and torch.equal(got.cpu(), want), (name, dtype, shape, dim)
            for name in ("amax", "amin"):
                got = ours(name)(view, () if dim is None else dim)
                want = unsigned_extreme(name, view.cpu(), dim)
                assert got.dtype == dtype and torch.equal(got.cpu().view(torch.int64) if dtype == torch.uint64
                                                          else got.cpu().to(torch.int64),
                                                          want.view(torch.int64) if dtype == torch.uint64
                                                          else want.to(torch.int64)), (name, dtype, shape, dim)
        if x.dim() == 2:
            assert torch.equal(torch_reduce.sum(x.to(device).t(), 0, keepdim=True).cpu(), torch.sum(x.t(), 0, True))
    small = torch.randint(0, 1000, (17, 33)).to(dtype).to(device)
    torch.testing.assert_close(torch_reduce.mean(small, 1, dtype=torch.float64),
                               torch.mean(small.cpu(), 1, dtype=torch.float64).to(device), rtol=1e-12, atol=0)
    assert torch.equal(torch_reduce.sum(small, dtype=torch.int32).cpu(), torch.sum(small.cpu(), dtype=torch.int32))
    assert torch_reduce.sum(torch.empty(0, dtype=dtype).to(device)).item() == 0
    assert torch_reduce.prod(torch.empty(3, 0, dtype=dtype).to(device), 1).tolist() == [1, 1, 1]


def to(a, device):
    return a.to(device) if isinstance(a, torch.Tensor) else a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", WIDE_UNSIGNED)
def test_wide_unsigned_errors_as_torch(dtype, device):
    """torch has no sum or product into these dtypes; mean and vector_norm need a floating dtype."""
    x = torch.ones(3, 4, dtype=dtype).to(device)
    cases = [("sum", (x,), {"dtype": dtype}),
             ("prod", (torch.ones(3, 4, dtype=torch.int32, device=device),), {"dtype": dtype}), ("mean", (x,), {}),
             ("vector_norm", (x,), {})]
    for name, args, kwargs in cases:
        with pytest.raises(Exception) as theirs:
            torch_op(name)(*(to(a, "cpu") for a in args), **kwargs)
        with pytest.raises(theirs.type) as mine:
            ours(name)(*args, **kwargs)
        if theirs.type is RuntimeError:  # torch's own words (NotImplementedError names torch's kernel)
            assert str(mine.value).split("\n")[0] == str(theirs.value).split("\n")[0]
        else:
            assert f"not implemented for '{str(dtype).split('.')[1].capitalize().replace('Uint', 'UInt')}'" \
                in str(mine.value)
        with pytest.raises(theirs.type):  # the fake kernel raises too
            ours(name)(*(to(a, "meta") for a in args), **kwargs)
    meta = torch.empty(5, 6, dtype=dtype, device="meta")
    assert torch_reduce.sum(meta, 1).dtype == torch.int64 and torch_reduce.prod(meta, 0).shape == (6,)
    assert torch_reduce.amax(meta, 1).dtype == dtype and torch_reduce.amin(meta, None, True).shape == (1, 1)


# ---------------------------------------------------------------------------------------- complex ----

def complex_close(got, want, x, name, dims, dtype, keepdim=False):
    """|ours - torch's complex128| within the accumulate dtype's rounding of the sum (or mean) of |x|."""
    assert got.dtype == dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    magnitude = x.abs().double().cpu()
    scale = torch_op(name)(magnitude, tuple(range(x.dim())) if dims is None else dims, keepdim)
    rtol = 1e-12 if dtype == torch.complex128 else 1e-5
    err = (got.cpu().to(torch.complex128) - want).abs()
    assert err.shape == scale.shape
    assert bool((err <= rtol * scale + 1e-300).all()), (name, dtype, err.max(), scale.max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_sum_mean(name, dtype, device):
    for shape, dim in PATHS:
        x = torch.randn(shape, dtype=dtype, device=device)
        views = [x, x.conj()] + ([x.t(), x[:, 1::2]] if x.dim() == 2 else [])
        for view in views:
            for keepdim in (False, True):
                got = ours(name)(view, dim, keepdim)
                want = torch_op(name)(view.cpu().to(torch.complex128), dim, keepdim) if dim is not None else \
                    torch_op(name)(view.cpu().to(torch.complex128)).reshape([1] * view.dim() if keepdim else [])
                complex_close(got, want, view, name, dim, dtype, keepdim)
    x = torch.randn(7, 9, dtype=torch.complex64, device=device)
    complex_close(ours(name)(x, 1, dtype=torch.complex128), torch_op(name)(x.cpu().to(torch.complex128), 1),
                  x, name, 1, torch.complex128)
    r = torch.randn(7, 9, device=device)
    complex_close(ours(name)(r, 0, dtype=dtype), torch_op(name)(r.cpu().to(torch.complex128), 0), r, name, 0, dtype)
    empty = torch.empty(4, 0, dtype=dtype, device=device)
    e_got, e_want = ours(name)(empty, 1).cpu(), torch_op(name)(empty.cpu(), 1)
    assert e_got.dtype == dtype and torch.equal(torch.view_as_real(e_got).isnan(), torch.view_as_real(e_want).isnan())
    assert ours(name)(torch.empty(0, 3, dtype=dtype, device=device), 1).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_complex_scalar_over_its_dim(name, device):
    """A 0-dim complex tensor (or a real one with a complex dtype=) over dim 0 or -1, the tensor itself: its
    value, as torch gives it (this raised: the dim was taken for the pair dim of its (real, imaginary) view)."""
    for x, kwargs in [(torch.tensor(1 + 2j, device=device), {}), (torch.tensor(3.0, device=device),
                                                                  {"dtype": torch.complex64})]:
        for dim in (0, -1, (0,)):
            for keepdim in (False, True):
                got = ours(name)(x, dim, keepdim, **kwargs)
                want = torch_op(name)(x, dim, keepdim, **kwargs)
                assert got.shape == want.shape and got.dtype == want.dtype, (x, dim, keepdim)
                torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_mean_with_an_infinite_part(dtype, device):
    """Each part's mean on its own (README): inf in one part leaves the other part's mean finite, where torch's
    division by the count as a complex number makes it NaN."""
    x = torch.tensor([[1 + 2j, complex(math.inf, 0), 3 - 5j], [2j, complex(0, -math.inf), 1]], dtype=dtype,
                     device=device)
    got = torch.view_as_real(torch_reduce.mean(x, 1)).cpu().double()
    want = torch.tensor([[math.inf, -1.0], [1 / 3, -math.inf]], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_complex_int_mean_dtype(device):
    i = torch.randint(-50, 50, (5, 8), device=device)
    assert torch.equal(torch_reduce.mean(i, 1, dtype=torch.complex128).cpu(),
                       torch.mean(i.cpu(), 1, dtype=torch.complex128))
    with pytest.raises(RuntimeError, match="could not infer output dtype"):
        torch_reduce.mean(i)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_complex_autograd(name, device):
    x = torch.randn(4, 5, 3, dtype=torch.complex128, device=device, requires_grad=True)
    for dim in (None, 1, (0, 2)):
        torch.autograd.gradcheck(lambda t: ours(name)(t, dim), (x,))
        torch.autograd.gradgradcheck(lambda t: ours(name)(t, dim), (x,))
    g, = torch.autograd.grad(ours(name)(x, 1).abs().sum(), x)
    g_torch, = torch.autograd.grad(torch_op(name)(x, 1).abs().sum(), x)
    torch.testing.assert_close(g, g_torch)
    # A real input summed as complex (dtype=): the gradient is real, that of the cast (torch's own sum raises
    # in the autograd engine here), without a "discards the imaginary part" warning.
    r = torch.randn(4, 5, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(5, dtype=torch.complex128, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g, = torch.autograd.grad((ours(name)(r, 0, dtype=torch.complex128) * w).sum().abs(), r)
    g_cast, = torch.autograd.grad((torch_op(name)(r.to(torch.complex128), 0) * w).sum().abs(), r)
    assert g.dtype == torch.float64
    torch.testing.assert_close(g, g_cast)


def complex_reference_product(x, dims, keepdim):
    """torch's complex product in complex128, one dim at a time (torch.prod takes one)."""
    out = x.cpu().to(torch.complex128)
    dims = sorted(d % max(x.dim(), 1) for d in (range(x.dim()) if dims is None else
                                                 [dims] if isinstance(dims, int) else dims))
    for d in reversed(dims):
        out = out.prod(d, keepdim=True) if x.dim() else out
    return out if keepdim or not x.dim() else out.squeeze(dims)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_prod(dtype, device):
    """Against complex128, relative to the product of the magnitudes (a product's rounding scale): every path's
    shape, conjugate, transposed and stepped views, keepdim, dtype= both ways, 0-dim and empty inputs. Each factor
    has a magnitude near 1, so the products of thousands stay finite."""
    for shape, dim in PATHS:
        x = torch.polar(1 + 0.01 * torch.randn(shape, dtype=torch.float64), 7 * torch.rand(shape, dtype=torch.float64))
        x = x.to(dtype).to(device)
        views = [x, x.conj()] + ([x.t(), x[:, 1::2]] if x.dim() == 2 else [])
        for view in views:
            for keepdim in (False, True):
                got = ours("prod")(view, dim, keepdim)
                want = complex_reference_product(view, dim, keepdim)
                scale = complex_reference_product(view.abs().to(torch.complex128), dim, keepdim).abs()
                # Every one of the n - 1 products rounds, and each rounding reaches the result whatever the
                # order: about sqrt(n) roundings of |result| (random signs), n at worst.
                count = view.numel() // max(want.numel(), 1)
                rtol = 4 * count ** 0.5 * torch.finfo(dtype.to_real()).eps
                assert got.dtype == dtype and got.shape == want.shape
                assert bool(((got.cpu().to(torch.complex128) - want).abs() <= rtol * scale).all()), (shape, dim)
    r = torch.randn(7, 9, device=device)
    got = ours("prod")(r, 1, dtype=dtype)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), torch.prod(r.cpu(), 1, dtype=dtype))
    z = torch.randn(7, 9, dtype=dtype, device=device)
    with warnings.catch_warnings():  # dtype= real: the cast drops the imaginary parts, as torch's (which warns once)
        warnings.simplefilter("ignore")
        torch.testing.assert_close(ours("prod")(z, 1, dtype=dtype.to_real()).cpu(), torch.prod(z.cpu().real, 1))
    for dim in (None, 0, -1):
        s = torch.tensor(1 - 2j, dtype=dtype, device=device)
        assert ours("prod")(s, dim).item() == 1 - 2j and ours("prod")(s, dim).shape == ()
    empty = ours("prod")(torch.empty(4, 0, dtype=dtype, device=device), 1)
    assert empty.dtype == dtype and torch.equal(empty.cpu(), torch.ones(4, dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_complex_prod_autograd(device):
    """torch's gradients (the conjugate of the other factors' product), zeros included; double backward."""
    x = torch.randn(4, 5, 3, dtype=torch.complex128, device=device, requires_grad=True)
    for dim in (None, 1, (0, 2)):
        torch.autograd.gradcheck(lambda t: ours("prod")(t, dim), (x,))
        torch.autograd.gradgradcheck(lambda t: ours("prod")(t, dim), (x,))
    z = x.detach().clone()
    z[0, 1, 2] = 0
    z[1, 2] = 0  # two zeros in a slice
    z.requires_grad_()
    g, = torch.autograd.grad(ours("prod")(z, 1).abs().sum(), z)
    g_torch, = torch.autograd.grad(torch.prod(z, 1).abs().sum(), z)
    torch.testing.assert_close(g, g_torch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_errors(dtype, device):
    x = torch.randn(3, 4, dtype=dtype, device=device)
    for name in ("amax", "amin"):  # torch has no max or min of complex numbers either
        with pytest.raises(NotImplementedError):
            torch_op(name)(x.cpu())
        for t in (x, x.to("meta")):
            with pytest.raises(NotImplementedError, match=f"\"{name}\" not implemented for 'Complex"):
                ours(name)(t, 1)
        # torch's order: the dims' and the empty input's errors first, and an empty result is returned, not refused
        # (but with requires_grad, autograd's error for a complex output).
        empty = torch.randn(0, 3, dtype=dtype, device=device)
        for t, args in ((x, (5,)), (x, ((1, 1),)), (empty, ()), (empty, (0,)), (empty, ((1, 1),)), (empty, (1,)),
                        (empty, (1, True)), (empty, (-1,))):
            for requires_grad in (False, True):
                try:
                    expected = torch_op(name)(t.detach().cpu().requires_grad_(requires_grad), *args)
                except Exception as error:  # noqa: BLE001 - whichever torch raises
                    for where in (t, t.to("meta")):
                        with pytest.raises(type(error), match=re.escape(str(error)[:24])):
                            ours(name)(where.detach().requires_grad_(requires_grad), *args)
                else:
                    for where in (t, t.to("meta")):
                        got = ours(name)(where.detach().requires_grad_(requires_grad), *args)
                        assert (got.dtype, got.shape, got.device) == (expected.dtype, expected.shape, where.device)
    # vector_norm's dtype= rules, in torch's words: complex for a complex input, real for a real one.
    for t, dtype in ((x, torch.float64), (x.real, torch.complex128)):
        with pytest.raises(RuntimeError) as theirs:
            torch.linalg.vector_norm(t.cpu(), dtype=dtype)
        for where in (t, t.to("meta")):
            with pytest.raises(RuntimeError, match=re.escape(str(theirs.value))):
                ours("vector_norm")(where, dtype=dtype)


# Bad dims raise torch's error in torch's order, whichever comes first: a dim out of range before a repeat (sum,
# mean, amax, amin; vector_norm and var_mean check each dim in turn), an empty reduction without an identity before
# either (named as the caller gave it). Fixed cases, then fresh random lists; the meta tensors' fake kernels too.
DIMS_ERROR_OPS = {
    "sum": (torch.sum, torch_reduce.sum), "mean": (torch.mean, torch_reduce.mean),
    "amax": (torch.amax, torch_reduce.amax), "amin": (torch.amin, torch_reduce.amin),
    "vector_norm": (lambda x, d: torch.linalg.vector_norm(x, 2, d), lambda x, d: torch_reduce.vector_norm(x, 2, d)),
    "vector_norm inf": (lambda x, d: torch.linalg.vector_norm(x, math.inf, d),
                        lambda x, d: torch_reduce.vector_norm(x, math.inf, d)),
    "var_mean": (torch.var_mean, torch_reduce.var_mean),
}


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("name", list(DIMS_ERROR_OPS))
def test_dims_errors_in_torchs_order(name, device):
    theirs, op = DIMS_ERROR_OPS[name]
    cases = [((), [0, 0, 1]), ((), [-1, -1]), ((2, 3), [0, 0, 2]), ((2, 3), [1, -1, -3]), ((2, 0), [-1]),
             ((2, 0), [-1, 2]), ((2, 0), [-1, 1]), ((2, 0), [0, -2, 5]), ((1, 0, 2), [-2, 0, -1])]
    for shape in ((), (3,), (2, 0), (1, 0, 2), (2, 3, 4)):
        for _ in range(6):
            bound = len(shape) + 2
            cases.append((shape, torch.randint(-bound, bound, (int(torch.randint(1, 5, ())),)).tolist()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # var_mean's degrees of freedom <= 0
        for shape, dims in cases:
            x = torch.randn(shape)
            try:
                theirs(x, dims)
            except (IndexError, RuntimeError) as error:
                with pytest.raises(type(error), match=f"^{re.escape(str(error).splitlines()[0])}"):
                    op(x.to(device), dims)
            else:
                op(x.to(device), dims)


def test_ints_past_int64_raise_like_torch():
    """A dim or a size past int64 raises torch's ValueError (an int) or TypeError (in a sequence); an order or a
    correction past what torch's Scalar holds (int64 or uint64) its OverflowError; a uint64 one is taken. The op's
    schema would raise a RuntimeError, and the C entry point read such an order as a float."""
    x = torch.randn(3, 4)
    F = torch.nn.functional
    calls = {"sum dim": (lambda v: torch.sum(x, v), lambda v: torch_reduce.sum(x, v)),
             "sum dims": (lambda v: torch.sum(x, [0, v]), lambda v: torch_reduce.sum(x, [0, v])),
             "amax dim": (lambda v: torch.amax(x, v), lambda v: torch_reduce.amax(x, v)),
             "var_mean dim": (lambda v: torch.var_mean(x, v), lambda v: torch_reduce.var_mean(x, v)),
             "layer_norm shape": (lambda v: F.layer_norm(x, [4, v]), lambda v: torch_reduce.layer_norm(x, [4, v])),
             "rms_norm shape": (lambda v: F.rms_norm(x, [v]), lambda v: torch_reduce.rms_norm(x, [v])),
             "vector_norm ord": (lambda v: torch.linalg.vector_norm(x, v), lambda v: torch_reduce.vector_norm(x, v)),
             "vector_norm ord, dim": (lambda v: torch.linalg.vector_norm(x, v, 1),
                                      lambda v: torch_reduce.vector_norm(x, v, 1)),
             "var_mean correction": (lambda v: torch.var_mean(x, 1, correction=v),
                                     lambda v: torch_reduce.var_mean(x, 1, correction=v))}
    for name, (theirs, ours) in calls.items():
        for v in (2**63 - 1, 2**63, 2**64, -2**63, -2**63 - 1, -2**64, 10**30):
            try:
                want = theirs(v)
            except (ValueError, TypeError, OverflowError) as error:  # the parser's: its words
                with pytest.raises(type(error), match=f"^{re.escape(str(error).splitlines()[0])}"):
                    ours(v)
            except (IndexError, RuntimeError) as error:  # a dim out of range, a shape that does not match
                with pytest.raises(type(error)):
                    ours(v)
            else:
                for got, expected in zip(*(r if isinstance(r, tuple) else (r,) for r in (ours(v), want))):
                    torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"{name}, {v}: {m}")


# A complex vector norm is the norm of the magnitudes: a real result, torch's gradients (through sgn).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("ord", [2, 1, 0, math.inf, -math.inf, 3, 0.5, -1.5], ids=str)
@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # torch's own order-0 norm of complex numbers
def test_complex_vector_norm(ord, dtype, device):
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    # The root of order p multiplies the sum's relative rounding by 1/|p| (p = 0.5: twice).
    root = 1 if ord in (0, math.inf, -math.inf) else max(1, 1 / abs(ord))
    rtol = (1e-12 if dtype == torch.complex128 else 1e-5) * root
    for shape, dim in PATHS:
        x = torch.randn(shape, dtype=dtype, device=device)
        views = [x, x.conj()] + ([x.t(), x[:, 1::2]] if x.dim() == 2 else [])
        for view in views:
            for keepdim in (False, True):
                got = torch_reduce.vector_norm(view, ord, dim, keepdim)
                want = torch.linalg.vector_norm(view.cpu().to(torch.complex128), ord, dim, keepdim)
                assert got.dtype == real and got.shape == want.shape, (got.dtype, got.shape, want.shape)
                torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=0)
    x = torch.randn(7, 9, dtype=torch.complex64, device=device)
    got = torch_reduce.vector_norm(x, ord, 1, dtype=torch.complex128)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), torch.linalg.vector_norm(x.cpu().to(torch.complex128), ord, 1),
                               rtol=1e-12, atol=0)
    # out= takes the result's real dtype (dtype='s, made real), as torch's; any other raises torch's error.
    for dtype, out_dtype in ((None, torch.float32), (torch.complex128, torch.float64), (None, torch.complex64),
                             (None, torch.float64), (torch.complex128, torch.complex128)):
        outs = [torch.empty(7, dtype=out_dtype, device=device) for _ in range(2)]
        try:
            torch.linalg.vector_norm(x, ord, 1, dtype=dtype, out=outs[0])
        except RuntimeError as theirs:
            with pytest.raises(RuntimeError, match=re.escape(str(theirs).splitlines()[0])):
                torch_reduce.vector_norm(x, ord, 1, dtype=dtype, out=outs[1])
            continue
        torch_reduce.vector_norm(x, ord, 1, dtype=dtype, out=outs[1])
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5 * root, atol=0)  # x is complex64 here


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ord", [2, 1, 0, math.inf, -math.inf, 0.5], ids=str)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:Casting complex values to real")
def test_complex32_vector_norm(ord, device):
    """complex32 as torch takes it: |z| in float16, a float16 norm (float32 with dtype=complex64)."""
    x = torch.randn(37, 65, dtype=torch.complex64, device=device).to(torch.complex32)
    for view in (x, x.conj(), x.t(), x[:, 1::2]):
        for dim in (None, 1, 0):
            got = torch_reduce.vector_norm(view, ord, dim)
            want = torch.linalg.vector_norm(view.cpu().to(torch.complex128), ord, dim)
            assert got.dtype == torch.float16 and got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want.half(), rtol=2e-3, atol=0)  # order 0.5 overflows to inf
    got = torch_reduce.vector_norm(x, ord, 1, dtype=torch.complex64)
    assert got.dtype == torch.float32
    assert torch_reduce.vector_norm(x.to("meta"), ord, 1).dtype == torch.float16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ord", [2, 1, math.inf, 3, 0.5], ids=str)
def test_complex_vector_norm_autograd(ord, device):
    """Backward, double backward and forward mode (gradcheck's complex derivatives), the gradient against torch's
    (zeros included: a zero subgradient there), opcheck and compile."""
    x = torch.randn(4, 5, 3, dtype=torch.complex128, device=device, requires_grad=True)
    for dim in (None, 1, (0, 2)):
        f = lambda t: torch_reduce.vector_norm(t, ord, dim)  # noqa: E731
        torch.autograd.gradcheck(f, (x,), check_forward_ad=True)
        torch.autograd.gradgradcheck(f, (x,))
    z = x.detach().clone()
    z[0, 0] = 0  # an element at 0
    z[1] = 0  # a norm of 0 (dim 1, 2)
    for dim in (None, 1, (1, 2)):
        a, b = (z.clone().requires_grad_() for _ in range(2))
        g, = torch.autograd.grad(torch_reduce.vector_norm(a, ord, dim).sum(), a)
        want, = torch.autograd.grad(torch.linalg.vector_norm(b, ord, dim).sum(), b)
        torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.library.opcheck(torch.ops.reduce.vector_norm.default, (x, ord, [1]), {})
    torch.compiler.reset()  # one lambda's code for every order: past dynamo's recompile limit otherwise
    compiled = torch.compile(lambda t: torch_reduce.vector_norm(t, ord, 1), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x.detach()), torch.linalg.vector_norm(x.detach(), ord, 1), rtol=1e-12, atol=0)


CAST_FIRST_INPUTS = [torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", CAST_FIRST_INPUTS, ids=str)
def test_inputs_without_kernels_cast_by_dtype(dtype, device):
    """sum, mean and prod cast the input to dtype= first, as torch's do: a float8 or complex32 input our kernels
    (and torch's CPU ones) do not read is taken where dtype= names a dtype they do, with torch's values, dtypes
    and gradients (in the input's dtype); without one it raises NotImplementedError, the class of torch's own
    refusal, on every device and in the fake kernels."""
    base = torch.randn(6, 5, 4, device=device)
    x = (torch.complex(base, base.flip(0)) if dtype.is_complex else base).to(dtype)
    wide = [torch.complex64, torch.complex128] if dtype.is_complex else [torch.float32, torch.float64, torch.bfloat16]
    for name in ("sum", "mean", "prod"):
        for out_dtype in wide:
            for dims in ((), (1,), (-1, True), ((0, 2),)):
                if name == "prod" and dims and isinstance(dims[0], tuple):
                    continue  # torch.prod takes one dim
                got = ours(name)(x, *dims, dtype=out_dtype)
                want = torch_op(name)(x.cpu(), *dims, dtype=out_dtype)
                assert got.dtype == want.dtype == out_dtype and got.shape == want.shape, (name, out_dtype, dims)
                torch.testing.assert_close(got.cpu(), want, rtol=1e-2 if out_dtype == torch.bfloat16 else 1e-5,
                                           atol=1e-5)
                fake = ours(name)(x.to("meta"), *dims, dtype=out_dtype)
                assert (fake.dtype, fake.shape) == (got.dtype, got.shape)
        with pytest.raises(NotImplementedError, match=f"{name}: unsupported dtype"):
            ours(name)(x, 1)
        with pytest.raises(NotImplementedError, match=f"{name}: unsupported dtype"):
            ours(name)(x.to("meta"), 1)
        with pytest.raises(NotImplementedError):
            torch_op(name)(x.cpu(), 1)
    if not dtype.is_complex:  # float8 leaves take gradients: sum's, in the input's dtype, as torch's
        leaf = x.detach().requires_grad_()
        (grad,) = torch.autograd.grad(torch_reduce.sum(leaf, 1, dtype=torch.float32).sum(), leaf)
        twin = x.detach().cpu().requires_grad_()
        (want,) = torch.autograd.grad(torch.sum(twin, 1, dtype=torch.float32).sum(), twin)
        assert grad.dtype == want.dtype == dtype and torch.equal(grad.cpu().float(), want.float())
        # Forward mode and the functorch transforms take the composite path: the same cast first.
        tangent = torch.randn(x.shape, device=device).to(dtype)
        for name in ("sum", "mean"):
            got = torch.func.jvp(lambda t: ours(name)(t, 1, dtype=torch.float32), (x,), (tangent,))
            want = torch.func.jvp(lambda t: torch_op(name)(t, 1, dtype=torch.float32), (x.cpu(),), (tangent.cpu(),))
            for g, w in zip(got, want):
                torch.testing.assert_close(g.cpu(), w)
            batched = torch.func.vmap(lambda t: ours(name)(t, 0, dtype=torch.float32))(x)
            torch.testing.assert_close(batched.cpu(), torch_op(name)(x.cpu(), 1, dtype=torch.float32))
    # opcheck's schema test perturbs the input arithmetically, which torch cannot in float8.
    utils = ["test_faketensor", "test_aot_dispatch_dynamic"] + ([] if dtype.is_floating_point else ["test_schema"])
    torch.library.opcheck(torch.ops.reduce.sum.default, (x, [1]), {"dtype": wide[0]}, test_utils=utils)


def test_opcheck_new_dtypes():
    for args, kwargs in (((torch.randn(5, 6, dtype=torch.complex64), [1]), {}),
                         ((torch.randn(5, 6, dtype=torch.complex128, requires_grad=True), [0]), {}),
                         ((torch.randint(0, 60000, (5, 6)).to(torch.uint16), [1]), {}),
                         ((torch.randn(5, 6), [0]), {"dtype": torch.complex64})):
        torch.library.opcheck(torch.ops.reduce.sum.default, args, kwargs)
    torch.library.opcheck(torch.ops.reduce.mean.default, (torch.randn(5, 6, dtype=torch.complex64), [1]))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    """The fake kernels give the new dtypes' shapes and dtypes; out= (of the right shape: dynamo does not resize
    graph inputs, for torch.sum either; its dtype rules in Python that dynamo traces) and dim=None trace in the
    wrappers."""
    z = torch.randn(5, 7, dtype=torch.complex64, device=device)
    u = wide_unsigned((5, 7), torch.uint16, device)
    x = torch.randn(4, 3, device=device)
    fn = torch.compile(lambda z, u, x, o, m, n: (
        torch_reduce.sum(z, 1), torch_reduce.mean(z), torch_reduce.sum(u, 0), torch_reduce.amax(x, None),
        torch_reduce.sum(x, 1, out=o), torch_reduce.mean(x, 1, out=m), torch_reduce.vector_norm(z, 2, 1, out=n)),
        fullgraph=True)
    outs = (torch.empty(4, device=device), torch.empty(4, device=device, dtype=torch.float64),
            torch.empty(5, device=device))
    got = fn(z, u, x, *outs)
    want = (z.sum(1), z.mean(), u.cpu().sum(0).to(device), x.amax(), x.sum(1), x.mean(1).double(),
            torch.linalg.vector_norm(z, 2, 1))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)
    for g, o in zip(got[4:], outs):
        assert g.data_ptr() == o.data_ptr()


def test_dtype_rules_as_torchs():
    """The dtype rules the wrappers compute in Python (TorchDynamo cannot trace torch's: they return no tensor)
    give torch.result_type's, torch.can_cast's and dtype.to_real's answers for every pair of dtypes."""
    from torch_reduce.ops import _can_cast, _real_dtype, _result_type
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128]
    for a in dtypes:
        assert _real_dtype(a) == a.to_real()
        for b in dtypes:
            assert _can_cast(a, b) == torch.can_cast(a, b), (a, b)
            for a_shape, b_shape in [((2,), ()), ((), (2,)), ((2,), (2,)), ((), ())]:
                x, y = torch.zeros(a_shape, dtype=a), torch.zeros(b_shape, dtype=b)
                try:
                    want = torch.result_type(x, y)
                except RuntimeError:
                    continue
                assert _result_type(x, y) == want, (a, a_shape, b, b_shape)


# ----------------------------------------------------------------------------------------- sparse ----

def sparse_layouts(device):
    x = torch.randn(4, 6, device=device)
    x[x.abs() < 0.7] = 0
    return {"torch.sparse_coo": x.to_sparse(), "torch.sparse_csr": x.to_sparse_csr(),
            "torch.sparse_csc": x.to_sparse_csc(), "torch.sparse_bsr": x.to_sparse_bsr((2, 2)),
            "torch.sparse_bsc": x.to_sparse_bsc((2, 3))}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OUT_OPS)
def test_sparse_refused_by_the_op(name, device):
    """A clear error from our op, naming the layout (never the dispatcher's "Could not run"), on the plain,
    autograd and inference paths."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR support is in beta state
        layouts = sparse_layouts(device)
    for layout, s in layouts.items():
        hint = "torch.sum sums sparse tensors" if name == "sum" else "densify it with .to_dense()"
        message = f"torch_reduce.{name} takes strided \\(dense\\) tensors, got {layout}; {hint}"
        for mode in ("plain", "grad", "inference"):
            t = s.clone().requires_grad_() if mode == "grad" else s
            with pytest.raises(NotImplementedError, match=message):
                if mode == "inference":
                    with torch.inference_mode():
                        ours(name)(t)
                else:
                    ours(name)(t)
        with pytest.raises(NotImplementedError, match=message):
            getattr(torch.ops.reduce, name)(s)
        if name == "sum":  # what the message points to
            torch.testing.assert_close(torch.sum(s), torch.sum(s.to_dense()))


def test_sparse_fake_kernel_raises_the_same():
    from torch_reduce.ops import _check_layout
    s = torch.randn(3, 4).to_sparse()
    with pytest.raises(NotImplementedError) as fake:
        _check_layout("sum", s)
    with pytest.raises(NotImplementedError) as real:
        torch_reduce.sum(s)
    assert str(fake.value) == str(real.value).split("\n")[0]


# ------------------------------------------------------------------------------- fake kernels ----

EVERY_DTYPE = FLOAT_DTYPES + [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool] + \
    WIDE_UNSIGNED + [torch.complex32] + COMPLEX + [torch.float8_e4m3fn]


def first_line_or_shapes(fn, *args, **kwargs):
    """What a call gives: its outputs' shapes and dtypes, or its exception's type and first line."""
    try:
        out = fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001
        return type(error).__name__, (str(error).strip().splitlines() or [""])[0]
    return [(tuple(t.shape), t.dtype) for t in (out if isinstance(out, (tuple, list)) else (out,))]


def test_fake_kernels_agree_with_the_real_ones():
    """Every op on every dtype, 0-dim, empty and 2-D inputs, dims in and out of range, repeated, and dtype=:
    the fake kernel (the call on meta tensors) gives the real kernel's shapes and dtypes, or raises its
    exception in its words."""
    ops = torch.ops.reduce
    calls = []
    for dtype in EVERY_DTYPE:
        for shape in [(), (0, 3), (3, 4)]:
            x = torch.zeros(shape).to(dtype) if dtype != torch.float8_e4m3fn else torch.zeros(shape, dtype=dtype)
            for block_size in (256, 100, 2048):
                calls.append((ops.sum_vec, (x,), {"block_size": block_size}))
            for dim in (None, [], [0], [-1], [1, -1], [2]):
                calls.append((ops.var_mean, (x, dim), {"correction": 2.5, "keepdim": True}))
                if dim is not None:
                    calls += [(ops.amax, (x, dim, True), {}), (ops.amin, (x, dim, False), {})]
                for out in (None, torch.float32, torch.int64, torch.uint16, torch.complex64):
                    calls += [(getattr(ops, name), (x, dim, False), {"dtype": out}) for name in ("sum", "mean", "prod")]
                    calls.append((ops.vector_norm, (x, 0.5, dim, True), {"dtype": out}))
    disagree = []
    for op, args, kwargs in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # casts of complex values to real
            real = first_line_or_shapes(op, *args, **kwargs)
            fake = first_line_or_shapes(op, *[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args],
                                        **kwargs)
        if fake != real:
            disagree.append(f"{op}({args[0].dtype}, {args[1:]}, {kwargs}): {real} on the CPU, {fake} on meta")
    assert not disagree, f"{len(disagree)} of {len(calls)} calls:\n" + "\n".join(disagree[:20])


# -------------------------------------------------------------------------------------------- out= ----

def call(fn, name, x, dim, **kwargs):
    if name == "vector_norm":
        return fn(x, 2, dim, **kwargs)
    return fn(x, dim, **kwargs)


def outcome(thunk):
    """(result, None) or (None, the exception); warnings recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return thunk(), None, [w for w in caught if "resized" in str(w.message)]
        except Exception as error:  # noqa: BLE001  (compared with torch's below)
            return None, error, []


def first_line(error):
    return str(error).split("\n")[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OUT_OPS)
def test_out_like_torch(name, device):
    x = torch.randn(5, 7, device=device)[:, 1:]
    ints = torch.randint(-9, 9, (5, 6), device=device, dtype=torch.int32)
    out_dtypes = [torch.float32, torch.float64, torch.float16, torch.int64, torch.int8, torch.complex64, torch.bool]
    for inp in (x, ints):
        for dtype in (None, torch.float64):
            for out_dtype in out_dtypes:
                for out_shape in ((6,), (0,), (2, 3), (5,)):
                    kwargs = {} if dtype is None or name in ("amax", "amin") else {"dtype": dtype}
                    o_theirs = torch.full(out_shape, 7, dtype=out_dtype, device=device)
                    o_ours = o_theirs.clone()
                    want, err_t, warn_t = outcome(lambda: call(torch_op(name), name, inp, 0, out=o_theirs, **kwargs))
                    got, err_o, warn_o = outcome(lambda: call(ours(name), name, inp, 0, out=o_ours, **kwargs))
                    case = (name, inp.dtype, dtype, out_dtype, out_shape)
                    if (name == "mean" and not out_dtype.is_floating_point and not out_dtype.is_complex
                            and (err_t is None or isinstance(err_t, NotImplementedError))):
                        # torch 2.11's CUDA mean writes a float mean into an integer out (and has no bool one);
                        # ours refuses with the error torch's CPU gives (torch 2.14's too), never a silently
                        # truncated mean.
                        assert isinstance(err_o, RuntimeError) and "can't be cast" in str(err_o), case
                        continue
                    if err_t is not None:
                        assert type(err_o) is type(err_t), (case, err_t, err_o)
                        assert first_line(err_o) == first_line(err_t), case
                        continue
                    assert err_o is None, (case, err_o)
                    assert got is o_ours and want is o_theirs
                    assert o_ours.shape == o_theirs.shape and o_ours.dtype == o_theirs.dtype
                    assert len(warn_o) == len(warn_t), case
                    tol = {"rtol": 1e-3, "atol": 1e-3} if out_dtype == torch.float16 else {}
                    torch.testing.assert_close(o_ours, o_theirs, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OUT_OPS)
def test_out_keeps_its_strides_and_rules(name, device):
    x = torch.randn(6, 4, device=device)
    base = torch.zeros(6, 2, device=device)
    out = base[:, 0]  # non-contiguous, the right shape: written in place
    assert call(ours(name), name, x, 1, out=out) is out
    torch.testing.assert_close(base[:, 0], call(torch_op(name), name, x, 1))
    assert bool((base[:, 1] == 0).all()) and out.stride() == (2,)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        call(ours(name), name, x.clone().requires_grad_(), 1, out=torch.empty(6, device=device))
    with torch.no_grad():
        call(ours(name), name, x.clone().requires_grad_(), 1, out=torch.empty(6, device=device))
    with pytest.raises(RuntimeError, match="cross-device copies are not allowed"):
        call(ours(name), name, x, 1, out=torch.empty(6, device="meta"))
    if name in ("sum", "prod"):  # torch takes out= only with a dim (sum's may be None)
        with pytest.raises(TypeError):
            torch_op(name)(x, out=torch.empty((), device=device))
        with pytest.raises(TypeError, match="out= needs dim"):
            ours(name)(x, out=torch.empty((), device=device))
        o = torch.empty((), device=device)
        torch.testing.assert_close(ours(name)(x, None, out=o), torch_op(name)(x.flatten(), 0))
        assert o.shape == ()
    else:
        o = torch.empty(3, device=device)
        with pytest.warns(UserWarning, match="was resized"):
            r = call(ours(name), name, x, None, out=o)
        torch.testing.assert_close(r, call(torch_op(name), name, x, None))
    if name == "amax":  # amax(x, dim=None, out=) as torch.amax takes it
        o = torch.empty((), device=device)
        torch.testing.assert_close(torch_reduce.amax(x, dim=None, out=o), torch.amax(x, dim=None))


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "amax", "amin", "vector_norm", "var_mean"])
def test_keepdim_without_dim_like_torch(name):
    """keepdim= without dim: sum, mean and prod raise torch's TypeError (keepdim belongs to their overload with
    dim; dim=None then reduces every dim), the others reduce every dim, as torch's do."""
    x = torch.randn(3, 4)
    theirs = {"vector_norm": torch.linalg.vector_norm}.get(name, getattr(torch, name, None))
    for keepdim in (True, False):
        try:
            want = theirs(x, keepdim=keepdim)
        except TypeError:
            with pytest.raises(TypeError, match="keepdim= needs dim"):
                getattr(torch_reduce, name)(x, keepdim=keepdim)
            got = getattr(torch_reduce, name)(x, None, keepdim)
            want = theirs(x, None, keepdim) if name != "prod" else torch.prod(x).reshape((1, 1) if keepdim else ())
        else:
            got = getattr(torch_reduce, name)(x, keepdim=keepdim)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "amax", "amin", "vector_norm", "var_mean"])
@pytest.mark.parametrize("value", [0, 1, None, np.bool_(True)], ids=repr)
def test_bool_arguments_are_bools_like_torch(name, value):
    """keepdim (and var_mean's unbiased) must be a Python bool, as torch's argument parser has it: the op's schema
    would read 0, 1, None or numpy's bool as a bool."""
    x = torch.randn(3, 4)
    theirs = {"vector_norm": torch.linalg.vector_norm}.get(name, getattr(torch, name, None))
    calls = [((1,), {"keepdim": value}), ((1, value), {})]  # var_mean's second positional is unbiased
    if name == "var_mean":
        calls.append(((1,), {"unbiased": value}))
    for args, kwargs in calls:
        if name == "vector_norm":
            args, kwargs = (), {"dim": 1, "keepdim": value}
        with pytest.raises(TypeError):
            theirs(x, *args, **kwargs)
        with pytest.raises(TypeError):
            getattr(torch_reduce, name)(x, *args, **kwargs)
    if name == "var_mean":  # the (input, unbiased) form takes nothing else, keepdim=False included
        with pytest.raises(TypeError):
            torch.var_mean(x, True, keepdim=False)
        with pytest.raises(TypeError, match="takes no other arguments"):
            torch_reduce.var_mean(x, True, keepdim=False)


def test_var_mean_has_no_out_like_torch():
    x = torch.randn(3, 4)
    with pytest.raises(TypeError):
        torch.var_mean(x, 1, out=(torch.empty(3), torch.empty(3)))
    with pytest.raises(TypeError):
        torch_reduce.var_mean(x, 1, out=(torch.empty(3), torch.empty(3)))
