"""A small run of every op for compute-sanitizer: each ladder variant at a few sizes and block sizes
(several blocks, partial last blocks, misaligned views), then the drop-in reductions on each kernel path,
var_mean, LayerNorm, RMSNorm and the gradient norm."""
import torch

import torch_reduce
from torch_reduce import LADDER

torch.manual_seed(0)
x = torch.randn(70_001, device="cuda")
for v in LADDER:
    for block in (32, 128, 1024):
        for t in (x, x[1:], x[:1000]):
            got, want = v.op(t, block).item(), t.double().sum().item()
            assert abs(got - want) <= 1e-3 * t.abs().sum().item(), (v.name, block, got, want)
    assert v.op(x.half(), 256).isfinite().item()
    assert v.op(torch.ones(33_333, dtype=torch.int8, device="cuda")).item() == 33_333

# The drop-ins on each kernel path: rows, columns, narrow-row tiles (K = 3, partial last tile, 16-bit), narrow
# rows that divide a vector (K = 2, 3 rows past the last vector), few rows over dim 0, and reduced dims apart in
# memory (stages).
narrow = torch.randn(5003, 3, device="cuda")
pairs = torch.randn(5003, 2, device="cuda")
apart = torch.randn(5, 6, 7, 9, device="cuda")
for name in ("sum", "mean", "amax", "amin", "prod", "vector_norm"):
    op = getattr(torch_reduce, name)
    call = (lambda t, *dims: op(t, 2, *dims)) if name == "vector_norm" else op
    y = torch.randn(300, 257, device="cuda")
    for args in ((), (0,), (1,), ((0, 1),)):
        call(y, *args)
        call(y.t(), *args)
    call(narrow, -1)
    call(narrow.bfloat16(), -1)
    call(pairs, -1)
    call(pairs.bfloat16(), -1)
    call(torch.randn(7, 4099, device="cuda"), 0)
    call(apart, (0, 2, 3))
    call(apart.contiguous(memory_format=torch.channels_last), (1, 2))
    call(apart.bfloat16(), (0, 2))
# Narrow-row tiles, several a block; rows of 392 vectors a warp each (enough rows for every resident warp); 8
# bfloat16 columns a thread, the reduced extent in one slice.
for t in (torch.randn(1_500_001, 3, device="cuda"), torch.randn(9000, 3136, device="cuda").bfloat16()):
    torch_reduce.sum(t, -1)
    torch_reduce.amax(t, -1)
torch_reduce.sum(torch.randn(3, 8, 2**21, device="cuda").bfloat16(), 1)
# Long rows split over blocks: one loop of a row's blocks (a one-wave grid; odd rows start misaligned), and runs of a
# row a block (300 rows of 5-7 splits: several waves).
for t in (torch.randn(3, 2**20 + 5, device="cuda"), torch.randn(300, 2**16 + 3, device="cuda")):
    torch_reduce.sum(t, -1)
    torch_reduce.amax(t.bfloat16(), -1)
# LayerNorm, RMSNorm and var_mean: one shape per row layout of each kernel (warp rows, blocks of 128/256/512/1024,
# the backward's wide rows, streaming rows with shared-memory or global column sums), mixed-precision parameters,
# and a misaligned view.
for hidden, dtype, param_dtype in [(768, torch.float32, None), (1001, torch.float32, None),
                                   (4096, torch.bfloat16, None), (4096, torch.bfloat16, torch.float32),
                                   (8192, torch.float32, None), (12288, torch.float32, None),
                                   (16384, torch.float32, None), (18432, torch.float32, None),
                                   (18432, torch.bfloat16, torch.float32), (40000, torch.float32, None)]:
    z = torch.randn(40, hidden, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(hidden, device="cuda", dtype=param_dtype or dtype, requires_grad=True)
    b = torch.randn(hidden, device="cuda", dtype=param_dtype or dtype, requires_grad=True)
    torch_reduce.layer_norm(z, (hidden,), w, b).sum().backward()
    torch_reduce.rms_norm(z, (hidden,), w).sum().backward()
    torch_reduce.var_mean(z.detach(), -1)
# The backward with its column sums in shared memory: rows enough that it is chosen (blocks of 160 threads for
# 2560, two rows at a time for 1024 with the last pair one row short, warp rows for 64), a fused add's grad_sum
# included.
for rows, hidden in [(4500, 2560), (8193, 1024), (20000, 64)]:
    z, r = (torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    w, b = (torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    torch_reduce.layer_norm(z, (hidden,), w, b).sum().backward()
    y, s = torch_reduce.add_rms_norm(z, r, (hidden,), w)
    (y.sum() + s.sum()).backward()
# Wide rows, several a cluster or block: split over a cluster's blocks (float32 18440: shares of 1153 and 1151
# vectors, their sums through distributed shared memory), the next row prefetched (bfloat16 12288), and held with
# the column sums in shared memory by 1024 threads of two vectors (bfloat16 16384) or 864 of three (20472).
for rows, hidden, dtype in [(600, 18440, torch.float32), (600, 12288, torch.bfloat16), (600, 16384, torch.bfloat16),
                            (600, 20472, torch.bfloat16)]:
    z = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
    w, b = (torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    torch_reduce.layer_norm(z, (hidden,), w, b).sum().backward()
    torch_reduce.rms_norm(z, (hidden,), w).sum().backward()
# Rows two at a time with the column sums in shared memory, where each SM has 48 rows or more
# (Tuning::kWideRowPairsMinRowsPerSm): in blocks of 512-768 threads (bfloat16 8192 columns) and in the fixed block of
# 256 (bfloat16 4096); an odd row count leaves the last pair a row short.
sms = torch.cuda.get_device_properties(0).multi_processor_count
for hidden in (8192, 4096):
    z = torch.randn(48 * sms + 1, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w, b = (torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    torch_reduce.layer_norm(z, (hidden,), w, b).sum().backward()
    torch_reduce.rms_norm(z, (hidden,), w).sum().backward()
shifted = torch.randn(7 * 2048 + 1, device="cuda")[1:].view(7, 2048).requires_grad_()
torch_reduce.layer_norm(shifted, (2048,), torch.ones(2048, device="cuda", requires_grad=True)).sum().backward()
# The gradient norm: full and partial chunks of every dtype, aligned and misaligned, empty and 0-dim tensors, a
# list longer than one launch's table, every kind of norm, and the scaling.
grads = [torch.randn(n, device="cuda", dtype=dtype) for n in (16_384 * 2 + 5, 1, 257)
         for dtype in (torch.float32, torch.bfloat16, torch.float64)]
grads += [torch.randn(4097, device="cuda")[1:], torch.empty(0, device="cuda"), torch.randn((), device="cuda")]
for ord in (2, 1, 0, 0.5):
    torch_reduce.foreach_norm(grads, ord)
    torch_reduce.get_total_norm(grads, ord)
torch_reduce.get_total_norm(grads[:-2], float("inf"))
torch_reduce.get_total_norm([torch.randn(3, device="cuda") for _ in range(1100)])
params = [torch.nn.Parameter(g) for g in grads]
for p in params:
    p.grad = torch.randn_like(p)
params[-3].grad = torch.randn(4097, device="cuda")[1:]  # misaligned
torch_reduce.clip_grad_norm_(params, 0.1)
torch_reduce.clip_grad_norm_(params, 1e9)  # nothing to clip: the scaling returns at once
torch.cuda.synchronize()
print("sanitize run done")
