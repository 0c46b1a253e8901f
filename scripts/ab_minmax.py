"""amax / amin / the inf norm over the dims benchmark's shapes, GPU time in graph replay (inputs rotated past the
L2), one JSON line a case: for comparing two builds of the extension (run once per build, alternating)."""
import argparse
import json

import torch

import torch_reduce
from torch_reduce.bench.timing import rotation, time_graph

CASES = [((8192, 1024), -1), ((64, 256, 56, 56), (2, 3)), ((64, 256, 56, 56), (0, 2, 3)), ((2**27, 2), -1),
         ((2**24, 32), -1), ((4096, 4096), 0), ((4096, 4096), -1), ((32, 2**24), 0), ((2**28,), None)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--line", type=float, default=4642.0, help="GB/s, for %% of the line")
    args = parser.parse_args()
    ops = {"amax": torch_reduce.amax, "amin": torch_reduce.amin,
           "norm_inf": lambda x, d: torch_reduce.vector_norm(x, float("inf"), d)}
    for dtype in (torch.float32, torch.bfloat16):
        for shape, dim in CASES:
            numel = 1
            for s in shape:
                numel *= s
            inputs = rotation(lambda: torch.randn(shape, device="cuda", dtype=dtype), numel * dtype.itemsize)
            for name, op in ops.items():
                if name == "norm_inf" and dtype == torch.bfloat16:
                    continue
                d = () if dim is None else dim
                ms = time_graph(lambda x: op(x, d), inputs).median_ms
                print(json.dumps({"label": args.label, "op": name, "case": f"{str(dtype)[6:]}:{shape}:{dim}",
                                  "us": round(ms * 1e3, 2),
                                  "line_pct": round(numel * dtype.itemsize / (ms * 1e-3) / 1e9 / args.line * 100, 1)}),
                      flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
