"""The CPU kernels split their work over torch's intra-op threads in pieces fixed by the shape alone, so a result
has the same bits at any thread count (an order of float adds that followed the threads would not)."""
import pytest
import torch

import torch_reduce


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _layer_norm_and_grads(x, w, b, dy):
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = torch_reduce.layer_norm(x, [x.shape[-1]], w, b)
    return (y, *torch.autograd.grad(y, (x, w, b), dy))


# name: (fn, shapes of its random float32 arguments, their dtype, the other arguments)
CASES = {
    "sum, 2 columns": (torch_reduce.sum, [(1 << 20, 2)], torch.float32, (0,)),
    "sum, 5 columns of 64 slabs": (torch_reduce.sum, [(64, 4099, 5)], torch.float32, (1,)),
    "sum, one long row": (torch_reduce.sum, [(1, 3 << 20)], torch.float32, (1,)),
    "sum, all": (torch_reduce.sum, [(3 << 20,)], torch.float32, ()),
    "amax, 3 columns of 2 slabs": (torch_reduce.amax, [(2, 90_001, 3)], torch.float32, (1,)),
    "amin, 40 columns, bf16": (torch_reduce.amin, [(70_000, 40)], torch.bfloat16, (0,)),
    "mean, bf16 rows": (torch_reduce.mean, [(300, 5000)], torch.bfloat16, (1,)),
    "var_mean, one long row": (torch_reduce.var_mean, [(1, 1 << 20)], torch.float64, (1,)),
    "var_mean, rows": (torch_reduce.var_mean, [(500, 700)], torch.float32, (1,)),
    "layer_norm and its gradients": (_layer_norm_and_grads, [(96, 3000), (3000,), (3000,), (96, 3000)],
                                     torch.float32, ()),
    "foreach_norm": (lambda *ts: torch_reduce.foreach_norm(ts), [(1000, 300), (70_001,), (3, 5)], torch.float32, ()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_results_do_not_depend_on_the_thread_count(name, threads):
    fn, shapes, dtype, rest = CASES[name]
    args = [torch.randn(shape).to(dtype) for shape in shapes]
    results = []
    for count in (1, 2, 3):
        torch.set_num_threads(count)
        out = fn(*args, *rest)
        results.append(out if isinstance(out, (tuple, list)) else (out,))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(_bits(a), _bits(b)), name


def _bits(t):
    return t.detach().reshape(-1).view(torch.uint8)


def test_cpu_max_over_split_slabs_gives_each_columns_first_nan(threads):
    """A slab of many rows is split over tasks; a column's NaN is its first in row order, whichever task saw it."""
    torch.set_num_threads(2)
    x = torch.randn(2, 200_003, 3)
    nans = torch.tensor([0x7FC00001, 0x7FC00002, 0xFFC00003], dtype=torch.int64).to(torch.int32).view(torch.float32)
    x[0, 150_000, 0], x[0, 20, 0] = nans[0], nans[1]  # two tasks' NaNs: the earlier row's wins
    x[1, 199_999, 2] = nans[2]
    for op in (torch_reduce.amax, torch_reduce.amin):
        out = op(x, 1)
        assert _bits(out[0, 0]).equal(_bits(nans[1])) and _bits(out[1, 2]).equal(_bits(nans[2]))
        finite = ~out.isnan()
        assert torch.equal(out[finite], getattr(torch, op.__name__)(x, 1)[finite])
