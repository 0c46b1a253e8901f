"""RMSNorm beyond the op contract (tests/test_op_contract.py runs values, every autograd mode, autocast, errors,
opcheck, compile, determinism and > 2^31 elements on the rms_norm spec): the module as a drop-in for
torch.nn.RMSNorm, mixed-precision weights, convert_norms on every kind of norm a model holds, and two
transformers models (Llama: RMSNorm; GPT-2: LayerNorm) converted, against the unconverted ones: logits, every
parameter's gradient, and 20 AdamW steps, in float32 and under bf16 autocast."""
import copy
import inspect
import os
import subprocess
import sys
from contextlib import nullcontext
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_reduce
from conftest import DEVICES, requires_cuda
from test_models import assert_close_normwise


def float64_rms_norm(x, shape, weight=None, eps=None):
    x64 = x.double()
    eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps if eps is None else eps
    dims = tuple(range(-len(shape), 0))
    y = x64 * torch.rsqrt(x64.pow(2).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kwargs", [{}, {"eps": 1e-6}, {"elementwise_affine": False}, {"eps": 1e-3, "dtype": torch.float64}],
                         ids=["default", "eps", "no_weight", "float64"])
def test_module_is_a_drop_in(kwargs, device):
    theirs = nn.RMSNorm((5, 12), device=device, **kwargs)
    ours = torch_reduce.nn.RMSNorm((5, 12), device=device, **kwargs)
    assert isinstance(ours, nn.RMSNorm) and repr(ours) == repr(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    if theirs.weight is not None:
        with torch.no_grad():
            theirs.weight.normal_(1, 0.3)
        ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 12, device=device, dtype=kwargs.get("dtype", torch.float32), requires_grad=True)
    out, want = ours(x), theirs(x)
    assert out.dtype == want.dtype and out.shape == want.shape
    ref = float64_rms_norm(x, (5, 12), theirs.weight, kwargs.get("eps"))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(out)
    params = [x] + ([ours.weight] if ours.weight is not None else [])
    got = torch.autograd.grad(out, params, dy)
    wanted = torch.autograd.grad(want, [x] + ([theirs.weight] if theirs.weight is not None else []), dy)
    for g, w in zip(got, wanted):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_input_float32_weight(dtype, device):
    """Mixed precision: the output in the input's dtype (as F.rms_norm gives it), statistics and weight's gradient
    in float32, values those of the float64 formula."""
    x = torch.randn(6, 40, device=device).to(dtype).requires_grad_()
    weight = torch.randn(40, device=device).mul_(0.3).add_(1).requires_grad_()
    out = torch_reduce.rms_norm(x, (40,), weight)
    assert out.dtype == dtype
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    ref = float64_rms_norm(x64, (40,), w64)
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    dy = torch.randn(6, 40, device=device)
    gx, gw = torch.autograd.grad(out, (x, weight), dy.to(dtype))
    rx, rw = torch.autograd.grad(ref, (x64, w64), dy.to(dtype).double())
    assert gx.dtype == dtype and gw.dtype == torch.float32
    torch.testing.assert_close(gx.double(), rx, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gw.double(), rw, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.float64, torch.float32), (torch.float32, torch.float64),
                                              (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16),
                                              (torch.float16, torch.float64)], ids=str)
def test_weight_of_another_dtype(x_dtype, w_dtype, op, device):
    """F.rms_norm takes a weight of any floating dtype (the output keeps the input's, the weight's gradient the
    weight's): so do ours, with torch's values (the weight cast to the dtype the product is computed in)."""
    x = torch.randn(5, 33, device=device, dtype=x_dtype, requires_grad=True)
    weight = torch.randn(33, device=device, dtype=w_dtype).mul_(0.3).add_(1).requires_grad_()
    if op == "rms_norm":
        out, want = torch_reduce.rms_norm(x, (33,), weight), F.rms_norm(x, (33,), weight)
    else:
        out = torch_reduce.add_rms_norm(x, x, (33,), weight)[0]
        want = F.rms_norm(x + x, (33,), weight)
    assert out.dtype == want.dtype == x_dtype
    tol = dict(rtol=1e-2, atol=1e-2) if x_dtype.itemsize == 2 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want, **tol)
    dy = torch.randn_like(out)
    for got, wanted in zip(torch.autograd.grad(out, (x, weight), dy), torch.autograd.grad(want, (x, weight), dy)):
        assert got.dtype == wanted.dtype
        torch.testing.assert_close(got.double(), wanted.double(), rtol=2e-2, atol=2e-2 if x_dtype.itemsize == 2 else 1e-4)


