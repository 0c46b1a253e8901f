"""Gradient-norm section: one eager call of torch_reduce.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_
(foreach=True), same run, on

(a) the 148 gradient tensors of GPT-2 small (124,439,808 float32: wte 50257x768, wpe 1024x768, per layer ln_1,
    attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj weights and biases, ln_f), target >= 3x torch;
(b) 1,000 tensors of 256 float32 (launch-bound), target >= 20x torch;
(c) the same on a rotation of 8 lists, no target: (b) rotates 256 lists (256,000 parameters) to stream past the
    L2, so each call also finds its parameters' host objects out of the CPU's caches; (c) shows the call with them
    in cache, as a training loop that clips the same parameters every step may find them;
(d) (a) with a max_norm above the norm, no target: a step that clips nothing (torch still multiplies every gradient
    by 1; ours leaves them untouched, the same bits).

Each sample is one call between CUDA events (host overhead included, as the GPU timeline sees it), on the next
gradient list of a rotation larger than the L2 (but in (c)), with a max_norm 0.9 of that list's norm (MaxNorms), so
that every call but (d)'s scales. GB/s counts what the clip must move: every gradient read once for
the norm, then read and written for the scaling (in (d) the read for the norm alone). Writes gradnorm.json and
gradnorm.md.
"""
from __future__ import annotations

import math

import torch

import torch_reduce

from .context import Context
from .timing import gbps, l2_rotation_bytes, time_launches

CLIP_RATIO = 0.9  # each call's max_norm, as a fraction of the list's norm (MaxNorms)
TARGETS = {"gpt2-small": 3.0, "1000x256": 20.0}


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """GPT2LMHeadModel's parameters (lm_head tied to wte), in its order."""
    d, shapes = 768, [(50257, 768), (1024, 768)]
    for _ in range(12):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return shapes + [(d,), (d,)]


def _parameter_lists(shapes, lists: int) -> list[list[torch.nn.Parameter]]:
    out = []
    for _ in range(lists):
        params = []
        for shape in shapes:
            p = torch.nn.Parameter(torch.empty(shape, device="cuda"))
            p.grad = torch.randn(shape, device="cuda")
            params.append(p)
        out.append(params)
    return out


def _rotation(shapes, lists: int | None = None) -> list[list[torch.nn.Parameter]]:
    """`lists` gradient lists, by default enough that cycling through them streams past the L2: two of GPT-2
    small (each is eight times the H200's L2), 256 of 1,000 x 256 floats."""
    list_bytes = 4 * sum(math.prod(s) for s in shapes)
    return _parameter_lists(shapes, lists or max(2, math.ceil(l2_rotation_bytes() / list_bytes)))


class MaxNorms:
    """max_norm for each call on a rotation of gradient lists, shared by torch's calls and ours, so that every call
    clips (multiplies by a coefficient below 1): a clip leaves the list's norm at max_norm, so the same max_norm
    again would multiply by 1, which ours skips. `ratio` below 1: each call's max_norm is that fraction of the
    list's norm (its last max_norm), the gradients shrinking by it a call (0.9: 400 calls leave float32 normal);
    None: a fixed max_norm above every norm (nothing to clip)."""

    def __init__(self, lists, ratio: float | None, fixed: float = 1e6):
        self.ratio, self.fixed = ratio, fixed
        self.norms = {id(params): torch.nn.utils.get_total_norm([p.grad for p in params]).item() for params in lists}

    def __call__(self, params) -> float:
        if self.ratio is None:
            return self.fixed
        self.norms[id(params)] *= self.ratio
        return self.norms[id(params)]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def run(ctx: Context) -> str:
    # name: (shapes, lists in the rotation (None: past the L2), MaxNorms' ratio (None: nothing to clip), passes
    # over the gradients the clip must make)
    cases = {"gpt2-small": (gpt2_small_shapes(), None, CLIP_RATIO, 3),
             "1000x256": ([(256,)] * 1000, None, CLIP_RATIO, 3),
             "1000x256, 8 lists": ([(256,)] * 1000, 8, CLIP_RATIO, 3),
             "gpt2-small, nothing to clip": (gpt2_small_shapes(), None, None, 1)}
    records, lines = [], [f"## Global gradient norm: clip_grad_norm_ (line: {ctx.line_gbps:.0f} GB/s"
                          + (", quick)" if ctx.quick else ")"), "", f"{ctx.line.describe()}.", "",
                          "One eager call each; GB/s: 3 x the gradient bytes (read for the norm, read and written "
                          "for the scaling) / time; where the norm is within max_norm, 1 x (the read for the norm: "
                          "scaling by 1 changes nothing, and ours leaves the gradients untouched).", "",
                          "| list | tensors | elements | torch ms | ours ms | torch GB/s | ours GB/s | ours % of line "
                          "| ratio | target | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (shapes, lists, clip_ratio, passes) in cases.items():
        inputs = _rotation(shapes, lists)
        max_norm = MaxNorms(inputs, clip_ratio)
        ours = lambda params: torch_reduce.clip_grad_norm_(params, max_norm(params))  # noqa: E731
        theirs = lambda params: torch.nn.utils.clip_grad_norm_(params, max_norm(params), foreach=True)  # noqa: E731
        check = [p.grad.clone() for p in inputs[0]]
        got = torch_reduce.get_total_norm(check)
        want = torch.nn.utils.get_total_norm(check)
        if not torch.allclose(got, want, rtol=1e-4):
            raise AssertionError(f"{name}: total norm {got.item()} vs torch's {want.item()}")
        del check
        elements = sum(math.prod(s) for s in shapes)
        nbytes = passes * 4 * elements
        their_ms = time_launches(theirs, inputs).median_ms
        our_ms = time_launches(ours, inputs).median_ms
        speedup = their_ms / our_ms
        target = TARGETS.get(name)
        for impl, ms in (("torch", their_ms), ("torch_reduce", our_ms)):
            records.append({"list": name, "impl": impl, "tensors": len(shapes), "elements": elements,
                            "dtype": "float32", "mode": "launch", "clips": clip_ratio is not None, "median_ms": ms,
                            "gbps": gbps(nbytes, ms),
                            "pct_line": ctx.pct_of_line(gbps(nbytes, ms)), "ratio": speedup if impl != "torch" else 1.0,
                            "target_ratio": target})
        lines.append(f"| {name} | {len(shapes)} | {elements:,} | {their_ms:.3f} | {our_ms:.3f} | "
                     f"{gbps(nbytes, their_ms):.0f} | {gbps(nbytes, our_ms):.0f} | "
                     f"{ctx.pct_of_line(gbps(nbytes, our_ms)):.0f}% | {speedup:.1f}x | "
                     + (f">= {target:g}x | {_verdict(speedup >= target)} |" if target else "- | - |"))
        del inputs
        torch.cuda.empty_cache()
    ctx.write_json("gradnorm", records)
    text = "\n".join(lines + [""])
    ctx.write_text("gradnorm.md", text)
    return text
