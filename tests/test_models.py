"""Whole models with every torch.nn.LayerNorm converted (torch_reduce.nn.convert_layernorm): the same logits,
the same gradients for every parameter, and the same losses over a few AdamW steps as the original."""
import copy
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_reduce
from conftest import DEVICES, requires_cuda
from torch_reduce.bench.models import TinyGPT

# Norm-wise relative tolerance: ||ours - torch|| <= tol * ||torch|| for every tensor compared.
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
CASES = [pytest.param(d, torch.float32, id=f"{d}-float32") for d in DEVICES] + [
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=requires_cuda)]


class Encoder(nn.Module):
    def __init__(self, norm_first, vocab=97, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 128, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(width), enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        return self.head(self.encoder(self.embed(idx)))


MODELS = {"gpt": TinyGPT, "encoder_pre_ln": lambda: Encoder(True), "encoder_post_ln": lambda: Encoder(False)}


def assert_close_normwise(got, want, tol, what):
    err = (got.double() - want.double()).norm().item()
    scale = want.double().norm().item()
    assert err <= tol * max(scale, 1e-12), f"{what}: |ours - torch| / |torch| = {err / max(scale, 1e-12):.2e}"


def math_attention(device):
    """TransformerEncoderLayer calls SDPA; pin the math kernel on CUDA so both models' attention is the same."""
    if device != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.MATH)


def loss_of(model, idx, targets):
    logits = model(idx)
    return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("name", list(MODELS))
def test_converted_model_matches(name, device, dtype):
    torch.manual_seed(0)
    # train(): TransformerEncoderLayer's eval fast path would bypass the module LayerNorms; dropout is 0.
    reference = MODELS[name]().to(device=device, dtype=dtype).train()
    ours = torch_reduce.nn.convert_layernorm(copy.deepcopy(reference))
    converted = [m for m in ours.modules() if isinstance(m, torch_reduce.nn.LayerNorm)]
    assert len(converted) == sum(isinstance(m, nn.LayerNorm) for m in reference.modules()) > 0
    assert not any(type(m) is nn.LayerNorm for m in ours.modules())
    tol = TOL[dtype]
    idx = torch.randint(0, 97, (4, 32), device=device)
    targets = torch.randint(0, 97, (4, 32), device=device)
    with math_attention(device):
        ref_logits, ref_loss = loss_of(reference, idx, targets)
        logits, loss = loss_of(ours, idx, targets)
        assert_close_normwise(logits, ref_logits, tol, "logits")
        ref_loss.backward()
        loss.backward()
        for (pname, p), (_, q) in zip(reference.named_parameters(), ours.named_parameters()):
            assert_close_normwise(q.grad, p.grad, tol, f"grad of {pname}")

        # Five AdamW steps each: the converted model's losses track the original's.
        optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (reference, ours)]
        for step in range(5):
            losses = []
            for model, opt in zip((reference, ours), optimizers):
                opt.zero_grad()
                _, step_loss = loss_of(model, idx, targets)
                step_loss.backward()
                opt.step()
                losses.append(step_loss.item())
            assert abs(losses[1] - losses[0]) <= 10 * tol * abs(losses[0]), (step, losses)
