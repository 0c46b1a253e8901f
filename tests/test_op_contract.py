"""Every op of tests/op_specs.py against torch's: values, autograd (gradcheck, double backward, create_graph),
forward-mode AD, torch.func, opcheck, torch.compile, autocast; and the layer_norm rules for mixed-precision
parameters and for tensors on other devices.

Each test runs all of a spec's samples and lists every failing one (with its arguments) in one failure.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

import torch_reduce
from conftest import DEVICES, requires_cuda
from op_specs import BY_NAME, SELF_CHECK, SPECS, describe

SPEC_IDS = [s.name for s in SPECS]
pytestmark = [
    # torch.var_mean warns for N - correction <= 0; functorch's vmap warns about our missing batching rules.
    pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom"),
    pytest.mark.filterwarnings("ignore:.*performance drop"),
]

TOL = {torch.float64: dict(rtol=1e-9, atol=1e-9), torch.float32: dict(rtol=1e-5, atol=1e-4),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=4e-3, atol=4e-3)}


# -------------------------------------------------------------------------------------------- helpers ----

def flat_outputs(out) -> list:
    """An op's tensor outputs as a list (var_mean gives two)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def assert_same(got, want, what="", **tol):
    """The same structure, and tensors of the same dtype, shape and device with close values. ``tol`` scales
    with the largest magnitude in ``want`` (sums and their gradients are compared relative to their size)."""
    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    assert got_spec == want_spec, f"{what}: structure {got_spec} != torch's {want_spec}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if not isinstance(w, torch.Tensor):
            assert g == w, f"{what}[{i}]: {g!r} != torch's {w!r}"
            continue
        assert isinstance(g, torch.Tensor), f"{what}[{i}]: {g!r} where torch gives a tensor"
        assert (g.dtype, g.shape, g.device) == (w.dtype, w.shape, w.device), \
            f"{what}[{i}]: {g.dtype} {list(g.shape)} {g.device}, torch's {w.dtype} {list(w.shape)} {w.device}"
        t = dict(tol or TOL.get(w.dtype, TOL[torch.float32]))
        finite = w[w.isfinite()].abs()
        t["atol"] = t["atol"] * max(1.0, finite.max().item() if finite.numel() else 1.0)
        torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m: f"{what}[{i}]: {m}", **t)


def compact(t: torch.Tensor):
    """(leaf, shape): gradcheck and torch.func perturb inputs element by element, so a stride-0 (expanded)
    tensor is passed as its compact base (a leaf) and expanded back to ``shape`` inside the function."""
    if all(st != 0 or n == 1 for n, st in zip(t.shape, t.stride())):
        return t.detach(), None
    index = tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())
    return t.detach()[index].clone(), t.shape