FUSED_ADDS = {"add_layer_norm": (torch_reduce.add_layer_norm, F.layer_norm),
              "add_rms_norm": (torch_reduce.add_rms_norm, F.rms_norm)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(FUSED_ADDS))
@pytest.mark.parametrize("x_shape, x_dtype, r_shape, r_dtype", [
    ((4, 6, 40), torch.bfloat16, (4, 6, 40), torch.float32),  # a 16-bit output beside a float32 residual stream
    ((4, 6, 40), torch.float32, (4, 6, 40), torch.float16),
    ((2, 3, 40), torch.float32, (40,), torch.float32),        # one residual row for every row
    ((40,), torch.float64, (5, 1, 40), torch.float64),        # the input broadcast
    ((3, 40), torch.float16, (), torch.float32),              # a 0-dim float32 residual keeps the input's dtype
], ids=str)
def test_fused_add_broadcasts_and_promotes_as_torchs_add(x_shape, x_dtype, r_shape, r_dtype, name, device):
    """input + residual as torch's add: broadcast and promoted (the sum torch's bits), the norm of that sum, and
    the gradients of both through it, each in its own dtype and shape."""
    ours_op, torch_norm = FUSED_ADDS[name]
    x = torch.randn(x_shape, device=device, dtype=x_dtype, requires_grad=True)
    r = torch.randn(r_shape, device=device, dtype=r_dtype, requires_grad=True)
    want_total = x + r
    w = torch.randn(40, device=device, dtype=want_total.dtype, requires_grad=True)
    y, total = ours_op(x, r, (40,), w)
    want = torch_norm(want_total, (40,), w)
    assert torch.equal(total, want_total) and y.dtype == want.dtype and y.shape == want.shape
    def tol(dtype):
        # A 16-bit sum rounds its elements and their gradients either way, and a broadcast operand's gradient adds
        # up to 120 of those (in whatever dtype it has): a few 16-bit ulps of the terms, absolute.
        sixteen = want_total.dtype.itemsize == 2 or dtype.itemsize == 2
        return dict(rtol=2e-2, atol=5e-2) if sixteen else dict(rtol=1e-4, atol=1e-4)

    torch.testing.assert_close(y, want, **tol(want.dtype))
    dy, dtotal = torch.randn_like(y), torch.randn_like(total)
    got = torch.autograd.grad((y, total), (x, r, w), (dy, dtotal))
    wanted = torch.autograd.grad((want, want_total), (x, r, w), (dy, dtotal))
    for g, h in zip(got, wanted):
        assert g.dtype == h.dtype and g.shape == h.shape
        torch.testing.assert_close(g, h, **tol(g.dtype))


