"""The drop-ins' C entry points (csrc/fast_call.cpp): the common call is parsed in C and goes straight to the op;
every other call reaches the Python wrapper (torch_reduce/reductions.py, functional.py) with its arguments as
given.
Checked: which calls take which path, that both give the wrapper's results and errors, references (no leaks),
threads, torch.compile, and the entry points' signatures."""
import gc
import inspect
import math
import sys
import threading
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import torch_reduce
from torch_reduce import _entry_points, functional, grad_norm, reductions
from conftest import DEVICES

WRAPPERS = {**reductions._WRAPPERS, **functional._WRAPPERS, **grad_norm._WRAPPERS}
NAMES = list(WRAPPERS)


@pytest.fixture
def wrapper_calls():
    """Counts the calls that reach each Python wrapper, for the duration of a test."""
    calls = {name: 0 for name in NAMES}

    def counting(name, wrapper):
        def counted(*args, **kwargs):
            calls[name] += 1
            return wrapper(*args, **kwargs)
        return counted

    def setup(table):
        for name, w in table.items():  # each counting wrapper under its original's name and docstring
            w.__name__, w.__doc__, w.__wrapped__ = name, WRAPPERS[name].__doc__, WRAPPERS[name]
        _entry_points.setup(table)

    setup({name: counting(name, w) for name, w in WRAPPERS.items()})
    yield calls
    _entry_points.setup(WRAPPERS)


def common_calls(x):
    """(name, args, kwargs) the entry points take themselves."""
    w, b = torch.randn(5, device=x.device), torch.randn(5, device=x.device)
    yield "layer_norm", (x, (5,)), {}
    yield "layer_norm", (x, [4, 5], torch.randn(4, 5, device=x.device), None), {}
    yield "layer_norm", (x, x.shape[-1:]), {"weight": w, "bias": b, "eps": 1e-3}
    yield "rms_norm", (x, 5), {}
    yield "rms_norm", (x, (5,), w, 1e-6), {}
    yield "rms_norm", (x, [5]), {"eps": None, "weight": torch.nn.Parameter(w)}
    r = torch.randn_like(x)
    yield "add_layer_norm", (x, r, (5,), w, b), {}
    yield "add_layer_norm", (x, r, [4, 5]), {"eps": 0.5}
    yield "add_rms_norm", (x, r, 5, w), {}
    yield "add_rms_norm", (x, r), {"normalized_shape": (5,), "weight": None, "eps": 1e-4}
    yield "var_mean", (x,), {}
    yield "var_mean", (x, 1), {"keepdim": True}
    yield "var_mean", (x, (0, 2)), {"correction": 0}
    yield "var_mean", (x, [1]), {"correction": 0.5, "keepdim": False}
    yield "var_mean", (x, None), {"correction": None}
    yield "sum", (x,), {}
    yield "sum", (x, 1), {}
    yield "sum", (x, -1, True), {}
    yield "sum", (x, (0, 2)), {"keepdim": False}
    yield "sum", (x,), {"dim": [0, 1], "keepdim": True, "dtype": None, "out": None}
    yield "mean", (x, ()), {}
    yield "mean", (x, None, True), {}
    yield "prod", (x, 2), {}
    yield "amax", (x,), {}
    yield "amax", (x, None), {}
    yield "amin", (x, [1, 2], True), {}
    yield "vector_norm", (x,), {}
    yield "vector_norm", (x, 1), {"dim": 0}
    yield "vector_norm", (x, math.inf, (1, 2), True), {}
    yield "vector_norm", (x,), {"ord": 0.5, "dim": -1, "keepdim": False}


