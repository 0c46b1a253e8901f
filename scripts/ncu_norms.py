"""A norm op per case, for Nsight Compute to profile (no timing here): the backward of LayerNorm (default), or with
--direction fwd the LayerNorm and RMSNorm forwards and, beside them, torch's x * 2 into a new tensor (a kernel that
reads and writes the same bytes and reduces nothing: the forward's reference) and Liger-Kernel's LayerNorm and
RMSNorm forwards where it imports. Each op runs --repeats times in a row, in that order, case after case; the
kernels' names tell the ops apart (row_norm_fwd_kernel, vectorized_elementwise_kernel, _layer_norm_forward_kernel,
_rms_norm_forward_kernel).

    ncu -k regex:row_norm_bwd ... python3 scripts/ncu_norms.py bfloat16:16384x4096 float32:16384x4096
    ncu -k regex:'row_norm_fwd|elementwise|_forward_kernel' ... python3 scripts/ncu_norms.py --direction fwd \
        --repeats 2 bfloat16:65536x4096
"""
import argparse

import torch
from norm_cases import liger_forwards, parse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+", help="dtype:ROWSxHIDDEN")
    parser.add_argument("--direction", choices=("bwd", "fwd"), default="bwd")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    for case in args.cases:
        dtype, rows, hidden, _ = parse(case)
        torch.manual_seed(0)
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        w = torch.randn(hidden, device="cuda", dtype=dtype)
        b = torch.randn(hidden, device="cuda", dtype=dtype)
        if args.direction == "fwd":
            ops = [lambda: torch.ops.reduce.layer_norm_fwd(x, [hidden], w, b, 1e-5),
                   lambda: torch.ops.reduce.rms_norm_fwd(x, [hidden], w, 1e-5),
                   lambda: torch.mul(x, 2)]
            ops += [lambda f=f: f(x) for f in liger_forwards(w, b).values()]
        else:
            _, mean, rstd = torch.ops.reduce.layer_norm_fwd(x, [hidden], w, b, 1e-5)
            dy = torch.randn_like(x)
            ops = [lambda: torch.ops.reduce.layer_norm_bwd(dy, x, [hidden], mean, rstd, w, b, [True, True, True])]
        for op in ops:
            for _ in range(args.repeats):
                op()
        torch.cuda.synchronize()
        print(case, "done", flush=True)


if __name__ == "__main__":
    main()