def as_function(op, args, kwargs):
    """(fn, leaves): fn(*leaves) is op(*args, **kwargs) with every floating tensor argument replaced by the
    matching leaf (a fresh leaf that requires grad, sharing the argument's values and strides)."""
    flat, spec = tree_flatten((args, kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    leaves, shapes = zip(*(compact(flat[i]) for i in where))

    def fn(*tensors):
        new = list(flat)
        for i, t, shape in zip(where, tensors, shapes):
            new[i] = t if shape is None else t.expand(shape)
        a, k = tree_unflatten(new, spec)
        return op(*a, **k)

    return fn, [leaf.requires_grad_() for leaf in leaves]


def each_sample(spec, device, dtype, check, requires_grad=True, samples=None):
    """Run check(args, kwargs) on every sample; fail once, listing every sample that failed and why."""
    failures = []
    for args, kwargs in samples if samples is not None else spec.samples(device, dtype, requires_grad):
        try:
            check(args, kwargs)
        except Exception as error:  # noqa: BLE001  (collected, reported below)
            lines = str(error).strip().splitlines() or [""]
            first = " ".join([lines[0]] + [ln.strip() for ln in lines if ln.startswith("Greatest absolute")])[:300]
            failures.append(f"{spec.name}({describe(args, kwargs)}): {type(error).__name__}: {first}")
    assert not failures, f"{len(failures)} sample(s) failed:\n" + "\n".join(failures)


# --------------------------------------------------------------------------------------------- values ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_values(spec, dtype, device):
    def check(args, kwargs):
        assert_same(spec.op(*args, **kwargs), spec.torch(*args, **kwargs), "output")

    each_sample(spec, device, dtype, check, requires_grad=False)


# ------------------------------------------------------------------------------------------- autograd ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_gradcheck(spec, device):
    def check(args, kwargs):
        fn, leaves = as_function(spec.op, args, kwargs)
        torch.autograd.gradcheck(fn, leaves, fast_mode=True)

    each_sample(spec, device, torch.float64, check)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_gradgradcheck(spec, device):
    def check(args, kwargs):
        if SELF_CHECK and spec.name == "layer_norm" and len(args) > 3 and args[2] is None \
                and args[3] is not None:
            return  # torch's own layer_norm double backward is wrong with a bias and no weight (pytorch#79705)
        fn, leaves = as_function(spec.op, args, kwargs)
        torch.autograd.gradgradcheck(fn, leaves, fast_mode=True)

    each_sample(spec, device, torch.float64, check)


def penalty_gradients(op, args, kwargs, scale, weights):
    """A gradient penalty: loss = sum(w * out^2) of op(x * scale, ...); g = dloss/dx with create_graph;
    backward of |g|. Returns the gradients of scale (a parameter before the op) and of every input."""
    fn, leaves = as_function(op, args, kwargs)
    scale = scale.clone().requires_grad_()
    outs = flat_outputs(fn(leaves[0] * scale, *leaves[1:]))
    loss = sum((o.pow(2) * w).sum() for o, w in zip(outs, weights))
    (g,) = torch.autograd.grad(loss, leaves[0], create_graph=True)
    g.norm().backward()
    return [scale.grad] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_create_graph_gradient_penalty(spec, device):
    def check(args, kwargs):
        x = compact(args[0])[0]
        scale = torch.rand_like(x) + 0.5
        weights = [torch.randn_like(o) for o in flat_outputs(spec.torch(*args, **kwargs))]
        want = penalty_gradients(spec.torch, args, kwargs, scale, weights)
        got = penalty_gradients(spec.op, args, kwargs, scale, weights)
        assert_same(got, want, "gradients of the penalty")

    each_sample(spec, device, torch.float64, check)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_penalty_linear_then_layer_norm(device):
    """The layer_norm case of create_graph as models meet it: Linear -> LayerNorm, a penalty on the gradient of
    the Linear's input; the Linear's and the norm's parameters get torch's gradients (none missing)."""
    x = torch.randn(6, 12, device=device, dtype=torch.float64)
    linear = torch.nn.Linear(12, 10, device=device, dtype=torch.float64)
    theirs = torch.nn.LayerNorm(10, device=device, dtype=torch.float64)
    with torch.no_grad():
        theirs.weight.normal_(1, 0.3)
        theirs.bias.normal_(0, 0.3)
    dy = torch.randn(6, 10, device=device, dtype=torch.float64)
    results = []
    for norm in (theirs, torch_reduce.nn.LayerNorm(10, device=device, dtype=torch.float64)):
        if norm is not theirs:
            norm.load_state_dict(theirs.state_dict())
            if SELF_CHECK:
                norm.forward = lambda t, m=norm: F.layer_norm(t, m.normalized_shape, m.weight, m.bias, m.eps)
        lin = torch.nn.Linear(12, 10, device=device, dtype=torch.float64)
        lin.load_state_dict(linear.state_dict())
        inp = x.clone().requires_grad_()
        loss = (norm(lin(inp)).pow(2) * dy).sum()
        (g,) = torch.autograd.grad(loss, inp, create_graph=True)
        g.norm().backward()
        results.append([lin.weight.grad, lin.bias.grad, norm.weight.grad, norm.bias.grad])
    names = ["Linear.weight", "Linear.bias", "LayerNorm.weight", "LayerNorm.bias"]
    missing = [n for n, g in zip(names, results[1]) if g is None]
    assert not missing, f"no gradient for {missing}"
    assert_same(results[1], results[0], "Linear weight, bias; LayerNorm weight, bias")


# ---------------------------------------------------------------------------------------- forward AD ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_jvp(spec, device):
    def check(args, kwargs):
        fn, leaves = as_function(spec.op, args, kwargs)
        ref, _ = as_function(spec.torch, args, kwargs)
        primals = tuple(leaf.detach() for leaf in leaves)
        tangents = tuple(torch.randn_like(p) for p in primals)
        got, want = torch.func.jvp(fn, primals, tangents), torch.func.jvp(ref, primals, tangents)
        zeros = [not t.any() for t in flat_outputs(got[1])]
        assert not any(zeros), f"all-zero tangent for output(s) {zeros} (torch's are not)"
        assert_same(got, want, "(out, tangent)")

    each_sample(spec, device, torch.float64, check)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_forward_ad_dual_tensors(spec, device):
    def tangents_of(fn, primals, tangents):
        with fwAD.dual_level():
            outs = flat_outputs(fn(*[fwAD.make_dual(p, t) for p, t in zip(primals, tangents)]))
            return [fwAD.unpack_dual(o).tangent for o in outs]

    def check(args, kwargs):
        fn, leaves = as_function(spec.op, args, kwargs)
        ref, _ = as_function(spec.torch, args, kwargs)
        primals = [leaf.detach() for leaf in leaves]
        tangents = [torch.randn_like(p) for p in primals]
        got = tangents_of(fn, primals, tangents)
        assert all(t is not None for t in got), f"no tangent for output(s) {[t is None for t in got]}"
        assert_same(got, tangents_of(ref, primals, tangents), "tangents")

    each_sample(spec, device, torch.float64, check)


# ------------------------------------------------------------------------------------------ torch.func ----

# An error is fine only if it says which transform (or functorch / forward-mode AD) is not supported.
LIMITATION = {
    "grad": r"functorch|torch\.func|\bgrad\b",
    "vjp": r"functorch|torch\.func|\bvjp\b",
    "jacrev": r"functorch|torch\.func|jacrev|\bvjp\b",
    "jacfwd": r"functorch|torch\.func|jacfwd|\bjvp\b|forward[- ]mode|forward AD",
    "vmap": r"functorch|torch\.func|vmap|batching rule",
}


def run_transform(transform, fn, leaves, weights, batch):
    argnums = tuple(range(len(leaves)))
    if transform == "grad":
        def scalar(*ts):
            return sum((o * w).sum() for o, w in zip(flat_outputs(fn(*ts)), weights))
        return torch.func.grad(scalar, argnums=argnums)(*leaves)
    if transform == "vjp":
        out, vjp_fn = torch.func.vjp(fn, *leaves)
        return out, vjp_fn(tuple(weights) if isinstance(out, tuple) else weights[0])
    if transform == "jacrev":
        return torch.func.jacrev(fn, argnums=argnums)(*leaves)
    if transform == "jacfwd":
        return torch.func.jacfwd(fn, argnums=argnums)(*leaves)
    return torch.func.vmap(fn)(*batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transform", list(LIMITATION))
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_torch_func(spec, transform, device):
    """torch's result, or a RuntimeError that names the transform; never a wrong value."""
    def check(args, kwargs):
        fn, leaves = as_function(spec.op, args, kwargs)
        ref, _ = as_function(spec.torch, args, kwargs)
        leaves = [leaf.detach() for leaf in leaves]
        weights = [torch.randn_like(o) for o in flat_outputs(ref(*leaves))]
        batch = [torch.stack([leaf] + [torch.randn_like(leaf) for _ in range(2)]) for leaf in leaves]
        want = run_transform(transform, ref, leaves, weights, batch)
        try:
            got = run_transform(transform, fn, leaves, weights, batch)
        except RuntimeError as error:
            assert re.search(LIMITATION[transform], str(error), re.IGNORECASE), \
                f"{transform} raised an error that names no limitation: {error}"
            return
        assert_same(got, want, transform)

    each_sample(spec, device, torch.float64, check)


# --------------------------------------------------------------------------------- opcheck, compile ----

class RecordReduceOps(TorchFunctionMode):
    """Records the calls of torch.ops.reduce.* made from Python (the registered ops our callables reach)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverloadPacket):
            func = func.default
        if isinstance(func, torch._ops.OpOverload) and func.namespace == "reduce":
            self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def opcheck_calls(op, args, kwargs):
    """opcheck every registered op that op(*args, **kwargs) calls, with the very arguments it passes."""
    with RecordReduceOps() as record:
        op(*args, **kwargs)
    assert record.calls, "no torch.ops.reduce op was called"
    for func, a, k in record.calls:
        torch.library.opcheck(func, a, k)


@pytest.mark.skipif(SELF_CHECK, reason="torch's ops are not in torch.ops.reduce")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_opcheck(spec, device):
    each_sample(spec, device, torch.float32, lambda args, kwargs: opcheck_calls(spec.op, args, kwargs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_compile_fullgraph(spec, device):
    """torch.compile(fullgraph=True) (aot_eager on CPU, inductor on CUDA): eager's outputs and gradients."""
    backend = "aot_eager" if device == "cpu" else "inductor"

    def check(args, kwargs):
        torch._dynamo.reset()  # every sample compiles afresh (no recompile limit across samples)
        fn, leaves = as_function(spec.op, args, kwargs)
        compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=False)
        results = []
        for f in (compiled, fn):
            outs = flat_outputs(f(*leaves))
            loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
            results.append((outs, torch.autograd.grad(loss, leaves)))
        assert_same(results[0], results[1], "compiled (outputs, gradients)")

    # The samples of one ladder op are alike: three of them are enough to compile.
    samples = spec.samples(device, torch.float64, True)
    each_sample(spec, device, torch.float64, check, samples=samples[:3] if spec.name.startswith("sum_") else samples)


# ------------------------------------------------------------------------------------------- autocast ----

AUTOCAST = [pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16")] + [
    pytest.param("cuda", dtype, id=f"cuda-{str(dtype)[6:]}", marks=requires_cuda)
    for dtype in (torch.bfloat16, torch.float16)]


def run_under_autocast(op, args, kwargs, device, autocast_dtype, grads_out=None):
    """(outputs, input gradients) of op under autocast, or the RuntimeError it raises."""
    fn, leaves = as_function(op, args, kwargs)
    try:
        with torch.autocast(device, dtype=autocast_dtype):
            outs = flat_outputs(fn(*leaves))
    except RuntimeError as error:
        return error, None
    grads_out = grads_out or [torch.randn_like(o, dtype=torch.float32) for o in outs]
    grads = torch.autograd.grad(outs, leaves, [g.to(o.dtype) for g, o in zip(grads_out, outs)])
    return (outs, list(grads)), grads_out


@pytest.mark.parametrize("device,autocast_dtype", AUTOCAST)
@pytest.mark.parametrize("input_dtype", ["float32", "autocast", "float64"])
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_autocast(spec, input_dtype, device, autocast_dtype):
    """torch's output dtype and values under autocast, and gradients of torch's dtypes."""
    dtype = autocast_dtype if input_dtype == "autocast" else getattr(torch, input_dtype)

    def check(args, kwargs):
        want, grads_out = run_under_autocast(spec.torch, args, kwargs, device, autocast_dtype)
        got, _ = run_under_autocast(spec.op, args, kwargs, device, autocast_dtype, grads_out)
        if isinstance(want, RuntimeError):
            assert isinstance(got, RuntimeError), f"torch raises ({want}); ours returns"
            return
        if isinstance(got, RuntimeError):
            raise got
        assert_same(got, want, "autocast (outputs, gradients)", **TOL[autocast_dtype])

    each_sample(spec, device, dtype, check)


@pytest.mark.parametrize("device,autocast_dtype", AUTOCAST)
def test_autocast_linear_then_layer_norm(device, autocast_dtype):
    """The usual case: a Linear's 16-bit activations into a LayerNorm with float32 parameters."""
    x = torch.randn(8, 16, device=device)
    theirs = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.LayerNorm(24)).to(device)
    with torch.no_grad():
        theirs[1].weight.normal_(1, 0.3)
        theirs[1].bias.normal_(0, 0.3)
    ours = torch.nn.Sequential(torch.nn.Linear(16, 24), torch_reduce.nn.LayerNorm(24)).to(device)
    ours.load_state_dict(theirs.state_dict())
    if SELF_CHECK:
        ours[1] = theirs[1].__class__(24).to(device)
        ours[1].load_state_dict(theirs[1].state_dict())
    dy = torch.randn(8, 24, device=device)
    results = []
    for model in (theirs, ours):
        with torch.autocast(device, dtype=autocast_dtype):
            out = model(x)
        grads = torch.autograd.grad(out, list(model.parameters()), dy.to(out.dtype))
        results.append((out, list(grads)))
    assert_same(results[1], results[0], "(output, Linear and LayerNorm gradients)", **TOL[autocast_dtype])


# ---------------------------------------------------------------------- mixed-precision parameters ----

def layer_norm_ours():
    return BY_NAME["layer_norm"].op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_layer_norm_16bit_input_float32_params(device, dtype, with_bias):
    x = (1 + 2 * torch.randn(5, 33, device=device)).to(dtype).requires_grad_()
    weight = (1 + 0.3 * torch.randn(33, device=device)).requires_grad_()
    bias = (0.3 * torch.randn(33, device=device)).requires_grad_() if with_bias else None
    leaves = [t for t in (x, weight, bias) if t is not None]
    dy = torch.randn(5, 33, device=device).to(dtype)

    out = layer_norm_ours()(x, (33,), weight, bias)
    grads = torch.autograd.grad(out, leaves, dy)
    assert out.dtype == dtype
    assert [g.dtype for g in grads] == [dtype] + [torch.float32] * (len(leaves) - 1)

    # float64 reference: the output and the input's gradient rounded once to the input's dtype
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = F.layer_norm(leaves64[0], (33,), leaves64[1], leaves64[2] if with_bias else None)
    ref_grads = torch.autograd.grad(ref, leaves64, dy.double())
    assert_same(out, ref.to(dtype), "output", **TOL[dtype])
    assert_same(grads[0], ref_grads[0].to(dtype), "grad input", **TOL[dtype])
    assert_same(list(grads[1:]), [g.float() for g in ref_grads[1:]], "grad weight, bias", rtol=1e-2, atol=1e-2)
    if device == "cpu":  # torch's CPU layer_norm takes this mix
        want = F.layer_norm(x, (33,), weight, bias)
        assert_same((out, list(grads)), (want, list(torch.autograd.grad(want, leaves, dy))), "vs F.layer_norm",
                    **TOL[dtype])
    if not SELF_CHECK:  # and the fake kernel agrees with the real one on this mix
        opcheck_calls(layer_norm_ours(), (x, (33,), weight, bias), {})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype,param_dtype", [(torch.float32, torch.bfloat16), (torch.float64, torch.float32),
                                                 (torch.float16, torch.bfloat16), (torch.bfloat16, torch.float64)],
                         ids=str)
