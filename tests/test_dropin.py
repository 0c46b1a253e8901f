"""torch_reduce.sum/mean/amax/amin against torch: same values, dtypes, shapes and errors, over drawn shapes,
dims, dtypes and views, and on every kernel path. The contract suite (tests/test_op_contract.py, from the specs
in tests/op_specs.py) runs the rest: autograd, opcheck, compile, bad inputs, determinism, > 2^31 elements,
streams, CUDA graphs and two GPUs."""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import torch_reduce
from conftest import ALL_DTYPES, DEVICES, INT_DTYPES, random_tensor, requires_cuda, seed_torch

OPS = ["sum", "mean", "amax", "amin"]
# Rounding allowed relative to the sum of |x| over the reduced elements, from the accumulate dtype.
ACCUMULATE_RTOL = {torch.float64: 1e-12}
DEFAULT_ACCUMULATE_RTOL = 1e-5  # float32 accumulation (float32, float16, bfloat16 results)


def ours(name):
    return getattr(torch_reduce, name)


def run_both(name, x, *args, **kwargs):
    """torch's result and ours, or, where torch raises, a check that ours raises the same exception type."""
    reference, reference_kwargs = x, kwargs
    if name == "mean" and kwargs.get("dtype") is not None and kwargs["dtype"].is_floating_point:
        # torch documents dtype= as a cast of the input first; its CPU mean computes in the input's dtype
        # instead, then casts (mean(fp32, dtype=bf16) != mean(x.bfloat16())): compare with the documented rule.
        reference, reference_kwargs = x.to(kwargs["dtype"]), {}
    try:
        want = getattr(torch, name)(reference, *args, **reference_kwargs)
    except (RuntimeError, IndexError) as error:
        with pytest.raises(type(error)):
            ours(name)(x, *args, **kwargs)
        return None, None
    return ours(name)(x, *args, **kwargs), want


def assert_like_torch(name, x, got, want, *args, **kwargs):
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device, (got, want)
    if name in ("amax", "amin") or not got.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        return
    # |ours - torch| <= rtol * (sum or mean of |x|) + a result ulp (16-bit results may round either way). The scale
    # in float64 (not in a dtype= that could overflow it to inf, a bound that takes anything).
    plain = {k: v for k, v in kwargs.items() if k != "dtype"}
    scale = getattr(torch, name)(x.to(got.dtype).double().abs(), *args, **plain)
    bound = ACCUMULATE_RTOL.get(got.dtype, DEFAULT_ACCUMULATE_RTOL) * scale
    if got.dtype in (torch.float16, torch.bfloat16):
        bound = bound + torch.finfo(got.dtype).eps * want.double().abs()
        # torch's CPU kernel rounds partial sums to a 16-bit dtype= (sum(x, (2, 0), dtype=bfloat16) of 8 normals
        # can be 3 ulps off): allow its own distance from the exact sum of the cast values too.
        exact = getattr(torch, name)(x.to(got.dtype).double(), *args, **plain)
        bound = bound + (want.double() - exact).abs()
    g, w = got.double(), want.double()
    ok = ((g - w).abs() <= bound) & bound.isfinite()  # an infinite bound (x holds infinities) takes nothing
    ok |= (g == w) | (g.isnan() & w.isnan())  # infinities and NaN: the same value
    assert bool(ok.all()), (name, x.dtype, x.shape, args, kwargs, (g - w).abs().max(), bound.max())


def check(name, x, *args, **kwargs):
    got, want = run_both(name, x, *args, **kwargs)
    if want is not None:
        assert_like_torch(name, x, got, want, *args, **kwargs)
    return got


# ------------------------------------------------------------------------------ hypothesis cases ----


@st.composite
def tensors(draw, device):
    """A tensor of 0..4 dims (sizes 0..40) of any dtype, contiguous or a view: transposed, stepped, offset."""
    shape = draw(st.lists(st.integers(0, 40), min_size=0, max_size=4))
    assume(math.prod(shape) <= 60_000)
    dtype = draw(st.sampled_from(ALL_DTYPES))
    view = draw(st.sampled_from(["contiguous", "transposed", "stepped", "offset", "permuted"]))
    if view == "transposed" and len(shape) >= 2:
        return random_tensor(shape[:-2] + [shape[-1], shape[-2]], dtype, device).transpose(-1, -2)
    if view == "stepped" and shape:
        base = random_tensor(shape[:-1] + [2 * shape[-1] + 1], dtype, device)
        return base[..., 1::2]
    if view == "offset":
        return random_tensor(math.prod(shape) + 3, dtype, device)[3:].view(shape)
    if view == "permuted" and len(shape) >= 3:
        return random_tensor([shape[2], shape[0], shape[1]] + shape[3:], dtype, device).permute(
            1, 2, 0, *range(3, len(shape)))
    return random_tensor(shape, dtype, device)


