"""Jagged nested tensors in the ops (torch_reduce/nested.py). A jagged tensor means its sequences, so each result
is checked against torch's op on each sequence (a slice of the values) in float64: every reduction over every kind
of dim set, the row norms and the fused adds; their gradients and double backward through the same sequences;
torch.compile, meta tensors, autocast, a converted model, torch's own jagged results where torch has them, and
the errors."""
import pytest
import torch
import torch.nn.functional as F

import torch_reduce
from conftest import DEVICES

LENGTHS = (3, 1, 0, 6)  # sequences of (length, 3, 4); an empty one among them
# packed: (B, j, 3, 4); transposed: (B, 3, j, 4), as attention's heads make it (its values are a strided view);
# holes: a view of a padded tensor (lengths given: the values hold elements no sequence has).
LAYOUTS = ["packed", "transposed", "holes"]
REDUCTIONS = ["sum", "mean", "amax", "amin", "prod", "vector_norm", "var_mean"]
PADDED = ("sum", "mean", "amax", "amin", "prod")  # over the ragged dim without the batch dim, as torch's jagged ops


def jagged(layout, dtype, device, requires_grad=False, like=None):
    """(a jagged tensor, the jagged leaf its gradients reach, its sequences as slices of that leaf's values); with
    like=, one of like's structure (its offsets and nested int: a residual). The leaf is jagged: torch's jagged
    tensors have no double backward from a dense leaf through nested_tensor_from_jagged."""
    if layout == "holes":  # rows of 7, the sequences starting at 1, 0, 4 and 1
        base = torch.randn(len(LENGTHS), 7, 3, 4, dtype=torch.float64, device=device).to(dtype)
        if like is None:
            leaf = torch.nested.narrow(base, 1, torch.tensor([1, 0, 4, 1], device=device),
                                       torch.tensor(LENGTHS, device=device), layout=torch.jagged)
        else:
            leaf = torch.nested.nested_tensor_from_jagged(base.flatten(0, 1), like.offsets(), like.lengths())
    else:
        offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], device=device) if like is None else \
            like.offsets()
        values = torch.randn(sum(LENGTHS), 3, 4, dtype=torch.float64, device=device).to(dtype)
        leaf = torch.nested.nested_tensor_from_jagged(values, offsets)
    leaf = leaf.detach().requires_grad_(requires_grad)
    if layout == "transposed":
        return leaf.transpose(1, 2), leaf, [s.transpose(0, 1) for s in sequences_of(leaf)]
    return leaf, leaf, sequences_of(leaf)


def dims_of(kind, x):
    """A dim set of each kind, by x's dims (the batch dim is 0; the ragged dim is 1, or 2 when transposed)."""
    ragged = x._ragged_idx
    inner = [d for d in range(1, x.dim()) if d != ragged]
    return {"one inner": [inner[-1]], "two inner": inner, "batch and ragged": [0, ragged],
            "batch, ragged, inner": [0, ragged, inner[0]], "every dim": None, "ragged alone": [ragged],
            "ragged and inner": sorted([ragged, inner[-1]])}[kind]


DIM_KINDS = ["one inner", "two inner", "batch and ragged", "batch, ragged, inner", "every dim", "ragged alone",
             "ragged and inner"]
PER_SEQUENCE = ("ragged alone", "ragged and inner")  # dense results, one a sequence


def call(name, x, dims, keepdim):
    if name == "var_mean":
        return torch_reduce.var_mean(x, dims, keepdim=keepdim)
    if name == "vector_norm":
        return torch_reduce.vector_norm(x, 3, dims, keepdim)
    if name in ("amax", "amin") and dims is None:
        dims = ()  # their "every dim"
    return getattr(torch_reduce, name)(x, dims, keepdim)


def on_dense(name, t, dims, keepdim):
    """torch's reduction of a dense tensor; over an empty dim, what torch's jagged ops give for an empty sequence."""
    if name == "var_mean":
        return torch.var_mean(t, dims, keepdim=keepdim)
    if name == "vector_norm":
        return torch.linalg.vector_norm(t, 3, dims, keepdim)
    if name in ("amax", "amin") and any(t.shape[d] == 0 for d in dims):
        info = torch.finfo(t.dtype)
        shape = [1 if d in dims else n for d, n in enumerate(t.shape) if keepdim or d not in dims]
        return torch.full(shape, info.min if name == "amax" else info.max, dtype=t.dtype, device=t.device)
    if name == "prod":
        for d in sorted(dims, reverse=True):
            t = t.prod(d, keepdim=keepdim)
        return t
    return getattr(torch, name)(t, dims, keepdim)


