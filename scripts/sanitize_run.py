"""A small run of every op for compute-sanitizer: each ladder variant at a few sizes and block sizes
(several blocks, partial last blocks, misaligned views), then the drop-in reductions, var_mean and LayerNorm."""
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

for name in ("sum", "mean", "amax", "amin"):
    op = getattr(torch_reduce, name, None)
    if op is not None:
        y = torch.randn(300, 257, device="cuda")
        for args in ((), (0,), (1,), ((0, 1),)):
            op(y, *args)
            op(y.t(), *args)
# LayerNorm and var_mean: one shape per row layout (warp, blocks of 128/256/512, streaming) and column
# accumulator place (shared memory, global scratch).
for hidden, dtype in [(768, torch.float32), (1001, torch.float32), (4096, torch.bfloat16), (8192, torch.float32),
                      (12288, torch.float32), (16384, torch.float32), (40000, torch.float32)]:
    z = torch.randn(40, hidden, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(hidden, device="cuda", dtype=dtype, requires_grad=True)
    torch_reduce.layer_norm(z, (hidden,), w, b).sum().backward()
    torch_reduce.var_mean(z.detach(), -1)
torch.cuda.synchronize()
print("sanitize run done")