@st.composite
def dims(draw, ndim, allow_none):
    """An int, a tuple (negative, repeated or out of range at times), None or ()."""
    bound = max(ndim, 1)
    kind = draw(st.sampled_from(["int", "tuple", "empty"] + (["none"] if allow_none else [])))
    if kind == "none":
        return None
    if kind == "empty":
        return ()
    one = st.integers(-bound - 1, bound)  # one past each end: IndexError
    if kind == "int":
        return draw(one)
    return tuple(draw(st.lists(st.integers(-bound, bound - 1), min_size=1, max_size=max(ndim, 1) + 1)))


HYPOTHESIS = settings(max_examples=300, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much,
                                             HealthCheck.too_slow])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
@HYPOTHESIS
@given(data=st.data())
def test_like_torch(name, device, data):
    seed_torch(data)
    x = data.draw(tensors(device))
    dim = data.draw(dims(x.dim(), allow_none=name in ("sum", "mean")))
    keepdim = data.draw(st.booleans())
    kwargs = {}
    if name in ("sum", "mean") and data.draw(st.booleans()):
        kwargs["dtype"] = data.draw(st.sampled_from(ALL_DTYPES))
    check(name, x, dim, keepdim, **kwargs)


# ------------------------------------------------------------------------------- named rules ----


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPS)
def test_dims_and_keepdim(name, device):
    x = random_tensor((3, 4, 5), torch.float32, device)
    for dim in (0, 1, 2, -1, -3, (0, 2), (-1, 0), (0, 1, 2), (2, 1), [1]):
        for keepdim in (False, True):
            assert check(name, x, dim, keepdim) is not None
    for dim in ((), None) if name in ("sum", "mean") else ((),):
        assert check(name, x, dim).shape == ()
        assert check(name, x, dim, True).shape == (1, 1, 1)
    # dims as torch's parser takes them: numpy ints, a 0-dim integer tensor, a bool after the first element
    for dim in (np.int64(1), (np.int32(0), 2), torch.tensor(-1), torch.Size([1, 2]), (0, True)):
        assert check(name, x, dim).shape == getattr(torch, name)(x, dim).shape


