"""torch.nn.LayerNorm and torch.nn.RMSNorm on the fused kernels, and converters for whole models."""
from __future__ import annotations

import contextlib
import copy
import inspect
import math
import sys
import types

import torch
import torch.fx
import torch.nn.utils.parametrize

from .functional import _rms_weight, layer_norm, rms_norm


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with torch_reduce's kernels: the same constructor, parameters, state_dict keys,
    reset_parameters and repr (it is a subclass), so torch checkpoints load unchanged."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles this branch alone: it cannot call the C entry point
            return torch.ops.reduce.layer_norm_fwd(input, self.normalized_shape, self.weight, self.bias, self.eps)[0]
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm with torch_reduce's kernels: the same constructor, parameters, state_dict keys,
    reset_parameters and repr (it is a subclass)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # torch's name: a caller may pass it by keyword
        if torch.jit.is_scripting():  # as LayerNorm's
            return torch.ops.reduce.rms_norm_fwd(x, self.normalized_shape, _rms_weight(x, self.weight), self.eps)[0]
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)


def _transformers_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float,
                           weight_in_float32: bool) -> torch.Tensor:
    """What transformers' RMSNorm modules compute: normalize in float32, then either cast back to the input's dtype
    and multiply by the weight (LlamaRMSNorm and its copies: the result has promote(weight, input)'s dtype), or
    multiply by the weight in float32 and cast the product back (``weight_in_float32``: Olmo2RMSNorm and its copies:
    the input's dtype). One fused call where the kernel's one rounding is theirs (the Llama rule rounds twice where
    weight and input are 16-bit: the result may differ in the last bit); else the normalization is fused and the
    rest is torch's, as there. A float64 input is normalized in float32, as theirs. Autocast does not touch their
    forward (no op in it casts), so it is off for ours too."""
    dtype = hidden_states.dtype
    shape = hidden_states.shape[-1:]
    with _autocast_off(hidden_states.device.type):
        mixed = weight_in_float32 and weight.dtype == torch.float32 and dtype in (torch.float16, torch.bfloat16)
        if dtype != torch.float64 and (weight.dtype == dtype or mixed):
            return rms_norm(hidden_states, shape, weight, eps)
        if weight_in_float32:
            return (weight * rms_norm(hidden_states.to(torch.float32), shape, None, eps)).to(dtype)
        normalized = rms_norm(hidden_states if dtype != torch.float64 else hidden_states.to(torch.float32), shape,
                              None, eps)
        return weight * normalized.to(dtype)


