"""What the norm scripts share (ab_norms.py, ncu_norms.py, replay_clocks.py, placement_probe.py,
fwd_harness_probe.py, bench_state/): a case "dtype:ROWSxHIDDEN" parsed, one input of a case with the statistics the
backward ops take, a case's rotated inputs with the LayerNorm ops and torch's beside them, and Liger-Kernel's forwards
where it imports."""
import torch
import torch.nn.functional as F

import torch_reduce  # noqa: F401  (registers torch.ops.reduce)
from torch_reduce.bench.timing import rotation


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


def layer_norm_case(case: str) -> tuple[list, dict]:
    """A case's inputs (norm_input, the benchmark's rotation; seed 0) and its ops on one of them: our LayerNorm forward
    and backward, torch's, and `x * 2`, the forward's bytes streamed."""
    dtype, rows, hidden, nbytes = parse(case)
    torch.manual_seed(0)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    b = torch.randn(hidden, device="cuda", dtype=dtype)
    inputs = rotation(lambda: norm_input(rows, hidden, dtype, w, b), nbytes)
    ops = {
        "x*2": lambda s: s[0] * 2,
        "ours_fwd": lambda s: torch.ops.reduce.layer_norm_fwd(s[0], [hidden], w, b, 1e-5),
        "torch_fwd": lambda s: F.layer_norm(s[0], [hidden], w, b, 1e-5),
        "ours_bwd": lambda s: torch.ops.reduce.layer_norm_bwd(s[1], s[0], [hidden], s[2], s[3], w, b,
                                                              [True, True, True]),
        "torch_bwd": lambda s: torch.ops.aten.native_layer_norm_backward(
            s[1], s[0], [hidden], s[2].view(rows, 1), s[3].view(rows, 1), w, b, [True, True, True]),
    }
    return inputs, ops