def wrapper_calls_of(x, out):
    """(name, args, kwargs) left to the wrapper."""
    yield "sum", (x, 1), {"dtype": torch.float64}
    yield "mean", (x, 1), {"out": out}
    yield "sum", (x, 1.0), {}                      # a float dim: the wrapper's (torch's) TypeError
    yield "sum", (x, True), {}                     # bool is not a dim
    yield "sum", (x, 1, 1), {}                     # keepdim must be a bool
    yield "sum", (), {"input": x}                  # the input by keyword
    yield "sum", (x, 5), {}                        # out of range: raised by the op, reported by the wrapper
    yield "amax", (x, 1), {"dim": 1}               # given twice
    yield "amax", (x, 1, False, None), {}          # too many positional arguments
    yield "vector_norm", (x, "fro"), {}
    yield "vector_norm", (x, torch.tensor(2.0)), {}
    yield "sum", (x.as_subclass(Logged), 1), {}
    w = torch.randn(5, device=x.device)
    yield "layer_norm", (x, (5,), w.as_subclass(Logged)), {}
    yield "layer_norm", (x, (6,)), {}                   # a shape the input does not end with: the op's error
    yield "layer_norm", (x, 5.0), {}
    yield "layer_norm", (), {"input": x, "normalized_shape": (5,)}
    yield "rms_norm", (x, (5,), w), {"eps": torch.tensor(1e-5)}
    yield "rms_norm", (x, (5,), None, 1e-5, 1), {}      # too many arguments
    yield "add_rms_norm", (x, x[:, :2], (5,)), {}        # shapes differ: the op's error
    yield "add_layer_norm", (x, x.as_subclass(Logged), (5,)), {}
    yield "var_mean", (x, False), {}                     # torch's var_mean(input, unbiased)
    yield "var_mean", (x, 1, True), {}                   # unbiased, positional
    yield "var_mean", (x, 1), {"unbiased": False, "keepdim": True}
    yield "var_mean", (x, 1), {"unbiased": True, "correction": 0}  # both: the wrapper's TypeError
    yield "var_mean", (x, 1), {"correction": True}
    yield "amax", (x, 1), {"dtype": None}                # amax has no dtype=: the wrapper's TypeError
    yield "sum", (x, OtherDims((0, 1))), {}              # a tuple subclass, read as it iterates
    strided_nested = torch.nested.nested_tensor([torch.randn(2, 5), torch.randn(3, 5)], device=x.device)
    yield "add_layer_norm", (strided_nested, strided_nested, (5,)), {}  # nested: sizes() throws (was an abort)
    yield "add_rms_norm", (x[0], strided_nested, (5,)), {}


class OtherDims(tuple):
    def __iter__(self):
        return iter((2,))


