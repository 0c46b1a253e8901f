"""What is specific to torch_reduce.prod and torch_reduce.vector_norm (the contract suite, tests/test_op_contract.py,
runs the rest from their rows in tests/op_specs.py): every order of the norm against a float64 reference, on
every kernel path (whole tensor, rows, columns) with odd sizes and non-contiguous and expanded views; zeros
in prod's gradient; integer, bool and empty inputs. (Their errors, against torch's, are the specs' error_inputs.)"""
from __future__ import annotations

import math

import pytest
import torch

import torch_reduce
from conftest import DEVICES, FLOAT_DTYPES, INT_DTYPES, random_tensor
from op_specs import SELF_CHECK

INF = math.inf
ORDS = [0, 1, 2, INF, -INF, 3, 0.5, 1.5, -1, -1.5]
# Tolerances against a float64 reference, by input dtype: the CPU's column fold is serial, so 3000 rows give
# an error up to 3000 u in float32 (README: summation order and error bounds); 16-bit results are rounded once.
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=2e-4, atol=1e-6),
       torch.float16: dict(rtol=2e-3, atol=1e-4), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-3)}


def prod(*args, **kwargs):
    return torch.prod(*args, **kwargs) if SELF_CHECK else torch_reduce.prod(*args, **kwargs)


def vector_norm(*args, **kwargs):
    return torch.linalg.vector_norm(*args, **kwargs) if SELF_CHECK else torch_reduce.vector_norm(*args, **kwargs)


def layouts(shape, dtype, device):
    """The same values as a contiguous tensor, a transposed view, a stepped view and an expanded view."""
    x = random_tensor(shape, dtype, device)
    yield "contiguous", x
    yield "transposed", random_tensor(shape[::-1], dtype, device).permute(*reversed(range(len(shape))))
    yield "stepped", random_tensor((*shape[:-1], 2 * shape[-1]), dtype, device)[..., ::2]
    yield "expanded", random_tensor((1, *shape[1:]), dtype, device).expand(shape)


# ---------------------------------------------------------------------------------------- vector_norm ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("ord", ORDS, ids=str)
def test_vector_norm_against_float64(ord, dtype, device):
    """Whole tensor (single pass), rows (short and long), columns, several dims, keepdim; odd sizes."""
    for shape, dims in [((1001,), None), ((3, 37), -1), ((5, 3000), 1), ((3000, 5), 0), ((7, 9, 11), (0, 2)),
                        ((2, 65, 3), 1), ((7, 9, 11), None)]:
        for layout, x in layouts(shape, dtype, device):
            for keepdim in (False, True):
                got = vector_norm(x, ord, dims, keepdim)
                want = torch.linalg.vector_norm(x.double(), ord, dims, keepdim).to(dtype).double()  # inf past max
                assert got.dtype == dtype
                torch.testing.assert_close(got.double(), want, **TOL[dtype],
                                           msg=lambda m: f"{layout} {list(shape)} dim={dims}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ord", ORDS, ids=str)
