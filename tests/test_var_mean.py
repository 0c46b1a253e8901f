"""torch_reduce.var_mean (torch.ops.reduce.var_mean) against a float64 reference: hidden sizes, drawn dims,
long and few rows, views, numerical stability with a large mean, edges. The contract suite
(tests/test_op_contract.py, from the specs in tests/op_specs.py) runs the rest: autograd, opcheck, compile, bad
inputs, determinism, > 2^31 elements, streams, CUDA graphs and two GPUs."""
import contextlib
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import torch_reduce
from conftest import DEVICES, seed_torch

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12),
       torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
HIDDEN = [1, 7, 32, 33, 768, 1000, 1024, 4097, 8192, 12288, 18432, 32768]


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
    seed_torch(data)
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
        # 1e-3: float32 Welford merges of partial means near 1e4 leave ~1e-4 of the variance (H200: 1.06e-4
        # once); the lost-digits formula misses by 100%.
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-3, atol=0)
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-4, atol=0)


@pytest.mark.parametrize("shape", [(4, 1000), (3, 4099), (200_003,)])
@pytest.mark.parametrize("first", ["near", "outlier"])
def test_cpu_one_pass_keeps_float32_digits(shape, first):
    """The CPU's one pass over 32-bit inputs sums d = x - x[0] and d^2 in double. Mean 1e3 and std 1e-2 (mean^2 /
    var = 1e10): E[x^2] - E[x]^2 even in double would lose 2^-20 of the variance, more than float32 keeps; the
    shift keeps it to the output's rounding, also when x[0] is an outlier (-1e3, then x0 is far from the mean but
    (mean - x0)^2 <= n var). Long single rows take the chunked path."""
    x = (1e3 + 1e-2 * torch.randn(shape, dtype=torch.float64)).float()
    if first == "outlier":
        x[..., 0] = -1e3
    for dim in (-1, None):
        var, mean = torch_reduce.var_mean(x, dim, correction=0)
        ref_var, ref_mean = torch.var_mean(x.double(), dim, correction=0)
        torch.testing.assert_close(var.double(), ref_var, rtol=2**-22, atol=0)
        torch.testing.assert_close(mean.double(), ref_mean, rtol=2**-22, atol=0)



def test_cpu_float64_long_rows_fold_pairwise():
    """Several float64 rows of 5e6 normals (each row one task, not chunked): its sums run 64 terms a lane, then
    pairwise; in 8 running lanes the mean was 6e-11 off (relative to mean |x|), torch's 1e-13."""
    import math

    x = torch.randn(2, 5_000_000, dtype=torch.float64)
    var, mean = torch_reduce.var_mean(x, -1)
    exact = torch.tensor([math.fsum(row) / len(row) for row in x.tolist()], dtype=torch.float64)
    assert ((mean - exact).abs() <= 1e-12 * x.abs().mean()).all(), (mean - exact)
    torch.testing.assert_close(var, torch.var(x, -1), rtol=1e-12, atol=0)

@pytest.mark.parametrize("device", DEVICES)
def test_edges(device):
    check(torch.randn(5, 0, device=device), -1)  # empty rows: NaN
    check(torch.randn(0, 5, device=device), -1)  # no rows
    check(torch.randn(5, 1, device=device), -1)  # N - correction = 0
    check(torch.randn(5, 2, device=device), -1, correction=3)
    check(torch.tensor(3.0, device=device), None, correction=0)
    x = torch.randn(4, 8, device=device)
    x[1, 3] = float("nan")
    check(x, -1)
    # An inf (torch's own Welford gives an order-dependent inf or NaN mean): torch.mean's mean, a NaN variance; both
    # signs in a row: NaN for both. Rows of 8 and of 1000 (the GPU's warp and block rows).
    for cols in (8, 1000):
        x = torch.randn(4, cols, device=device)
        inf = float("inf")
        x[0, 0], x[1, 3], x[2, 5], x[3, 1], x[3, 6] = inf, -inf, inf, inf, -inf
        var, mean = torch_reduce.var_mean(x, -1)
        torch.testing.assert_close(mean, torch.mean(x, -1), equal_nan=True)
        assert var.isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=str)
