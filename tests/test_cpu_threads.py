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
            assert torch.equal(a, b), name
