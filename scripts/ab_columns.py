"""sum, mean and amax (or --ops: also prod and vector_norm of orders 2, 0.5 and 1.5) over the dims benchmark's outer
dims (the column kernel), rows (--set rows, narrow) or the whole tensor (--set whole), GPU time in graph replay
(inputs rotated past the L2) beside torch's, one JSON line a case, with a digest of the result's bits: for
comparing builds or forms of a kernel (run once per build, alternating; the bits change only with the plan)."""
import argparse
import hashlib
import json

import torch

import torch_reduce
from torch_reduce.bench.timing import rotation, time_graph

# (shape, dim). columns: the dims benchmark's (32, 2^24) and (7, 2^20) over dim 0, outer dims of other extents and a
# middle one, then shapes of several slices a block, whose column groups do not fill the GPU. rows: rows of a warp
# (1024 and 768 floats), of a tile, of a block, few long rows split over blocks, and BatchNorm's (2, 3). narrow: rows
# of 1 to 16 elements, those that divide a 16-byte vector or are two (a row count that leaves 3 past the last
# vector), and one that is neither (7).
CASES = {
    "columns": [((32, 2**24), 0), ((7, 2**20), 0), ((8, 2**24), 0), ((16, 64, 2**16), 1), ((3, 2**22), 0),
                ((768, 65536), 0), ((4096, 4096), 0), ((8192, 1024), 0)],
    "rows": [((8192, 1024), -1), ((65536, 768), -1), ((2**24, 32), -1), ((4096, 4096), -1), ((32, 2**24), -1),
             ((768, 65536), -1), ((8, 2**24), -1), ((64, 256, 56, 56), (2, 3))],
    "whole": [((2**28,), None)],
    "narrow": [((2**27, 2), -1), ((2**26, 4), -1), ((2**25, 8), -1), ((2**24, 16), -1), ((2**28, 1), -1),
               ((2**24 + 3, 2), -1), ((2**20, 7), -1)],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    parser.add_argument("--set", default="columns", help="comma-separated: columns, rows, whole, narrow")
    parser.add_argument("--ops", default="sum,mean,amax", help="comma-separated: sum, mean, amax, prod, norm2, "
                        "norm0.5, norm1.5 (bfloat16: sum alone)")
    args = parser.parse_args()
    cases = [case for name in args.set.split(",") for case in CASES[name]]

    def reduction(module, name):
        return lambda x, dim: getattr(module, name)(x) if dim is None else getattr(module, name)(x, dim)

    def norm(module, order):
        return lambda x, dim: module.vector_norm(x, order, dim)

    ours = {name: reduction(torch_reduce, name) for name in ("sum", "mean", "amax", "prod")}
    theirs = {name: reduction(torch, name) for name in ("sum", "mean", "amax", "prod")}
    for order in (2, 0.5, 1.5):
        ours[f"norm{order}"], theirs[f"norm{order}"] = norm(torch_reduce, order), norm(torch.linalg, order)
    names = args.ops.split(",")
    for dtype in (torch.float32, torch.bfloat16):
        for shape, dim in cases:
            numel = 1
            for s in shape:
                numel *= s
            gen = torch.Generator(device="cuda").manual_seed(0)
            inputs = rotation(lambda: torch.randn(shape, device="cuda", dtype=dtype, generator=gen),
                              numel * dtype.itemsize)
            for name in names:
                op = ours[name]
                if dtype == torch.bfloat16 and name != "sum":
                    continue
                result = op(inputs[0], dim)
                digest = hashlib.sha1(result.float().cpu().numpy().tobytes()).hexdigest()[:12]
                ms = time_graph(lambda x: op(x, dim), inputs).median_ms
                torch_ms = time_graph(lambda x: theirs[name](x, dim), inputs).median_ms
                print(json.dumps({"label": args.label, "op": name, "case": f"{str(dtype)[6:]}:{shape}:{dim}",
                                  "us": round(ms * 1e3, 2), "torch_us": round(torch_ms * 1e3, 2),
                                  "line_pct": round((numel + result.numel()) * dtype.itemsize / (ms * 1e-3) / 1e9
                                                    / args.line * 100, 1),
                                  "bits": digest}), flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
