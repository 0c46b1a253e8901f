"""One call of a norm op per case, for Nsight Compute to profile (no timing here): the backward of LayerNorm
(default), or with --direction fwd the RMSNorm and LayerNorm forwards and, beside them, torch's x * 2 into a new
tensor (a kernel that reads and writes the same bytes and reduces nothing: the forward's reference).

    ncu -k regex:row_norm_bwd ... python3 scripts/ncu_norms.py bfloat16:16384x4096 float32:16384x4096
    ncu -k regex:'row_norm_fwd|elementwise' ... python3 scripts/ncu_norms.py --direction fwd bfloat16:65536x4096
"""
import argparse

import torch

import torch_reduce  # noqa: F401  (registers torch.ops.reduce)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
    parser.add_argument("--direction", choices=("bwd", "fwd"), default="bwd")
    args = parser.parse_args()
    for case in args.cases:
        dtype_name, shape = case.split(":")
        rows, hidden = map(int, shape.split("x"))
        dtype = getattr(torch, dtype_name)
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        _, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        if args.direction == "fwd":
            torch.ops.reduce.rms_norm_fwd(x, [hidden], w, 1e-5)
            torch.mul(x, 2)
        else:
            dy = torch.randn_like(x)
            torch.ops.reduce.layer_norm_bwd(dy, x, [hidden], mean, rstd, w, b, [True, True, True])
        torch.cuda.synchronize()
        print(case, "done", flush=True)


if __name__ == "__main__":
    main()
