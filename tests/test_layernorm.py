"""torch_reduce.layer_norm / reduce::layer_norm_fwd, layer_norm_bwd / torch_reduce.nn.LayerNorm against torch:
every hidden size and row layout against float64 (tolerances scaled to each row's conditioning), the backward's
gradients requested separately and past 2^31 elements, the module and convert_layernorm. The contract suite
(tests/test_op_contract.py, from the specs in tests/op_specs.py) runs the rest: autograd, opcheck, compile, bad
inputs, device mixes, determinism (bitwise weight and bias gradients), streams, CUDA graphs and two GPUs."""
import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

import torch_reduce
from conftest import DEVICES, requires_cuda, seed_torch
from norm_reference import layer_norm_formula, rms_norm_formula

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN = [1, 7, 32, 33, 768, 1000, 1024, 2048, 4096, 4097, 8192, 12288, 16384, 18432, 32768, 32776]
# Outputs and input gradients are rounded to the dtype once; weight/bias gradients sum over rows.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10),
       torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
# Taken by the gradient's dtype (float32 parameters beside a 16-bit input sum in float32, and are stored so), relative
# to the largest entry: a 16-bit gradient is the float32 sum rounded once (CPU, 5 seeds: bfloat16 3.6e-3, float16
# 3.1e-4 at most; float32 parameters 6.5e-8).
SUM_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-10, atol=1e-10),
           torch.float16: dict(rtol=5e-3, atol=5e-3), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def make_params(shape, dtype, device, affine, with_bias):
    weight = (1 + 0.3 * torch.randn(shape, device=device)).to(dtype).requires_grad_() if affine else None
    bias = (0.3 * torch.randn(shape, device=device)).to(dtype).requires_grad_() if with_bias else None
    return weight, bias


def unaligned(rows, hidden, dtype, device):
    """A (rows, hidden) view one element past its storage's start: not 16-byte aligned, as the vector kernels need."""
    return torch.randn(rows * hidden + 1, device=device).to(dtype)[1:].view(rows, hidden)


def reference(x, shape, weight, bias, eps):
    """LayerNorm's formula in float64 (norm_reference.py): what exact math gives."""
    up = lambda t: None if t is None else t.detach().double().requires_grad_()  # noqa: E731
    xs, ws, bs = up(x), up(weight), up(bias)
    return layer_norm_formula(xs, shape, ws, bs, eps), (xs, ws, bs)


def conditioning(x, shape, eps, centred=True):
    """max(1, largest rstd): x - mean loses about u * |x| to rounding in any float32 LayerNorm, and rstd
    multiplies that loss, so rows of nearly equal elements (tiny variance) are ill-conditioned. 1 where nothing is
    centred (RMSNorm) and for rows of one element (x - mean is exactly 0 there)."""
    rows = x.detach().double().reshape(-1, math.prod(shape))
    if rows.numel() == 0 or rows.shape[-1] == 1 or not centred:
        return 1.0
    return max(1.0, (rows.var(-1, unbiased=False) + eps).rsqrt().max().item())


