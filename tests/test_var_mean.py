"""torch_reduce.var_mean (torch.ops.reduce.var_mean) against torch.var_mean."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import torch_reduce
from conftest import DEVICES, requires_cuda

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
       torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
HIDDEN = [1, 7, 32, 33, 768, 1000, 1024, 4097, 8192, 12288]


# torch.var_mean warns when N - correction <= 0; the edge tests mean it.
pytestmark = pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom")


def check(x, dim=None, correction=1, keepdim=False):
    var, mean = torch_reduce.var_mean(x, dim, correction=correction, keepdim=keepdim)
    # The reference: float64 statistics, rounded to the input's dtype once (what float32 math gives).
    ref_var, ref_mean = torch.var_mean(x.double(), dim, correction=correction, keepdim=keepdim)
    assert var.dtype == mean.dtype == x.dtype and var.device == x.device
    assert var.shape == mean.shape == ref_var.shape
    torch.testing.assert_close(mean, ref_mean.to(x.dtype), equal_nan=True, **TOL[x.dtype])
    torch.testing.assert_close(var, ref_var.to(x.dtype), equal_nan=True, **TOL[x.dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rows(hidden, dtype, device):
    x = torch.randn(37, hidden, device=device).to(dtype)
    check(x, -1)
    check(x, 1, correction=0, keepdim=True)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=0, max_size=4), data=st.data(),
       dtype=st.sampled_from(list(TOL)), correction=st.integers(0, 2), keepdim=st.booleans())
def test_dims(device, shape, data, dtype, correction, keepdim):
    x = torch.randn(shape, device=device).to(dtype)
    ndim = max(len(shape), 1)
    dim = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                              st.lists(st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim,
                                       unique_by=lambda d: d % ndim).map(tuple)))
    check(x, dim, correction, keepdim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 100_003, 3_000_017])
def test_full(n, device):
    check(torch.randn(n, device=device))
    check(torch.randn(n, device=device)[1:], correction=0)


@pytest.mark.parametrize("device", DEVICES)
def test_views_and_few_long_rows(device):
    base = torch.randn(64, 301, device=device)
    check(base.t(), -1)
    check(base[:, 1:], -1)
    check(base.t(), (0,))
    check(torch.randn(3, 300_001, device=device), -1)
    for hidden in (64, 2048, 40000):  # 4 bytes past a 16-byte boundary: the streaming kernels
        check(torch.randn(7 * hidden + 1, device=device)[1:].view(7, hidden), -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4, 1000), (2, 3, 1_000_000), (2_000_000,)])
def test_stable_with_large_mean(shape, device):
    """mean 1e4, std 1: E[x^2] - E[x]^2 would lose every digit in float32; Welford / two passes keep them."""
    x64 = 1e4 + torch.randn(shape, device=device, dtype=torch.float64)
    x = x64.float()
    for dim in (-1, None):
        var, mean = torch_reduce.var_mean(x, dim)
        ref_var, ref_mean = torch.var_mean(x.double(), dim)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=0)
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-4, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_edges(device):
    check(torch.randn(5, 0, device=device), -1)  # empty rows: NaN
    check(torch.randn(0, 5, device=device), -1)  # no rows
    check(torch.randn(5, 1, device=device), -1)  # N - correction = 0
    check(torch.randn(5, 2, device=device), -1, correction=3)
    check(torch.tensor(3.0, device=device), None, correction=0)
    x = torch.randn(4, 8, device=device)
    x[1, 3] = float("nan")
    check(x, -1)  # (inf is left out: torch's own Welford gives an order-dependent inf or NaN mean)


def test_errors():
    with pytest.raises(RuntimeError, match="floating point"):
        torch_reduce.var_mean(torch.arange(10))
    with pytest.raises((RuntimeError, IndexError), match="range|Dimension"):
        torch_reduce.var_mean(torch.randn(3, 4), 2)
    with pytest.raises(RuntimeError, match="appears multiple times|repeat"):
        torch_reduce.var_mean(torch.randn(3, 4), (1, -1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (-1, False), ((0, 2), True), ((0, 2), False)])
def test_gradcheck(device, dim, keepdim):
    x = torch.randn(3, 4, 5, device=device, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: torch_reduce.var_mean(t, dim, keepdim=keepdim), (x,))
    torch.autograd.gradcheck(lambda t: torch_reduce.var_mean(t, dim, correction=0, keepdim=keepdim)[0], (x,))
    torch.autograd.gradcheck(lambda t: torch_reduce.var_mean(t, dim, keepdim=keepdim)[1], (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(6, 40, device=device, requires_grad=True)
    for args, kwargs in [((x, [-1]), {}), ((x, None), {"correction": 0}), ((x, [0]), {"keepdim": True}),
                         ((x.detach().half(), [1]), {})]:
        torch.library.opcheck(torch.ops.reduce.var_mean.default, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    def f(t):
        var, mean = torch_reduce.var_mean(t, -1, keepdim=True)
        return (t - mean) / (var + 1e-5).sqrt()

    x = torch.randn(8, 64, device=device)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    torch.testing.assert_close(compiled(x), f(x))


@requires_cuda
def test_cuda_deterministic():
    x = torch.randn(3, 2_000_003, device="cuda")
    first = torch_reduce.var_mean(x, -1)
    full = torch_reduce.var_mean(x)
    for _ in range(10):
        for a, b in zip(first + full, torch_reduce.var_mean(x, -1) + torch_reduce.var_mean(x)):
            assert torch.equal(a, b)


@requires_cuda
def test_cuda_more_than_2_31_elements():
    """(2^21 + 1) rows of 1024 fp16: 2^31 + 1024 elements, 4 GiB; rows past 2^31 elements use 64-bit offsets."""
    rows = 2**21 + 1
    try:
        x = torch.empty(rows, 1024, device="cuda", dtype=torch.float16)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    x.normal_()
    x[-1] = 5.0 + torch.arange(1024, device="cuda", dtype=torch.float16) / 1024  # the last row, past 2^31
    var, mean = torch_reduce.var_mean(x, -1)
    ref = torch.var_mean(x[-1].double())
    torch.testing.assert_close(var[-1].double(), ref[0], rtol=2e-3, atol=1e-3)
    torch.testing.assert_close(mean[-1].double(), ref[1], rtol=2e-3, atol=1e-3)
    var_all, mean_all = torch_reduce.var_mean(x)
    ref_var, ref_mean = torch.var_mean(x)  # fp16 in, float32 inside: no 8 GiB float copy
    torch.testing.assert_close(var_all, ref_var, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(mean_all, ref_mean, rtol=1e-2, atol=1e-3)
