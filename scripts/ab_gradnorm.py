"""clip_grad_norm_ on the gradnorm section's lists (GPT-2 small's 148 gradients, 1,000 of 256 floats), one JSON
line a case: one eager call between CUDA events (ours and torch's foreach path, as the benchmark times them) and
ours in graph replay (the GPU's time alone), each list rotated past the L2; with a digest of the first call's bits.
For comparing two builds or configurations of the list kernels: run once per build, alternating processes."""
import argparse
import hashlib
import json
import math

import torch

import torch_reduce
from torch_reduce.bench.gradnorm import CLIP_RATIO, MaxNorms, _rotation, gpt2_small_shapes
from torch_reduce.bench.timing import time_graph, time_launches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--cases", default="gpt2-small,1000x256")
    args = parser.parse_args()
    shapes_of = {"gpt2-small": gpt2_small_shapes(), "1000x256": [(256,)] * 1000}
    for case in args.cases.split(","):
        shapes = shapes_of[case]
        torch.manual_seed(0)
        inputs = _rotation(shapes)
        max_norm = MaxNorms(inputs, CLIP_RATIO)  # as the benchmark: every call scales
        ours = lambda params: torch_reduce.clip_grad_norm_(params, max_norm(params))  # noqa: E731
        theirs = lambda params: torch.nn.utils.clip_grad_norm_(params, max_norm(params), foreach=True)  # noqa: E731
        # The bits of the first call (the total and the scaled gradients) on the same seeded list in every process.
        digest = hashlib.sha1(ours(inputs[0]).cpu().numpy().tobytes())
        for p in inputs[0]:
            digest.update(p.grad.view(torch.int32).sum(dtype=torch.int64).cpu().numpy().tobytes())
        nbytes = 3 * 4 * sum(math.prod(s) for s in shapes)
        torch_ms = time_launches(theirs, inputs).median_ms
        eager_ms = time_launches(ours, inputs).median_ms
        graph_ms = time_graph(ours, inputs, replays=10).median_ms
        print(json.dumps({"label": args.label, "case": case, "torch_eager_us": round(torch_ms * 1e3, 1),
                          "ours_eager_us": round(eager_ms * 1e3, 1), "ours_graph_us": round(graph_ms * 1e3, 1),
                          "graph_gbps": round(nbytes / (graph_ms * 1e-3) / 1e9),
                          "digest": digest.hexdigest()[:12]}), flush=True)
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