@pytest.mark.parametrize("name", list(FUSED_ADDS))
def test_fused_add_under_autocast_with_a_float32_residual_stream(name):
    """The README's decoder-layer change under CPU autocast: a bfloat16 projection beside a float32 residual
    stream gives torch's dtypes and values (the sum and the norm in float32), not an error."""
    ours_op, torch_norm = FUSED_ADDS[name]
    proj, residual = nn.Linear(48, 48), torch.randn(2, 5, 48, requires_grad=True)
    weight, x = torch.randn(48, requires_grad=True), torch.randn(2, 5, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = proj(x)
        y, total = ours_op(out, residual, (48,), weight)
        want_total = out + residual
        want = torch_norm(want_total, (48,), weight)
    assert y.dtype == want.dtype and total.dtype == want_total.dtype == torch.float32
    assert torch.equal(total, want_total)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    params = (proj.weight, residual, weight)
    got = torch.autograd.grad((y * y).sum() + total.sum(), params, retain_graph=True)
    # The projection's gradient comes through a bfloat16 matmul of a bfloat16 output gradient, which a last-bit
    # difference upstream can round the other way: compared as a whole, as the model tests compare.
    for g, h, what in zip(got, torch.autograd.grad((want * want).sum() + want_total.sum(), params),
                          ("projection", "residual", "weight")):
        assert_close_normwise(g, h, 1e-2, what)


@pytest.mark.parametrize("name", list(FUSED_ADDS))
def test_fused_add_of_mixed_dtypes_compiles_fullgraph(name):
    """The promotion of the README's bfloat16 projection beside a float32 residual stream, under
    torch.compile(fullgraph=True): torch's values and dtypes."""
    ours_op, torch_norm = FUSED_ADDS[name]
    x, r, w = torch.randn(4, 40).bfloat16(), torch.randn(4, 40), torch.randn(40)
    compiled = torch.compile(lambda x, r, w: ours_op(x, r, (40,), w), fullgraph=True, backend="aot_eager")
    total = x + r
    for got, want in zip(compiled(x, r, w), (torch_norm(total, (40,), w), total)):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("name", list(FUSED_ADDS))
def test_fused_add_takes_a_0dim_cpu_tensor_beside_another_device(name, device):
    """torch's x + r takes a 0-dim CPU tensor beside a tensor on any device, on either side."""
    ours_op, torch_norm = FUSED_ADDS[name]
    x, scalar = torch.randn(3, 40, device=device), torch.tensor(1.5)
    for args in ((x, scalar), (scalar, x)):
        y, total = ours_op(*args, (40,))
        want_total = args[0] + args[1]
        assert total.device == y.device == x.device and total.shape == want_total.shape
        if device != "meta":
            torch.testing.assert_close(total, want_total)
            torch.testing.assert_close(y, torch_norm(want_total, (40,)))


def test_fused_add_refuses_what_torchs_add_refuses():
    for op in (torch_reduce.add_layer_norm, torch_reduce.add_rms_norm):
        with pytest.raises(RuntimeError):
            torch.randn(4, 6) + torch.randn(5)
        with pytest.raises(RuntimeError, match="broadcast"):
            op(torch.randn(4, 6), torch.randn(5), (6,))


# ------------------------------------------------------------------------------------------ convert_norms ----

class LlamaStyleRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm, as that library writes it."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Olmo2StyleRMSNorm(LlamaStyleRMSNorm):
    """transformers' Olmo2RMSNorm: the weight applied in float32, then cast back (the input's dtype)."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class T5StyleRMSNorm(LlamaStyleRMSNorm):
    """T5's (and IdeficsRMSNorm's) rule: cast to a 16-bit weight's dtype, else promote: must be left alone."""

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class KeywordXRMSNorm(LlamaStyleRMSNorm):
    """Llama's formula with its argument named ``x`` (as Llama4TextRMSNorm): callable as norm(x=h) once converted."""

    def forward(self, x):
        return super().forward(x)


class GemmaStyleRMSNorm(LlamaStyleRMSNorm):
    """A look-alike with another formula, (1 + weight): must be left alone."""

    def forward(self, hidden_states):
        x = hidden_states.float()
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (out * (1.0 + self.weight.float())).type_as(hidden_states)


class UpcastRMSNorm(nn.RMSNorm):
    """An nn.RMSNorm subclass with a forward of its own: must be left alone."""

    def forward(self, x):
        return super().forward(x.float()).type_as(x)


def norms_model(hidden=16):
    return nn.Sequential(nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.RMSNorm(hidden, eps=1e-5),
                         LlamaStyleRMSNorm(hidden), GemmaStyleRMSNorm(hidden), UpcastRMSNorm(hidden), nn.Linear(hidden, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_convert_norms_converts_what_it_can_keep(device):
    model = norms_model().to(device)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "weight") and m.weight is not None and m.weight.dim() == 1:
                m.weight.normal_(1, 0.3)
    reference = copy.deepcopy(model)
    params_before = [id(p) for p in model.parameters()]
    seen = []
    model[3].register_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    assert torch_reduce.nn.convert_norms(model) is model
    assert [id(p) for p in model.parameters()] == params_before
    assert type(model[1]) is torch_reduce.nn.LayerNorm and type(model[2]) is torch_reduce.nn.RMSNorm
    assert type(model[3]).__name__ == "LlamaStyleRMSNorm" and type(model[3]) is not LlamaStyleRMSNorm
    assert isinstance(model[3], LlamaStyleRMSNorm)
    assert type(model[4]) is GemmaStyleRMSNorm and type(model[5]) is UpcastRMSNorm
    x = torch.randn(4, 16, device=device)
    torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)
    assert seen == ["LlamaStyleRMSNorm"]
    assert torch_reduce.nn.convert_norms(model) is model  # converting twice changes nothing
    assert type(model[3]).__mro__[1] is LlamaStyleRMSNorm


class ChannelRMSNorm(LlamaStyleRMSNorm):
    """Llama's formula over dim 1 of (N, C, L): the same as Llama's on (rows, C) input, another norm on 3-d input."""

    def forward(self, hidden_states):
        x = hidden_states.float()
        out = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.variance_epsilon)
        return self.weight.view(-1, *[1] * (x.dim() - 2)) * out.to(hidden_states.dtype)


