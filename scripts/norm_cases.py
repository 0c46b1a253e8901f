"""What the norm scripts share (ab_norms.py, ncu_norms.py, replay_clocks.py, placement_probe.py,
fwd_harness_probe.py): a case "dtype:ROWSxHIDDEN" parsed, one input of a case with the statistics the backward ops
take, and Liger-Kernel's forwards where it imports."""
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


def liger_forwards(weight: torch.Tensor, bias: torch.Tensor) -> dict:
    """Liger-Kernel's LayerNorm and RMSNorm forwards (Triton) as functions of x, or none where it does not import."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # not installed, or a torch/Triton mismatch at import
        return {}
    return {"liger_layer_norm": lambda x: LigerLayerNormFunction.apply(x, weight, bias, 1e-5),
            "liger_rms_norm": lambda x: LigerRMSNormFunction.apply(x, weight, 1e-5, 0.0, "llama", False, None)}
