"""Fused residual add + norm section: torch_reduce.add_layer_norm / add_rms_norm against torch's unfused
`x + r` then F.layer_norm / F.rms_norm, on (rows, hidden) activations in float32 and bfloat16, with random
parameters; the LayerNorm section's clocks, rotation (x, r, dy and ds each their own tensors) and checks
(layernorm.Section.measure). Modes: fwd (under no_grad), bwd (autograd.grad of x, r and the parameters, with
cotangents for both results: the normalized output and the sum, which feeds the next layer), fwd_bwd.
Bytes counted: fwd reads x, r and writes y, x + r: 4 x N; bwd reads dy, ds, x + r and writes one gradient (x's and
r's are the same tensor): 4 x N; fwd + bwd 8 x N (x element size). Targets (graph replay): fwd and fwd_bwd
>= 1.5x torch and >= 85% of the line where N >= 2^24. Writes addnorm.json and addnorm.md.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

import torch_reduce

from .context import Context
from .layernorm import DTYPES, EPS, GRAPH_REPLAYS, IMPLS, SAME_BYTES_NOTE, Section, _name, _parameters, markdown
from .timing import rotation

SHAPES = [(4096, 1024), (16384, 1024), (65536, 768), (4096, 4096), (16384, 4096), (2048, 8192), (8192, 8192),
          (1024, 18432)]
QUICK_SHAPES = [(16384, 4096), (65536, 768)]
MODES = {"fwd": 4, "bwd": 4, "fwd_bwd": 8}  # bytes counted, in N x element size
# op: (parameters, {impl: fn(x, r, *params) -> (normalized, x + r)})
NORMS: dict[str, tuple[int, dict[str, Callable]]] = {
    "add_layer_norm": (2, {
        "torch": lambda x, r, w, b: (lambda s: (F.layer_norm(s, s.shape[-1:], w, b, EPS), s))(x + r),
        "ours": lambda x, r, w, b: torch_reduce.add_layer_norm(x, r, x.shape[-1:], w, b, EPS)}),
    "add_rms_norm": (1, {
        "torch": lambda x, r, w: (lambda s: (F.rms_norm(s, s.shape[-1:], w, EPS), s))(x + r),
        "ours": lambda x, r, w: torch_reduce.add_rms_norm(x, r, x.shape[-1:], w, EPS)}),
}


class AddSample(NamedTuple):
    x: torch.Tensor
    r: torch.Tensor
    dy: torch.Tensor
    ds: torch.Tensor
    outputs: Optional[tuple] = None  # the bwd mode's forward, already run


def _timed_call(mode: str, norm: Callable, params: tuple) -> Callable[[AddSample], object]:
    if mode == "fwd":
        def forward(s: AddSample):
            with torch.no_grad():
                return norm(s.x, s.r, *params)
        return forward
    if mode == "bwd":
        return lambda s: torch.autograd.grad(s.outputs, (s.x, s.r, *params), (s.dy, s.ds), retain_graph=True)
    return lambda s: torch.autograd.grad(norm(s.x, s.r, *params), (s.x, s.r, *params), (s.dy, s.ds))


def _with_forward(norm: Callable, inputs: list[AddSample], params: tuple, stream) -> list[AddSample]:
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        return [s._replace(outputs=norm(s.x, s.r, *params)) for s in inputs]


def measure(section: Section, op: str, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    rows, hidden = shape
    param_count, norms = NORMS[op]
    params = _parameters(hidden, dtype, param_count)

    def tensor(grad=False):
        return torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=grad)

    inputs = rotation(lambda: AddSample(tensor(True), tensor(True), tensor(), tensor()),
                      2 * rows * hidden * dtype.itemsize)
    pairs = [(s.x, s.r) for s in inputs]
    for mode, passes in MODES.items():
        graph_ms, errors, reference = dict.fromkeys(IMPLS), {}, None
        for impl, norm in norms.items():
            stream = torch.cuda.Stream() if mode == "bwd" else None
            samples_of = partial(_with_forward, norm, inputs, params, stream) if mode == "bwd" else inputs.copy
            reference, graph_ms[impl], _ = section.measure(
                f"{op} {mode} {_name(dtype)} {rows}x{hidden}", impl, _timed_call(mode, norm, params), samples_of,
                reference, False, errors, stream)
        same_bytes_ms = section.same_bytes(f"{op} {mode} {_name(dtype)} {rows}x{hidden}", passes, pairs)
        section.add(op, mode, dtype, shape, passes, graph_ms, None, errors, same_bytes_ms)
    torch.cuda.synchronize()


def report(ctx: Context, records: list[dict]) -> str:
    return markdown(ctx, "addnorm", "## Fused residual add + norm (torch's x + r, then the norm, vs torch_reduce)",
                    f"Bytes: fwd 4x, bwd 4x, fwd + bwd 8x N x element size (parameters and their gradients left out). "
                    f"{ctx.line.describe()}. Graph: CUDA-graph replay (GPU time alone), {GRAPH_REPLAYS} replays. "
                    f"\"vs\": their time / ours; ours % line from graph replay. {SAME_BYTES_NOTE}", records)


def run(ctx: Context) -> str:
    configs = [(op, dtype, shape) for op in NORMS for dtype in DTYPES
               for shape in (QUICK_SHAPES if ctx.quick else SHAPES)]
    section = Section(ctx, len(configs), name="addnorm")
    for op, dtype, shape in configs:
        section.bar.set_postfix_str(f"{op} {_name(dtype)} {shape[0]}x{shape[1]}")
        measure(section, op, dtype, shape)
        torch.cuda.empty_cache()
        section.bar.update()
    section.bar.close()
    ctx.write_json("addnorm", section.records)
    return report(ctx, section.records)