def test_warns_as_torch(device, dtype):
    """torch.var_mean's warning where N - correction <= 0 (expanded dims counted), on the same calls and no others,
    a Python UserWarning."""
    x = torch.randn(3, 2, dtype=dtype, device=device)
    calls = [(x[:, :1], 1, 1), (x[:, :1], 1, 0), (x, 1, 2), (x, 1, 1.5), (x, 1, 2.5), (x[:, :0], 1, 1),
             (x[:0, :1], 1, 1), (x, None, 6), (x, None, 5), (x[:, :1].expand(3, 4), 1, 4), (x[0, 0], None, 1)]
    for t, dim, correction in calls:
        seen = []
        for var_mean in (torch.var_mean, torch_reduce.var_mean):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                var_mean(t, dim, correction=correction)
            seen.append([w for w in caught if "degrees of freedom is <= 0" in str(w.message)])
        theirs, ours = seen
        assert bool(ours) == bool(theirs), (tuple(t.shape), dim, correction)
        assert all(w.category is UserWarning for w in ours)
    # The unbiased forms (positional, keyword, a bool in dim's place) warn as Python's too, not on c10's log.
    single = x[:, :1]
    for args, kwargs in (((single, 1, True), {}), ((single, 1), {"unbiased": True, "keepdim": True}),
                         ((single[0, 0], True), {}), ((x, 1, False), {})):
        seen = []
        for var_mean in (torch.var_mean, torch_reduce.var_mean):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                var_mean(*args, **kwargs)
            seen.append([w.category for w in caught if "degrees of freedom is <= 0" in str(w.message)])
        theirs, ours = seen  # torch warns twice for a complex input (its real and imaginary parts), ours once
        assert bool(ours) == bool(theirs) and set(ours) <= {UserWarning}, (args, kwargs)
    # A tensor subclass and a __torch_function__ mode take the wrapper, whose op call (torch.ops) would send the
    # warning to c10's log: Python's too, once.

    class Subclass(torch.Tensor):
        pass

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for t, mode in ((single.as_subclass(Subclass), contextlib.nullcontext()), (single, Mode()), (x, Mode())):
        with warnings.catch_warnings(record=True) as caught, mode:
            warnings.simplefilter("always")
            torch_reduce.var_mean(t, 1)
        ours = [w.category for w in caught if "degrees of freedom is <= 0" in str(w.message)]
        assert ours == ([UserWarning] if t.shape[1] == 1 else []), (type(t), mode)


# Reductions over nothing: the variance is NaN at every correction, as torch's, though a negative one makes
# N - correction positive (0 / 1 would be 0).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("correction", [-2, -1, -0.5, 0, 1], ids=str)
@pytest.mark.parametrize("shape,dim", [((0,), None), ((0, 5), 0), ((3, 0), 1), ((3, 0, 2), (1, 2)), ((0, 4), None)],
                         ids=str)
def test_of_nothing(shape, dim, correction, device):
    check(torch.randn(shape, device=device), dim, correction=correction)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cols", [5, 1024, 3 * 2**16 + 5])  # one thread's run, a block's row, a split row
def test_infinite_rows(cols, dtype, device):
    """A row holding inf (and finite values) has mean inf, as torch.mean (torch.var_mean's own Welford gives NaN
    or inf by the order it meets them), and variance NaN; inf beside -inf gives NaN for both."""
    x = torch.randn(4, cols, device=device).to(dtype)
    x[0] = float("inf")
    x[1] = -float("inf")
    x[2, cols // 2] = float("inf")
    x[3, 0], x[3, -1] = float("inf"), -float("inf")
    var, mean = torch_reduce.var_mean(x, -1)
    nan = float("nan")
    expected_mean = torch.tensor([float("inf"), -float("inf"), float("inf"), nan], dtype=dtype, device=device)
    torch.testing.assert_close(mean, expected_mean, equal_nan=True, rtol=0, atol=0)
    assert var.isnan().all()
    torch.testing.assert_close(torch_reduce.var_mean(x.T, 0)[1], mean, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (-1, False), ((0, 2), True), ((0, 2), False)])