class Logged(torch.Tensor):
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def outcome(fn, args, kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001  (compared below)
        return type(error), str(error).splitlines()[0]


def same(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and a and isinstance(a[0], torch.Tensor):
        return len(a) == len(b) and all(same(p, q) for p, q in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("device", DEVICES)
def test_common_calls_skip_the_wrapper(device, wrapper_calls):
    x = torch.randn(3, 4, 5, device=device)
    for name, args, kwargs in common_calls(x):
        got = getattr(torch_reduce, name)(*args, **kwargs)
        want = WRAPPERS[name](*args, **kwargs)
        assert same(got, want), (name, args, kwargs)
    assert sum(wrapper_calls.values()) == 0, wrapper_calls
    p = torch.nn.Parameter(x.clone())
    torch_reduce.sum(p, 1).sum().backward()
    assert sum(wrapper_calls.values()) == 0 and torch.equal(p.grad, torch.ones_like(x))


@pytest.mark.parametrize("device", DEVICES)
def test_other_calls_reach_the_wrapper(device, wrapper_calls):
    x = torch.randn(3, 4, 5, device=device)
    out = torch.empty(0, device=device)
    cases = list(wrapper_calls_of(x, out))
    for name, args, kwargs in cases:
        got = outcome(getattr(torch_reduce, name), args, kwargs)
        want = outcome(WRAPPERS[name], args, kwargs)
        assert same(got, want), (name, args, kwargs, got, want)
    assert sum(wrapper_calls.values()) == len(cases)  # each once, from the entry point (the second call is direct)
    assert Logged.seen, "the subclass's __torch_function__ was not called"


def test_torch_function_mode_sees_the_call(wrapper_calls):
    seen = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 5)
    with Mode():
        got = torch_reduce.sum(x, 1)
        torch_reduce.clip_grad_norm_(parameters_with_grads("cpu", 0), 1.0)
    torch.testing.assert_close(got, x.sum(1))
    assert wrapper_calls["sum"] == 1 and wrapper_calls["clip_grad_norm_"] == 1
    assert torch.ops.reduce.sum in seen and torch.ops.reduce.clip_grad_norm_ in seen


def test_torch_dispatch_modes_see_the_op(wrapper_calls):
    """The entry points release the GIL around the op; a dispatch mode (Python, below the dispatcher) takes it back."""
    seen = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 6)
    with Mode():
        torch_reduce.sum(x, 1)
        torch_reduce.add_rms_norm(x, x, 6)
    assert seen == [torch.ops.reduce.sum.default, torch.ops.reduce.add_rms_norm_fwd.default]
    assert sum(wrapper_calls.values()) == 0


def parameters_with_grads(device, seed):
    """Leaf parameters of several shapes and dtypes, one without a gradient; the same values for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (17,), (2, 3, 5), (1,), (6,)]
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator).to(device)) for shape in shapes]
    for p in params[:-1]:
        p.grad = torch.randn(p.shape, generator=generator).to(device)
    return params


def clip_calls():
    """(make the parameters' container, args after it, kwargs): clip_grad_norm_ calls the entry point takes."""
    yield list, (0.5,), {}
    yield tuple, (0.5, 1), {}
    yield iter, (2,), {"norm_type": math.inf}
    yield (lambda ps: (p for p in ps)), (0.25,), {"foreach": False}
    yield list, (), {"max_norm": 3.0, "norm_type": 2.0, "error_if_nonfinite": False, "foreach": None}


def clip_wrapper_calls(device):
    """(make, args, kwargs) of clip_grad_norm_ calls left to the wrapper."""
    yield (lambda ps: ps[0]), (0.5,), {}                                    # one tensor
    yield (lambda ps: (p for p in ps)), (0.5,), {"error_if_nonfinite": True}  # a generator, read before
    yield list, (0.5,), {"foreach": True}
    yield (lambda ps: [p.detach().requires_grad_() for p in ps]), (0.5,), {}  # no gradients
    yield list, (torch.tensor(0.5, device=device),), {}                     # a tensor max_norm
    yield (lambda ps: [p.as_subclass(Logged) for p in ps]), (0.5,), {}


def clip_outcome(fn, make, args, kwargs, device, seed):
    params = parameters_with_grads(device, seed)
    try:
        total = fn(make(params), *args, **kwargs)
    except Exception as error:  # noqa: BLE001  (compared below)
        return type(error), str(error).splitlines()[0]
    return total, [p.grad for p in params]


def assert_same_clip(got, want):
    if isinstance(want[0], type):
        assert got == want
        return
    torch.testing.assert_close(got[0], want[0])
    assert len(got[1]) == len(want[1])
    for g, w in zip(got[1], want[1]):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("device", DEVICES)
def test_clip_grad_norm_entry_point(device, wrapper_calls):
    """The common calls skip the wrapper; the others reach it, a generator already read as a list; both give
    torch.nn.utils.clip_grad_norm_'s total and gradients."""
    for seed, (make, args, kwargs) in enumerate(clip_calls()):
        got = clip_outcome(torch_reduce.clip_grad_norm_, make, args, kwargs, device, seed)
        want = clip_outcome(torch.nn.utils.clip_grad_norm_, make, args, kwargs, device, seed)
        assert_same_clip(got, want)
    assert wrapper_calls["clip_grad_norm_"] == 0
    cases = list(clip_wrapper_calls(device))
    for seed, (make, args, kwargs) in enumerate(cases):
        got = clip_outcome(torch_reduce.clip_grad_norm_, make, args, kwargs, device, seed)
        want = clip_outcome(torch.nn.utils.clip_grad_norm_, make, args, kwargs, device, seed)
        assert_same_clip(got, want)
    assert wrapper_calls["clip_grad_norm_"] == len(cases)


def test_clip_grad_norm_entry_point_errors(wrapper_calls):
    """Errors are the wrapper's (or Python's), whichever path raised them."""
    params = parameters_with_grads("cpu", 0)
    with pytest.raises(TypeError, match="not iterable"):
        torch_reduce.clip_grad_norm_(3, 1.0)
    with pytest.raises(TypeError):
        torch_reduce.clip_grad_norm_(params)  # max_norm missing
    with pytest.raises(TypeError):
        torch_reduce.clip_grad_norm_(params, 1.0, max_norm=1.0)  # given twice
    with pytest.raises(RuntimeError, match="non-finite"):
        params[0].grad[0, 0] = math.nan
        torch_reduce.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)

    def broken():
        yield params[0]
        raise ValueError("broken iterable")

    with pytest.raises(ValueError, match="broken iterable"):
        torch_reduce.clip_grad_norm_(broken(), 1.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert torch_reduce.clip_grad_norm_((p for p in []), 1.0).item() == 0
    assert any("empty generator" in str(w.message) for w in seen)


def test_warnings_are_pythons(wrapper_calls):
    """An op's warning on the fast path: the result returned, the warning a Python UserWarning (torch.ops would send
    it to c10's log), the call not run again; a filter set to "error" raises it."""
    x = torch.randn(3, 1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        var, mean = torch_reduce.var_mean(x, 1)
    assert [w.category for w in seen] == [UserWarning] and "degrees of freedom" in str(seen[0].message)
    assert torch.equal(mean, x[:, 0]) and bool(var.isnan().all())
    assert wrapper_calls["var_mean"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="degrees of freedom"):
            torch_reduce.var_mean(x, 1)


def test_clip_grad_norm_non_leaf_takes_the_wrapper(wrapper_calls):
    """A non-leaf tensor's .grad warns (torch's UserWarning) and is None: the wrapper's call, not ours."""
    leaf = torch.nn.Parameter(torch.randn(4))
    leaf.grad = torch.ones(4)
    non_leaf = leaf * 2
    with pytest.warns(UserWarning, match="not a leaf"):
        total = torch_reduce.clip_grad_norm_([leaf, non_leaf], 10.0)
    assert total.item() == 2.0 and wrapper_calls["clip_grad_norm_"] == 1


@pytest.mark.parametrize("device", DEVICES)
def test_clip_grad_norm_views_and_tensors_without_autograd_metadata(device, wrapper_calls):
    """The entry point reads a gradient from autograd's metadata, and asks autograd for a view's: a leaf view, a
    view whose base came to require grad after it was taken, a tensor that never had metadata (no grad) and a
    parameter all take the C path and give torch's total and gradients."""

    def make():
        base = torch.randn(8, device=device)
        leaf_view = base[:4].requires_grad_()
        leaf_view.grad = torch.randn(4, device=device)
        later = torch.randn(8, device=device)
        late_view = later[2:6]
        later.requires_grad_()
        late_view.grad = torch.randn(4, device=device)
        parameter = torch.nn.Parameter(torch.randn(3, 5, device=device))
        parameter.grad = torch.randn(3, 5, device=device)
        return [leaf_view, late_view, torch.randn(3, device=device), parameter]

    torch.manual_seed(0)
    ours = make()
    torch.manual_seed(0)
    theirs = make()
    got = torch_reduce.clip_grad_norm_(ours, 0.5)
    want = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(got, want)
    for p, q in zip(ours, theirs):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad)
    assert wrapper_calls["clip_grad_norm_"] == 0


def test_no_reference_leaks():
    x = torch.randn(8, 9)
    dims = (0, 1)
    calls = [lambda: torch_reduce.sum(x, dims), lambda: torch_reduce.amax(x, dims, True),
             lambda: torch_reduce.sum(x, dims, dtype=torch.float64), lambda: outcome(torch_reduce.sum, (x, 7), {})]
    for call in calls:
        call()
    gc.collect()
    before = sys.getrefcount(x), sys.getrefcount(dims)
    for _ in range(100):
        for call in calls:
            call()
    gc.collect()
    assert (sys.getrefcount(x), sys.getrefcount(dims)) == before


def test_clip_grad_norm_no_reference_leaks():
    params = parameters_with_grads("cpu", 0)
    grads = [p.grad for p in params]
    calls = [lambda: torch_reduce.clip_grad_norm_(params, 1e6), lambda: torch_reduce.clip_grad_norm_(iter(params), 1e6),
             lambda: torch_reduce.clip_grad_norm_(params, 1e6, foreach=True)]
    for call in calls:
        call()
    gc.collect()
    before = [sys.getrefcount(o) for o in (params, *params, *grads)]
    for _ in range(100):
        for call in calls:
            call()
    gc.collect()
    assert [sys.getrefcount(o) for o in (params, *params, *grads)] == before


def test_threads():
    x = torch.randn(64, 257)
    want = torch_reduce.sum(x, 1)
    errors = []

    def work():
        for _ in range(200):
            if not torch.equal(torch_reduce.sum(x, 1), want):
                errors.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


COMPILE_ARGS = {"vector_norm": lambda t: (t, 2, 1), "var_mean": lambda t: (t, 1, False), "layer_norm": lambda t: (t, (7,)), "rms_norm": lambda t: (t, (7,)),
                "add_layer_norm": lambda t: (t, t * 2, (7,)), "add_rms_norm": lambda t: (t, t * 2, (7,))}


@pytest.mark.parametrize("name", [name for name in NAMES if name != "clip_grad_norm_"])
def test_compile_traces_the_wrapper(name):
    x = torch.randn(6, 7)
    fn, args = getattr(torch_reduce, name), COMPILE_ARGS.get(name, lambda t: (t, 1))
    torch.compiler.reset()  # one lambda's code for every entry point: past dynamo's recompile limit otherwise
    compiled = torch.compile(lambda t: fn(*args(t)), fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(*args(x)))


def test_compile_traces_clip_grad_norm_():
    """The compiled clip (fullgraph) of parameters whose gradients' norm is above max_norm: the norm and every
    clipped gradient as torch's."""
    grads = [torch.randn(6, 7) * 3, torch.randn(5)]

    def parameters():
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        return params

    ours, theirs = parameters(), parameters()
    torch.compiler.reset()
    total = torch.compile(lambda params: torch_reduce.clip_grad_norm_(params, 1.0), fullgraph=True)(ours)
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert want > 2  # the gradients were scaled
    torch.testing.assert_close(total, want)
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("name", NAMES)
def test_signature_and_doc(name):
    entry, wrapper = getattr(torch_reduce, name), WRAPPERS[name]
    assert wrapper.__doc__ in entry.__doc__
    names = list(inspect.signature(wrapper).parameters)
    if entry.__text_signature__ is None:  # a sentinel default (var_mean's): the signature is the doc's first line
        first = entry.__doc__.splitlines()[0]
        assert first.startswith(f"{name}(") and all(n in first for n in names), first
        return
    assert list(inspect.signature(entry).parameters) == names