def _autocast_off(device_type: str):
    """Autocast off on ``device_type``, where it has autocast (the meta device has none)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


# symbolic_trace (FX) records these calls as nodes: our modules are not torch.nn's, so FX traces into their
# forward, where the functionals' checks cannot read a Proxy.
torch.fx.wrap("layer_norm")
torch.fx.wrap("rms_norm")
torch.fx.wrap("_transformers_rms_norm")


def _transformers_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """The forward of a converted transformers-style RMSNorm (_transformers_rms_norm; ``_weight_in_float32``, its
    class's rule, found at conversion). TorchScript cannot switch autocast off (it wants the device as a
    constant), so a scripted model holding such a module raises when the module runs."""
    if torch.jit.is_scripting():
        raise RuntimeError("torch_reduce: a converted transformers-style RMSNorm does not run under TorchScript (it "
                           "switches autocast off, which TorchScript cannot); script the unconverted model")
    return _transformers_rms_norm(hidden_states, self.weight, self.variance_epsilon, self._weight_in_float32)


_CONVERTED_SUBCLASSES: dict[tuple, type] = {}  # (class, forward's name, the class attributes it reads)
_REMADE_FSDP_CLASSES: dict[tuple[type, type], type] = {}  # (FSDP's class, the converted class beneath it)
# The forwards a converted subclass may have, by the name its pickles give them.
_FORWARDS = {"layer_norm": LayerNorm.forward, "rms_norm": RMSNorm.forward,
             "transformers_rms_norm": _transformers_rms_norm_forward}


def _new_converted(cls: type, forward: str, attributes: dict | None = None) -> torch.nn.Module:
    """An empty instance of ``cls``'s converted subclass with that forward: what a pickle of a converted module is
    loaded into (pickle then sets its state), in any process, since the subclass is made again if need be."""
    converted = _subclass_with_forward(cls, _FORWARDS[forward], **(attributes or {}))
    return converted.__new__(converted)


def _reduce_converted(self, protocol):
    """Pickles (torch.save, deepcopy, multiprocessing) a module of a converted subclass as its original class,
    forward's name and class attributes: pickle finds a class by its module and name, which here lead to the
    original class."""
    cls = type(self)
    _, _, *rest = object.__reduce_ex__(self, protocol)  # (copyreg.__newobj__, (cls,), state, None, None)
    return (_new_converted, (cls._converted_from, cls._converted_forward, cls._converted_attributes), *rest)


def _subclass_with_forward(cls: type, forward, **attributes) -> type:
    """A subclass of ``cls`` that differs in its forward (and the class ``attributes`` the forward reads) alone:
    its methods, name and isinstance kept, the forward's argument named as in ``cls``'s, for a caller that passes
    it by keyword."""
    name = next(key for key, f in _FORWARDS.items() if f is forward)
    key = (cls, name, tuple(sorted(attributes.items())))
    if key not in _CONVERTED_SUBCLASSES:
        _CONVERTED_SUBCLASSES[key] = type(cls.__name__, (cls,), {
            "forward": _argument_named_as(forward, cls.forward), "__module__": cls.__module__,
            "__qualname__": cls.__qualname__, "__reduce_ex__": _reduce_converted, "_converted_from": cls,
            "_converted_forward": name, "_converted_attributes": attributes, **attributes})
    return _CONVERTED_SUBCLASSES[key]


def _argument_named_as(forward, original):
    """``forward(self, x)`` with ``x`` renamed as ``original``'s one argument (a forward of ours has no other
    local)."""
    name = list(inspect.signature(original).parameters)[1]
    code = forward.__code__
    if code.co_varnames[1] == name:
        return forward
    renamed = types.FunctionType(code.replace(co_varnames=(code.co_varnames[0], name) + code.co_varnames[2:]),
                                 forward.__globals__, forward.__name__, forward.__defaults__, forward.__closure__)
    renamed.__qualname__, renamed.__doc__ = forward.__qualname__, forward.__doc__
    renamed.__annotations__ = {name if key == code.co_varnames[1] else key: value
                               for key, value in forward.__annotations__.items()}
    return renamed


def _converted_class(cls: type, torch_class: type, ours: type) -> type | None:
    """The class a module of class ``cls`` becomes, or None when it stays as it is: ``torch_class`` becomes
    ``ours``; a subclass that keeps torch's forward becomes a subclass of it with our forward; a subclass with a
    forward of its own is left alone, since we cannot know what that forward means (e.g. CLIP's LayerNorm
    that computes in float32 and casts back)."""
    if cls is torch_class:
        return ours
    if not issubclass(cls, torch_class) or cls.forward is not torch_class.forward or issubclass(cls, ours):
        return None
    return _subclass_with_forward(cls, ours.forward)


def _wrapped_base(cls: type) -> int | None:
    """Where the wrapped class sits in ``cls.__bases__`` when torch made ``cls`` around a module's class at run time
    and reads it back from there, else None: parametrize's Parametrized<Name>, its first base (removing the last
    parametrization restores it; type_before_parametrizations names it); FSDP2's FSDP<Name>, its second (FSDPModule's
    __new__ builds the class two places down its MRO)."""
    getstate = cls.__dict__.get("__getstate__")
    if getattr(getstate, "__module__", None) == torch.nn.utils.parametrize.__name__:
        return 0
    # not imported here: it imports DTensor, which takes seconds
    fsdp_module = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if fsdp_module is not None and len(cls.__bases__) == 2 and issubclass(cls.__bases__[0], fsdp_module):
        return 1
    return None


def _convert_beneath_torchs_classes(cls: type, convert) -> type | None:
    """``convert(cls)`` (the class a module becomes, or None to leave it) applied to the class that torch's
    generated classes wrap, which are then made again around the converted class: they must stay outermost. A
    parametrized class is its module's own (parametrize adds a property to it per tensor), so it is made again for
    each module; FSDP's are shared, as FSDP shares them."""
    at = _wrapped_base(cls)
    if at is None:
        return convert(cls)
    inner = _convert_beneath_torchs_classes(cls.__bases__[at], convert)
    if inner is None:
        return None
    if at == 1 and (cls, inner) in _REMADE_FSDP_CLASSES:
        return _REMADE_FSDP_CLASSES[cls, inner]
    namespace = {key: value for key, value in cls.__dict__.items() if key not in ("__dict__", "__weakref__")}
    remade = type(cls.__name__, cls.__bases__[:at] + (inner,) + cls.__bases__[at + 1:], namespace)
    if at == 1:
        _REMADE_FSDP_CLASSES[cls, inner] = remade
    return remade