def test_gradcheck_of_one_output(device, dim, keepdim):
    """The gradient when only var or only mean is used (the other's gradient undefined); the contract suite
    gradchecks both outputs together."""
    x = torch.randn(3, 4, 5, device=device, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: torch_reduce.var_mean(t, dim, correction=0, keepdim=keepdim)[0], (x,))
    torch.autograd.gradcheck(lambda t: torch_reduce.var_mean(t, dim, keepdim=keepdim)[1], (x,))


def var_mean_derivatives(fn, x, dim, correction, keepdim, outputs):
    """The first derivative of var_mean's `outputs` ("var", "mean" or both) at x for random cotangents, and
    the second: the first's derivatives with respect to x and to the cotangents."""
    x = x.detach().clone().requires_grad_()
    results = dict(zip(("var", "mean"), fn(x, dim, correction=correction, keepdim=keepdim)))
    gen = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(results[o].shape, generator=gen, dtype=results[o].dtype).to(x.device).requires_grad_()
                  for o in outputs]
    (first,) = torch.autograd.grad([results[o] for o in outputs], x, cotangents, create_graph=True)
    direction = torch.randn(x.shape, generator=gen, dtype=x.dtype).to(x.device)
    second = torch.autograd.grad(first, [x] + cotangents, direction, allow_unused=True, materialize_grads=True)
    return [first.detach()] + [s.detach() for s in second]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim,keepdim", [(None, False), ((), False), (-1, False), (-1, True), ((0, 2), False),
                                         ((0, 1, 2), True)], ids=str)
@pytest.mark.parametrize("correction", [0, 1, 2.5, 4, 6, 8, 9.5, 24, 24.5, 30], ids=str)
def test_derivatives_as_torch(device, dim, keepdim, correction):
    """First and second derivatives against torch's in float64, N - correction of every sign (N = 4, 8 or 24
    elements per output). torch's var_backward divides by N - correction unclamped: a correction above N gives
    a finite gradient, one equal to N inf (NaN where x equals the mean); over every dim (dim None or ()) any
    N - correction <= 0 gives inf, NaN where x equals the mean. torch takes dim=() as N = 1 in its backward,
    not the N its forward divides by; ours is then its dim=None's."""
    random = torch.randn(2, 3, 4, dtype=torch.float64, device=device)
    random[1, 2] = 0.75  # a constant row: x equals its mean there
    halves = torch.arange(24, dtype=torch.float64, device=device) - 11.5
    halves[11] = halves[12] = 0  # the mean, 0, is exact and two elements equal it
    theirs_dim = None if dim == () else dim
    for x in (random, halves.view(2, 3, 4)):
        for outputs in (("var", "mean"), ("var",), ("mean",)):
            got = var_mean_derivatives(torch_reduce.var_mean, x, dim, correction, keepdim, outputs)
            want = var_mean_derivatives(torch.var_mean, x, theirs_dim, correction, keepdim, outputs)
            for g, w, what in zip(got, want, ("d/dx", "d2/dx2", "d2/dx d(cotangent)", "d2/dx d(cotangent 2)")):
                torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, equal_nan=True,
                                           msg=lambda m: f"{outputs} {what}: {m}")


IN_PLACE = {"mean.sub_(1)": lambda var, mean: mean.sub_(1), "var.mul_(2)": lambda var, mean: var.mul_(2),
            "mean.zero_()": lambda var, mean: mean.zero_(), "nothing": lambda var, mean: None}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("change", list(IN_PLACE))