class BroadcastChannelRMSNorm(LlamaStyleRMSNorm):
    """A channel norm whose forward raises on (rows, C) and (N, L, C) input."""

    def forward(self, hidden_states):
        x = hidden_states.float()
        out = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.variance_epsilon)
        return self.weight[:, None] * out.to(hidden_states.dtype)


class ResidualRMSNorm(LlamaStyleRMSNorm):
    """Llama's formula with a residual argument: ours would drop it."""

    def forward(self, hidden_states, residual=None):
        return super().forward(hidden_states if residual is None else hidden_states + residual)


@pytest.mark.parametrize("cls", [ChannelRMSNorm, BroadcastChannelRMSNorm, ResidualRMSNorm])
def test_convert_norms_leaves_other_norms_with_llamas_fields_alone(cls):
    """A ...RMSNorm with a weight and a variance_epsilon whose forward normalizes another dim, raises on the probe's
    input, or takes more than the input is not converted (and converting does not raise)."""
    module = cls(6)
    with torch.no_grad():
        module.weight.normal_(1, 0.3)
    x = torch.randn(2, 6, 6)
    before = module(x, x) if cls is ResidualRMSNorm else module(x.transpose(1, 2)[..., :1])
    assert torch_reduce.nn.convert_norms(module) is module and type(module) is cls
    after = module(x, x) if cls is ResidualRMSNorm else module(x.transpose(1, 2)[..., :1])
    torch.testing.assert_close(after, before, rtol=0, atol=0)


class KeepsTorchForward(nn.LayerNorm):
    """An nn.LayerNorm subclass that keeps torch's forward: converted to a subclass of it."""


OUR_FORWARDS = (torch_reduce.nn.LayerNorm.forward, torch_reduce.nn.RMSNorm.forward,
                torch_reduce.nn._transformers_rms_norm_forward)


def test_converted_models_pickle(tmp_path):
    """torch.save of a whole converted model (pickle finds a class by its module and name, which for a converted
    subclass lead to its original class) loads as the same converted modules, in this process and in a new one
    that has converted nothing."""
    model = nn.Sequential(norms_model(), KeepsTorchForward(3))
    torch_reduce.nn.convert_norms(model)
    converted = [type(m) for m in model.modules() if type(m).forward in OUR_FORWARDS]
    assert len(converted) == 4
    x = torch.randn(4, 16)
    want = model(x)
    path = tmp_path / "model.pt"
    torch.save((model, x, want), path)
    loaded = torch.load(path, weights_only=False)[0]
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    torch.testing.assert_close(loaded(x), want, rtol=0, atol=0)
    again = copy.deepcopy(loaded)
    assert [type(m) for m in again.modules()] == [type(m) for m in model.modules()]
    code = f"""
import torch, torch_reduce
from test_rms_norm import OUR_FORWARDS
model, x, want = torch.load({str(path)!r}, weights_only=False)
names = [type(m).__name__ for m in model.modules() if type(m).forward in OUR_FORWARDS]
assert names == {[c.__name__ for c in converted]!r}, names
torch.testing.assert_close(model(x), want, rtol=0, atol=0)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_converted_models_script(device):
    """torch.jit.script of a converted model calls the registered ops: torch's outputs and gradients, under autocast
    too. A converted transformers-style RMSNorm cannot switch autocast off under TorchScript: it raises as it runs."""
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.RMSNorm(16, eps=1e-5), KeepsTorchForward(16),
                          nn.LayerNorm(16, bias=False), nn.RMSNorm(16, elementwise_affine=False),
                          nn.Linear(16, 3)).to(device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(1, 0.3)
    reference = copy.deepcopy(model)
    scripted = torch.jit.script(torch_reduce.nn.convert_norms(model))
    assert "reduce::layer_norm_fwd" in str(scripted.inlined_graph)
    assert "reduce::rms_norm_fwd" in str(scripted.inlined_graph)
    for autocast in (False, True):
        x = torch.randn(5, 16, device=device, requires_grad=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            got, want = scripted(x), reference(x)
        assert got.dtype == want.dtype
        tol = 2e-2 if autocast else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        for g, w in zip(torch.autograd.grad(got.float().square().sum(), [x, *scripted.parameters()]),
                        torch.autograd.grad(want.float().square().sum(), [x, *reference.parameters()])):
            assert_close_normwise(g, w, tol, "gradient")
    llama = torch.jit.script(torch_reduce.nn.convert_norms(LlamaStyleRMSNorm(16).to(device)))
    with pytest.raises(Exception, match="does not run under TorchScript"):
        llama(torch.randn(5, 16, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_convert_norms_leaves_the_random_stream_alone(device):
    """Probing a transformers-style norm draws from a generator of its own: a seeded run draws the same numbers after
    converting as without (dropout masks, data order)."""
    model = norms_model().to(device)
    torch.manual_seed(1)
    want = torch.rand(4, device=device)
    torch.manual_seed(1)
    torch_reduce.nn.convert_norms(model)
    assert type(model[3]) is not LlamaStyleRMSNorm  # the probe ran
    torch.testing.assert_close(torch.rand(4, device=device), want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_convert_norms_on_the_meta_device(device):
    """A model built on the meta device, converted, then materialized (to_empty and a state_dict, as FSDP2 and large
    checkpoints do) is converted as one built on a real device, and computes the same; the look-alikes stay alone."""
    reference = norms_model().to(device)
    with torch.no_grad():
        for m in reference.modules():
            if hasattr(m, "weight") and m.weight is not None and m.weight.dim() == 1:
                m.weight.normal_(1, 0.3)
    with torch.device("meta"):
        model = norms_model()
    torch.manual_seed(1)
    want = torch.rand(4)
    torch.manual_seed(1)
    torch_reduce.nn.convert_norms(model)
    torch.testing.assert_close(torch.rand(4), want, rtol=0, atol=0)  # the probe's stand-in drew from its own stream
    on_real = torch_reduce.nn.convert_norms(copy.deepcopy(reference))
    assert [type(m) for m in model] == [type(m) for m in on_real]
    assert type(model[3]) is not LlamaStyleRMSNorm and type(model[4]) is GemmaStyleRMSNorm
    meta = torch.randn(4, 16, device="meta", requires_grad=True)
    model(meta).sum().backward()  # converted, each norm runs on meta tensors too (no autocast there)
    model.to_empty(device=device).load_state_dict(reference.state_dict())
    x = torch.randn(4, 16, device=device)
    torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-5)


class EpsOutsideRMSNorm(LlamaStyleRMSNorm):
    """x / (sqrt(mean(x^2)) + eps): the first RMSNorm paper's eps, another norm where mean(x^2) is near eps."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        return self.weight * (h / (h.pow(2).mean(-1, keepdim=True).sqrt() + self.variance_epsilon)).type_as(h)


