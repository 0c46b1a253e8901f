"""RMSNorm section: torch_reduce.rms_norm against F.rms_norm (whatever torch runs for it) and Liger-Kernel's
RMSNorm (LigerRMSNormFunction, casting mode "llama", dy not overwritten), on the LayerNorm section's grid of
(rows, hidden) activations in float32 and bfloat16, with a random weight; the same modes, clocks, rotation and
checks (layernorm.Section). Bytes counted: fwd 2x, bwd 3x, fwd + bwd 5x N x element size.
Targets (graph replay): fwd >= 1.2x torch, >= 1.0x liger and >= 85% of the line where N >= 2^24; bwd >= 80% of
the line where N >= 2^24; fwd_bwd >= 1.3x torch. Writes rmsnorm.json, rmsnorm.md and
rmsnorm_heatmap_<dtype>.png.
"""
from __future__ import annotations

from importlib import metadata
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import torch_reduce

from .context import Context
from .layernorm import (DTYPES, EPS, GRAPH_REPLAYS, SAME_BYTES_NOTE, Section, _name, grid_shapes, markdown,
                        plot_heatmaps)


def _liger() -> tuple[Optional[Callable], str]:
    """Liger-Kernel's RMSNorm as norm(x, weight), and its version (or why it is missing)."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        version = metadata.version("liger-kernel")
    except Exception as error:  # ImportError, or a torch/Triton mismatch failing at import: the run goes on
        return None, f"not importable ({type(error).__name__}: {error})"
    # in_place=False: its default writes dx over dy, which the rotation reuses.
    return (lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False, None)), version


def _norms(liger: Optional[Callable]) -> dict[str, Optional[Callable]]:
    return {"torch": lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS),
            "ours": lambda x, w: torch_reduce.rms_norm(x, x.shape[-1:], w, EPS),
            "liger": liger}


def report(ctx: Context, records: list[dict], liger_version: str) -> str:
    text = markdown(ctx, "rmsnorm", "## RMSNorm (torch vs torch_reduce vs Liger-Kernel)",
                    f"Bytes: fwd 2x, bwd 3x, fwd + bwd 5x N x element size (the weight and its gradient are O(hidden) "
                    f"and left out). {ctx.line.describe()}. Graph: CUDA-graph replay (GPU time alone), "
                    f"{GRAPH_REPLAYS} replays; eager: CUDA events around one call (host overhead included). "
                    f"Liger-Kernel: {liger_version}. \"vs\": their time / ours; ours % line from graph replay. "
                    f"{SAME_BYTES_NOTE}", records)
    return text + plot_heatmaps(ctx, records, "rms_norm", "rmsnorm")


def run(ctx: Context) -> str:
    liger, liger_version = _liger()
    if liger is None:
        print(f"liger-kernel {liger_version}: its RMSNorm figures are None", flush=True)
    norms = _norms(liger)
    configs = [(dtype, shape) for dtype in DTYPES for shape in grid_shapes(ctx.quick)]
    section = Section(ctx, len(configs), name="rmsnorm")
    for dtype, shape in configs:
        section.bar.set_postfix_str(f"{_name(dtype)} {shape[0]}x{shape[1]}")
        section.norm("rms_norm", dtype, shape, norms, 1)
        torch.cuda.empty_cache()
        section.bar.update()
    section.bar.close()
    ctx.write_json("rmsnorm", section.records, section_meta={"liger_kernel": liger_version})
    return report(ctx, section.records, liger_version)