def test_outputs_changed_in_place_keep_the_backward(device, change, compiled):
    """torch's backward saves the input alone, so changing var or mean in place after the call leaves the gradient
    as it was: ours too (it keeps the mean by value and recomputes it where the output changed), eager and under
    torch.compile (whose functionalized graph sees the change as a new tensor)."""
    torch.compiler.reset()  # one closure's code for every case: past dynamo's recompile limit otherwise
    x = torch.randn(3, 5, dtype=torch.float64, device=device)
    grads = []
    for op in (torch_reduce.var_mean, torch.var_mean):
        def loss(leaf):
            var, mean = op(leaf, 1)
            IN_PLACE[change](var, mean)
            return var.sum() + (mean * mean).sum()
        leaf = x.clone().requires_grad_()
        grads.append(torch.autograd.grad((torch.compile(loss, fullgraph=True) if compiled else loss)(leaf), leaf)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


# Complex inputs, as torch.var_mean takes them: the variance (real) is E|x - mean|^2, the mean complex.
COMPLEX_TOL = {torch.complex32: dict(rtol=1e-3, atol=1e-3), torch.complex64: dict(rtol=1e-5, atol=1e-5),
               torch.complex128: dict(rtol=1e-12, atol=1e-12)}
COMPLEX_CALLS = [((37, 33), -1, False), ((37, 33), 0, True), ((4, 5, 6), (0, 2), False), ((4, 5, 6), (-1, 1), True),
                 ((4, 5, 6), None, True), ((1001,), None, False), ((), None, False), ((), 0, True), ((), -1, False),
                 ((3, 0), 1, False), ((0, 3), None, False), ((5, 1), -1, False)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(COMPLEX_TOL), ids=str)
@pytest.mark.parametrize("shape,dim,keepdim", COMPLEX_CALLS, ids=str)
@pytest.mark.parametrize("correction", [0, 1, 2.5], ids=str)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex(shape, dim, keepdim, correction, dtype, device):
    x = (torch.randn(shape, dtype=torch.complex128, device=device) + (1 - 2j)).to(dtype)  # a mean away from 0
    var, mean = torch_reduce.var_mean(x, dim, correction=correction, keepdim=keepdim)
    ref_var, ref_mean = torch.var_mean(x.to(torch.complex128), dim, correction=correction, keepdim=keepdim)
    assert var.dtype == x.real.dtype and mean.dtype == dtype and var.device == mean.device == x.device
    assert var.shape == mean.shape == ref_var.shape
    torch.testing.assert_close(var, ref_var.to(var.dtype), equal_nan=True, **COMPLEX_TOL[dtype])
    torch.testing.assert_close(mean, ref_mean.to(dtype), equal_nan=True, **COMPLEX_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_complex_views(device):
    x = torch.randn(6, 9, dtype=torch.complex64, device=device)
    for view in (x.T, x.conj(), x.T.conj(), x[:, ::2], x[1:, 1:], x[:1].expand(4, 9)):
        for dim in (0, 1, None):
            got, want = torch_reduce.var_mean(view, dim), torch.var_mean(view, dim)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, **COMPLEX_TOL[torch.complex64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex_errors(device):
    x = torch.randn(3, 4, dtype=torch.complex64, device=device)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        torch_reduce.var_mean(x, (1, -1))
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch_reduce.var_mean(x, 2)
    x = torch.zeros(3, 4, dtype=torch.complex32, device="meta")  # the fake kernel's dtypes as the real one's
    assert [(t.shape, t.dtype) for t in torch_reduce.var_mean(x, 1)] == [((3,), torch.float16), ((3,), torch.complex32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (-1, False), ((0, 2), True)], ids=str)
@pytest.mark.parametrize("correction", [0, 1, 2.5], ids=str)
def test_complex_autograd(device, dim, keepdim, correction):
    """Backward and double backward (gradcheck's complex derivatives), forward mode, and every derivative against
    torch's at random complex cotangents; the op's contract (opcheck) and torch.compile on a complex input."""
    x = torch.randn(3, 4, 5, dtype=torch.complex128, device=device, requires_grad=True)
    f = lambda t: torch_reduce.var_mean(t, dim, correction=correction, keepdim=keepdim)  # noqa: E731
    torch.autograd.gradcheck(f, (x,))
    torch.autograd.gradgradcheck(f, (x,))
    torch.autograd.gradcheck(f, (x,), check_forward_ad=True, check_backward_ad=False, check_undefined_grad=False,
                             check_batched_grad=False)
    for outputs in (("var", "mean"), ("var",), ("mean",)):
        got = var_mean_derivatives(torch_reduce.var_mean, x, dim, correction, keepdim, outputs)
        want = var_mean_derivatives(torch.var_mean, x, dim, correction, keepdim, outputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    dims = None if dim is None else [dim] if isinstance(dim, int) else list(dim)
    torch.library.opcheck(torch.ops.reduce.var_mean.default, (x, dims), {"correction": correction, "keepdim": keepdim})
    torch.compiler.reset()  # one lambda's code for every case: past dynamo's recompile limit otherwise
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for g, w in zip(compiled(x.detach()), torch.var_mean(x.detach(), dim, correction=correction, keepdim=keepdim)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