def check(x, shape, weight, bias, eps=1e-5):
    x = x.detach().requires_grad_()
    out = torch_reduce.layer_norm(x, shape, weight, bias, eps)
    ref, ref_leaves = reference(x, shape, weight, bias, eps)
    kappa = conditioning(x, shape, eps)
    tol = {k: v * kappa for k, v in TOL[x.dtype].items()}
    assert out.dtype == x.dtype and out.shape == x.shape and out.device == x.device
    torch.testing.assert_close(out, ref.to(x.dtype), **tol)
    grad = torch.randn_like(out)
    leaves = [t for t in (x, weight, bias) if t is not None]
    grads = torch.autograd.grad(out, leaves, grad)
    ref_grads = torch.autograd.grad(ref, [t for t in ref_leaves if t is not None], grad.double())
    torch.testing.assert_close(grads[0], ref_grads[0].to(x.dtype), **tol)
    for got, want in zip(grads[1:], ref_grads[1:]):
        scale = max(1.0, want.abs().max().item())
        sum_tol = {k: v * kappa for k, v in SUM_TOL[got.dtype].items()}
        torch.testing.assert_close(got.double() / scale, want / scale, **sum_tol, check_dtype=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_hidden_sizes(hidden, dtype, device):
    rows = 3 if hidden >= 4097 and device == "cpu" else 67
    x = (2 + 3 * torch.randn(rows, hidden, device=device)).to(dtype)
    weight, bias = make_params((hidden,), dtype, device, True, True)
    check(x, (hidden,), weight, bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows,hidden", [(5, 64), (67, 1024), (67, 1600), (1030, 4096), (3, 12288)])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_16bit_input_float32_params_every_layout(rows, hidden, dtype, with_bias, device):
    """float32 weight and bias beside a 16-bit input (mixed precision) in each row layout of the GPU forward: a warp
    a row, blocks whose threads hold at most two vectors (the kernel that loads the parameters with the row), blocks
    of more vectors a thread, and wide rows."""
    if device == "cpu" and rows * hidden > 2**16:
        rows = 3
    x = (2 + 3 * torch.randn(rows, hidden, device=device)).to(dtype)
    weight, bias = make_params((hidden,), torch.float32, device, True, with_bias)
    check(x, (hidden,), weight, bias)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None)
@given(batch=st.lists(st.integers(1, 5), min_size=0, max_size=2),
       normalized=st.lists(st.sampled_from([1, 2, 3, 7, 8, 16, 33, 64]), min_size=1, max_size=3),
       dtype=st.sampled_from(DTYPES), affine=st.booleans(), with_bias=st.booleans(),
       eps=st.sampled_from([0.0, 1e-5, 1e-2]), data=st.data())
def test_shapes_drawn(device, batch, normalized, dtype, affine, with_bias, eps, data):
    seed_torch(data)
    x = torch.randn(batch + normalized, device=device).to(dtype)
    if eps == 0.0:  # then var must be well above 0: no single-element rows, no two elements close together
        eps = 1e-5 if math.prod(normalized) == 1 else eps
        # a ramp of steps of 8, wrapped at 1024 steps so float16 stays finite (65504 is its largest)
        ramp = 8 * (torch.arange(math.prod(normalized), device=device) % 1024)
        x = x + ramp.view(normalized).to(dtype)
    weight, bias = make_params(tuple(normalized), dtype, device, affine, affine and with_bias)
    check(x, tuple(normalized), weight, bias, eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,hidden", [(20000, 64), (3001, 768)])
def test_many_rows_per_block(rows, hidden, dtype, device):
    """Far more rows than the GPU keeps resident blocks: each block's column partial sums many rows."""
    x = torch.randn(rows, hidden, device=device).to(dtype)
    check(x, (hidden,), *make_params((hidden,), dtype, device, True, True))


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_requested_separately(device):
    """Only the parameters' gradients (a frozen input), only the input's (frozen parameters), no_grad."""
    x = torch.randn(33, 96, device=device)
    weight, bias = make_params((96,), torch.float32, device, True, True)
    dy = torch.randn_like(x)
    ref, (xs, ws, bs) = reference(x, (96,), weight, bias, 1e-5)
    ref_grads = torch.autograd.grad(ref, (xs, ws, bs), dy.double())
    grads = torch.autograd.grad(torch_reduce.layer_norm(x, (96,), weight, bias), (weight, bias), dy)
    for got, want in zip(grads, ref_grads[1:]):
        torch.testing.assert_close(got.double(), want, **SUM_TOL[torch.float32])
    x.requires_grad_()
    (grad_x,) = torch.autograd.grad(torch_reduce.layer_norm(x, (96,), weight.detach(), bias.detach()), (x,), dy)
    torch.testing.assert_close(grad_x.double(), ref_grads[0], **TOL[torch.float32])
    with torch.no_grad():
        assert not torch_reduce.layer_norm(x, (96,), weight, bias).requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_views_and_unaligned(device):
    base = torch.randn(40, 65, device=device)
    check(base[:, 1:], (64,), *make_params((64,), torch.float32, device, True, True))  # copied contiguous
    for hidden in (64, 2048, 40000):  # contiguous but 4 bytes past a 16-byte boundary: the streaming kernels
        check(unaligned(7, hidden, torch.float32, device), (hidden,),
              *make_params((hidden,), torch.float32, device, True, True))
    check(base.t(), (40,), None, None)
    check(torch.randn(5, 2, 3, device=device).transpose(0, 1), (3,), None, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck_backward_masks(device, dtype):
    """layer_norm_bwd called directly with every output mask (the contract suite opchecks the ops that
    torch_reduce.layer_norm calls)."""
    x = torch.randn(6, 2, 40, device=device, dtype=dtype)
    w, b = (t.detach() for t in make_params((2, 40), dtype, device, True, True))
    out, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [2, 40], w, b, 1e-5)
    dy = torch.randn_like(out)
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        torch.library.opcheck(torch.ops.reduce.layer_norm_bwd.default, (dy, x, [2, 40], mean, rstd, w, b, mask))
    torch.library.opcheck(torch.ops.reduce.layer_norm_bwd.default,
                          (dy, x, [2, 40], mean, rstd, None, None, [True, True, True]))
    # Inputs that require grad: the backward's own autograd (double backward) traced with symbolic sizes too.
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in (dy, x, mean, rstd, w, b)]
    dy, x, mean, rstd, w, b = leaves
    torch.library.opcheck(torch.ops.reduce.layer_norm_bwd.default, (dy, x, [2, 40], mean, rstd, w, b, [True] * 3))
    torch.library.opcheck(torch.ops.reduce.rms_norm_bwd.default, (dy, x, [2, 40], rstd, w, [True] * 2))


NORMS = {"layer_norm": lambda x: torch_reduce.layer_norm(x, x.shape[-1:]),
         "rms_norm": lambda x: torch_reduce.rms_norm(x, x.shape[-1:]),
         "add_layer_norm": lambda x: torch_reduce.add_layer_norm(x, x, x.shape[-1:])[0],
         "add_rms_norm": lambda x: torch_reduce.add_rms_norm(x, x, x.shape[-1:])[0]}


@pytest.mark.parametrize("name", list(NORMS))
def test_compile_dynamic_over_hidden_sizes(name):
    """torch.compile(dynamic=True) of a norm over x.shape[-1:]: one graph for every hidden size, as torch's
    (a size read as an int made the graph hold it: a recompile per size, then the recompile limit)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(NORMS[name], dynamic=True, fullgraph=True, backend=backend)
    for hidden in range(5, 15):
        x = torch.randn(3, hidden, dtype=torch.float64)
        torch.testing.assert_close(compiled(x), NORMS[name](x))
    assert len(graphs) == 1


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_double_backward_traces_with_symbolic_sizes(norm):
    """make_fx with symbolic sizes through a gradient penalty: the backward's checks read the statistics' sizes
    symbolically."""
    from torch.fx.experimental.proxy_tensor import make_fx
    op = getattr(torch_reduce, norm)

    def penalty(x, w):
        y = op(x, (5,), w)
        gx, = torch.autograd.grad((y ** 3).sum(), x, create_graph=True)
        return torch.autograd.grad((gx ** 2).sum(), (x, w))

    x, w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True), torch.randn(5, dtype=torch.float64,
                                                                                  requires_grad=True)
    traced = make_fx(penalty, tracing_mode="symbolic")(x, w)
    for got, want in zip(traced(x, w), penalty(x, w)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_module_and_compile_fullgraph(device):
    torch.manual_seed(0)
    ours = torch_reduce.nn.LayerNorm(64, device=device)
    theirs = torch.nn.LayerNorm(64, device=device)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1]
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), ours, torch.nn.GELU()).to(device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    x = torch.randn(16, 32, device=device)
    torch.testing.assert_close(compiled(x), model(x))
    compiled(x).sum().backward()
    torch.testing.assert_close(model[1](model[0](x)), theirs(model[0](x)))


def test_module_constructor_matches_torch():
    for kwargs in [{}, {"elementwise_affine": False}, {"bias": False}, {"eps": 1e-3}]:
        ours, theirs = torch_reduce.nn.LayerNorm((4, 5), **kwargs), torch.nn.LayerNorm((4, 5), **kwargs)
        assert ours.state_dict().keys() == theirs.state_dict().keys()
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        assert ours.extra_repr() == theirs.extra_repr()
    ours = torch_reduce.nn.LayerNorm(8, dtype=torch.float64)
    assert ours.weight.dtype == torch.float64
    with torch.no_grad():
        ours.weight.zero_()
    ours.reset_parameters()
    assert torch.equal(ours.weight, torch.ones(8, dtype=torch.float64))


def test_convert_layernorm():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8),
                                torch.nn.Sequential(torch.nn.LayerNorm(8, elementwise_affine=False)))
    weight = model[1].weight
    assert torch_reduce.nn.convert_layernorm(model) is model
    assert isinstance(model[1], torch_reduce.nn.LayerNorm) and model[1].weight is weight
    assert isinstance(model[2][0], torch_reduce.nn.LayerNorm) and model[2][0].weight is None
    top = torch_reduce.nn.convert_layernorm(torch.nn.LayerNorm(3, bias=False))
    assert isinstance(top, torch_reduce.nn.LayerNorm) and top.bias is None


@requires_cuda
def test_cuda_backward_more_than_2_31_elements():
    """(2^21 + 1) rows of 1024 bf16: 2^31 + 1024 elements (4 GiB each for x, out, dx; dy shares x's memory). The
    backward's input and weight gradients past element 2^31 (the contract suite checks the forward)."""
    rows, hidden = 2**21 + 1, 1024
    try:
        x = torch.empty(rows, hidden, device="cuda", dtype=torch.bfloat16)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    x.normal_()
    weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    out, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], weight, None, 1e-5)
    tail = x[-3:].float()  # rows past element 2^31
    torch.testing.assert_close(out[-3:], F.layer_norm(tail, (hidden,), weight.float()).bfloat16(),
                               **TOL[torch.bfloat16])
    del out
    dx, dw, _ = torch.ops.reduce.layer_norm_bwd(x, x, [hidden], mean, rstd, weight, None, [True, True, False])
    ref_dx = torch.ops.aten.native_layer_norm_backward(
        tail, tail, [hidden], mean[-3:], rstd[-3:], weight.float(), None, [True, False, False])[0]
    torch.testing.assert_close(dx[-3:].float(), ref_dx, rtol=2e-2, atol=2e-2)
    del dx
    ref_dw = torch.zeros(hidden, device="cuda", dtype=torch.float64)  # column sums, a chunk of rows at a time
    for start in range(0, rows, 2**16):
        xs = x[start:start + 2**16].double()
        ref_dw += (xs * (xs - mean[start:start + 2**16]) * rstd[start:start + 2**16]).sum(0)
    torch.testing.assert_close(dw.double(), ref_dw, rtol=1.6e-2, atol=1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("hidden", [64, 1024, 8192, 40000])
def test_rows_near_the_largest_float(device, dtype, hidden):
    """Constant rows near the dtype's largest value: variance 0, so the output is the bias, exactly. A plain row
    sum overflows to inf there (then NaN), although nothing in the exact result does."""
    x = torch.full((3, hidden), torch.finfo(dtype).max * 0.9, device=device, dtype=dtype)
    x[1] = -x[1]
    bias = torch.randn(hidden, device=device).to(dtype)
    out = torch_reduce.layer_norm(x, (hidden,), torch.ones(hidden, device=device, dtype=dtype), bias)
    torch.testing.assert_close(out, bias.expand_as(out), rtol=0, atol=0)
    var, mean = torch_reduce.var_mean(x, -1)
    assert torch.equal(var, torch.zeros_like(var)) and torch.equal(mean, x[:, 0])


NORM_CALLS = {
    "layer_norm": lambda x, r, w, b: torch_reduce.layer_norm(x, (x.shape[-1],), w, b),
    "rms_norm": lambda x, r, w, b: torch_reduce.rms_norm(x, (x.shape[-1],), w),
    "add_layer_norm": lambda x, r, w, b: torch_reduce.add_layer_norm(x, r, (x.shape[-1],), w, b)[0],
    "add_rms_norm": lambda x, r, w, b: torch_reduce.add_rms_norm(x, r, (x.shape[-1],), w)[0],
}
NORM_CALLS_SUM = {
    "add_layer_norm": lambda x, r, w, b: torch_reduce.add_layer_norm(x, r, (x.shape[-1],), w, b)[1],
    "add_rms_norm": lambda x, r, w, b: torch_reduce.add_rms_norm(x, r, (x.shape[-1],), w)[1],
}
TORCH_NORM_CALLS = {
    "layer_norm": lambda x, r, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
    "rms_norm": lambda x, r, w, b: F.rms_norm(x, (x.shape[-1],), w),
    "add_layer_norm": lambda x, r, w, b: F.layer_norm(x + r, (x.shape[-1],), w, b),
    "add_rms_norm": lambda x, r, w, b: F.rms_norm(x + r, (x.shape[-1],), w),
}


def check_norm_forward(name, rows, hidden, dtype):
    """Norm `name` of a random (rows, hidden) CUDA input (and residual) against the float64 formula of the input
    rounded as torch's add rounds it, the fused sum bitwise; returns the input."""
    x, r = (torch.randn(rows, hidden, device="cuda").to(dtype) for _ in range(2))
    w, b = make_params((hidden,), dtype, "cuda", True, True)
    w, b = w.detach(), b.detach()
    got = NORM_CALLS[name](x, r, w, b)
    s = (x + r) if name.startswith("add") else x
    want = TORCH_NORM_CALLS[name.removeprefix("add_")](s.double(), None, w.double(), b.double())
    kappa = conditioning(s, (hidden,), 1e-5, centred="layer" in name)
    torch.testing.assert_close(got, want.to(dtype), **{k: v * kappa for k, v in TOL[dtype].items()})
    if name.startswith("add"):
        assert torch.equal(NORM_CALLS_SUM[name](x, r, w, b), s)
    return x


def norm_inputs(device):
    x, r = (torch.randn(3, 16, device=device, requires_grad=True) for _ in range(2))
    w, b = (torch.randn(16, device=device, requires_grad=True) for _ in range(2))
    return x, r, w, b


def check_norm_grads(name, x, r, w, b, eps=None):
    """Norm `name` of x (plain; fused: of x + r) with weight w (and bias b, LayerNorm; either may be None), eps None
    the norm's default: the output, the fused sum (bitwise) and every gradient against float64, the reference given
    the eps ours used (RMSNorm's default is float32's machine epsilon for a float32 or 16-bit input; float64's own
    would differ on rows of tiny values). Returns the outputs, parameters given, output gradients and gradients."""
    layer, fused = "layer" in name, name.startswith("add")
    hidden, dtype = x.shape[-1], x.dtype
    default_eps = 1e-5 if layer else torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    eps_used = default_eps if eps is None else eps
    arguments = (w, b) if layer else (w,)
    params = tuple(p for p in arguments if p is not None)
    kwargs = {} if eps is None else {"eps": eps}
    if fused:
        call = torch_reduce.add_layer_norm if layer else torch_reduce.add_rms_norm
        y, s = call(x, r, (hidden,), *arguments, **kwargs)
        outputs, inputs = (y, s), (x, r, *params)
        assert torch.equal(s, x + r)
    else:
        call = torch_reduce.layer_norm if layer else torch_reduce.rms_norm
        y, s = call(x, (hidden,), *arguments, **kwargs), x
        outputs, inputs = (y,), (x, *params)
    s64, w64, b64 = (None if t is None else t.detach().double().requires_grad_() for t in (s, w, b))
    y64 = (layer_norm_formula(s64, (hidden,), w64, b64, eps_used) if layer else
           rms_norm_formula(s64, (hidden,), w64, eps_used))
    kappa = conditioning(s, (hidden,), eps_used, centred=layer)
    tol = {k: v * kappa for k, v in TOL[dtype].items()}
    assert y.dtype == dtype
    torch.testing.assert_close(y, y64.to(dtype), **tol)
    if not layer:  # RMSNorm's input gradient rstd * (g - xhat * mean(g * xhat)) cancels (a row of one element: to
        # g * eps / (x^2 + eps)), and rstd multiplies the rounding of that difference
        rows = s.detach().double().reshape(-1, hidden)
        rstd = (rows.square().mean(-1) + eps_used).rsqrt().max().item() if rows.numel() else 1.0
        tol = {k: v * max(1.0, rstd) for k, v in TOL[dtype].items()}
    grads_out = [torch.randn_like(t) for t in outputs]
    got = torch.autograd.grad(outputs, inputs, grads_out, retain_graph=True)
    leaves64 = [t for t in ((s64, w64, b64) if layer else (s64, w64)) if t is not None]
    want = torch.autograd.grad(y64, leaves64, grads_out[0].double())
    want_input = want[0] + grads_out[1].double() if fused else want[0]
    for g in got[:2 if fused else 1]:
        torch.testing.assert_close(g, want_input.to(dtype), **tol)
    for g, p, p64 in zip(got[2 if fused else 1:], params, want[1:]):
        assert g.dtype == p.dtype
        scale = max(1.0, p64.abs().max().item())
        sum_tol = {k: v * kappa for k, v in SUM_TOL[g.dtype].items()}
        torch.testing.assert_close(g.double() / scale, p64 / scale, **sum_tol, check_dtype=False)
    return outputs, params, grads_out, got


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(NORM_CALLS))
@pytest.mark.parametrize("hidden", [1, 3])
@pytest.mark.parametrize("with_weight", [False, True], ids=["no_weight", "weight"])
def test_more_than_65536_rows_of_few_elements(name, hidden, with_weight, device):
    """Past 65536 rows of a few elements, where torch 2.11's CUDA LayerNorm backward takes another path for its
    parameter gradients (without a weight: a zero bias gradient at one element a row, an error at three; H100):
    every norm against its formula, with and without a weight (LayerNorm with a bias)."""
    x, r = (torch.randn(65539, hidden, device=device, requires_grad=True) for _ in range(2))
    w = (1 + 0.3 * torch.randn(hidden, device=device)).requires_grad_() if with_weight else None
    b = (0.3 * torch.randn(hidden, device=device)).requires_grad_()
    check_norm_grads(name, x, r, w, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", [False, True], ids=["bias", "weight_and_bias"])
def test_two_dim_normalized_shape_past_65536_rows(affine, device):
    """A normalized shape of two dims past 65536 rows: torch 2.11's CUDA LayerNorm backward raises there ("invalid
    gradient at index 1 - got [16] but expected shape compatible with [8, 16]" at 100000 x (8, 16); H100)."""
    x = torch.randn(65539, 2, 3, device=device)
    weight, bias = make_params((2, 3), torch.float32, device, affine, True)
    check(x, (2, 3), weight, bias)


@requires_cuda
@pytest.mark.parametrize("name", list(NORM_CALLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,hidden", [(8193, 1024), (6001, 1600), (8192, 2560), (70000, 256), (3001, 768),
                                         (301, 8200), (701, 18440)])
def test_backward_kernel_layouts(rows, hidden, dtype, name):
    """Shapes on which the backward keeps its column sums in shared memory (many rows: two rows at a time in
    blocks of one vector a thread for 1024 and bfloat16 1600, an odd row count leaving the last pair one row short;
    blocks of 160 threads for 2560, warp rows for 256; bfloat16 18440: three vectors a thread in blocks of 800, the
    last warp's threads partly idle) or in registers (3001 x 768; 8200, one row an SM; float32 18440, each row split
    over a cluster of four blocks, the last block's share shorter), every norm, the fused ones' grad_sum included:
    against float64, and the parameter gradients the same bits on a second run."""
    check_grads_reproducible(name, rows, hidden, dtype, dtype)


def check_grads_reproducible(name, rows, hidden, dtype, param_dtype):
    """Norm `name`'s gradients of a random (rows, hidden) input against float64 (check_norm_grads), and the parameter
    gradients the same bits on a second run."""
    x, r = (torch.randn(rows, hidden, device="cuda").to(dtype).requires_grad_() for _ in range(2))
    w, b = make_params((hidden,), param_dtype, "cuda", True, True)
    outputs, params, grads_out, got = check_norm_grads(name, x, r, w, b)
    again = torch.autograd.grad(outputs, params, grads_out)
    for g, h in zip(got[len(got) - len(params):], again):
        assert torch.equal(g, h)


@requires_cuda
@pytest.mark.parametrize("name", list(NORM_CALLS))
@pytest.mark.parametrize("dtype,param_dtype,hidden",
                         [(dtype, param_dtype, hidden)
                          for dtype, param_dtype in [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                     (torch.float16, torch.float16)]
                          for hidden in (4000, 4096, 8192, 10240, 12288)]
                         + [(torch.float32, torch.float32, 2048)], ids=str)
@pytest.mark.parametrize("rows_per_sm", [50, 8])
def test_backward_two_wide_rows_at_once(rows_per_sm, hidden, dtype, param_dtype, name):
    """Rows of 512-768 threads of two vectors (16-bit 8192-12288 columns) go two at a time to a block
    compiled for 768 threads an SM where each SM has 48 rows at least (Tuning::kWideRowPairsMinBlock), and rows of
    256 threads (16-bit 4000, some of the last warp's threads idle, and 4096; float32 2048) to a block of that fixed
    size (Tuning::kFixedRowPairsBlock); an odd row count leaving the last pair one row short; float32 parameters
    beside bfloat16 (mixed precision); float16 with grad_sum (the fused norms) one row at a time, its pair kernels
    spilling (ptxas, sm_90); fewer rows one at a time. The kernel launched (by its template
    arguments: the block, two vectors a thread, two rows), every norm against float64, the parameter gradients the
    same bits on a second run. bfloat16 with grad_sum takes pairs where its pair kernel keeps off local memory,
    which the compiler decides (the 256-thread RMSNorm one with bfloat16 parameters keeps 8 bytes of stack)."""
    rows = rows_per_sm * torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count + 1
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        check_grads_reproducible(name, rows, hidden, dtype, param_dtype)
        torch.cuda.synchronize()
    kernels = [e.name for e in profile.events() if "row_norm_bwd_rows_kernel" in e.name]
    threads = ((hidden // (16 // dtype.itemsize) + 1) // 2 + 31) // 32 * 32  # a row's block, two vectors a thread
    block = "256u, 256u" if threads == 256 else "0u, 0u"
    pairs = [k for k in kernels if re.search(rf"row_norm_bwd_rows_kernel<[^,]+, [^,]+, {block}, 2, 2, ", k)]
    assert kernels, "no backward row kernel seen"
    if torch.cuda.get_device_capability()[0] == 9:  # the plan measured (HopperTuning); other GPUs' occupancy differs
        if dtype == torch.bfloat16 and name.startswith("add") and rows_per_sm >= 48:
            assert len(pairs) in (0, len(kernels)), kernels  # one plan for the whole call, either way
        else:
            one_at_a_time = rows_per_sm < 48 or (dtype == torch.float16 and name.startswith("add"))
            assert len(pairs) == (0 if one_at_a_time else len(kernels)), kernels


@requires_cuda
@pytest.mark.parametrize("name", list(NORM_CALLS))
@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 16388), (torch.float32, 18432), (torch.float32, 32768),
                                          (torch.float32, 32772), (torch.bfloat16, 40000), (torch.bfloat16, 65536)])