def reference(name, x, sequences, dims, keepdim):
    """The reduction of x from its sequences (each (.., length, ..): x's dims but the batch dim, so d - 1)."""
    ragged = x._ragged_idx
    inner = sorted({ragged - 1 if d == 0 else d - 1 for d in (range(x.dim()) if dims is None else dims)})
    if dims is None or 0 in dims:  # every element of every sequence
        out = on_dense(name, torch.cat(sequences, ragged - 1), inner, keepdim)
        return tuple(o.unsqueeze(0) for o in out) if isinstance(out, tuple) and keepdim else \
            out.unsqueeze(0) if keepdim else out
    each = [on_dense(name, s, inner, keepdim) for s in sequences]
    if ragged in dims:  # one result per sequence, dense
        return tuple(torch.stack(parts) for parts in zip(*each)) if name == "var_mean" else torch.stack(each)
    return tuple(list(parts) for parts in zip(*each)) if name == "var_mean" else each


def flat(result):
    """A result as a list of dense tensors: a jagged one as its sequences, slices of its values (differentiable to
    any order, which unbind is not: its double backward needs ops torch's jagged tensors lack)."""
    parts = result if isinstance(result, (tuple, list)) else [result]
    return [s for p in parts for s in (sequences_of(p) if p.is_nested else [p])]


def sequences_of(x):
    values, offsets = x.values(), x.offsets().tolist()
    lengths = x.lengths().tolist() if x.lengths() is not None else [b - a for a, b in zip(offsets, offsets[1:])]
    return [values.narrow(x._ragged_idx - 1, start, n) for start, n in zip(offsets, lengths)]


def flat_reference(result):
    parts = result if isinstance(result, tuple) else [result]
    return [s for p in parts for s in (p if isinstance(p, list) else [p])]


def gradients(outputs, inputs, cotangents):
    """The gradient of sum(output * cotangent) for each input, with its graph (for double backward)."""
    loss = sum((o * c).sum() for o, c in zip(outputs, cotangents))
    return torch.autograd.grad(loss, inputs, create_graph=True)


def check_gradients(got, want, inputs):
    """First and second order: the gradients of ours and of the reference through the same sequences agree."""
    cotangents = [torch.randn_like(w) for w in want]
    ours, theirs = gradients(got, inputs, cotangents), gradients(want, inputs, cotangents)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.values() if a.is_nested else a, b.values() if b.is_nested else b)
    second = [torch.randn_like(a.values() if a.is_nested else a) for a in ours]
    for a, b in zip(second_order(ours, second, inputs), second_order(theirs, second, inputs)):
        torch.testing.assert_close(a, b)


