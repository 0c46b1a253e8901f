"""Converted models under torch.distributed, and global reductions over a process group. One process a rank:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m torch_reduce.bench.distributed \\
        [--device cuda|cpu] [--parts train,bench] [--out DIR]

(torchrun is the same launcher.) CUDA: NCCL, one GPU a rank; --device cpu: gloo.

train  A GPT-style decoder (bench/models.py) converted with torch_reduce.nn.convert_layernorm trains beside the
       same model unconverted: the same initial weights, the same data (each rank its own slice of every global
       batch), AdamW, under DDP and under FSDP2 (fully_shard on each block and on the root), in float32 and under
       bf16 autocast; each step clips the gradients to a global norm of 0.25 (torch.nn.utils.clip_grad_norm_ for the
       unconverted model, torch_reduce.clip_grad_norm_ for ours: FSDP2's gradients are sharded DTensors). Pass:
       each step's global mean loss and gradient norm, and all parameters together, within the mode's norm-wise
       relative tolerance, each parameter within its own (as in tests/test_training.py).
       Writes distributed_training.json and .md; exits 1 when a check fails.
bench  One DDP training step of the converted and of the unconverted model (the same run, alternate steps, CUDA
       events, medians after warm-up; the slowest rank's median); a global var_mean over world x 2^28 float32
       (2^28 a rank): torch_reduce.distributed.var_mean against torch's all_gather_into_tensor + torch.var_mean,
       both checked against float64; and clip_grad_norm_ on GPT-2 small's gradients sharded as FSDP2 shards them
       (DTensors, Shard(0)), ours against torch's (foreach=True), every call scaling. --bench-items picks among
       them. Writes distributed_bench.json and .md; exits 1 when torch_reduce's var or mean or total norm is off
       float64 by more than 1e-5 (relative).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

import torch_reduce

from .context import Context, gpu_slug
from .models import TinyGPT

PARTS = ("train", "bench")
BENCH_ITEMS = ("ddp", "var_mean", "clip")
STRATEGIES = ("ddp", "fsdp2")
# Norm-wise relative tolerances of tests/test_training.py: on every loss and on all parameters together, and
# on each parameter alone (AdamW turns the rounding of a near-zero gradient element into a whole step).
TOLERANCE = {"float32": 1e-5, "bf16_autocast": 2e-2}
PARAMETER_TOLERANCE = {"float32": 1e-4, "bf16_autocast": 2e-2}
MODES = tuple(TOLERANCE)
IMPLS = ("torch", "torch_reduce")  # the unconverted model (or torch's reduction), then ours
LR = 1e-3
MAX_GRAD_NORM = 0.25  # under the decoder's gradient norms (0.80-0.86 in 20 steps of the CI's small one): steps clip
VAR_MEAN_TOLERANCE = 1e-5  # relative to float64, for var and for mean
# all_gather_into_tensor under its newer name where torch has it (the old name warns there).
all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


@dataclass(frozen=True)
class Group:
    """This process's place in the process group."""
    rank: int
    world: int
    device: torch.device
    backend: str


def init_group(device_type: str) -> Group:
    if "RANK" not in os.environ:
        sys.exit("run under torchrun: python -m torch.distributed.run --standalone --nproc-per-node 2 "
                 "-m torch_reduce.bench.distributed ...")
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if device.index >= torch.cuda.device_count():
            sys.exit(f"{device} for local rank {device.index}, but {torch.cuda.device_count()} GPU(s) visible")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return Group(dist.get_rank(), dist.get_world_size(), device, dist.get_backend())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(mode: str, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if mode == "bf16_autocast" else nullcontext()


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-12)).item()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, mode: str,
               clip: Optional[Callable] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One optimizer step on next-token prediction, the gradients clipped by ``clip`` (a clip_grad_norm_) when
    given; returns this rank's loss and the global gradient norm before clipping."""
    optimizer.zero_grad()
    with _autocast(mode, batch.device):
        logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    loss.backward()
    norm = None
    if clip is not None:
        norm = clip(model.parameters(), MAX_GRAD_NORM)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
    optimizer.step()
    return loss.detach(), norm