def test_forward_rows_too_long_for_512_threads(name, dtype, hidden):
    """The forward keeps a row of more vectors than 512 threads hold in registers in a block of 1024 (float32
    16388..32768 elements, bfloat16 up to 65536), and streams longer ones (32772): every norm, the fused sum
    included, against the float64 formula of the input rounded as torch's add rounds it; var_mean beside."""
    x = check_norm_forward(name, 37, hidden, dtype)
    var, mean = torch_reduce.var_mean(x, -1, correction=0)
    torch.testing.assert_close(mean.double(), x.double().mean(-1), **TOL[dtype])
    torch.testing.assert_close(var.double(), x.double().var(-1, correction=0), **TOL[dtype])


@requires_cuda
@pytest.mark.parametrize("name", list(NORM_CALLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,hidden", [(8192, 96), (8192, 448), (8192, 1024), (1024, 4096), (4096, 8192),
                                         (257, 16384), (37, 20000)])
def test_forward_kernel_of_each_width(rows, hidden, dtype, name):
    """The forward kernels compiled for 2, 4 and 8 vectors a thread, in each layout that launches them: warps of one,
    two, four and eight vectors a thread (96, 448, 1024; float32 LayerNorm 1024: blocks of 64 threads, at most four
    vectors a thread), blocks of 128-512 threads (4096, 8192, bfloat16 16384), 1024 threads of four (float32
    LayerNorm 16384) and blocks of five vectors a thread (20000: past what 1024 threads hold at four): every norm,
    the fused sum included, against the float64 formula of the input rounded as torch's add rounds it."""
    check_norm_forward(name, rows, hidden, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,hidden", [(6001, 1600), (8193, 2560), (5003, 4096), (301, 8200), (701, 18440)])
def test_forward_more_rows_than_resident_blocks(rows, hidden, dtype):
    """Rows of a warp or a block each (up to 1024 threads), more of them than the GPU holds at once, so the grid
    runs in waves, the last one partial: every norm's output against the float64 formula, the statistics the
    backward reads (mean, rstd) against float64, var_mean beside."""
    x, r = (torch.randn(rows, hidden, device="cuda").to(dtype) for _ in range(2))
    w, b = (t.detach() for t in make_params((hidden,), dtype, "cuda", True, True))
    for name, call in NORM_CALLS.items():
        s = (x + r) if name.startswith("add") else x
        want = TORCH_NORM_CALLS[name.removeprefix("add_")](s.double(), None, w.double(), b.double())
        kappa = conditioning(s, (hidden,), 1e-5, centred="layer" in name)
        torch.testing.assert_close(call(x, r, w, b), want.to(dtype), **{k: v * kappa for k, v in TOL[dtype].items()})
    x64 = x.double()
    var64, mean64 = x64.var(-1, correction=0), x64.mean(-1)
    _, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], w, b, 1e-5)
    _, rms_rstd = torch.ops.reduce.rms_norm_fwd(x, [hidden], w, 1e-5)
    torch.testing.assert_close(mean.double().view(rows), mean64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double().view(rows), (var64 + 1e-5).rsqrt(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rms_rstd.double().view(rows), (x64.square().mean(-1) + 1e-5).rsqrt(), rtol=1e-5,
                               atol=1e-5)
    var, mean = torch_reduce.var_mean(x, -1, correction=0)
    torch.testing.assert_close(mean.double(), mean64, **TOL[dtype])
    torch.testing.assert_close(var.double(), var64, **TOL[dtype])


@requires_cuda
@pytest.mark.parametrize("rows,dtype,hidden,param_dtype", [(1031, torch.bfloat16, 16384, torch.float32),
                                                          (130, torch.bfloat16, 16384, None),
                                                          (1031, torch.bfloat16, 20472, torch.float32),
                                                          (1031, torch.bfloat16, 20472, None),
                                                          (1031, torch.bfloat16, 24584, torch.float32),
                                                          (1031, torch.bfloat16, 24584, None),
                                                          (1031, torch.float32, 16392, None)], ids=str)
def test_backward_wide_rows_mixed_and_plain(rows, dtype, hidden, param_dtype):
    """The backward's plans for rows wider than the Held register kernel holds: bfloat16 16384 held by 1024 threads
    of two vectors with the column sums in shared memory (1031 rows: as many in progress as the Reread kernel, which
    reads each row twice) or read twice (130 rows: too few for blocks of several rows to fill the GPU), 20472 held
    by 864 threads of three (the last warp partly idle), 24584 and float32 16392 split over a cluster's four blocks;
    with float32 weight and bias beside a bfloat16 input (mixed precision), and with none; LayerNorm and RMSNorm
    against float64."""
    x = torch.randn(rows, hidden, device="cuda").to(dtype)
    weight, bias = make_params((hidden,), param_dtype, "cuda", True, True) if param_dtype else (None, None)
    check(x, (hidden,), weight, bias)
    xs = x.detach().requires_grad_()
    leaves = [t for t in (xs, weight) if t is not None]
    out = torch_reduce.rms_norm(xs, (hidden,), weight, 1e-6)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = rms_norm_formula(leaves64[0], (hidden,), leaves64[1] if weight is not None else None, 1e-6)
    want = torch.autograd.grad(ref, leaves64, grad.double())
    torch.testing.assert_close(out, ref.to(dtype), **TOL[dtype])
    torch.testing.assert_close(got[0], want[0].to(dtype), **TOL[dtype])
    for g, w64 in zip(got[1:], want[1:]):
        scale = max(1.0, w64.abs().max().item())
        torch.testing.assert_close(g.double() / scale, w64 / scale, **SUM_TOL[g.dtype], check_dtype=False)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(list(NORM_CALLS)), dtype=st.sampled_from(DTYPES),
       hidden=st.one_of(st.integers(1, 20000), st.integers(1, 5000).map(lambda k: 8 * k),
                        st.sampled_from([768, 1024, 1600, 2560, 4096, 5120, 8192, 12288, 18432])),
       eps=st.sampled_from([None, 1e-5, 1e-6]), data=st.data())