class ClampedRMSNorm(LlamaStyleRMSNorm):
    """rsqrt(max(mean(x^2), eps)): another norm where mean(x^2) is below eps."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        return self.weight * (h * h.pow(2).mean(-1, keepdim=True).clamp_min(self.variance_epsilon).rsqrt())


class ScaledRMSNorm(LlamaStyleRMSNorm):
    """Llama's result times 1.005: a difference of 0.5%, far above float32's rounding."""

    def forward(self, hidden_states):
        return super().forward(hidden_states) * 1.005


class TrainingDropoutRMSNorm(LlamaStyleRMSNorm):
    """Llama's norm that drops out in training mode: not ours in either mode."""

    def forward(self, hidden_states):
        return F.dropout(super().forward(hidden_states), 0.1, self.training)


class CountingRMSNorm(LlamaStyleRMSNorm):
    """Llama's norm that counts its calls in a buffer and a list: the probe's calls must not count."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__(hidden_size, eps)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.seen = []

    def forward(self, hidden_states):
        self.steps += 1
        self.seen.append(hidden_states.shape)
        return super().forward(hidden_states)


@pytest.mark.parametrize("cls", [EpsOutsideRMSNorm, ClampedRMSNorm, ScaledRMSNorm, TrainingDropoutRMSNorm])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_convert_norms_leaves_near_look_alikes_alone(cls, training):
    """Formulas that agree with Llama's at unit scale within a few % (eps's place, a clamp, a factor, dropout in
    training mode): the probe compares in float32 at float32's rounding, also at the scale of sqrt(eps) and in both
    modes, so each is left alone, converted in either mode."""
    norm = cls(64, eps=1e-4).train(training)
    assert type(torch_reduce.nn.convert_norms(norm)) is cls


def test_convert_norms_probes_a_copy():
    """A forward that changes its module's state (a buffer it counts in, a list it appends to) is not ours: left
    alone, and the probe's calls changed nothing of the module."""
    norm = CountingRMSNorm(8)
    assert type(torch_reduce.nn.convert_norms(norm)) is CountingRMSNorm
    assert int(norm.steps) == 0 and norm.seen == []


