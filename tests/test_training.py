"""Training through torch_reduce.nn.convert_layernorm: 20 AdamW steps of a converted GPT-style decoder give the
losses and parameters of the unconverted copy (float32, and bf16 autocast); the converter keeps what a model
relies on: subclasses of nn.LayerNorm with their own forward, hooks, the Parameter objects, and the classes torch
gives a parametrized or fully sharded norm."""
import copy
import subprocess
import sys
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_reduce
import torch.nn.utils.parametrize as parametrize
from conftest import DEVICES, requires_cuda, subprocess_env
from op_specs import SELF_CHECK
from test_models import assert_close_normwise
from torch_reduce.bench.models import TinyGPT

STEPS = 20
# Norm-wise relative: on every loss and on all parameters together, and on each parameter alone (in float32,
# AdamW turns the rounding of a near-zero gradient element into a step: a correct LayerNorm whose bits differ
# from torch's was measured at up to 1e-5 on single weights, 5e-7 on the whole model).
TOL = {"float32": 1e-5, "bf16_autocast": 2e-2}
PARAM_TOL = {"float32": 1e-4, "bf16_autocast": 2e-2}


class _ReferenceLayerNorm(nn.LayerNorm):
    """TORCH_REDUCE_SELF_CHECK=1's stand-in for our LayerNorm: F.layer_norm in float64, rounded once (a correct
    LayerNorm whose bits differ from torch's, so the tolerances are exercised). CPU-autocast semantics only."""

    def forward(self, x):
        up = lambda t: None if t is None else t.double()  # noqa: E731
        return F.layer_norm(x.double(), self.normalized_shape, up(self.weight), up(self.bias), self.eps).to(x.dtype)


def _reference_convert(module):
    for m in module.modules():
        if type(m) is nn.LayerNorm:
            m.__class__ = _ReferenceLayerNorm
    return module


convert = _reference_convert if SELF_CHECK else torch_reduce.nn.convert_layernorm


def gpt(ffn_norm=False):
    """TinyGPT (torch_reduce/bench/models.py); with ffn_norm, NormFormer's LayerNorm inside each MLP after the GELU, so
    that under autocast a LayerNorm sees a Linear's 16-bit output with its float32 parameters (TinyGPT's own
    norms sit on the float32 residual stream)."""
    model = TinyGPT()
    for block in model.blocks:
        # No bias on q, k, v: the key bias has an exactly-zero gradient (softmax ignores a score shift common
        # to every key), so AdamW would turn its rounding noise into full-size steps of either sign.
        block.attn.qkv = nn.Linear(64, 192, bias=False)
    if ffn_norm:
        for block in model.blocks:
            block.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 64))
    for m in model.modules():
        # Random affine parameters: they are converted too, and a zero bias would make its relative
        # difference a ratio of two small updates.
        if isinstance(m, nn.LayerNorm):
            with torch.no_grad():
                m.weight.normal_(1, 0.1)
                m.bias.normal_(0, 0.1)
    return model


CASES = [pytest.param("cpu", "float32", id="cpu-float32"), pytest.param("cpu", "bf16_autocast", id="cpu-bf16_autocast")]
CASES += [pytest.param("cuda", mode, id=f"cuda-{mode}", marks=requires_cuda) for mode in TOL]


@pytest.mark.parametrize("device,mode", CASES)
@pytest.mark.parametrize("ffn_norm", [False, True], ids=["gpt", "gpt_ffn_norm"])
def test_adamw_steps_match_unconverted(ffn_norm, device, mode):
    if SELF_CHECK and device == "cuda" and mode == "bf16_autocast":
        pytest.skip("the self-check's reference LayerNorm does not model CUDA autocast's float32 layer_norm")
    reference = gpt(ffn_norm).to(device)
    ours = convert(copy.deepcopy(reference))
    assert not any(type(m) is nn.LayerNorm for m in ours.modules())
    tol = TOL[mode]
    autocast = torch.autocast(device, dtype=torch.bfloat16) if mode == "bf16_autocast" else nullcontext()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (reference, ours)]
    batches = [torch.randint(0, 97, (4, 33), device=device) for _ in range(STEPS)]
    for step, batch in enumerate(batches):
        losses = []
        for model, optimizer in zip((reference, ours), optimizers):
            optimizer.zero_grad()
            with autocast:
                logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        assert_close_normwise(losses[1], losses[0], tol, f"loss at step {step}")
    every = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (reference, ours)]
    assert_close_normwise(every[1], every[0], tol, f"all parameters after {STEPS} steps")
    for (name, p), (_, q) in zip(reference.named_parameters(), ours.named_parameters()):
        assert_close_normwise(q, p, PARAM_TOL[mode], f"{name} after {STEPS} steps")


