"""The benchmark's own measurement (Section.norm: every mode and implementation) of two LayerNorm shapes in a fresh
process, with Liger-Kernel and without: does the section time ours slower than the calls timed alone
(autograd_vs_op.py)?

    python3 scripts/bench_state/section_alone.py
"""
import json
import tempfile
from pathlib import Path

import torch

from torch_reduce.bench.context import Context
from torch_reduce.bench.layernorm import Section, _liger, _norms

ctx = Context(quick=False, out_dir=Path(tempfile.mkdtemp()))
liger, _ = _liger()
for use_liger in (True, False):
    norms = _norms(liger if use_liger else None)
    for case in (("bfloat16", 65536, 4096), ("float32", 16384, 4096)):
        dtype = getattr(torch, case[0])
        section = Section(ctx, 1)
        section.norm("layer_norm", dtype, case[1:], norms, 2)
        for r in section.records:
            print(json.dumps({"liger": use_liger, "case": case, "mode": r["mode"],
                              "graph_us": {k: (None if v is None else round(v * 1e3, 1)) for k, v in r["graph_ms"].items()}}),
                  flush=True)
        section.bar.close()
        torch.cuda.empty_cache()