# ------------------------------------------------------------------------------------------- train ----

def training_model(config: dict, seed: int) -> nn.Module:
    """The unconverted decoder, the same on every rank."""
    torch.manual_seed(seed)
    # No q, k, v bias: the key bias has an exactly-zero gradient (softmax ignores a shift common to every key),
    # so AdamW would turn its rounding noise into full-size steps of either sign.
    model = TinyGPT(**config, qkv_bias=False)
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):  # random affine parameters: converted too, and no zero bias to compare
            with torch.no_grad():
                m.weight.normal_(1, 0.1)
                m.bias.normal_(0, 0.1)
    return model


def rank_batches(group: Group, config: dict, steps: int, batch: int, seed: int) -> torch.Tensor:
    """(steps, batch, context + 1) tokens: this rank's rows of every global batch of world x batch."""
    generator = torch.Generator().manual_seed(seed)
    every = torch.randint(0, config["vocab"], (steps, group.world * batch, config["context"] + 1), generator=generator)
    return every[:, group.rank * batch:(group.rank + 1) * batch].to(group.device)


def distribute(model: nn.Module, strategy: str, group: Group, mesh) -> nn.Module:
    if strategy == "ddp":
        return DistributedDataParallel(model, device_ids=[group.device.index] if group.device.type == "cuda" else None)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model: nn.Module, batches: torch.Tensor, mode: str, group: Group,
          clip: Callable) -> tuple[list[float], list[float]]:
    """AdamW steps, one a batch, the gradients clipped by ``clip``; the global mean loss and the global gradient
    norm of each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = zip(*(train_step(model, optimizer, batch, mode, clip) for batch in batches))
    total = torch.stack(losses).double()
    dist.all_reduce(total)  # a sum: gloo has no average
    return (total / group.world).tolist(), torch.stack(norms).double().tolist()


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (FSDP2's shards gathered; a collective), by name."""
    whole = {}
    for name, p in model.named_parameters():
        p = p.detach()
        whole[name] = p.full_tensor() if isinstance(p, DTensor) else p
    return whole


def training_config(args) -> dict:
    return dict(vocab=args.vocab, width=args.width, heads=args.heads, layers=args.layers, context=args.context)


def training_check(strategy: str, mode: str, group: Group, mesh, args) -> dict:
    config = training_config(args)
    reference = training_model(config, args.seed).to(group.device)
    ours = torch_reduce.nn.convert_layernorm(copy.deepcopy(reference))
    converted = sum(isinstance(m, torch_reduce.nn.LayerNorm) for m in ours.modules())
    left = sum(type(m) is nn.LayerNorm for m in ours.modules())
    batches = rank_batches(group, config, args.steps, args.batch, args.seed + 1)
    losses, norms, parameters = {}, {}, {}
    clips = (torch.nn.utils.clip_grad_norm_, torch_reduce.clip_grad_norm_)
    for impl, model, clip in zip(IMPLS, (reference, ours), clips):
        model = distribute(model, strategy, group, mesh)
        losses[impl], norms[impl] = train(model, batches, mode, group, clip)
        parameters[impl] = full_parameters(model)
    tol, parameter_tol = TOLERANCE[mode], PARAMETER_TOLERANCE[mode]
    loss_diffs = [abs(a - b) for a, b in zip(losses["torch_reduce"], losses["torch"])]
    norm_diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms["torch_reduce"], norms["torch"])]
    want, got = parameters["torch"], parameters["torch_reduce"]
    every = [torch.cat([p.double().flatten() for p in side.values()]) for side in (got, want)]
    each = {name: _relative(got[name], want[name]) for name in want}
    worst = max(each, key=each.get)
    record = {
        "strategy": strategy, "mode": mode, "steps": args.steps, "tolerance": tol, "parameter_tolerance": parameter_tol,
        "layernorms_converted": converted, "layernorms_left": left, "losses": losses, "grad_norms": norms,
        "steps_clipped": sum(n > MAX_GRAD_NORM for n in norms["torch"]),
        "loss_rel_diff_max": max(d / max(abs(b), 1e-12) for d, b in zip(loss_diffs, losses["torch"])),
        "loss_abs_diff_max": max(loss_diffs), "grad_norm_rel_diff_max": max(norm_diffs),
        "parameters_rel_diff": _relative(*every), "parameter_abs_diff_max": (every[0] - every[1]).abs().max().item(),
        "worst_parameter": worst, "worst_parameter_rel_diff": each[worst],
    }
    record["passed"] = (converted > 0 and left == 0 and record["loss_rel_diff_max"] <= tol
                        and record["grad_norm_rel_diff_max"] <= tol and record["steps_clipped"] > 0
                        and record["parameters_rel_diff"] <= tol and each[worst] <= parameter_tol)
    return record