def test_norms_drawn_shapes(device, name, dtype, hidden, eps, data):
    """Any row count and width, so that every plan of the forward and backward (warp rows, blocks of any size, rows
    two at a time, column sums in registers or shared memory, rows read twice or split over a cluster, streamed
    rows, waves of more rows than the GPU holds) meets shapes no list names: every norm, plain and fused, with
    float32 parameters beside a 16-bit input or the input's own, aligned or not; the output, the sum, and every
    gradient against float64 (check_norm_grads), eps drawn or the norm's default."""
    seed_torch(data)
    cap = 2**23 if device == "cuda" else 2**15
    most = max(1, min(70000, cap // hidden))  # drawn integers lean small: the planner's many-row plans need many rows
    rows = data.draw(st.one_of(st.integers(1, most), st.integers(most // 2, most)), label="rows")
    param_dtype = torch.float32 if dtype != torch.float32 and data.draw(st.booleans(), label="mixed") else dtype
    if data.draw(st.booleans(), label="unaligned"):
        x, r = (unaligned(rows, hidden, dtype, device) for _ in range(2))
    else:
        x, r = (torch.randn(rows, hidden, device=device).to(dtype) for _ in range(2))
    w, b = make_params((hidden,), param_dtype, device, True, True)
    check_norm_grads(name, x.requires_grad_(), r.requires_grad_(), w, b, eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(NORM_CALLS))
def test_backward_graph_behaves_as_torchs(name, device):
    """The norms' backward node (written as torch's generated nodes are) as torch's: a second backward raises
    torch's error unless the graph was retained, saved-tensor hooks see what it saves, an in-place change of a
    saved input is caught, and the edges lead to the inputs' gradient accumulators."""
    x, r, w, b = norm_inputs(device)
    fused = name.startswith("add")
    y = NORM_CALLS[name](x, r, w, b)
    y.sum().backward(retain_graph=True)
    first = [t.grad.clone() for t in (x, w)]
    y.sum().backward()
    for t, g in zip((x, w), first):
        torch.testing.assert_close(t.grad, 2 * g)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    wanted = {id(t) for t in (x, r if fused else None, w, b if "layer" in name else None) if t is not None}
    edges = {id(fn.variable) for fn, _ in y.grad_fn.next_functions if fn is not None}
    assert edges == wanted

    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        y = NORM_CALLS[name](x, r, w, b)
    assert any(t is w for t in packed) and packed  # the weight and the statistics at least
    x.grad = None
    y.sum().backward()
    want_x = x.detach().requires_grad_()
    TORCH_NORM_CALLS[name](want_x, r.detach(), w.detach(), b.detach()).sum().backward()
    torch.testing.assert_close(x.grad, want_x.grad)

    base = torch.randn(3, 16, device=device, requires_grad=True)
    z = base * 1  # a non-leaf input changed in place after the forward saved it
    y = NORM_CALLS[name](z, r, w, b)
    z.add_(1)
    if fused:  # the fused norm saves its own sum, not z: changing z does not touch what it needs
        y.sum().backward()
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