class EitherRuleRMSNorm(LlamaStyleRMSNorm):
    """Llama's rule or Olmo2's by an instance flag: each instance converted with its own."""

    def __init__(self, hidden_size, weight_in_float32):
        super().__init__(hidden_size)
        self.weight_in_float32 = weight_in_float32

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        if self.weight_in_float32:
            return (self.weight * h).to(hidden_states.dtype)
        return self.weight * h.to(hidden_states.dtype)


def test_convert_norms_keeps_each_instances_rule_and_converts_once(tmp_path):
    """Converted classes are made per rule, so two instances of one class with other rules keep theirs, through a
    pickle too; converting again (a forward whose argument was renamed included) changes nothing."""
    model = nn.Sequential(EitherRuleRMSNorm(8, False), EitherRuleRMSNorm(8, True), KeywordXRMSNorm(8))
    reference = copy.deepcopy(model)
    torch_reduce.nn.convert_norms(model)
    classes = [type(m) for m in model]
    torch_reduce.nn.convert_norms(model)
    assert [type(m) for m in model] == classes and classes[0] is not classes[1]
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    for norm, want, again in zip(model, reference, loaded):
        assert norm(x).dtype == want(x).dtype == again(x).dtype
        torch.testing.assert_close(norm(x), want(x), rtol=2e-2, atol=2e-2)


STYLE_DTYPES = [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16),
                (torch.float16, torch.bfloat16), (torch.float64, torch.float64), (torch.float64, torch.float32),
                (torch.float32, torch.float32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype, w_dtype", STYLE_DTYPES, ids=str)
@pytest.mark.parametrize("cls", [LlamaStyleRMSNorm, Olmo2StyleRMSNorm, KeywordXRMSNorm])
def test_transformers_style_norm_keeps_its_dtypes(cls, x_dtype, w_dtype, device):
    """Each style's dtype rule (Llama's weight * normalized.to(input dtype): promote(weight, input)'s dtype;
    Olmo2's (weight * normalized).to(input dtype): the input's), whatever the weight's dtype was at conversion,
    and its values: within one rounding of the result's dtype (Llama's rule rounds twice), float64 input
    normalized in float32 as theirs. The argument keeps its name."""
    theirs = cls(24).to(device=device, dtype=w_dtype)
    with torch.no_grad():
        theirs.weight.normal_(1, 0.3)
    ours = torch_reduce.nn.convert_norms(copy.deepcopy(theirs))
    assert type(ours) is not cls
    name = list(inspect.signature(cls.forward).parameters)[1]
    assert list(inspect.signature(type(ours).forward).parameters)[1] == name
    for weight_dtype in (w_dtype, torch.float32):  # and after the model's weights changed dtype
        ours.to(weight_dtype), theirs.to(weight_dtype)
        x = torch.randn(5, 24, device=device).to(x_dtype)
        got, want = ours(**{name: x}), theirs(x)
        assert got.dtype == want.dtype
        rounded = [torch.float32 if d == torch.float64 else d for d in (x_dtype, weight_dtype, got.dtype)]
        eps = max(torch.finfo(d).eps for d in rounded)
        torch.testing.assert_close(got, want, rtol=4 * eps, atol=4 * eps)


@pytest.mark.parametrize("device", DEVICES)
def test_convert_norms_leaves_t5_style_alone(device):
    """T5's rule casts to a 16-bit weight's dtype: our forwards' dtypes differ there, so it is not converted."""
    norm = T5StyleRMSNorm(24).to(device)
    assert type(torch_reduce.nn.convert_norms(norm)) is T5StyleRMSNorm


def test_converted_models_trace_with_fx():
    """torch.fx.symbolic_trace of a converted model (FX treats torch.nn's norms as leaves, not ours): the norms
    are recorded as calls of our functionals, and the traced module computes what the model does."""
    model = nn.Sequential(norms_model(), KeywordXRMSNorm(3), Olmo2StyleRMSNorm(3))
    torch_reduce.nn.convert_norms(model)
    traced = torch.fx.symbolic_trace(model)
    called = {node.target.__name__ for node in traced.graph.nodes if node.op == "call_function"}
    assert {"layer_norm", "rms_norm", "_transformers_rms_norm"} <= called
    x = torch.randn(4, 16)
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)