def second_order(grads, cotangents, inputs):
    """The gradients of sum(grad * cotangent) (zeros where the gradient is constant, as a sum's), as dense tensors."""
    loss = sum(((g.values() if g.is_nested else g) * c).sum() for g, c in zip(grads, cotangents))
    if not loss.requires_grad:
        return [torch.zeros_like(i.values() if i.is_nested else i) for i in inputs]
    return [g.values() if g.is_nested else g
            for g in torch.autograd.grad(loss, inputs, retain_graph=True, allow_unused=True, materialize_grads=True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", DIM_KINDS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_are_the_sequences(device, layout, kind, name):
    x, source, sequences = jagged(layout, torch.float64, device, requires_grad=True)
    dims = dims_of(kind, x)
    reaches_ragged = dims is None or x._ragged_idx in dims
    for keepdim in (False, True):
        if reaches_ragged and layout == "holes":
            with pytest.raises(RuntimeError, match="ragged dim of a jagged tensor with holes"):
                call(name, x, dims, keepdim)
            continue
        if kind in PER_SEQUENCE and name not in PADDED:
            with pytest.raises(RuntimeError, match="ragged dim of a jagged tensor without its batch dim is supported"):
                call(name, x, dims, keepdim)
            continue
        got = call(name, x, dims, keepdim)
        want = reference(name, x, sequences, dims, keepdim)
        for result in (got if isinstance(got, tuple) else [got]):
            assert result.is_nested == (not reaches_ragged)
            if result.is_nested:  # the input's structure: its offsets and nested int
                assert result.offsets() is x.offsets() and result.shape[0] == x.shape[0]
        got, want = flat(got), flat_reference(want)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w, equal_nan=True)
        if name not in ("amax", "amin") or kind not in PER_SEQUENCE:  # an empty sequence's max is no function of x
            check_gradients(got, want, [source])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", REDUCTIONS + ["layer_norm", "rms_norm"])
def test_double_backward_through_torchs_jagged_ops(device, name):
    """A loss that is not linear in a jagged result (torch's jagged sin of it first): the first backward runs through
    torch's jagged ops into ours, recording its graph, and the second back through ours (torch's own backward of a
    view of values differentiates once on jagged tensors)."""
    x, source, sequences = jagged("packed", torch.float64, device, requires_grad=True)
    if name in ("layer_norm", "rms_norm"):
        got, want = getattr(torch_reduce, name)(x, [4]), [getattr(F, name)(s, [4]) for s in sequences]
    else:
        got, want = call(name, x, [x.dim() - 1], False), reference(name, x, sequences, [x.dim() - 1], False)
        if name == "var_mean":
            got, want = got[0], want[0]
    check_gradients(flat(got.sin()), [w.sin() for w in want], [source])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
@pytest.mark.parametrize("name", PADDED)
def test_over_the_ragged_dim_like_torch(device, dtype, name):
    """torch's own jagged sum, mean, amax, amin and prod over the sequences, empty ones included: the same dtype and
    shape, the same values (floating sums and products: to rounding)."""
    make = (lambda n: torch.randn(n, 5, device=device).to(dtype)) if dtype.is_floating_point else \
        (lambda n: torch.randint(-9, 9, (n, 5), device=device).to(dtype))
    x = torch.nested.as_nested_tensor([make(n) for n in LENGTHS], layout=torch.jagged)
    if name == "mean" and not dtype.is_floating_point:
        # torch's jagged mean of integers or bools over the ragged dim gives float32 (torch 2.14); its dense mean
        # refuses them, and so does ours, jagged or not (README, "Jagged nested tensors").
        with pytest.raises(RuntimeError, match="^mean\\(\\): could not infer output dtype"):
            torch_reduce.mean(x, 1)
        return
    for keepdim in (False, True):
        got, want = getattr(torch_reduce, name)(x, 1, keepdim), getattr(torch, name)(x, 1, keepdim)
        if device == "cuda" and dtype == torch.bool and name == "amax":
            # torch's own CUDA jagged amax of bool is True everywhere (H200, torch 2.11); each sequence's any()
            want = torch.stack([s.any(0) for s in x.unbind()])
            want = want.unsqueeze(1) if keepdim else want
        assert got.dtype == want.dtype and got.shape == want.shape
        exact = not dtype.is_floating_point or name in ("amax", "amin")  # else: rounding, in another order
        torch.testing.assert_close(got, want, equal_nan=True, **({"atol": 0, "rtol": 0} if exact else {}))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_row_norms_are_the_sequences(device, layout, name):
    x, source, sequences = jagged(layout, torch.float64, device, requires_grad=True)
    residual, residual_source, residual_sequences = jagged(layout, torch.float64, device, True, like=x)
    assert residual.shape == x.shape  # the same nested int
    weight = torch.randn(3, 4, dtype=torch.float64, device=device, requires_grad=True)
    bias = torch.randn(3, 4, dtype=torch.float64, device=device, requires_grad=True)
    if layout == "transposed":  # rows of (j, 4): normalize the last dim only
        weight, bias = weight[0].detach().requires_grad_(), bias[0].detach().requires_grad_()
    shape = list(weight.shape)
    fused = name.startswith("add_")
    layer = "layer" in name
    args = (shape, weight, bias, 1e-5) if layer else (shape, weight, 1e-6)
    got = getattr(torch_reduce, name)(x, residual, *args) if fused else getattr(torch_reduce, name)(x, *args)
    norm = F.layer_norm if layer else F.rms_norm
    sums = [s + r for s, r in zip(sequences, residual_sequences)] if fused else sequences
    want = [norm(s, *args) for s in sums] + (sums if fused else [])
    got = list(got) if fused else [got]
    for result in got:
        assert result.is_nested and result.offsets() is x.offsets()
        assert torch.equal(result.lengths(), x.lengths()) if layout == "holes" else result.lengths() is None
    got = flat(got)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    params = [weight, bias] if layer else [weight]
    check_gradients(got, want, [source, residual_source, *params] if fused else [source, *params])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_norms_in_low_precision(device, dtype):
    """The same kernels as dense rows: the values' rows give the same bits as the jagged tensor, a float32 weight
    beside a 16-bit input (mixed precision) too."""
    x, _, _ = jagged("packed", dtype, device)
    for weight_dtype in {dtype, torch.float32}:
        weight = torch.randn(4, device=device, dtype=weight_dtype)
        for name in ("layer_norm", "rms_norm"):
            got = getattr(torch_reduce, name)(x, [4], weight)
            assert torch.equal(got.values(), getattr(torch_reduce, name)(x.values(), [4], weight))
            assert got.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_ladder(device):
    """The ladder sums a jagged tensor's elements, every variant; one with holes is refused."""
    x, leaf, sequences = jagged("packed", torch.float64, device, requires_grad=True)
    want = torch.cat(sequences).sum()
    for variant in torch_reduce.LADDER:
        got = variant.op(x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got, leaf)[0].values(), torch.ones_like(leaf.values()))
    with pytest.raises(RuntimeError, match="jagged tensor with holes"):
        torch_reduce.LADDER[0].op(jagged("holes", torch.float64, device)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_compile(device):
    x, _, _ = jagged("packed", torch.float32, device, requires_grad=True)
    weight = torch.randn(4, device=device, requires_grad=True)

    def f(x, weight):
        y = torch_reduce.layer_norm(x, [4], weight)
        return torch_reduce.mean(y, 1) + torch_reduce.amax(x, 1) + torch_reduce.sum(torch_reduce.rms_norm(y, [4]),
                                                                                     (0, 1))

    eager = f(x, weight)
    compiled = torch.compile(f, fullgraph=True)(x, weight)
    torch.testing.assert_close(compiled, eager, equal_nan=True)
    cotangent = torch.randn_like(eager).nan_to_num()
    for a, b in zip(torch.autograd.grad(eager.nan_to_num(), (x, weight), cotangent),
                    torch.autograd.grad(compiled.nan_to_num(), (x, weight), cotangent)):
        torch.testing.assert_close(a.values() if a.is_nested else a, b.values() if b.is_nested else b)


def test_meta():
    x = torch.nested.nested_tensor([torch.randn(n, 3, 4) for n in LENGTHS], layout=torch.jagged, device="meta")
    assert torch_reduce.sum(x, -1).shape == x.shape[:-1] and torch_reduce.sum(x, -1).is_nested
    assert torch_reduce.mean(x, 1, True).shape == (len(LENGTHS), 1, 3, 4)
    assert torch_reduce.var_mean(x, (0, 1))[0].shape == (3, 4)
    out = torch_reduce.layer_norm(x, [4])
    assert out.is_nested and out.shape == x.shape and out.device.type == "meta"


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_as_torch(device):
    x, _, _ = jagged("packed", torch.float32, device)
    weight = torch.randn(4, device=device)
    low = torch.bfloat16
    with torch.autocast(device, dtype=low):
        x_low = x.to(low)
        for ours, theirs in [(torch_reduce.layer_norm(x_low, [4], weight), F.layer_norm(x_low, [4], weight)),
                             (torch_reduce.sum(x_low, -1), torch.sum(x_low, -1))]:
            assert ours.dtype == theirs.dtype and ours.is_nested
            torch.testing.assert_close(ours.values(), theirs.values())


@pytest.mark.parametrize("device", DEVICES)
def test_converted_model(device):
    """A model's norms converted (convert_norms) run jagged batches as before: outputs and every gradient. In
    float64: a parameter's gradient sums terms over the tokens, and in float32 one that cancels to near zero
    differs between two summation orders by more than assert_close's float32 tolerance."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 8),
                                torch.nn.RMSNorm(8)).to(device, torch.float64)
    x = torch.nested.nested_tensor([torch.randn(n, 4, dtype=torch.float64) for n in LENGTHS], layout=torch.jagged,
                                   device=device)
    converted = torch_reduce.nn.convert_norms(__import__("copy").deepcopy(model))
    for m in (model, converted):
        m(x).values().square().sum().backward()
    torch.testing.assert_close(converted(x).values(), model(x).values())
    for a, b in zip(converted.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_errors():
    x, _, _ = jagged("packed", torch.float32, "cpu")
    other, _, _ = jagged("packed", torch.float32, "cpu")  # another structure (its own offsets)
    with pytest.raises(RuntimeError, match="batch dim of a jagged tensor needs its ragged dim"):
        torch_reduce.sum(x, 0)
    with pytest.raises(RuntimeError, match="normalized over dims after its ragged dim"):
        torch_reduce.rms_norm(x.transpose(1, 2), [3, 4])
    for norm in (torch_reduce.layer_norm, torch_reduce.rms_norm):  # the ragged size itself in normalized_shape
        with pytest.raises(ValueError, match="normalization over the ragged dim is not supported"):
            norm(x, [x.shape[1], *x.shape[2:]])
    with pytest.raises(RuntimeError, match="residual must be a jagged tensor with the input's structure"):
        torch_reduce.add_layer_norm(x, other, [4])
    with pytest.raises(RuntimeError, match="residual must be a jagged tensor .* got a dense one"):
        torch_reduce.add_rms_norm(x, torch.randn(4), [4])
    with pytest.raises(RuntimeError, match="weight is a jagged tensor beside a dense input"):
        torch_reduce.layer_norm(torch.randn(2, 4), [4], x)
    strided = torch.nested.as_nested_tensor([torch.randn(2, 4), torch.randn(3, 4)])  # torch's older layout
    for call in (lambda: torch_reduce.sum(strided, -1), lambda: torch_reduce.layer_norm(strided, [4])):
        with pytest.raises(NotImplementedError, match="nested tensor of layout torch.strided; torch_reduce takes jagged"):
            call()
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch_reduce.amax(x, 4)
    with pytest.raises(RuntimeError, match="could not infer output dtype"):
        torch_reduce.mean(x.to(torch.int32), 1)