def test_vector_norm_zeros_nan_inf(ord, device):
    """Exact zeros (powers of 0 for p < 0 and 0 < p < 1), NaN and infinity, as torch gives them."""
    x = torch.tensor([[0.0, 1.5, -2.0, 0.0], [0.0, 0.0, 0.0, 0.0], [float("nan"), 1.0, 0.0, 2.0],
                      [float("inf"), -1.0, 0.0, 3.0], [-float("inf"), 0.5, 2.0, 1.0]], device=device)
    for dims in (1, 0, None):
        torch.testing.assert_close(vector_norm(x, ord, dims), torch.linalg.vector_norm(x, ord, dims), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ord", ORDS + [2.5], ids=str)  # 2.5: |x|^(p-2) has no derivative at 0
def test_vector_norm_gradient_with_zeros(ord, device):
    """torch's subgradients where an element or a whole slice is 0 (0 where torch gives 0, never NaN); ord=0's
    gradient is 0 (torch's graph does not reach the input there). The double backward is torch's too, NaN where its
    formulas give NaN (a zero slice at order 2 and between 2 and 3, a zero element between 2 and 3), not a quiet 0."""
    x = torch.tensor([[0.0, 1.5, -2.0, 0.25], [0.0, 0.0, 0.0, 0.0], [3.0, -1.0, 0.5, 2.0]],
                     device=device, dtype=torch.float64)
    for dims in (1, 0, None):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        g = torch.randn_like(torch.linalg.vector_norm(x, ord, dims))
        w = torch.randn_like(x)
        grads = []
        for norm, t in ((torch.linalg.vector_norm, a), (vector_norm, b)):
            (first,) = torch.autograd.grad(norm(t, ord, dims), t, g, allow_unused=True, materialize_grads=True,
                                           create_graph=True)
            second = (torch.autograd.grad((first * w).sum(), t, allow_unused=True, materialize_grads=True)[0]
                      if first.requires_grad else torch.zeros_like(x))
            grads.append((first.detach(), second))
        (want, want_second), (got, got_second) = grads
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"dim={dims}: {m}")
        torch.testing.assert_close(got_second, want_second, equal_nan=True, msg=lambda m: f"dim={dims}, second: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_vector_norm_order_zero(device):
    """ord=0 counts the non-zeros; it has no gradient (None, as torch's: its graph does not reach the input) and a
    zero tangent (the contract suite's jvp test wants a non-zero tangent, so this order is checked here)."""
    x = torch.tensor([[0.0, 1.5, -2.0], [0.0, 0.0, 4.0]], device=device, dtype=torch.float64, requires_grad=True)
    assert vector_norm(x, 0, 1).tolist() == [2.0, 1.0]
    for dims in (None, 1, (0, 1)):
        assert torch.autograd.grad(vector_norm(x, 0, dims).sum(), x, allow_unused=True) == (None,)
        assert torch.autograd.grad(torch.linalg.vector_norm(x, 0, dims).sum(), x, allow_unused=True) == (None,)
    _, tangent = torch.func.jvp(lambda t: vector_norm(t, 0, 1), (x.detach(),), (torch.ones_like(x),))
    assert not tangent.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("ord", ORDS, ids=str)
def test_vector_norm_of_one_element(ord, dtype, device):
    """Over dims of size 1 (or a 0-dim tensor) each result is one element's norm: |x| exactly (order 0: x != 0), as
    torch's, where the root of |x|^p would overflow (float32 |x| > 1.8e19 at order 2) or round; its gradient
    torch's."""
    big = torch.finfo(dtype).max / 2
    values = torch.tensor([[-big, 3.0, 0.0, -1e-3 * big, float("inf"), float("nan"), -7.0]], dtype=dtype)
    for x, dims in [(values.to(device), 0), (values.to(device).t(), (1,)), (values.to(device).view(7, 1, 1), (1, 2)),
                    (values.to(device)[:, :1], None), (values.to(device)[0, 0], None), (values.to(device)[0, 1], 0)]:
        for keepdim in (False, True):
            got = vector_norm(x, ord, dims, keepdim)
            want = torch.linalg.vector_norm(x, ord, dims, keepdim)
            assert got.dtype == want.dtype and got.is_contiguous()
            # torch's 0-dim input with a dim computes the root of |x|^p (3.0 at order 0.5: 2.9999999999999996)
            torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"dim={dims}: {m}")
            exact = x.abs() if ord != 0 else (x != 0).to(x.dtype)
            torch.testing.assert_close(got, exact.reshape(got.shape), rtol=0, atol=0, equal_nan=True)
    x = torch.tensor([[-2.5, 0.0, 4.0]], device=device, dtype=torch.float64)
    if ord != 0:
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        g = torch.randn(3, device=device, dtype=torch.float64)
        (got,) = torch.autograd.grad(vector_norm(a, ord, 0), a, g)
        (want,) = torch.autograd.grad(torch.linalg.vector_norm(b, ord, 0), b, g)
        torch.testing.assert_close(got, want)
    assert torch.equal(vector_norm(x.float(), ord, 0, dtype=torch.float64), torch.linalg.vector_norm(x.float(), ord, 0,
                                                                                          dtype=torch.float64))
    assert vector_norm(torch.tensor([[3 + 4j]], device=device), ord, 1).tolist() == [1.0 if ord == 0 else 5.0]


