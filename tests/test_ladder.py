"""The ladder ops (torch.ops.reduce.sum_*): every size and block size against float64 within the error bound of
each variant's summation order, every dtype, views, NaN and infinities, and the CPU model's bits on the GPU. The
contract suite (tests/test_op_contract.py, from the specs in tests/op_specs.py) runs the rest: autograd, opcheck,
compile, bad inputs (block sizes, dtypes, sparse), determinism, > 2^31 elements, streams, CUDA graphs, two GPUs."""
import math

import pytest
import torch

from conftest import ALL_DTYPES, DEVICES, random_tensor, requires_cuda
from torch_reduce import LADDER
from torch_reduce.analysis.model_gpu import MODEL_GPU
from torch_reduce.ladder import BY_NAME

SIZES = [0, 1, 2, 31, 32, 33, 255, 256, 257, 997, 1023, 1025, 4095, 4097, 65521, 65537, 1_000_003]
BLOCK_SIZES = [32, 64, 128, 256, 512, 1024]
VARIANTS = [v.name for v in LADDER]
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
RESULT_ROUNDING = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def reference(x):
    return x.double().sum() if x.dtype.is_floating_point else x.long().sum()


def per_thread_elements(name, n, block):
    """The longest serial chain a thread runs before the trees (an upper bound)."""
    v = BY_NAME[name]
    if v.loads_per_thread == 1:
        return 1
    if name in ("sum_first_add", "sum_warp_unrolled", "sum_unrolled"):
        return 2
    resident_blocks = MODEL_GPU.multiprocessors * (MODEL_GPU.threads_per_multiprocessor // block)
    threads = min(-(-n // block), resident_blocks) * block
    return -(-n // max(threads, 1)) + 16


def error_bound(name, x, block):
    """|sum - exact| <= depth * u * sum|x|: depth = additions any element goes through (chain + trees)."""
    n = x.numel()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    depth = per_thread_elements(name, n, block) + 2 * math.ceil(math.log2(max(n, 2))) + 8
    bound = depth * UNIT_ROUNDOFF[acc] * x.double().abs().sum().item()
    return bound + RESULT_ROUNDING.get(x.dtype, 0.0) * abs(reference(x).item())


def check_sum(name, x, block=256):
    out = getattr(torch.ops.reduce, name)(x, block)
    ref = reference(x)
    assert out.shape == ()
    assert out.dtype == (x.dtype if x.dtype.is_floating_point else torch.int64)
    assert out.device == x.device
    if x.dtype.is_floating_point:
        err = abs(out.double().item() - ref.item())
        assert err <= error_bound(name, x, block), (name, x.numel(), block, out.item(), ref.item())
    else:
        assert out.item() == ref.item()
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", BLOCK_SIZES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", VARIANTS)
def test_float32_sizes_and_blocks(name, n, block, device):
    check_sum(name, random_tensor(n, torch.float32, device), block)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 257, 65537, 1_000_003])
@pytest.mark.parametrize("name", VARIANTS)
def test_every_dtype(name, dtype, n, device):
    check_sum(name, random_tensor(n, dtype, device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", VARIANTS)
def test_views(name, device):
    base = random_tensor((301, 517), torch.float32, device)
    for view in (base[1:], base.t(), base.view(-1)[::3], base.view(-1)[1:], base.view(-1)[3:-2], base[:, 5:9],
                 base.view(-1)[7:7 + 4 * 513].view(4, 513).t()):
        check_sum(name, view)
    check_sum(name, random_tensor((64, 33), torch.int8, device).t())
    check_sum(name, random_tensor((3, 1001), torch.bfloat16, device)[:, 1:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", VARIANTS)
def test_empty_nan_inf(name, device):
    op = getattr(torch.ops.reduce, name)
    for dtype in (torch.float32, torch.int32, torch.bool, torch.float16):
        empty = torch.empty((0, 5), dtype=dtype, device=device)
        assert op(empty).item() == 0 and op(empty).dtype == torch.sum(empty).dtype
    x = random_tensor(10_000, torch.float32, device)
    for poison, expect in ((math.nan, math.nan), (math.inf, math.inf), (-math.inf, -math.inf)):
        y = x.clone()
        y[4321] = poison
        got, want = op(y).item(), torch.sum(y).item()
        assert (math.isnan(got) and math.isnan(want)) or got == want == expect
    y = x.clone()
    y[10], y[9000] = math.inf, -math.inf
    assert math.isnan(op(y).item()) and math.isnan(torch.sum(y).item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", VARIANTS)
def test_opcheck_integer_and_empty(name, device):
    """The inputs the contract suite's float samples leave out: integers (an int64 result) and empty."""
    op = getattr(torch.ops.reduce, name)
    for x, block in ((random_tensor((5, 7), torch.int32, device), 32), (random_tensor(0, torch.float32, device), 128)):
        torch.library.opcheck(op, (x, block))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", VARIANTS)
def test_gradient_is_the_output_gradient_expanded(name, device):
    """Exactly: every element's gradient is the output's (gradcheck, in the contract suite, to a tolerance)."""
    op = getattr(torch.ops.reduce, name)
    x = random_tensor((6, 9), torch.float64, device).requires_grad_()
    g = torch.randn((), dtype=torch.float64, device=device)
    (grad,) = torch.autograd.grad(op(x, 32), x, g)
    assert torch.equal(grad, g.expand_as(x))


def test_ladder_registry():
    assert [v.lesson for v in LADDER[:7]] == [f"REDUCE-{i}" for i in range(7)]
    for v in LADDER:
        assert v.summary and v.op is getattr(torch.ops.reduce, v.name)


# ------------------------------------------------------------------------------------------- GPU only ----


def gpu_replays_cpu_model(name, n, block):
    """Whether the CPU model's launch geometry is the GPU's (same SMs; vector kernels below the cap)."""
    properties = torch.cuda.get_device_properties(0)
    if (properties.multi_processor_count, properties.max_threads_per_multi_processor) != (
            MODEL_GPU.multiprocessors, MODEL_GPU.threads_per_multiprocessor):
        return BY_NAME[name].loads_per_thread in (1, 2) and name != "sum_multi"
    if BY_NAME[name].loads_per_thread == 0:
        # fewer blocks than one per SM: no occupancy question
        return -(-n // 4) <= MODEL_GPU.multiprocessors * block * 4
    return True


@requires_cuda
@pytest.mark.parametrize("block", BLOCK_SIZES)
@pytest.mark.parametrize("name", VARIANTS)
def test_cuda_bits_equal_cpu_model(name, block):
    op = getattr(torch.ops.reduce, name)
    for n in SIZES[1:] + [2**20 + 7, 3 * 2**21 + 1]:
        if not gpu_replays_cpu_model(name, n, block):
            continue
        x = random_tensor(n, torch.float32, "cpu")
        cpu, gpu = op(x, block), op(x.cuda(), block).cpu()
        assert torch.equal(cpu, gpu), (name, n, block, cpu.item(), gpu.item())