def training_report(records: list[dict], meta: dict) -> str:
    lines = [f"## Converted vs unconverted decoder under torch.distributed ({meta['world_size']} ranks, "
             f"{meta['backend']}, {meta['device']})", "",
             f"Model {meta['model']}, {meta['batch_per_rank']} sequences a rank, AdamW lr {LR}, gradients clipped "
             f"to a norm of {MAX_GRAD_NORM}. Relative differences are norm-wise: each step's global mean loss and "
             "gradient norm; all parameters together; the worst single parameter.", "",
             "| strategy | mode | steps (clipped) | loss rel diff (max) | grad norm rel diff (max) | params rel diff | "
             "worst parameter | tol / param tol | LayerNorms converted | result |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in records:
        lines.append(f"| {r['strategy']} | {r['mode']} | {r['steps']} ({r['steps_clipped']}) | "
                     f"{r['loss_rel_diff_max']:.2e} | {r['grad_norm_rel_diff_max']:.2e} | "
                     f"{r['parameters_rel_diff']:.2e} | {r['worst_parameter']} {r['worst_parameter_rel_diff']:.2e} | "
                     f"{r['tolerance']:.0e} / {r['parameter_tolerance']:.0e} | {r['layernorms_converted']} | "
                     f"{'PASS' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def run_training(group: Group, ctx: Context, args) -> bool:
    mesh = init_device_mesh(group.device.type, (group.world,)) if "fsdp2" in args.strategies else None
    meta = {"part": "train", "device": group.device.type, "backend": group.backend, "world_size": group.world,
            "model": training_config(args), "batch_per_rank": args.batch, "lr": LR, "seed": args.seed}
    records = []
    for strategy in args.strategies:
        for mode in args.modes:
            record = training_check(strategy, mode, group, mesh, args)
            records.append(record)
            if group.rank == 0:
                print(f"{'PASS' if record['passed'] else 'FAIL'} {strategy} {mode}: losses "
                      f"{record['loss_rel_diff_max']:.2e}, gradient norms {record['grad_norm_rel_diff_max']:.2e} "
                      f"({record['steps_clipped']} steps clipped), parameters {record['parameters_rel_diff']:.2e}, worst "
                      f"{record['worst_parameter']} {record['worst_parameter_rel_diff']:.2e}", flush=True)
                # Written after every check: a later one that crashes leaves the earlier ones on disk.
                meta["passed"] = all(r["passed"] for r in records)
                ctx.write_json("distributed_training", records, meta)
    if group.rank == 0:
        text = training_report(records, meta)
        ctx.write_text("distributed_training.md", text + "\n")
        print(text, flush=True)
    return all(r["passed"] for r in records)


# ------------------------------------------------------------------------------------------- bench ----

def _call_ms(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(fns: dict[str, Callable[[], object]], device: torch.device, warmup: int, samples: int,
              before_each: Optional[Callable[[], None]] = None) -> dict[str, float]:
    """Each fn's median time over samples, the fns taking turns (drift hits them alike)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            if before_each is not None:
                before_each()
            times[name].append(_call_ms(fn, device))
    return {name: statistics.median(t) for name, t in times.items()}


def every_rank(values: dict[str, float], group: Group) -> dict[str, list[float]]:
    """Each rank's figure, by name (a collective)."""
    local = torch.tensor([values[name] for name in values], dtype=torch.float64, device=group.device)
    gathered = [torch.empty_like(local) for _ in range(group.world)]
    dist.all_gather(gathered, local)
    return {name: [g[i].item() for g in gathered] for i, name in enumerate(values)}


def step_time(width: int, mode: str, group: Group, args) -> dict:
    """One DDP step (zero_grad, forward, loss, backward with its all-reduce, AdamW) of each model."""
    config = dict(vocab=args.bench_vocab, width=width, heads=args.bench_heads, layers=args.bench_layers,
                  context=args.bench_context)
    torch.manual_seed(args.seed)
    reference = TinyGPT(**config, fused_attention=True).to(group.device)
    models = {"torch": reference, "torch_reduce": torch_reduce.nn.convert_layernorm(copy.deepcopy(reference))}
    batch = rank_batches(group, config, 1, args.bench_batch, args.seed + 1)[0]
    steps = {}
    for impl, model in models.items():
        ddp = distribute(model, "ddp", group, None)
        steps[impl] = partial(train_step, ddp, torch.optim.AdamW(ddp.parameters(), lr=LR), batch, mode)
    per_rank = every_rank(median_ms(steps, group.device, args.bench_warmup, args.bench_steps), group)
    ms = {impl: max(per_rank[impl]) for impl in IMPLS}  # the slowest rank sets the pace
    return {"what": "ddp_step", "mode": mode, "model": config, "batch_per_rank": args.bench_batch,
            "tokens_per_rank": args.bench_batch * args.bench_context, "median_ms": ms, "per_rank_median_ms": per_rank,
            "speedup": ms["torch"] / ms["torch_reduce"], "samples": args.bench_steps, "warmup": args.bench_warmup}


def sharded_clip(group: Group, args) -> dict:
    """clip_grad_norm_ on GPT-2 small's 148 gradients (124 M float32) sharded as FSDP2 shards them (Shard(0) of each
    over the ranks), torch's (foreach=True) and ours on the same gradients, every call scaling them (max_norm 0.9
    of the norm: gradnorm.MaxNorms); both totals checked against the float64 norm of the whole gradients first."""
    from .gradnorm import CLIP_RATIO, MaxNorms, gpt2_small_shapes
    mesh = init_device_mesh(group.device.type, (group.world,))
    generator = torch.Generator(group.device).manual_seed(args.seed)  # the same whole gradients on every rank
    params, squares = [], []
    for shape in gpt2_small_shapes():
        whole = torch.randn(shape, device=group.device, generator=generator)
        squares.append(whole.double().square().sum())
        p = nn.Parameter(distribute_tensor(torch.empty(shape, device=group.device), mesh, [Shard(0)]))
        p.grad = distribute_tensor(whole, mesh, [Shard(0)])
        params.append(p)
    grads = [p.grad for p in params]
    exact = torch.stack(squares).sum().sqrt().item()
    rel_error = {impl: abs(total(grads).full_tensor().item() - exact) / exact for impl, total in
                 (("torch", torch.nn.utils.get_total_norm), ("torch_reduce", torch_reduce.get_total_norm))}
    max_norm = MaxNorms([params], CLIP_RATIO)
    fns = {"torch": lambda: torch.nn.utils.clip_grad_norm_(params, max_norm(params), foreach=True),
           "torch_reduce": lambda: torch_reduce.clip_grad_norm_(params, max_norm(params))}

    def together():  # each sample starts with every rank ready
        dist.barrier()
        _synchronize(group.device)

    per_rank = every_rank(median_ms(fns, group.device, args.bench_warmup, args.bench_steps, together), group)
    ms = {impl: max(per_rank[impl]) for impl in IMPLS}
    return {"what": "fsdp2_clip", "tensors": len(params), "elements": sum(g.numel() for g in grads),
            "dtype": "float32", "median_ms": ms, "per_rank_median_ms": per_rank,
            "speedup": ms["torch"] / ms["torch_reduce"], "total_rel_error_vs_float64": rel_error,
            "accurate": {impl: e <= 1e-5 for impl, e in rel_error.items()}, "samples": args.bench_steps,
            "warmup": args.bench_warmup}


def _torch_reduce_distributed():
    """torch_reduce.distributed, or None and why (it may not exist yet in this tree)."""
    try:
        from torch_reduce import distributed
    except Exception as error:  # a missing or broken module costs this row, not the run
        return None, f"torch_reduce.distributed not importable ({type(error).__name__}: {error})"
    return distributed, None


def global_var_mean(group: Group, args) -> dict:
    """var_mean of the concatenation of every rank's tensor. Rank r holds normals of mean 3 + r and standard
    deviation 2: the ranks' means differ, so combining per-rank statistics is put to the test."""
    numel = args.var_mean_numel
    generator = torch.Generator(device=group.device).manual_seed(args.seed + group.rank)
    x = torch.randn(numel, device=group.device, generator=generator).mul_(2).add_(3 + group.rank)
    gathered = torch.empty(group.world * numel, device=group.device)

    def torch_var_mean():
        all_gather_into_tensor(gathered, x)
        return torch.var_mean(gathered)

    fns = {"torch": torch_var_mean}
    module, missing = _torch_reduce_distributed()
    if module is not None:
        fns["torch_reduce"] = lambda: module.var_mean(x)
    all_gather_into_tensor(gathered, x)
    exact_var, exact_mean = torch.var_mean(gathered.double())
    errors, accurate = {}, {}
    for impl, fn in fns.items():
        var, mean = fn()
        errors[impl] = {"var": abs(var.item() - exact_var.item()) / exact_var.item(),
                        "mean": abs(mean.item() - exact_mean.item()) / abs(exact_mean.item())}
        accurate[impl] = max(errors[impl].values()) <= VAR_MEAN_TOLERANCE
    del exact_var, exact_mean

    def together():  # each sample starts with every rank ready, so no rank times the other's lateness
        dist.barrier()
        _synchronize(group.device)

    per_rank = every_rank(median_ms(fns, group.device, args.bench_warmup, args.bench_steps, together), group)
    ms = {impl: max(per_rank[impl]) if impl in per_rank else None for impl in IMPLS}
    return {"what": "global_var_mean", "numel_per_rank": numel, "dtype": "float32", "median_ms": ms,
            "per_rank_median_ms": per_rank, "speedup": ms["torch"] / ms["torch_reduce"] if ms["torch_reduce"] else None,
            "rel_error_vs_float64": errors, "accurate": accurate, "tolerance": VAR_MEAN_TOLERANCE,
            "samples": args.bench_steps, "warmup": args.bench_warmup, "missing": missing}


def _ms(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.3f}"


def bench_report(records: list[dict], meta: dict) -> str:
    lines = [f"## torch.distributed timings ({meta['world_size']} ranks, {meta['backend']}, {meta['device']})", "",
             "Medians of per-sample times (CUDA events on the GPU, the host clock on the CPU), taken in turns after "
             "warm-up; each figure is the slowest rank's median. speedup: torch / torch_reduce.", "",
             "| what | torch ms | torch_reduce ms | speedup | notes |", "|---|---:|---:|---:|---|"]
    for r in records:
        ms = r["median_ms"]
        speedup = "–" if r["speedup"] is None else f"{r['speedup']:.3f}x"
        if r["what"] == "ddp_step":
            m = r["model"]
            what = f"DDP step, {r['mode']}, width {m['width']}"
            notes = (f"{m['layers']} layers, {m['heads']} heads, context {m['context']}, vocab {m['vocab']}, "
                     f"{r['tokens_per_rank']} tokens a rank")
        elif r["what"] == "fsdp2_clip":
            what = f"clip_grad_norm_, GPT-2 small's gradients sharded over {meta['world_size']} ranks (FSDP2)"
            errors = "; ".join(f"{impl} {e:.1e}" for impl, e in r["total_rel_error_vs_float64"].items())
            notes = (f"{r['tensors']} DTensors, {r['elements']:,} float32, Shard(0); every call scales; the total's "
                     f"rel. error vs float64: {errors}")
        else:
            what = f"global var_mean, {meta['world_size']} x {r['numel_per_rank']} float32"
            errors = "; ".join(f"{impl} var {e['var']:.1e} mean {e['mean']:.1e}"
                               for impl, e in r["rel_error_vs_float64"].items())
            notes = f"rel. error vs float64: {errors}" + (f"; {r['missing']}" if r["missing"] else "")
        lines.append(f"| {what} | {_ms(ms['torch'])} | {_ms(ms['torch_reduce'])} | {speedup} | {notes} |")
    return "\n".join(lines)


def run_bench(group: Group, ctx: Context, args) -> bool:
    meta = {"part": "bench", "device": group.device.type, "backend": group.backend, "world_size": group.world}
    records = []
    for width in args.bench_widths if "ddp" in args.bench_items else ():
        for mode in args.modes:
            records.append(step_time(width, mode, group, args))
            if group.device.type == "cuda":
                torch.cuda.empty_cache()  # the next models get the memory back
    if "var_mean" in args.bench_items:
        records.append(global_var_mean(group, args))
    if "clip" in args.bench_items:
        records.append(sharded_clip(group, args))
    if group.rank == 0:
        ctx.write_json("distributed_bench", records, meta)
        text = bench_report(records, meta)
        ctx.write_text("distributed_bench.md", text + "\n")
        print(text, flush=True)
    return all(r.get("accurate", {}).get("torch_reduce", True) for r in records)  # torch's reported, not judged


# -------------------------------------------------------------------------------------------- main ----

def _names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {choices}")
        return names
    return parse


def _ints(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torch_reduce.bench.distributed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--parts", type=_names(PARTS), default=list(PARTS), help=f"comma-separated, of {PARTS}")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/<gpu>)")
    parser.add_argument("--seed", type=int, default=0)
    train = parser.add_argument_group("train")
    train.add_argument("--strategies", type=_names(STRATEGIES), default=list(STRATEGIES))
    train.add_argument("--modes", type=_names(MODES), default=list(MODES), help="also the bench's DDP step modes")
    train.add_argument("--steps", type=int, default=20, help="AdamW steps")
    train.add_argument("--batch", type=int, default=4, help="sequences a rank a step")
    train.add_argument("--vocab", type=int, default=256)
    train.add_argument("--width", type=int, default=128)
    train.add_argument("--heads", type=int, default=4)
    train.add_argument("--layers", type=int, default=2)
    train.add_argument("--context", type=int, default=64)
    bench = parser.add_argument_group("bench")
    bench.add_argument("--bench-items", type=_names(BENCH_ITEMS), default=list(BENCH_ITEMS),
                       help=f"comma-separated, of {BENCH_ITEMS}")
    bench.add_argument("--bench-widths", type=_ints, default=[1024, 2048])
    bench.add_argument("--bench-heads", type=int, default=16)
    bench.add_argument("--bench-layers", type=int, default=4)
    bench.add_argument("--bench-context", type=int, default=1024)
    bench.add_argument("--bench-vocab", type=int, default=8192)
    bench.add_argument("--bench-batch", type=int, default=8, help="sequences a rank a step")
    bench.add_argument("--bench-warmup", type=int, default=5)
    bench.add_argument("--bench-steps", type=int, default=20, help="timed samples of each")
    bench.add_argument("--var-mean-numel", type=int, default=2**28, help="float32 elements a rank")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: pass --device cpu to run on gloo")
    group = init_group(args.device)
    slug = gpu_slug() if args.device == "cuda" else "cpu"
    ctx = Context(quick=False, out_dir=args.out or Path("benchmarks") / "results" / slug)
    try:
        passed = True
        if "train" in args.parts:
            passed &= run_training(group, ctx, args)
        if "bench" in args.parts:
            passed &= run_bench(group, ctx, args)
        dist.barrier()  # no rank tears its group down while another still talks to it (not after an error: a hang)
    finally:
        dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: there, gloo's threads were seen to abort a rank once ("terminate
    # called without an active exception", SIGABRT) after every check had passed and the report was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