def test_converted_rms_norm_takes_torchs_keyword():
    """nn.RMSNorm's forward names its argument x, nn.LayerNorm's input: converted, they keep the names."""
    for module in (nn.RMSNorm(8), nn.LayerNorm(8)):
        name = list(inspect.signature(type(module).forward).parameters)[1]
        x = torch.randn(2, 8)
        want = module(**{name: x})
        torch_reduce.nn.convert_norms(module)
        torch.testing.assert_close(module(**{name: x}), want)


# ------------------------------------------------------------------------------- transformers models ----

def tiny_llama(width):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=128, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="eager")
    return LlamaForCausalLM(config)


def tiny_gpt2(width):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=128, n_embd=width, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
    return GPT2LMHeadModel(config)


def tiny_olmo2(width):
    """Olmo2's RMSNorms (q and k norms too) apply the weight in float32, then cast back: another dtype rule."""
    from transformers import Olmo2Config, Olmo2ForCausalLM
    config = Olmo2Config(vocab_size=128, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="eager")
    return Olmo2ForCausalLM(config)


TRANSFORMERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "olmo2": tiny_olmo2}
# Norm-wise relative tolerances (see tests/test_training.py): logits and gradients at the first step. Later steps
# drift apart in any two float32 implementations of the norms (AdamW scales each update by its gradient's own size,
# so last-bit differences in small gradients grow into whole steps), so the losses of later steps and the
# parameters after 20 steps are held to STEP_TOL, or, where more, to 4x the drift of a control: the same model with
# its norms computed in float64 and rounded once, as exact as a float32 norm can be. Measured on the CPU (Llama,
# width 512, six seeds): ours 3.8e-6 to 5.1e-5 after 20 steps, the control 3.3e-6 to 8.0e-5, seed by seed alike.
MODEL_TOL = {"float32": 1e-5, "bf16_autocast": 2e-2}
STEP_TOL = {"float32": 1e-4, "bf16_autocast": 2e-2}
MODEL_CASES = [pytest.param("cpu", mode, id=f"cpu-{mode}") for mode in MODEL_TOL]
MODEL_CASES += [pytest.param("cuda", mode, id=f"cuda-{mode}", marks=requires_cuda) for mode in MODEL_TOL]


def float64_norms(model):
    """``model`` with each norm's forward computed in float64 and rounded to its input's dtype once (float32 runs)."""
    def rms(module, h):
        x = h.double()
        return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)).to(h.dtype)

    def layer(module, h):
        return F.layer_norm(h.double(), module.normalized_shape, module.weight.double(), module.bias.double(),
                            module.eps).to(h.dtype)

    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.forward = partial(layer, module)
        elif type(module).__name__.endswith("RMSNorm"):
            module.forward = partial(rms, module)
    return model


def relative(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("device,mode", MODEL_CASES)
@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_transformers_model_converted(name, device, mode):
    pytest.importorskip("transformers")
    width = 64 if device == "cpu" else 512
    torch.manual_seed(0)
    reference = TRANSFORMERS[name](width).to(device).train()
    with torch.no_grad():  # random norm weights: a kernel that ignored them would pass with ones
        for module in reference.modules():
            if "Norm" in type(module).__name__:
                module.weight.normal_(1, 0.1)
    ours = torch_reduce.nn.convert_norms(copy.deepcopy(reference))
    ours_forwards = (torch_reduce.nn.LayerNorm.forward, torch_reduce.nn.RMSNorm.forward,
                     torch_reduce.nn._transformers_rms_norm_forward)
    norms = [m for m in ours.modules() if "Norm" in type(m).__name__]
    assert norms and all(type(m).forward in ours_forwards for m in norms), [type(m) for m in norms]
    models = {"reference": reference, "ours": ours}
    if mode == "float32":  # under autocast the drift allowed (2e-2) is far above a control's
        models["control"] = float64_norms(copy.deepcopy(reference))
    autocast = torch.autocast(device, dtype=torch.bfloat16) if mode == "bf16_autocast" else nullcontext()
    tol, step_tol = MODEL_TOL[mode], STEP_TOL[mode]
    optimizers = {key: torch.optim.AdamW(m.parameters(), lr=1e-3) for key, m in models.items()}
    drift = {key: 0.0 for key in models if key != "reference"}  # the largest loss error of the later steps
    for step in range(20):
        idx = torch.randint(0, 128, (2, 32), device=device)
        results = {}
        for key, model in models.items():
            with autocast:
                logits = model(idx).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1)[:-1], idx.flatten()[1:])
            optimizers[key].zero_grad()
            loss.backward()
            results[key] = (logits, loss, [p.grad.clone() for p in model.parameters()])
            optimizers[key].step()
        (l_ref, loss_ref, g_ref), (l_ours, loss_ours, g_ours) = results["reference"], results["ours"]
        assert l_ours.dtype == l_ref.dtype
        if step == 0:
            assert_close_normwise(l_ours, l_ref, tol, "logits")
            for (n, _), g, w in zip(reference.named_parameters(), g_ours, g_ref):
                assert_close_normwise(g, w, max(tol, 1e-4) if mode == "float32" else tol, f"gradient of {n}")
            assert_close_normwise(loss_ours, loss_ref, tol, "loss at step 0")
        for key in drift:
            drift[key] = max(drift[key], relative(results[key][1], loss_ref))
    flat = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
    control_loss, control_params = drift.get("control", 0.0), 0.0
    if "control" in models:
        control_params = relative(flat(models["control"]), flat(reference))
    assert drift["ours"] <= max(step_tol, 4 * control_loss), (
        f"losses of steps 1-19: |ours - torch| / |torch| up to {drift['ours']:.2e} (control {control_loss:.2e})")
    params = relative(flat(ours), flat(reference))
    assert params <= max(step_tol, 4 * control_params), (
        f"parameters after 20 AdamW steps: |ours - torch| / |torch| = {params:.2e} (control {control_params:.2e})")


