"""The CPU kernels of the norms (var_mean, LayerNorm and RMSNorm, forward and backward) and of the dim reductions
run in a copy compiled for AVX2 where the CPU has it (csrc/cpu/isa.h), and the model of the GPU's whole-tensor sum
(cpu/model.h) folds float32 vectors with AVX2 there. They must give the bits of the baseline copy
(TORCH_REDUCE_CPU_CAPABILITY=default): the same operations in the same order, no multiply-add contracted."""
import subprocess
import sys

import pytest
import torch

from conftest import subprocess_env

# A child prints a digest of every result: odd and even widths, rows of one, every parameter combination, mixed
# precision parameters, each dtype; the seed is the parent's, so both children see the same inputs.
CHILD = r"""
import hashlib, sys
import torch
import torch_reduce  # noqa: F401
torch.manual_seed(int(sys.argv[1]))
ops, digest = torch.ops.reduce, hashlib.sha256()
def add(*tensors):
    for t in tensors:
        if t.numel():
            digest.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
    for rows, cols in ((8, 1024), (5, 7), (33, 1001), (1, 4099), (3, 40000)):
        x = (torch.randn(rows, cols) * 3 + 1).to(dtype)
        dy = torch.randn(rows, cols).to(dtype)
        add(*ops.var_mean(x, [1], correction=1))
        param_types = (dtype, torch.float32) if dtype in (torch.bfloat16, torch.float16) else (dtype,)
        for param_type in param_types:
            for given in (0, 1, 2):
                w = torch.randn(cols).to(param_type) if given else None
                b = torch.randn(cols).to(param_type) if given == 2 else None
                y, mean, rstd = ops.layer_norm_fwd(x, [cols], w, b, 1e-5)
                add(y, mean, rstd, *ops.layer_norm_bwd(dy, x, [cols], mean, rstd, w, b, [True, True, True]))
                y, rstd = ops.rms_norm_fwd(x, [cols], w, None)
                add(y, rstd, *ops.rms_norm_bwd(dy, x, [cols], rstd, w, [True, True]))
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32):
    for shape in ((70001,), (4096, 64), (64, 4097), (7, 3, 1001)):
        x = torch.randn(shape) * 4 if dtype.is_floating_point else torch.randint(-100, 100, shape)
        x = x.to(dtype)
        for dims in (None, (0,), (-1,), (0, -1))[:len(shape) + 1]:
            given = () if dims is None else (dims,)
            add(torch_reduce.sum(x, *given), torch_reduce.amax(x, dims or ()), torch_reduce.amin(x, dims or ()))
            if dtype.is_floating_point:
                add(torch_reduce.mean(x, *given), torch_reduce.prod(x * 0.01 + 1, *(given and given[0][:1])))
                for p in (2.0, 1.0, float("inf"), 0.5):
                    add(torch_reduce.vector_norm(x, p, dims))
x = torch.randn(70001) * 4
for view in (x, x[1:], x[:1025], x[3:259]):  # whole rounds of the model, misaligned heads, partial rounds only
    add(torch_reduce.sum(view), torch_reduce.mean(view))
    for variant in torch_reduce.ops.LADDER:
        add(getattr(ops, variant.name)(view))
print(digest.hexdigest())
"""


def _digest(seed, **env):
    done = subprocess.run([sys.executable, "-c", CHILD, str(seed)], capture_output=True, text=True,
                          env=subprocess_env(**env), timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"), reason="needs an AVX2 CPU")
def test_avx2_copy_gives_the_baseline_bits(fresh_seed):
    assert _digest(fresh_seed) == _digest(fresh_seed, TORCH_REDUCE_CPU_CAPABILITY="default")
