"""What the norm scripts share (ab_norms.py, replay_clocks.py, placement_probe.py, fwd_harness_probe.py): a case
"dtype:ROWSxHIDDEN" parsed, and one input of a case with the statistics the backward ops take."""
import torch

import torch_reduce  # noqa: F401  (registers torch.ops.reduce)


def parse(case: str) -> tuple[torch.dtype, int, int, int]:
    """(dtype, rows, hidden, bytes of one rows x hidden tensor)."""
    dtype_name, shape = case.split(":")
    rows, hidden = map(int, shape.split("x"))
    dtype = getattr(torch, dtype_name)
    return dtype, rows, hidden, rows * hidden * dtype.itemsize


def norm_input(rows: int, hidden: int, dtype: torch.dtype, weight: torch.Tensor, bias: torch.Tensor) -> tuple:
    """(x, dy, LayerNorm's mean and rstd, RMSNorm's rstd), x and dy random."""
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
    _, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], weight, bias, 1e-5)
    _, rms_rstd = torch.ops.reduce.rms_norm_fwd(x, [hidden], weight, 1e-5)
    return x, torch.randn_like(x), mean, rstd, rms_rstd