@pytest.mark.parametrize("device", DEVICES)
def test_vector_norm_dtype_argument(device):
    x = random_tensor((6, 33), torch.float16, device)
    for dtype in (torch.float32, torch.float64):
        got = vector_norm(x, 2, 1, dtype=dtype)
        assert got.dtype == dtype
        torch.testing.assert_close(got, torch.linalg.vector_norm(x, 2, 1, dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_vector_norm_empty_with_identity(device):
    """Orders with an identity: an empty norm is 0 (the orders without one raise: the contract suite's
    error_inputs). Order NaN too: torch gives 0, where the power's formula gives 0 ** (1 / NaN), NaN."""
    empty = torch.empty(0, 3, device=device)
    for ord in (0, 1, 2, 0.5, 3, math.nan):
        for dims in (None, 0, 1):
            torch.testing.assert_close(vector_norm(empty, ord, dims), torch.linalg.vector_norm(empty, ord, dims))
        foreach = torch._foreach_norm if SELF_CHECK else torch_reduce.foreach_norm
        torch.testing.assert_close(foreach([empty, empty[:, :0]], ord), torch._foreach_norm([empty, empty[:, :0]], ord))


# ----------------------------------------------------------------------------------------------- prod ----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_prod_against_float64(dtype, device):
    for shape, dim in [((301,), None), ((3, 37), -1), ((5, 300), 1), ((300, 5), 0), ((7, 9, 11), 1),
                       ((7, 9, 11), None)]:
        for layout, x in layouts(shape, dtype, device):
            x = (1 + 0.05 * x.float()).to(dtype)  # about 1: the product of 300 stays in range
            for keepdim in (False, True):
                got = prod(x, dim, keepdim) if dim is not None else prod(x)
                want = x.double().prod(dim, keepdim) if dim is not None else x.double().prod()
                want = want.to(dtype).double()  # float16 overflows to inf as the reference rounded to it does
                assert got.dtype == dtype
                torch.testing.assert_close(got.double(), want, **TOL[dtype], msg=lambda m: f"{layout} {dim}: {m}")


@pytest.mark.skipif(SELF_CHECK, reason="torch's float32 prod is 1e-5 - 1e-4 off here")
@pytest.mark.parametrize("device", DEVICES)
def test_prod_float32_of_many_factors_near_one(device):
    """2^22 float32 factors 1 +- 0.001, on every kernel path (whole tensor, rows, columns, dims apart): the
    float64 accumulator gives the exact product rounded to float32, within one ulp. (A float32 tree drifted
    3.6e-3 here: its products of factors near 1 round down more often than up.)"""
    g = torch.Generator().manual_seed(0)
    x = (1 + 0.002 * (torch.rand(2**22, generator=g) - 0.5)).to(device)
    for what, got, want in [
        ("whole", prod(x), x.double().prod()),
        ("rows", prod(x.view(4, -1), 1), x.double().view(4, -1).prod(1)),
        ("columns", prod(x.view(-1, 4), 0), x.double().view(-1, 4).prod(0)),
        ("dims apart", prod(x.view(2**10, 4, 2**10), (0, 2)), x.double().view(2**10, 4, 2**10).prod(2).prod(0)),
    ]:
        assert got.dtype == torch.float32, what
        torch.testing.assert_close(got.double(), want, rtol=2**-23, atol=0, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_prod_integers_and_bool(dtype, device):
    """int64 results (exact, wrapping as torch's do), and dtype= casts the input first."""
    x = (random_tensor((4, 9), dtype, device) % 3) if dtype != torch.bool else random_tensor((4, 9), dtype, device)
    for dim in (None, 0, 1):
        got = prod(x) if dim is None else prod(x, dim)
        want = torch.prod(x) if dim is None else torch.prod(x, dim)
        assert got.dtype == want.dtype == torch.int64
        assert torch.equal(got, want)
    for out in (torch.int8, torch.float32, torch.int32):
        assert torch.equal(prod(x, 1, dtype=out), torch.prod(x, 1, dtype=out))
    big = torch.full((70,), 3, dtype=torch.int64, device=device)  # 3^70 wraps around int64
    assert torch.equal(prod(big), torch.prod(big))


@pytest.mark.parametrize("device", DEVICES)
def test_prod_zeros_nan_empty(device):
    x = torch.tensor([[0.0, 2.0, 3.0], [float("nan"), 0.0, 1.0], [float("inf"), 0.0, 1.0], [2.0, -1.0, 0.5]],
                     device=device)
    for dim in (0, 1):
        torch.testing.assert_close(prod(x, dim), torch.prod(x, dim), equal_nan=True)
    empty = torch.empty(0, 3, device=device)
    assert prod(empty).item() == 1.0
    assert prod(empty, 0).tolist() == [1.0, 1.0, 1.0]
    assert prod(empty, 1).shape == (0,)
    assert prod(torch.empty(0, dtype=torch.int32, device=device)).dtype == torch.int64


@pytest.mark.parametrize("device", DEVICES)
def test_prod_gradient_with_zeros(device):
    """torch's gradient with no zero, one zero and two zeros in a slice (the product of the others, exactly),
    and its double backward."""
    x = torch.tensor([[0.0, 2.0, 3.0, -1.5], [0.0, 0.0, 4.0, 1.0], [1.5, -2.0, 0.5, 3.0]],
                     device=device, dtype=torch.float64)
    for dim in (None, 0, 1):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        fa = (lambda t: torch.prod(t)) if dim is None else (lambda t: torch.prod(t, dim))
        fb = (lambda t: prod(t)) if dim is None else (lambda t: prod(t, dim))
        g = torch.randn_like(fa(x))
        (want,) = torch.autograd.grad(fa(a), a, g, create_graph=True)
        (got,) = torch.autograd.grad(fb(b), b, g, create_graph=True)
        torch.testing.assert_close(got, want, msg=lambda m: f"dim={dim}: {m}")
        w = torch.randn_like(x)
        torch.testing.assert_close(torch.autograd.grad((got * w).sum(), b)[0],
                                   torch.autograd.grad((want * w).sum(), a)[0], msg=lambda m: f"dim={dim}: {m}")
        torch.autograd.gradgradcheck(fb, (x.clone().requires_grad_(),))


@pytest.mark.skipif(SELF_CHECK, reason="torch.prod takes one dim")
@pytest.mark.skipif(SELF_CHECK, reason="torch's gradient is NaN at an infinite element")
@pytest.mark.parametrize("device", DEVICES)
def test_prod_gradient_at_infinity(device):
    """At an infinite element the gradient is the product of the others (README), with or without a zero elsewhere
    in the input; torch's divides the product by the element there (NaN) unless the input holds a zero."""
    x = torch.tensor([[2.0, INF, 3.0], [-1.5, 4.0, -INF], [INF, -INF, 0.5]], device=device, dtype=torch.float64)
    for rows in (x, torch.cat([x, torch.zeros(1, 3, device=device, dtype=torch.float64)])):
        leaf = rows.clone().requires_grad_()
        (got,) = torch.autograd.grad(prod(leaf, 1).sum(), leaf)
        want = torch.stack([torch.stack([torch.cat([r[:i], r[i + 1:]]).prod() for i in range(r.numel())])
                            for r in rows])
        torch.testing.assert_close(got, want, msg=lambda m: f"{rows.shape[0]} rows: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_prod_several_dims(device):
    """A tuple of dims (torch.prod takes one): the product over all of them, its gradient that of the
    flattened product."""
    x = (1 + 0.2 * torch.randn(3, 4, 5, device=device, dtype=torch.float64)).requires_grad_()
    got = torch_reduce.prod(x, (0, 2), keepdim=True)
    want = x.permute(1, 0, 2).reshape(4, 15).prod(1).reshape(1, 4, 1)
    torch.testing.assert_close(got, want)
    torch.autograd.gradcheck(lambda t: torch_reduce.prod(t, (2, 0)), (x,))
    torch.autograd.gradgradcheck(lambda t: torch_reduce.prod(t, (2, 0)), (x,))
    _, tangent = torch.func.jvp(lambda t: torch_reduce.prod(t, (0, 2)), (x.detach(),), (torch.ones_like(x),))
    _, want_tangent = torch.func.jvp(lambda t: t.permute(1, 0, 2).reshape(4, 15).prod(1), (x.detach(),),
                                     (torch.ones_like(x),))
    torch.testing.assert_close(tangent, want_tangent)


@pytest.mark.parametrize("device", DEVICES)
def test_prod_and_norm_cpu_autocast_policy(device):
    """torch's autocast lists: on the CPU prod runs in float32 (fp32), vector_norm as called; on CUDA both
    reduce to float32 unless dtype= is given (fp32_set_opt_dtype)."""
    x = random_tensor((4, 8), torch.bfloat16, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        assert prod(x, 1).dtype == torch.prod(x, 1).dtype
        assert vector_norm(x, 2, 1).dtype == torch.linalg.vector_norm(x, 2, 1).dtype
        assert vector_norm(x, 2, 1, dtype=torch.float64).dtype == torch.float64