def test_layer_norm_rejected_dtype_mixes(device, x_dtype, param_dtype):
    """The mixes torch's CPU layer_norm rejects raise (never a silent cast of the parameters)."""
    x = torch.randn(4, 8, device=device, dtype=x_dtype)
    weight, bias = torch.ones(8, device=device, dtype=param_dtype), torch.zeros(8, device=device, dtype=param_dtype)
    with pytest.raises(RuntimeError):  # the rule itself, checked on torch
        F.layer_norm(x.cpu(), (8,), weight.cpu(), bias.cpu())
    with pytest.raises(RuntimeError):
        layer_norm_ours()(x, (8,), weight, bias)
    with pytest.raises(RuntimeError):
        layer_norm_ours()(x, (8,), weight, None)


# ------------------------------------------------------------------------------ devices, fake kernels ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["weight", "bias", "both"])
def test_layer_norm_params_on_meta_raise(device, which):
    x = torch.randn(4, 8, device=device)
    weight = torch.ones(8, device="meta" if which in ("weight", "both") else device)
    bias = torch.zeros(8, device="meta" if which in ("bias", "both") else device)
    with pytest.raises(RuntimeError, match="device"):
        layer_norm_ours()(x, (8,), weight, bias)
    if which != "bias":
        with pytest.raises(RuntimeError, match="device"):
            layer_norm_ours()(x, (8,), weight)


