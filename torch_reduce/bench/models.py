"""A GPT-style decoder for the training checks and the distributed benchmark (its LayerNorms are what
torch_reduce.nn.convert_layernorm converts)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention. ``fused``: torch's scaled_dot_product_attention (fast, what models
    run); else written out, so two models run the very same deterministic attention."""

    def __init__(self, width, heads, qkv_bias=True, fused=False):
        super().__init__()
        self.heads = heads
        self.fused = fused
        self.qkv = nn.Linear(width, 3 * width, bias=qkv_bias)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            out = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads, qkv_bias=True, fused_attention=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, qkv_bias, fused_attention)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder: token + position embeddings, pre-LN blocks, final LayerNorm, LM head."""

    def __init__(self, vocab=97, width=64, heads=4, layers=2, context=32, qkv_bias=True, fused_attention=False):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads, qkv_bias, fused_attention) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln_f(self.blocks(x)))
