"""PyTorch's own OpInfo samples (torch.testing._internal's op_db) for var_mean, sum, mean, amax, amin, prod,
linalg.vector_norm, layer_norm and rms_norm: ours, called with exactly a sample's input, args and kwargs, gives
torch's result (values, dtype, shape), but for the two kinds of norm samples we refuse (README: a negative eps, a
complex RMSNorm); and their error inputs raise torch's type of error.

No sample is skipped: op_db's sample_inputs never pass out= (OpInfo's test_out builds those from
supports_out, and out= is outside the spec), and every dtype OpInfo lists for the op is run among float32,
float64, bfloat16 and complex64. Each sample runs as given and in its noncontiguous() form, as OpInfo's
test_noncontiguous_samples does.
"""
import functools

import pytest
import torch

pytest.importorskip("expecttest")  # torch.testing._internal imports it
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import torch_reduce  # noqa: E402
from conftest import DEVICES  # noqa: E402
from op_specs import SELF_CHECK, describe  # noqa: E402
from test_op_contract import TOL, assert_same  # noqa: E402

NAMES = ("var_mean", "sum", "mean", "amax", "amin", "prod", "linalg.vector_norm", "nn.functional.layer_norm",
         "nn.functional.rms_norm")
OPINFOS = [op for op in op_db if op.name in NAMES]
assert {op.name for op in OPINFOS} == set(NAMES)
pytestmark = [pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom"),
              pytest.mark.filterwarnings("ignore:Casting complex values to real")]  # torch's own, in a reference call


def ours(name):
    if SELF_CHECK:
        return functools.reduce(getattr, name.split("."), torch)
    return getattr(torch_reduce, name.split(".")[-1])  # linalg.vector_norm is torch_reduce.vector_norm, and so on


def opinfo_id(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def refusal(opinfo, dtype, kwargs):
    """The words of our error where we refuse a call torch takes (README): a complex RMSNorm, a negative eps."""
    if SELF_CHECK:
        return None
    if opinfo.name == "nn.functional.rms_norm" and dtype.is_complex:
        return "expected a float32, float64, float16 or bfloat16 input"
    return "eps must be non-negative" if kwargs.get("eps", 0) < 0 else None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.complex64], ids=str)
@pytest.mark.parametrize("opinfo", OPINFOS, ids=opinfo_id)
def test_opinfo_samples(opinfo, dtype, device):
    if dtype not in opinfo.supported_dtypes(device):
        pytest.skip(f"OpInfo does not list {dtype} for {opinfo_id(opinfo)} on {device}")
    tol = TOL[torch.float32 if dtype == torch.complex64 else dtype]
    failures = []
    for sample in opinfo.sample_inputs(device, dtype):
        for s in (sample, sample.noncontiguous()):
            call = describe((s.input, *s.args), s.kwargs)
            want = opinfo.op(s.input, *s.args, **s.kwargs)
            refused = refusal(opinfo, dtype, s.kwargs)
            if refused:
                with pytest.raises(RuntimeError, match=refused):
                    ours(opinfo.name)(s.input, *s.args, **s.kwargs)
                continue
            try:
                got = ours(opinfo.name)(s.input, *s.args, **s.kwargs)
                assert_same(tuple(got) if isinstance(got, tuple) else got,
                            tuple(want) if isinstance(want, tuple) else want, call, **tol)
            except Exception as error:  # noqa: BLE001  (collected: every failing sample is listed)
                failures.append(f"{opinfo.name}({call}): {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    assert not failures, f"{len(failures)} sample(s) failed:\n" + "\n".join(failures)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opinfo", [op for op in OPINFOS if op.error_inputs_func is not None], ids=opinfo_id)
def test_opinfo_error_inputs(opinfo, device):
    """Each of OpInfo's error inputs raises torch's type of error (the words may be ours)."""
    for error in opinfo.error_inputs(device):
        s = error.sample_input
        with pytest.raises(error.error_type):
            ours(opinfo.name)(s.input, *s.args, **s.kwargs)


# torch.var_mean's three signatures: (dim, *, correction, keepdim), (dim, unbiased, keepdim), (unbiased).
VAR_MEAN_CALLS = [
    ((), {}),
    ((1, True), {}),
    ((1, False), {}),
    ((1, True, True), {}),
    (((0, 2), False, True), {}),
    ((False,), {}),  # unbiased=False over every dim, not dim=0
    ((True,), {}),
    ((), {"unbiased": False}),
    ((1,), {"unbiased": False, "keepdim": True}),
    ((), {"dim": -1, "unbiased": True, "keepdim": True}),
    ((1,), {"correction": 0.5}),
    ((1,), {"correction": 2.0}),
    ((None,), {"correction": None}),
    ((), {"correction": 0, "keepdim": True}),
    (([0, 2],), {"correction": 2, "keepdim": True}),
    ((None,), {"correction": -1}),
    ((-1,), {"keepdim": True}),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args,kwargs", VAR_MEAN_CALLS, ids=[describe(a, k) or "x" for a, k in VAR_MEAN_CALLS])
def test_var_mean_signatures(args, kwargs, device):
    x = torch.randn(4, 5, 3, device=device, dtype=torch.float64)
    want = torch.var_mean(x, *args, **kwargs)
    got = ours("var_mean")(x, *args, **kwargs)
    assert_same(tuple(got), tuple(want), f"var_mean(x, {describe(args, kwargs)})")