@requires_cuda
@pytest.mark.parametrize("x_device,param_device", [("cuda", "cpu"), ("cpu", "cuda")])
def test_layer_norm_params_on_other_device_raise(x_device, param_device):
    x = torch.randn(4, 8, device=x_device)
    with pytest.raises(RuntimeError, match="device"):
        layer_norm_ours()(x, (8,), torch.ones(8, device=param_device), torch.zeros(8, device=x_device))
    with pytest.raises(RuntimeError, match="device"):
        layer_norm_ours()(x, (8,), torch.ones(8, device=x_device), torch.zeros(8, device=param_device))


def _bad_layer_norm_calls():
    """Calls of the registered LayerNorm ops that the CPU kernels reject: (name, op, args)."""
    fwd, bwd = torch.ops.reduce.layer_norm_fwd.default, torch.ops.reduce.layer_norm_bwd.default
    x, w = torch.randn(4, 6), torch.ones(6)
    _, mean, rstd = fwd(x, [6], None, None, 1e-5)
    dy, mask = torch.randn(4, 6), [True, True, True]
    return [
        ("normalized_shape not the trailing dims", fwd, (x, [5], None, None, 1e-5)),
        ("normalized_shape longer than the input", fwd, (x, [2, 4, 6], None, None, 1e-5)),
        ("weight shape", fwd, (x, [6], torch.ones(5), None, 1e-5)),
        ("bias shape", fwd, (x, [6], w, torch.zeros(5), 1e-5)),
        ("weight dtype (float32 input, bfloat16 weight)", fwd, (x, [6], w.bfloat16(), None, 1e-5)),
        ("weight dtype (float64 input, float32 weight)", fwd, (x.double(), [6], w, None, 1e-5)),
        ("integer input", fwd, (x.int(), [6], None, None, 1e-5)),
        ("backward: grad_out shape", bwd, (torch.randn(4, 5), x, [6], mean, rstd, w, None, mask)),
        ("backward: mean/rstd shape", bwd, (dy, x, [6], mean[:2], rstd[:2], w, None, mask)),
        ("backward: normalized_shape", bwd, (dy, x, [5], mean, rstd, w, None, mask)),
        ("backward: weight shape", bwd, (dy, x, [6], mean, rstd, torch.ones(5), None, mask)),
    ]