def _takes_one_tensor(forward) -> bool:
    """Whether ``forward(self, x)`` is all a forward takes: ours takes nothing more, so a module whose forward has
    other parameters (a residual, a mask, ``*args``) keeps its own."""
    try:
        params = list(inspect.signature(forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD)


def _transformers_rms_norm_rule(module: torch.nn.Module) -> bool | None:
    """_transformers_rms_norm's ``weight_in_float32`` for a module written like transformers' RMSNorms, or None to
    leave the module alone. Such a module is a class named ...RMSNorm with one 1-dim parameter, ``weight``, a float
    ``variance_epsilon``, no children and a forward of one tensor; which rule computes what its forward computes is
    found by running both on (2, 3, hidden) inputs: in dtype pairs where their rules give other dtypes (a bfloat16
    input beside a float32 weight and the converse), in the weight's own dtype, in float32 and float64, and in
    float32 at the scale where eps's place in the formula shows, in training and in eval mode. A look-alike with
    another formula (Gemma's (1 + weight); T5's, which casts to the weight's dtype; eps outside the square root;
    one that normalizes another dim or drops out in training), or one whose forward raises on such an input,
    matches neither and is left alone, as is one whose forward changes the module's state. The probe runs on a copy
    (its own weight, buffers, containers and training mode) and leaves the random streams where they were; a meta
    weight's module is probed on the CPU."""
    cls = type(module)
    params = dict(module.named_parameters(recurse=False))
    if not (cls.__name__.endswith("RMSNorm") and list(params) == ["weight"] and params["weight"].dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float) and not list(module.children())
            and not hasattr(cls, "_converted_forward") and _takes_one_tensor(cls.forward)):
        return None
    weight, eps = params["weight"], module.variance_epsilon
    device = weight.device if weight.device.type != "meta" else torch.device("cpu")
    generator = torch.Generator(device).manual_seed(0)
    probe = copy.copy(module)
    probe.__dict__.update({key: copy.copy(value) for key, value in vars(module).items()
                           if isinstance(value, (list, dict, set))})
    probe._buffers = {key: None if b is None else b.clone() for key, b in module._buffers.items()}
    eps_scale = min(max(math.sqrt(eps), 1e-4), 1e4) if eps > 0 else 1.0
    cases = dict.fromkeys([(weight.dtype, weight.dtype, 1.0), (weight.dtype, torch.float32, 1.0),
                           (torch.float32, torch.bfloat16, 1.0), (torch.bfloat16, torch.float32, 1.0),
                           (torch.float32, torch.float64, 1.0), (torch.float32, torch.float32, eps_scale)])
    candidates = [False, True]
    cuda_devices = [device] if device.type == "cuda" else []
    with torch.no_grad(), _autocast_off(device.type), torch.random.fork_rng(cuda_devices):
        for training in dict.fromkeys((module.training, not module.training)):
            probe.training = training
            for weight_dtype, dtype, scale in cases:
                probe._parameters = {"weight": torch.nn.Parameter(torch.randn(
                    weight.shape, dtype=weight_dtype, device=device, generator=generator), requires_grad=False)}
                x = scale * torch.randn(2, 3, weight.numel(), device=device, dtype=dtype, generator=generator)
                try:
                    theirs = cls.forward(probe, x)  # not module(x): its hooks are not for this probe
                except Exception:  # e.g. a norm over channels, (N, C, L): not this formula
                    return None
                candidates = [rule for rule in candidates if _agree(
                    _transformers_rms_norm(x, probe.weight, eps, rule), theirs, (weight_dtype, dtype))]
                if not candidates:
                    return None
    return None if _state_changed(probe, module) else candidates[0]