def tiny_bert(width):
    """Post-LN: each layer ends in its LayerNorm, so a checkpointed layer's recomputation stops inside ours."""
    from transformers import BertConfig, BertForMaskedLM
    config = BertConfig(vocab_size=128, hidden_size=width, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=2 * width, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertForMaskedLM(config)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_transformers_bfloat16_model_with_float32_norms(name, device):
    """A model cast to bfloat16 with its RMSNorms' weights put back in float32 (a common layout): the converted
    model gives the unconverted one's logits and dtype, or raises where it raises (Llama's rule makes float32
    activations that its bfloat16 projections refuse). (An nn.LayerNorm's float32 weight beside a bfloat16 input is
    our mixed precision, which torch's CUDA kernel refuses: tests/test_op_contract.py.)"""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    reference = TRANSFORMERS[name](64).to(device).bfloat16()
    for module in reference.modules():
        if "Norm" in type(module).__name__:
            module.float()
    ours = torch_reduce.nn.convert_norms(copy.deepcopy(reference))
    idx = torch.randint(0, 128, (2, 16), device=device)
    try:
        want = reference(idx).logits
    except RuntimeError as error:
        with pytest.raises(type(error)):
            ours(idx)
        return
    got = ours(idx).logits
    assert got.dtype == want.dtype
    assert_close_normwise(got, want, 2e-2, "logits")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.parametrize("name", list(TRANSFORMERS) + ["bert"])
def test_transformers_gradient_checkpointing(name, reentrant, device):
    """A converted model with transformers' gradient checkpointing on (each layer, its norms among it, recomputed
    in the backward): the loss and every gradient of the unconverted model without it."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    reference = {**TRANSFORMERS, "bert": tiny_bert}[name](64).to(device).train()
    ours = torch_reduce.nn.convert_norms(copy.deepcopy(reference))
    ours.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    norms = [m for m in ours.modules() if "Norm" in type(m).__name__]
    runs = []
    for m in norms:
        m.register_forward_hook(lambda *_: runs.append(1))
    idx = torch.randint(0, 128, (2, 32), device=device)
    results = []
    for model in (reference, ours):
        loss = F.cross_entropy(model(idx).logits.flatten(0, 1)[:-1], idx.flatten()[1:])
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss_ref, g_ref), (loss_ours, g_ours) = results
    assert len(runs) > len(norms), "no norm was recomputed: checkpointing is off"
    assert_close_normwise(loss_ours, loss_ref, MODEL_TOL["float32"], "loss")
    assert_close_normwise(torch.cat([g.flatten() for g in g_ours]), torch.cat([w.flatten() for w in g_ref]),
                          MODEL_TOL["float32"], "all gradients")
    # Each alone, but for gradients that are zero up to rounding (BERT's key bias: softmax ignores a shift common
    # to every key), held to the whole gradient's size.
    floor = 1e-7 * torch.cat([w.flatten() for w in g_ref]).norm().item()
    for (n, _), g, w in zip(reference.named_parameters(), g_ours, g_ref):
        err, scale = (g - w).double().norm().item(), w.double().norm().item()
        assert err <= 1e-4 * scale + floor, f"gradient of {n}: |ours - torch| = {err:.2e}, |torch| = {scale:.2e}"