@pytest.mark.skipif(SELF_CHECK, reason="checks our registered ops' fake kernels")
def test_fake_kernels_reject_what_the_kernels_reject():
    """On meta tensors (the fake kernels, as torch.compile traces them) the same bad calls raise."""
    failures = []
    for name, op, args in _bad_layer_norm_calls():
        with pytest.raises(RuntimeError):  # the case itself: the CPU kernel rejects it
            op(*args)
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        try:
            op(*meta)
            failures.append(name)
        except RuntimeError:
            pass
    assert not failures, f"the fake kernel accepts what the kernel rejects: {failures}"


@pytest.mark.skipif(SELF_CHECK, reason="checks our registered ops' fake kernels")
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "var_mean"])
def test_fake_reductions_raise_like_the_kernels(name):
    x = torch.randn(3, 4)
    cases = [((x, 2), {}), ((x, (0, -2)), {}), ((x, (0, 0)), {}), ((torch.empty(0, 4), 0), {}),
             ((torch.empty(0, 4),), {}), ((x.long(), 1), {})]
    op = getattr(torch_reduce, name)
    for args, kwargs in cases:
        try:
            op(*args, **kwargs)
            expected = None
        except (RuntimeError, IndexError) as error:
            expected = type(error)
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        if expected is None:
            real = flat_outputs(op(*args, **kwargs))
            fake = flat_outputs(op(*meta, **kwargs))
            assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real], (args, kwargs)
        else:
            with pytest.raises(expected):
                op(*meta, **kwargs)
