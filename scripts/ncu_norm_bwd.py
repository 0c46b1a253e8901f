"""One call of the LayerNorm backward op per case, for Nsight Compute to profile (no timing here):

    ncu -k regex:row_norm_bwd ... python3 scripts/ncu_norm_bwd.py bfloat16:16384x4096 float32:16384x4096
"""
import sys

import torch

import torch_reduce  # noqa: F401  (registers torch.ops.reduce)


def main() -> None:
    for case in sys.argv[1:]:
        dtype_name, shape = case.split(":")
        rows, hidden = map(int, shape.split("x"))
        dtype = getattr(torch, dtype_name)
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        _, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        torch.ops.reduce.layer_norm_bwd(dy, x, [hidden], mean, rstd, w, b, [True, True, True])
        torch.cuda.synchronize()
        print(case, "done", flush=True)


if __name__ == "__main__":
    main()