# --------------------------------------------------------------------------------- what is kept ----

class LayerNormFp32(nn.LayerNorm):
    """open_clip's: normalizes in float32 whatever the input, returns the input's dtype."""

    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


class LayerNorm2d(nn.LayerNorm):
    """timm's channels-first LayerNorm: normalizes the C of an (N, C, H, W) tensor."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_subclass_with_own_forward_keeps_its_behaviour(device):
    """Either left alone or converted with its forward's semantics: the outputs and gradients are the
    unconverted model's. (W = C = 8: a plain LayerNorm(8) would silently normalize over W instead.)"""
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), LayerNorm2d(8), nn.GELU(), nn.Conv2d(8, 4, 1)).to(device)
    # CLIP's half-precision towers: 16-bit Linears around a LayerNormFp32 with float32 parameters
    half = dict(device=device, dtype=torch.bfloat16)
    clip = nn.Sequential(nn.Linear(16, 32, **half), LayerNormFp32(32, device=device), nn.Linear(32, 8, **half))
    for model, x in ((conv, torch.randn(2, 3, 5, 8, device=device)),
                     (clip, torch.randn(6, 16, device=device).bfloat16())):
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                with torch.no_grad():
                    m.weight.normal_(1, 0.3)
                    m.bias.normal_(0, 0.3)
        reference = copy.deepcopy(model)
        converted = convert(model)
        want = reference(x)
        got = converted(x)
        assert got.dtype == want.dtype
        tol = 1e-5 if x.dtype == torch.float32 else 1e-2
        assert_close_normwise(got, want, tol, f"output of {type(model[1]).__name__}")
        dy = torch.randn_like(want)
        grads = torch.autograd.grad(got, list(converted.parameters()), dy)
        ref_grads = torch.autograd.grad(want, list(reference.parameters()), dy)
        for (name, _), g, r in zip(reference.named_parameters(), grads, ref_grads):
            assert_close_normwise(g, r, tol, f"grad of {name}")


@pytest.mark.parametrize("top_level", [False, True], ids=["inside", "top_level"])
def test_hooks_still_fire_after_conversion(top_level):
    norm = nn.LayerNorm(8)
    model = norm if top_level else nn.Sequential(nn.Linear(4, 8), norm, nn.GELU())
    calls = []

    def pre_hook(module, args):
        calls.append("pre")
        return (args[0] + 1,)  # the forward must see the hook's input

    def hook(module, args, output):
        calls.append("post")
        return output * 2  # and the caller the hook's output

    norm.register_forward_pre_hook(pre_hook)
    norm.register_forward_hook(hook)
    x = torch.randn(3, 8 if top_level else 4)
    want = model(x)
    assert calls == ["pre", "post"]
    converted = convert(model)
    if not SELF_CHECK:
        assert any(isinstance(m, torch_reduce.nn.LayerNorm) for m in converted.modules())
    got = converted(x)
    assert calls == ["pre", "post"] * 2, f"hooks that fired on the converted model: {calls[2:]}"
    assert_close_normwise(got, want, 1e-5, "output with the hooks")


