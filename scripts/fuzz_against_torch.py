"""Differential fuzz against torch on one device: random calls of the norms (forward and backward, a random subset of
the leaves differentiated), the dim reductions, clip_grad_norm_ and foreach_norm, at random shapes (hidden sizes
around the kernels' plan boundaries among them), dtypes and layouts (contiguous, one element past a 16-byte boundary,
transposed, sliced), each against a float64 reference. A call fails when our error exceeds 4x torch's own error on
the same call and a floor of a few units of the dtype's rounding, both measured against the natural scale of the
result (the reduction of |x| for a sum or mean, the column sums of |dy| (|xhat| + |x| rstd) for a weight gradient),
or when our parameter gradients differ between two runs (they are fixed-order folds), when a fused add's sum is not
x + r, when a gradient norm is inf, NaN or 0 where torch's is not (or the reverse: gradients at the edges of the
dtypes' range among them), or when a clipped gradient is not what torch's clip_grads_with_norm_ gives with our total.
On a GPU, one clip in seven or so spreads its list over the GPU and the CPU. One call in ten runs an op in one of
torch's other autograd modes (jvp, dual tensors, double backward, a Hessian-vector product, jacrev, vmap) on small
float64 leaves against torch's op in the same mode. Prints the failures; exits 1 if any.

    python3 scripts/fuzz_against_torch.py [--device cuda] [--seconds 80] [--seed 11]
"""
import argparse
import math
import random
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import torch_reduce

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from norm_reference import layer_norm_formula, rms_norm_formula  # noqa: E402