@pytest.mark.parametrize("device", DEVICES)
def test_numpys_argument_names_as_torch_takes_them(device):
    """axis for dim, keepdims for keepdim, and x, a or x1 for the tensor (input; vector_norm's x also as input), as
    torch's argument parser takes them; a name and its alias together raise its TypeError."""
    x = random_tensor((3, 4, 5), torch.float32, device)
    torch_ops = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin, "prod": torch.prod,
                 "vector_norm": torch.linalg.vector_norm, "var_mean": torch.var_mean}
    for name, theirs in torch_ops.items():
        ours, tensor = getattr(torch_reduce, name), "x" if name == "vector_norm" else "input"
        calls = [((x,), {"axis": 1}), ((x,), {"axis": 2 if name == "prod" else (0, 2), "keepdims": True}),
                 ((), {"a": x, "axis": -1}),
                 ((), {"x1": x, "dim": 1, "keepdims": True}),
                 ((), {"input" if tensor == "x" else "x": x, "axis": 0})]
        for args, kwargs in calls:
            want, got = theirs(*args, **kwargs), ours(*args, **kwargs)
            for g, w in zip(got if name == "var_mean" else [got], want if name == "var_mean" else [want]):
                assert g.shape == w.shape, (name, kwargs)
                torch.testing.assert_close(g, w)
        for kwargs in ({"dim": 0, "axis": 1}, {"dim": 0, "keepdim": True, "keepdims": True}):
            with pytest.raises(TypeError):
                theirs(x, **kwargs)
            with pytest.raises(TypeError, match="unexpected keyword argument '(axis|keepdims)'"):
                ours(x, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_numbers_as_torch_takes_them(device):
    """A 0-dim tensor or a numpy scalar where torch takes a number: var_mean's correction, vector_norm's ord."""
    x = random_tensor((3, 4, 5), torch.float32, device)
    for correction in (np.int64(1), torch.tensor(1), np.float32(0.5), torch.tensor(0.5)):
        for got, want in zip(torch_reduce.var_mean(x, 1, correction=correction),
                             torch.var_mean(x, 1, correction=correction)):
            torch.testing.assert_close(got, want)
    for ord in (torch.tensor(3.0), np.int64(3), torch.tensor(float("inf"))):
        torch.testing.assert_close(torch_reduce.vector_norm(x, ord, (0, 2)), torch.linalg.vector_norm(x, ord, (0, 2)))


def test_an_input_that_is_not_a_tensor_raises_torchs_type_error():
    """A list or a number where the tensor goes: torch's TypeError naming the argument (the ops' schemas would
    raise a RuntimeError)."""
    import torch.nn.functional as F

    pairs = [(getattr(torch_reduce, n), getattr(torch, n)) for n in ("sum", "mean", "amax", "amin", "prod", "var_mean")]
    pairs += [(torch_reduce.vector_norm, torch.linalg.vector_norm),
              (lambda a: torch_reduce.layer_norm(a, 2), lambda a: F.layer_norm(a, (2,))),
              (lambda a: torch_reduce.rms_norm(a, 2), lambda a: F.rms_norm(a, (2,))),
              (lambda a: torch_reduce.add_rms_norm(a, torch.ones(2), 2), lambda a: F.rms_norm(a, (2,)))]
    for ours_call, torch_call in pairs:
        for value in ([1.0, 2.0], 3.0, None):
            with pytest.raises(TypeError):
                torch_call(value)
            with pytest.raises(TypeError, match="must be Tensor, not"):
                ours_call(value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_extremes_at_the_dtypes_limits(dtype, device):
    """Integer max and min (the CPU folds them in the input's own type, not the int64 accumulator) reach the dtype's
    limits and the rows' own positions, over rows of odd lengths around the vector widths and the whole tensor."""
    low, high = (False, True) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    for cols in (1, 31, 33, 257, 4099):
        x = random_tensor((5, cols), dtype, device)
        x[1, cols // 2] = high
        x[2, cols - 1] = low
        x[3].fill_(low)
        x[4].fill_(high)
        for name in ("amax", "amin"):
            for dims in (1, None, 0):
                check(name, x, dims) if dims is not None else check(name, x)


@pytest.mark.parametrize("device", DEVICES)
def test_dtypes(device):
    for dtype in ALL_DTYPES:
        x = random_tensor((17, 33), dtype, device)
        assert check("sum", x).dtype == (dtype if dtype.is_floating_point else torch.int64)
        assert check("sum", x, 1).dtype == (dtype if dtype.is_floating_point else torch.int64)
        assert check("amax", x, 0).dtype == dtype and check("amin", x).dtype == dtype
        if dtype.is_floating_point:
            assert check("mean", x, 0).dtype == dtype
        else:
            with pytest.raises(RuntimeError, match="could not infer output dtype"):
                torch_reduce.mean(x)
            assert check("mean", x, 1, dtype=torch.float32).dtype == torch.float32
        for out in ALL_DTYPES:
            assert check("sum", x, 0, dtype=out).dtype == out
    # dtype= casts first, then accumulates in the dtype's accumulate type: 200 + 100 wraps in uint8.
    u8 = torch.tensor([200, 100], dtype=torch.uint8, device=device)
    assert torch_reduce.sum(u8, dtype=torch.uint8).item() == 44
    assert torch_reduce.sum(torch.tensor([1.5, 2.7], device=device), dtype=torch.int32).item() == 3
    with pytest.raises(RuntimeError, match="Optional dtype must be either a floating point"):
        torch_reduce.mean(torch.randn(4, device=device), dtype=torch.int64)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape, dim in (((0,), None), ((0, 3), 0), ((0, 3), 1), ((2, 0), (0,)), ((2, 0, 3), (1, 2)), ((0, 3), ())):
        x = random_tensor(shape, torch.float32, device)
        for name in OPS:
            if dim is not None or name in ("sum", "mean"):
                check(name, x, dim)
    e = torch.empty((0, 4), device=device)
    assert torch.equal(torch_reduce.sum(e, 0), torch.zeros(4, device=device))
    assert torch_reduce.mean(e, 0).isnan().all() and torch_reduce.mean(e).isnan()
    with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
        torch_reduce.amax(e)
    with pytest.raises(IndexError, match="Expected reduction dim 0 to have non-zero size"):
        torch_reduce.amin(e, 0)
    assert torch_reduce.amax(e, 1).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim(device):
    for dtype in (torch.float32, torch.int32, torch.bool):
        x = random_tensor((), dtype, device)
        for name in OPS:
            if name == "mean" and not dtype.is_floating_point:
                continue
            for dim in (0, -1, (0,), ()):
                for keepdim in (False, True):
                    check(name, x, dim, keepdim)
            with pytest.raises(RuntimeError, match="appears multiple times"):
                ours(name)(x, (0, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagation(device):
    x = random_tensor((7, 300), torch.float32, device)
    x[3, 100] = math.nan
    x[5, 7] = math.inf
    for name in ("amax", "amin"):
        for dim in ((), 0, 1, (0, 1)):
            got = check(name, x, dim)
            assert got.isnan().any()
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            check(name, x.to(dtype), 1)
    assert torch_reduce.amax(x, 1)[3].isnan() and not torch_reduce.amax(x, 1)[4].isnan()
    assert torch_reduce.amax(x, 1)[5].item() == math.inf


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int8, torch.bool], ids=str)
@pytest.mark.parametrize("K", [1, 2, 3, 5, 8, 9, 16, 31, 32, 33, 64, 65, 128, 255, 256, 257, 1024, 1025, 1100, 5003])
def test_row_lengths(K, dtype, device):
    """Every lanes-per-row choice and the block-per-row path, aligned and misaligned rows, offset views."""
    base = random_tensor((130 * K + 1,), dtype, device)
    for x in (base[: 130 * K].view(130, K), base[1:].view(130, K)):
        for name in OPS:
            if name != "mean" or dtype.is_floating_point:
                check(name, x, -1)
                check(name, x, 0)


@pytest.mark.parametrize("fill", ["tenths", "uniform"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,dim", [((1 << 22, 2), 0), ((2, 1 << 22), 1), ((3, 1 << 20, 3), 1)], ids=str)
def test_long_reductions_over_a_dim_round_as_a_tree_on_the_cpu(shape, dim, dtype, fill):
    """The CPU's dim kernels run 64 terms in sequence a value, then fold the runs pairwise: a float32 sum's error
    stays within (64 + log2 K) * u * sum|x|. Constant tenths are a running sum's worst case (2^22 of them in a few
    running float32 values were 4% off, torch 1e-6)."""
    x = torch.full(shape, 0.1) if fill == "tenths" else torch.rand(shape)
    x = x.to(dtype)
    exact = x.double().sum(dim)
    depth = 64 + math.log2(shape[dim])
    bound = depth * 2.0**-24 * x.double().abs().sum(dim)
    total = torch_reduce.sum(x, dim, dtype=torch.float32).double()
    assert ((total - exact).abs() <= bound).all(), (total, exact)
    mean, exact_mean = torch_reduce.mean(x, dim, dtype=torch.float32).double(), exact / shape[dim]
    assert ((mean - exact_mean).abs() <= bound / shape[dim] + 2.0**-24 * exact_mean.abs()).all(), (mean, exact_mean)

@pytest.mark.parametrize("device", DEVICES)
def test_layouts(device):
    """Dense permutations run in place; interleaved reduced dims and gaps are copied first."""
    x = random_tensor((6, 7, 8, 9), torch.float32, device)
    views = [x, x.permute(3, 1, 0, 2), x.transpose(1, 2), x[:, ::2], x[..., 1:], x.unsqueeze(2), x[:, :1]]
    for v in views:
        for dim in ((0,), (1,), (0, 2), (1, 3), (0, 1), (-1, -2), (0, 1, 2, 3), (2,)):
            dim = tuple(d for d in dim if d < v.dim())
            for name in OPS:
                check(name, v, dim)
                check(name, v, dim, True)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_integer_inputs(device):
    """Integer inputs and dtype= on them (the contract suite's samples are floating point)."""
    i = random_tensor((9, 4), torch.int32, device)
    cases = {
        "sum": [((i, [1], True), {}), ((i, None, False), {"dtype": torch.float32})],
        "mean": [((i, [0], False), {"dtype": torch.float64})],
        "amax": [((i, [0], False), {})],
        "amin": [((i, [1], False), {}), ((i.to(torch.int8), [], True), {})],
    }
    for name, samples in cases.items():
        for args, kwargs in samples:
            torch.library.opcheck(getattr(torch.ops.reduce, name), args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["amax", "amin"])
def test_gradient_of_ties(name, device):
    """Ties share the gradient evenly, exactly as torch's amax/amin backward."""
    x = torch.randint(0, 3, (6, 8), device=device).double()
    for dim, keepdim in ((1, False), (0, True), ((), False), ((0, 1), True)):
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = ours(name)(mine, dim, keepdim)
        grad = torch.randn_like(out)
        out.backward(grad)
        getattr(torch, name)(theirs, dim, keepdim).backward(grad)
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=0)
        assert (mine.grad != 0).sum() > (out.numel() if dim != () else 1)  # there were ties


@pytest.mark.parametrize("device", DEVICES)
def test_sum_and_mean_gradients(device):
    x = random_tensor((4, 5), torch.float32, device).requires_grad_()
    out = torch_reduce.mean(x, 0) + torch_reduce.sum(x, 0, dtype=torch.float64).float()
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, torch.full_like(x, 1.25))
    assert x.grad.dtype == torch.float32


# ------------------------------------------------------------------------------------------- GPU only ----

# The benchmark's (M, N) shapes, scaled down: the same kernel choices (lanes per row, block per row,
# split rows, column splits).
BENCH_SHAPES = [(512, 1024), (1024, 512), (4096, 768), (768, 4096), (1024, 4096), (32, 2**20), (2**20, 32)]


@requires_cuda
@pytest.mark.parametrize("shape", BENCH_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
def test_cuda_benchmark_shapes(shape, dtype):
    x = random_tensor(shape, dtype, "cuda")
    for name in OPS:
        if name == "mean" and not dtype.is_floating_point:
            continue
        for dim in (-1, 0, ()):
            check(name, x, dim)
    check("sum", x.t(), 0)


@requires_cuda
def test_cuda_matches_cpu_reference():
    for shape, dim in (((300, 1000), 1), ((1000, 300), 0), ((64, 50_000), 1), ((50_000, 8), 0), ((5, 6, 7000), (0, 2))):
        x = random_tensor(shape, torch.float64, "cpu")
        for name in OPS:
            torch.testing.assert_close(ours(name)(x.cuda(), dim).cpu(), ours(name)(x, dim), rtol=1e-12, atol=1e-12)


@requires_cuda
def test_cuda_accuracy_of_full_sum():
    x = torch.randn(2**24, device="cuda")
    exact = x.double().sum().item()
    assert abs(torch_reduce.sum(x).item() - exact) <= 1e-6 * x.double().abs().sum().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "prod", "vector_norm"])
def test_backward_graph_behaves_as_torchs(name, device):
    """The reductions' backward node (written as torch's generated nodes are) as torch's: a second backward raises
    torch's error unless the graph was retained, where the node saved tensors (sum and mean save none, as torch's
    SumBackward and MeanBackward); an in-place change of a saved input is caught; the edge leads to the input's
    gradient accumulator; the gradient is torch's."""
    if name == "vector_norm":
        ours, theirs = (lambda t: torch_reduce.vector_norm(t, 3.0, 1)), (lambda t: torch.linalg.vector_norm(t, 3.0, 1))
    else:
        ours, theirs = (lambda t: getattr(torch_reduce, name)(t, 1)), (lambda t: getattr(torch, name)(t, 1))
    x = torch.randn(4, 6, device=device, requires_grad=True)
    y = ours(x)
    assert y.grad_fn.next_functions[0][0].variable is x
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)
    if name in ("sum", "mean"):
        y.sum().backward()
        t = theirs(x)
        t.sum().backward()
        t.sum().backward()  # torch's too: nothing saved, nothing freed
    else:
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.sum().backward()
    want = x.detach().requires_grad_()
    theirs(want).sum().backward()
    torch.testing.assert_close(first, want.grad)

    z = x * 1
    y = ours(z)
    z.mul_(2)
    if name in ("sum", "mean"):
        y.sum().backward()
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