def test_same_parameter_objects():
    """The very Parameter objects stay (optimizers built before the conversion, tied weights), with their
    requires_grad, names and the training flag."""
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Sequential(nn.LayerNorm(8, bias=False)))
    model[2][0].weight.requires_grad_(False)
    model.eval()
    before = list(model.named_parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    converted = convert(model)
    after = list(converted.named_parameters())
    assert [n for n, _ in after] == [n for n, _ in before]
    assert all(p is q for (_, p), (_, q) in zip(before, after))
    assert converted[2][0].weight.requires_grad is False
    assert not any(m.training for m in converted.modules())
    weight = converted[1].weight.detach().clone()
    converted(torch.randn(5, 4)).pow(2).sum().backward()
    optimizer.step()  # the optimizer built on the unconverted model moves the converted model's weight
    assert not torch.equal(converted[1].weight, weight)


class _Doubled(nn.Module):
    def forward(self, weight):
        return 2 * weight


@pytest.mark.skipif(SELF_CHECK, reason="checks our converted classes")
@pytest.mark.parametrize("converter", ["convert_layernorm", "convert_norms"])
@pytest.mark.parametrize("norm_class", [nn.LayerNorm, nn.RMSNorm], ids=["LayerNorm", "RMSNorm"])
def test_parametrized_norms_convert_beneath_torchs_class(norm_class, converter):
    """A norm parametrized before the conversion keeps parametrize's class outermost, as parametrize reads the
    class beneath it back: removing the last parametrization (which raised, after it had already written the
    parametrized weight into the original, so that the module went on with a weight doubled twice) leaves our
    class with the parametrized weight, as torch leaves its own."""
    ours_class = getattr(torch_reduce.nn, norm_class.__name__)
    theirs, ours = norm_class(8), norm_class(8)
    for norm in (theirs, ours):
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
        parametrize.register_parametrization(norm, "weight", _Doubled())
    getattr(torch_reduce.nn, converter)(ours)
    if norm_class is nn.RMSNorm and converter == "convert_layernorm":  # left alone, parametrization and all
        assert parametrize.type_before_parametrizations(ours) is nn.RMSNorm and not isinstance(ours, ours_class)
        return
    assert isinstance(ours, ours_class) and issubclass(parametrize.type_before_parametrizations(ours), ours_class)
    x = torch.randn(3, 8)
    torch.testing.assert_close(ours(x), theirs(x))
    if hasattr(ours, "bias"):  # a second parametrization on the converted class, removed first
        parametrize.register_parametrization(ours, "bias", _Doubled())
        parametrize.remove_parametrizations(ours, "bias", leave_parametrized=False)
    for norm in (theirs, ours):
        parametrize.remove_parametrizations(norm, "weight")
    assert type(theirs) is norm_class and type(ours) is ours_class
    torch.testing.assert_close(ours.weight, 2 * torch.linspace(0.5, 1.5, 8))
    torch.testing.assert_close(ours(x), theirs(x))


FULLY_SHARD_SCRIPT = """
import torch, torch.distributed as dist, torch_reduce
from torch import nn
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.RMSNorm(8))
for module in (model[1], model[2], model):
    fully_shard(module)
torch_reduce.nn.convert_norms(model)
for norm, ours in ((model[1], torch_reduce.nn.LayerNorm), (model[2], torch_reduce.nn.RMSNorm)):
    assert isinstance(norm, ours) and type(norm).__name__.startswith("FSDP"), type(norm).__mro__
    fresh = type(norm)(8)  # FSDP's __new__ builds the class two places down the MRO: ours
    assert type(fresh) is ours, type(fresh)
model(torch.randn(2, 8)).sum().backward()
other = nn.Sequential(nn.LayerNorm(8), nn.RMSNorm(8))  # FSDP's classes again: convert_layernorm leaves RMSNorm
for module in (other[0], other[1], other):
    fully_shard(module)
torch_reduce.nn.convert_layernorm(other)
assert isinstance(other[0], torch_reduce.nn.LayerNorm) and not isinstance(other[1], torch_reduce.nn.RMSNorm)
dist.destroy_process_group()
print("ok")
"""


@pytest.mark.skipif(SELF_CHECK, reason="checks our converted classes")
@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_fully_sharded_norms_convert_beneath_fsdps_class():
    """A norm that fully_shard wrapped itself keeps FSDP's class outermost: FSDPModule.__new__ (type(norm)(...))
    builds the class two places down the MRO, and found FSDPModule there (an IndexError) with ours in between."""
    run = subprocess.run([sys.executable, "-c", FULLY_SHARD_SCRIPT], capture_output=True, text=True, timeout=120,
                         env=subprocess_env(OMP_NUM_THREADS="1"))
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