FLOOR = {torch.float64: 1e-12, torch.float32: 3e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
HIDDEN_NEAR = [64, 96, 128, 256, 512, 768, 1024, 1536, 1600, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 8200, 10240,
               12288, 14336, 16384, 16392, 18432, 20480, 24576, 32768, 40000, 65536]
LAYOUTS = ["contiguous"] * 4 + ["unaligned", "transposed", "sliced"]


class Fuzz:
    def __init__(self, device, seed):
        self.device, self.rng = device, random.Random(seed)
        torch.manual_seed(seed)
        self.failures, self.counts = [], {}
        big = device != "cpu"
        self.norm_cap, self.reduction_cap, self.clip_cap = (2**25, 2**26, 2**22) if big else (2**17, 2**16, 2**14)

    def fail(self, what):
        self.failures.append(what)

    def tensor(self, shape, dtype, layout):
        shape = tuple(shape)
        randn = lambda *size: torch.randn(size, device=self.device).to(dtype)  # noqa: E731
        if layout == "unaligned":
            return randn(math.prod(shape) + 1)[1:].view(shape)
        if layout == "transposed" and len(shape) >= 2:
            return randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
        if layout == "sliced" and shape:
            return randn(*shape[:-1], shape[-1] + 3)[..., 1:shape[-1] + 1]
        return randn(*shape)

    def judge(self, what, ours, theirs, ref, scale, dtype, floor_units=4):
        """ours' error within 4x torch's (theirs None: torch refused the call) and floor_units x the dtype's floor,
        each relative to max(|ref|, scale)."""
        if ours is None or ref.numel() == 0:
            return
        scale = max(ref.abs().max().item(), scale, 1e-300)
        error = lambda t: (t.double() - ref).abs().max().item() / scale  # noqa: E731
        mine, torchs = error(ours), (error(theirs) if theirs is not None else 0.0)
        if math.isnan(mine) and math.isnan(torchs):
            return
        if not mine <= max(4 * torchs, FLOOR[dtype] * floor_units):
            self.fail(f"{what}: ours err {mine:.3g}, torch's {torchs:.3g} (scale {scale:.3g})")

    def same_range(self, what, ours, theirs):
        """A norm that is inf, NaN or 0 where torch's is not, or the reverse (judge's bound is inf where torch's is)."""
        kinds = lambda t: (t.isinf(), t.isnan(), t == 0)  # noqa: E731
        if any(not torch.equal(a, b) for a, b in zip(kinds(ours), kinds(theirs))):
            self.fail(f"{what}: ours {ours.item():.4g}, torch's {theirs.item():.4g}")

    # ------------------------------------------------------------------------------------------- norms ----
    def hidden(self):
        k = self.rng.random()
        if k < 0.35:
            return max(1, self.rng.choice(HIDDEN_NEAR) + self.rng.choice([0, 0, 0, 1, -1, 8, -8, 4, 2, 3]))
        if k < 0.5:
            return self.rng.randint(1, 40)
        return int(math.exp(self.rng.uniform(0, math.log(70000))))

    def norm(self):
        rng = self.rng
        name = rng.choice(["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
        layer, fused = "layer" in name, name.startswith("add")
        dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16, torch.bfloat16, torch.float16,
                            torch.float64])
        hidden = self.hidden()
        most = max(1, min(70000, self.norm_cap // hidden))
        rows = rng.randint(1, min(most, 8)) if rng.random() < 0.2 else \
            max(1, min(most, int(math.exp(rng.uniform(0, math.log(most + 1))))))
        lead = [max(1, rows // 3), 3] if rows >= 3 and rng.random() < 0.3 else [rows]
        shape = (*lead, hidden)
        layout = rng.choice(LAYOUTS + ["contiguous"])
        param_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) and rng.random() < 0.3 else dtype
        affine = rng.random() < 0.85
        with_bias = layer and rng.random() < (0.8 if affine else 0.3)
        x = self.tensor(shape, dtype, layout).requires_grad_()
        r = self.tensor(shape, dtype, "contiguous").requires_grad_() if fused else None
        w = (1 + 0.3 * torch.randn(hidden, device=self.device)).to(param_dtype).requires_grad_() if affine else None
        b = (0.3 * torch.randn(hidden, device=self.device)).to(param_dtype).requires_grad_() if with_bias else None
        desc = f"{name} {shape} {dtype} weight {w is not None} bias {b is not None} params {param_dtype} {layout}"
        eps = 1e-5 if layer else torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
        params = [p for p in (w, b) if p is not None]
        normalized = (hidden,)
        if name == "layer_norm":
            outs, leaves = (torch_reduce.layer_norm(x, normalized, w, b, eps),), [x]
        elif name == "rms_norm":
            outs, leaves = (torch_reduce.rms_norm(x, normalized, w),), [x]
        elif name == "add_layer_norm":
            outs, leaves = torch_reduce.add_layer_norm(x, r, normalized, w, b, eps), [x, r]
        else:
            outs, leaves = torch_reduce.add_rms_norm(x, r, normalized, w), [x, r]
        leaves += params
        cotangents = [torch.randn_like(o) for o in outs]
        picked = [i for i in range(len(leaves)) if rng.random() < 0.7] or [rng.randrange(len(leaves))]
        got = [None] * len(leaves)
        for i, g in zip(picked, torch.autograd.grad(outs, [leaves[i] for i in picked], cotangents, retain_graph=True)):
            got[i] = g
        summed = (x + r) if fused else x
        if fused and not torch.equal(outs[1], summed):
            self.fail(f"{desc}: the sum is not x + r")
        if fused and got[0] is not None and got[1] is not None and not torch.equal(got[0], got[1]):
            self.fail(f"{desc}: the gradients of x and r differ")

        def torch_norm(s, weight, bias):
            return F.layer_norm(s, normalized, weight, bias, eps) if layer else F.rms_norm(s, normalized, weight, eps)

        # The reference: the norm's formula in float64, not torch's kernels (torch 2.11's CUDA LayerNorm gives a zero
        # bias gradient past 65536 rows without a weight: seed 1796634266 flagged ours, right, against it).
        leaves64 = [t.detach().double().requires_grad_() for t in [summed] + params]
        it = iter(leaves64[1:])
        weight64, bias64 = next(it) if w is not None else None, next(it) if b is not None else None
        y64 = layer_norm_formula(leaves64[0], normalized, weight64, bias64, eps) if layer else \
            rms_norm_formula(leaves64[0], normalized, weight64, eps)
        want = torch.autograd.grad(y64, leaves64, cotangents[0].double())
        theirs_leaves = [summed.detach().requires_grad_()] + [p.detach().to(dtype).requires_grad_() for p in params]
        it = iter(theirs_leaves[1:])
        try:
            y_torch = torch_norm(theirs_leaves[0], next(it) if w is not None else None,
                                 next(it) if b is not None else None)
            theirs = [y_torch] + list(torch.autograd.grad(y_torch, theirs_leaves, cotangents[0]))
        except RuntimeError:  # torch refuses some calls ours takes (e.g. a bias without a weight, on the GPU)
            theirs = [None] * (1 + len(theirs_leaves))
        # Natural scales: rows' rstd amplifies the rounding of x - mean; a weight gradient sums |dy| (|xhat| + |x|
        # rstd) over the rows.
        rows2 = leaves64[0].detach().reshape(-1, hidden)
        centre = rows2.mean(-1, keepdim=True) if layer else torch.zeros_like(rows2[:, :1])
        var = rows2.var(-1, unbiased=False, keepdim=True) if layer else (rows2 * rows2).mean(-1, keepdim=True)
        rstd = (var + eps).rsqrt()
        kappa = max(1.0, rstd.max().item()) if rows2.numel() else 1.0
        dy = cotangents[0].detach().double().reshape(-1, hidden).abs()
        wmax = w.detach().double().abs().max().item() if w is not None else 1.0
        self.judge(f"{desc}: output", outs[0], theirs[0], y64.detach(), 1.0, dtype, 4 * kappa)
        dx_want = want[0] + (cotangents[1].double() if fused else 0)
        dx_theirs = None if theirs[1] is None else theirs[1] + (cotangents[1] if fused else 0)
        for i in range(2 if fused else 1):
            self.judge(f"{desc}: grad {'xr'[i]}", got[i], dx_theirs, dx_want, dy.max().item() * wmax * kappa, dtype)
        first = 2 if fused else 1
        for k, p in enumerate(params):
            scale = (dy * ((rows2 - centre).abs() * rstd + rows2.abs() * rstd)).sum(0).max().item() if p is w \
                else dy.sum(0).max().item()
            g = got[first + k]
            if g is not None and g.dtype != p.dtype:
                self.fail(f"{desc}: a parameter's gradient in {g.dtype}, not {p.dtype}")
            self.judge(f"{desc}: grad {'weight' if p is w else 'bias'}", g, theirs[2 + k], want[1 + k], scale, dtype)
        if params:
            again = torch.autograd.grad(outs, params, cotangents)
            if any(g is not None and not torch.equal(g, h) for g, h in zip(got[first:], again)):
                self.fail(f"{desc}: parameter gradients differ between two runs")
        self.counts["norm"] = self.counts.get("norm", 0) + 1

    # -------------------------------------------------------------------------------------- reductions ----
    def reduction(self):
        rng = self.rng
        op = rng.choice(["sum", "mean", "amax", "amin", "prod", "norm2", "norm1", "norminf", "norm_half", "var_mean"])
        ndim = rng.randint(1, 4)
        sizes = [1, 2, 3, 5, 7, 8, 16, 31, 64, 100, 128, 257, 1000, 1024, 4097, 65537]
        shape = [rng.choice(sizes) for _ in range(ndim)]
        while math.prod(shape) > self.reduction_cap:
            i = rng.randrange(ndim)
            shape[i] = max(1, shape[i] // 4)
        integers = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool] if op in ("sum", "amax", "amin",
                                                                                             "prod") else []
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16, torch.float64] + integers)
        layout = rng.choice(LAYOUTS)
        base = self.tensor(shape, torch.float32, layout)
        if dtype.is_floating_point:
            x = (1 + 0.01 * base if op == "prod" else base).to(dtype)
        elif dtype == torch.bool:
            x = base > (-2 if op == "prod" else 0)
        else:
            x = ((base.abs() < 0.7).to(dtype) + 1) if op == "prod" else (base * 3).clamp(-100, 100).to(dtype)
        dims = None
        if rng.random() >= 0.15:
            picked = sorted(rng.sample(range(ndim), rng.randint(1, ndim)))
            dims = [d - ndim if rng.random() < 0.3 else d for d in picked]
            if op == "prod" or (len(dims) == 1 and rng.random() < 0.5):
                dims = dims[0]
        keepdim = rng.random() < 0.3
        desc = f"{op} {tuple(shape)} {dtype} dim {dims} keepdim {keepdim} {layout}"
        try:
            ours, theirs, ref, scales = self.reduce(op, x, dims, keepdim)
        except Exception as error:  # noqa: BLE001 - any error is a finding
            self.fail(f"{desc}: raised {type(error).__name__}: {str(error)[:150]}")
            return
        for o, t, want, scale in zip(ours, theirs, ref, scales):
            if (o.shape, o.dtype) != (t.shape, t.dtype):
                self.fail(f"{desc}: {tuple(o.shape)} {o.dtype}, torch's {tuple(t.shape)} {t.dtype}")
            elif not o.dtype.is_floating_point:
                if not torch.equal(o, t):
                    self.fail(f"{desc}: integer results differ from torch's")
            else:
                self.judge(desc, o, t, want, scale, x.dtype, floor_units=8)
        self.counts["reduction"] = self.counts.get("reduction", 0) + 1

    @staticmethod
    def reduce(op, x, dims, keepdim):
        """(ours, torch's, float64 reference, natural scale) for each result."""
        kw = {} if dims is None else {"dim": dims, "keepdim": keepdim}
        x64 = x.double() if x.dtype.is_floating_point else x
        if op in ("sum", "mean", "amax", "amin"):
            if op in ("amax", "amin") and dims is None:
                kw = {}
            mine, torchs = getattr(torch_reduce, op)(x, **kw), getattr(torch, op)(x, **kw)
            want = getattr(torch, op)(x64, **kw) if x.dtype.is_floating_point else torchs
            scale = getattr(torch, op)(x64.abs(), **kw).max().item() if op in ("sum", "mean") and \
                x.dtype.is_floating_point and want.numel() else 0.0
            return (mine,), (torchs,), (want,), (scale,)
        if op == "prod":
            args = () if dims is None else (dims,)
            pkw = {} if dims is None else {"keepdim": keepdim}
            torchs = torch.prod(x, *args, **pkw)
            want = torch.prod(x64, *args, **pkw) if x.dtype.is_floating_point else torchs
            return (torch_reduce.prod(x, *args, **pkw),), (torchs,), (want,), (0.0,)
        if op.startswith("norm"):
            order = {"norm2": 2, "norm1": 1, "norminf": math.inf, "norm_half": 0.5}[op]
            return ((torch_reduce.vector_norm(x, order, **kw),), (torch.linalg.vector_norm(x, order, **kw),),
                    (torch.linalg.vector_norm(x64, order, **kw),), (0.0,))
        mean_scale = torch.mean(x64.abs(), **kw).max().item() if x.numel() else 0.0
        return torch_reduce.var_mean(x, **kw), torch.var_mean(x, **kw), torch.var_mean(x64, **kw), (0.0, mean_scale)

    # ---------------------------------------------------------------------------------- autograd modes ----
    def autograd_call(self):
        """(description, float64 leaves, ours, torch's, tolerance): one op over small random float64 leaves."""
        rng, f64 = self.rng, torch.float64
        shape = [rng.choice([1, 2, 3, 5, 7, 8, 16, 33]) for _ in range(rng.randint(0, 4))]
        x = self.tensor(shape, f64, rng.choice(LAYOUTS))
        if rng.random() < 0.15:
            x = x.round()  # ties of amax and amin, zeros of prod
        kd, nd = rng.random() < 0.4, len(shape)
        dims = None if nd == 0 or rng.random() < 0.2 else tuple(rng.sample(range(nd), rng.randint(1, nd)))
        op = rng.choice(["sum", "mean", "amax", "amin", "prod", "vector_norm", "var_mean", "layer_norm", "rms_norm",
                         "add_layer_norm", "add_rms_norm", "foreach_norm"])
        desc = f"{op} {tuple(shape)} dim {dims} keepdim {kd}"
        if op in ("sum", "mean", "amax", "amin"):
            kw = {} if dims is None else {"dim": dims, "keepdim": kd}
            return desc, [x], lambda a: getattr(torch_reduce, op)(a, **kw), lambda a: getattr(torch, op)(a, **kw), 1e-9
        if op == "prod":
            kw = {} if dims is None else {"dim": dims[0], "keepdim": kd}
            return desc, [x], lambda a: torch_reduce.prod(a, **kw), lambda a: torch.prod(a, **kw), 1e-9
        if op == "vector_norm":
            order = rng.choice([2, 1, 3.0, 0.5, math.inf, -math.inf, 0])
            return (f"{desc} order {order}", [x], lambda a: torch_reduce.vector_norm(a, order, dims, kd),
                    lambda a: torch.linalg.vector_norm(a, order, dims, kd), 1e-9)
        if op == "var_mean":
            correction = rng.choice([0, 1, 2, 0.5, None])
            dims = rng.choice([dims, ()]) if dims is None else dims
            # torch's derivatives take dim=() as N = 1, its forward as every dim; ours are its dim=None's
            theirs_dims = None if dims == () else dims
            return (f"{op} {tuple(shape)} dim {dims} keepdim {kd} correction {correction}", [x],
                    lambda a: torch_reduce.var_mean(a, dims, correction=correction, keepdim=kd),
                    lambda a: torch.var_mean(a, theirs_dims, correction=correction, keepdim=kd), 1e-9)
        if op == "foreach_norm":  # torch's _foreach_norm has no forward-mode formula: its norms one by one
            leaves = [x] + [self.tensor(s, f64, "contiguous") for s in ([3, 5], [7], [])[:rng.randint(0, 3)]]
            order = rng.choice([2, 1, 3.0, math.inf])
            return (f"foreach_norm of {len(leaves)} order {order}", leaves,
                    lambda *a: torch_reduce.foreach_norm(list(a), order),
                    lambda *a: tuple(torch.linalg.vector_norm(t, order) for t in a), 1e-9)
        if not shape:  # a norm needs a dim to normalize
            shape, x = [5], self.tensor([5], f64, rng.choice(LAYOUTS))
        normalized = shape[len(shape) - rng.randint(1, min(len(shape), 2)):]
        params = [self.tensor(normalized, f64, "contiguous") for _ in range(rng.choice([0, 1, 1, 2]))]
        layer, fused = "layer" in op, op.startswith("add")
        if not layer:
            params = params[:1]
        eps = rng.choice([1e-5, 1e-2] + ([] if layer else [None]))
        leaves = [x] + ([self.tensor(shape, f64, "contiguous")] if fused else []) + params
        desc = f"{op} {tuple(shape)} normalized {normalized} params {len(params)} eps {eps}"

        n = 1 + fused  # the leaves before the parameters

        def ours(*a):
            return getattr(torch_reduce, op)(*a[:n], normalized, *a[n:], eps=eps)

        def theirs(*a):
            s = a[0] + a[1] if fused else a[0]
            y = (F.layer_norm if layer else F.rms_norm)(s, normalized, *a[n:], eps=eps)
            return (y, s) if fused else y
        # A row's rstd scales the rounding of x - mean, twice in the second derivatives (a row of one element:
        # 1/sqrt(eps))
        rows = (leaves[0] + leaves[1] if fused else leaves[0]).reshape(-1, math.prod(normalized))
        var = rows.var(-1, correction=0) if layer else (rows * rows).mean(-1)
        kappa = (var + (eps or torch.finfo(torch.float64).eps)).rsqrt().max().item() if rows.numel() else 1.0
        return desc, leaves, ours, theirs, 1e-9 * max(1.0, kappa) ** 2

    def autograd_modes(self):
        """One op in one of torch's other autograd modes (jvp, dual tensors, double backward, a Hessian-vector
        product, jacrev, vmap) against torch's op in the same mode, in float64: values within 1e-9 of the result's
        scale (more where a norm's rstd is large), inf and NaN where torch's are, an error only where torch's
        raises."""
        desc, leaves, ours, theirs, tolerance = self.autograd_call()
        small = sum(t.numel() for t in leaves) <= 600
        vmap = ["vmap"] * (not desc.startswith("foreach_norm"))  # torch's _foreach_norm has no batching rule
        mode = self.rng.choice(["jvp", "dual", "double backward"] + vmap + ["hvp", "jacrev"] * small)
        desc = f"{mode} of {desc}"
        tangents = [torch.randn_like(t) for t in leaves]
        as_list = lambda o: list(o) if isinstance(o, (tuple, list)) else [o]  # noqa: E731
        total = lambda o: sum((t * t).sum() for t in as_list(o))  # noqa: E731
        every = tuple(range(len(leaves)))

        def apply(fn):
            if mode == "jvp":
                return as_list(torch.func.jvp(fn, tuple(leaves), tuple(tangents))[1])
            if mode == "dual":
                with fwAD.dual_level():
                    outs = fn(*[fwAD.make_dual(t, d) for t, d in zip(leaves, tangents)])
                    return [fwAD.unpack_dual(o).tangent for o in as_list(outs)]
            if mode == "hvp":
                grad = torch.func.grad(lambda *a: total(fn(*a)), argnums=every)
                return list(torch.func.jvp(grad, tuple(leaves), tuple(tangents))[1])
            if mode == "jacrev":
                return torch.utils._pytree.tree_leaves(torch.func.jacrev(fn, argnums=every)(*leaves))
            if mode == "vmap":
                return as_list(torch.vmap(fn)(*[torch.stack([t, 2 * t - 1, t * t]) for t in leaves]))
            inputs = [t.detach().requires_grad_() for t in leaves]
            first = torch.autograd.grad(total(fn(*inputs)), inputs, create_graph=True, materialize_grads=True)
            return list(first) + list(torch.autograd.grad(total(first), inputs, materialize_grads=True))

        results = []
        for fn in (ours, theirs):
            try:
                results.append(apply(fn))
            except Exception as error:  # noqa: BLE001 - compared with torch's
                results.append(error)
        mine, torchs = results
        if isinstance(mine, Exception) or isinstance(torchs, Exception):
            if not isinstance(torchs, Exception):
                self.fail(f"{desc}: ours raised {type(mine).__name__}: {str(mine)[:150]}")
            return
        if len(mine) != len(torchs):
            self.fail(f"{desc}: {len(mine)} results, torch's {len(torchs)}")
            return
        for k, (a, b) in enumerate(zip(mine, torchs)):
            if a is None or b is None or a.shape != b.shape:
                self.fail(f"{desc}: result {k} is {None if a is None else tuple(a.shape)}, torch's "
                          f"{None if b is None else tuple(b.shape)}")
            elif not torch.equal(a.isnan(), b.isnan()) or not torch.equal(a.isinf() * a.sign(), b.isinf() * b.sign()):
                self.fail(f"{desc}: result {k} has inf or NaN where torch's does not, or the reverse")
            else:
                finite = b.isfinite()
                scale = max(1.0, b[finite].abs().max().item() if finite.any() else 0.0)
                error = (a[finite] - b[finite]).abs().max().item() / scale if finite.any() else 0.0
                if error > tolerance:
                    self.fail(f"{desc}: result {k} differs from torch's by {error:.3g} of its scale {scale:.3g}")
        self.counts["autograd mode"] = self.counts.get("autograd mode", 0) + 1

    # ---------------------------------------------------------------------------------------- clipping ----
    def clip(self):
        rng = self.rng
        n = rng.choice([1, 2, 3, 7, 50, 148, 300])
        dtypes = [rng.choice([torch.float32, torch.bfloat16, torch.float16, torch.float64]) for _ in range(n)]
        if rng.random() < 0.5:
            dtypes = [dtypes[0]] * n
        shapes = [tuple(rng.choice([1, 2, 3, 5, 8, 64, 100, 257, 1024, 3000]) for _ in range(rng.randint(0, 3)))
                  for _ in range(n)]
        if sum(math.prod(s) for s in shapes) > self.clip_cap:
            return
        # Now and then magnitudes at the edges of float32's and float16's range, whose norms torch gives as inf or 0.
        scales = [1.0, 1e-3, 10.0] * 4 + [1e19, 3e4, 1e-22, 1e-5]
        grads = [self.tensor(s, d, rng.choice(LAYOUTS) if s else "contiguous") * rng.choice(scales)
                 for s, d in zip(shapes, dtypes)]
        spread = self.device != "cpu" and n > 1 and rng.random() < 0.15  # a list over the GPU and the CPU
        if spread:
            grads = [g.cpu() if rng.random() < 0.5 else g for g in grads]
        order = rng.choice([2.0, 2.0, 1.0, math.inf, 0.5, 3.0, -math.inf, 0.0])
        max_norm, foreach = rng.choice([0.1, 1.0, 1e6]), rng.choice([None, True, False])
        desc = f"clip_grad_norm_ of {n} ({sorted(set(map(str, dtypes)))}{', two devices' if spread else ''}) " \
               f"order {order} max_norm {max_norm} foreach {foreach}"
        results = []
        for clip in (torch_reduce.clip_grad_norm_, torch.nn.utils.clip_grad_norm_):
            params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            try:
                results.append((clip(params, max_norm, norm_type=order, foreach=foreach), params))
            except Exception as error:  # noqa: BLE001 - compared with torch's
                results.append((error, params))
        (mine, ours), (torchs, theirs) = results
        if isinstance(mine, Exception) or isinstance(torchs, Exception):
            if type(mine) is not type(torchs):
                self.fail(f"{desc}: ours {type(mine).__name__}: {str(mine)[:100]}, torch's "
                          f"{type(torchs).__name__}: {str(torchs)[:100]}")
            return
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double(), order).cpu()
                                                      for g in grads]), order)
        worst = max(dtypes, key=lambda d: torch.finfo(d).eps)
        if (mine.dtype, mine.shape) != (torchs.dtype, torchs.shape):
            self.fail(f"{desc}: the total is {mine.dtype}, torch's {torchs.dtype}")
        self.same_range(f"{desc}: total", mine, torchs)
        self.judge(f"{desc}: total", mine, torchs, total, 0.0, worst)
        # Given our total, torch's scaling gives the values ours must (its mul's casts and promotions), to the bit.
        scaled = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(scaled, grads):
            p.grad = g.clone()
        torch.nn.utils.clip_grads_with_norm_(scaled, max_norm, mine, foreach=foreach)
        for p, q, g in zip(ours, scaled, grads):
            both_nan = p.grad.isnan() & q.grad.isnan()
            if not torch.equal(torch.where(both_nan, 0, p.grad), torch.where(both_nan, 0, q.grad)):
                self.fail(f"{desc}: clipped {tuple(g.shape)} {g.dtype}: not torch's scaling by our total")
        coefficient = min(1.0, max_norm / (total.item() + 1e-6))
        for p, q, g in zip(ours, theirs, grads):
            # A product below the dtype's smallest normal rounds to a multiple of the subnormal quantum: two quanta
            # either way (the scale at which the floor is that much).
            info = torch.finfo(g.dtype)
            quantum = info.smallest_normal * info.eps
            self.judge(f"{desc}: clipped {tuple(g.shape)} {g.dtype}", p.grad, q.grad, g.double() * coefficient,
                       2 * quantum / (4 * FLOOR[g.dtype]), g.dtype)
        self.counts["clip"] = self.counts.get("clip", 0) + 1
        self.foreach_norm(grads, order)

    def foreach_norm(self, tensors, order):
        """foreach_norm of a list against torch._foreach_norm, with a dtype= each tensor's reaches (or None)."""
        dtype = self.rng.choice([None, torch.float32, torch.float64])
        if dtype is not None:  # a dtype= no tensor's narrows to
            tensors = [t for t in tensors if torch.promote_types(t.dtype, dtype) == dtype] or \
                [t.to(dtype) for t in tensors]
        desc = f"foreach_norm of {len(tensors)} ({sorted(set(str(t.dtype) for t in tensors))}) order {order} " \
               f"dtype {dtype}"
        results = []
        for norms in (torch_reduce.foreach_norm, torch._foreach_norm):
            try:
                results.append(norms(tensors, order, dtype=dtype))
            except Exception as error:  # noqa: BLE001 - compared with torch's
                results.append(error)
        mine, torchs = results
        if isinstance(mine, Exception) or isinstance(torchs, Exception):
            if type(mine) is not type(torchs):
                self.fail(f"{desc}: ours {type(mine).__name__}: {str(mine)[:100]}, torch's "
                          f"{type(torchs).__name__}: {str(torchs)[:100]}")
            return
        for t, a, b in zip(tensors, mine, torchs):
            if (a.dtype, a.shape) != (b.dtype, b.shape):
                self.fail(f"{desc}: a norm of {t.dtype} is {a.dtype} {tuple(a.shape)}, torch's {b.dtype} "
                          f"{tuple(b.shape)}")
                continue
            self.same_range(f"{desc}: norm of {tuple(t.shape)} {t.dtype}", a, b)
            self.judge(f"{desc}: norm of {tuple(t.shape)} {t.dtype}", a, b,
                       torch.linalg.vector_norm(t.double(), order), 0.0, a.dtype)
        self.counts["foreach_norm"] = self.counts.get("foreach_norm", 0) + 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=float, default=80)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # var_mean's degrees-of-freedom warnings, torch's and ours alike
    fuzz = Fuzz(args.device, args.seed)
    start, calls = time.time(), 0
    while time.time() - start < args.seconds and len(fuzz.failures) <= 60:
        calls += 1
        k = fuzz.rng.random()
        (fuzz.norm if k < 0.45 else fuzz.reduction if k < 0.75 else fuzz.clip if k < 0.9 else fuzz.autograd_modes)()
    print(f"seed {args.seed}, {args.device}: {calls} calls {fuzz.counts} in {time.time() - start:.0f} s; "
          f"{len(fuzz.failures)} failures")
    for failure in fuzz.failures:
        print("FAIL", failure)
    sys.exit(1 if fuzz.failures else 0)


if __name__ == "__main__":
    main()