def _same(copied, original) -> bool:
    """An attribute as the probe's copy left it against the module's: a container (copied one level down) holds the
    same objects, anything else is the same object or an equal value."""
    if copied is original:
        return True
    if isinstance(original, dict):
        return copied.keys() == original.keys() and all(copied[k] is original[k] for k in original)
    if isinstance(original, list):
        return len(copied) == len(original) and all(a is b for a, b in zip(copied, original))
    try:
        return bool(copied == original)
    except Exception:  # a comparison that is no bool
        return False


def _state_changed(probe: torch.nn.Module, module: torch.nn.Module) -> bool:
    """Whether the probe's forward calls changed the copy's buffers or attributes (a call counter, a cache): a
    forward with effects of its own is not ours."""
    if vars(probe).keys() != vars(module).keys():
        return True
    for key, value in vars(module).items():
        if key not in ("_parameters", "_buffers", "training") and not _same(vars(probe)[key], value):
            return True
    return any(b is not None and b.device.type != "meta" and not torch.equal(probe._buffers[key], b)
               for key, b in module._buffers.items())


def _agree(ours: torch.Tensor, theirs, dtypes: tuple) -> bool:
    """``theirs`` has our shape and dtype, and our values within a few roundings of the coarsest dtype involved
    (float64 counts as float32, in which both normalize)."""
    if not (isinstance(theirs, torch.Tensor) and theirs.shape == ours.shape and theirs.dtype == ours.dtype):
        return False
    tol = 32 * max(torch.finfo(torch.float32 if d == torch.float64 else d).eps for d in dtypes + (ours.dtype,))
    return torch.allclose(theirs.double(), ours.double(), rtol=tol, atol=tol * theirs.abs().max().item())


def convert_layernorm(module: torch.nn.Module) -> torch.nn.Module:
    """Switch every torch.nn.LayerNorm inside ``module`` (``module`` itself included) to torch_reduce's kernels,
    in place, and return ``module``.

    Each module keeps its identity: only its class changes, so its Parameter objects (seen by optimizers,
    tied weights), hooks, buffers, attributes and training mode all stay. Subclasses with a forward of their
    own are left alone (see ``_converted_class``).
    """
    for child in module.modules():
        cls = _convert_beneath_torchs_classes(type(child),
                                              lambda c: _converted_class(c, torch.nn.LayerNorm, LayerNorm))
        if cls is not None:
            child.__class__ = cls
    return module


def convert_norms(module: torch.nn.Module) -> torch.nn.Module:
    """Switch every norm inside ``module`` (``module`` itself included) to torch_reduce's kernels, in place, and
    return ``module``: torch.nn.LayerNorm and torch.nn.RMSNorm (and their subclasses that keep torch's forward),
    and RMSNorm modules written the way transformers writes them (LlamaRMSNorm, Olmo2RMSNorm, Qwen2RMSNorm, ...:
    a ``weight`` and a ``variance_epsilon``; see ``_transformers_rms_norm_rule``). As convert_layernorm, each
    module keeps its identity, Parameter objects, hooks and attributes; only its class changes.
    """
    for child in module.modules():
        def converted(cls, child=child):
            return (_converted_class(cls, torch.nn.LayerNorm, LayerNorm)
                    or _converted_class(cls, torch.nn.RMSNorm, RMSNorm)
                    or (_subclass_with_forward(cls, _transformers_rms_norm_forward, _weight_in_float32=rule)
                        if (rule := _transformers_rms_norm_rule(child)) is not None else None))
        cls = _convert_beneath_torchs_classes(type(child), converted)
        if cls is not None:
            child.__class__ = cls
    return module
