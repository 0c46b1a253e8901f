"""torch.nn.LayerNorm and torch.nn.RMSNorm on the fused kernels, and converters for whole models."""
from __future__ import annotations

import copy
import inspect
import sys

import torch
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

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # as LayerNorm's
            return torch.ops.reduce.rms_norm_fwd(input, self.normalized_shape, _rms_weight(input, self.weight),
                                                 self.eps)[0]
        return rms_norm(input, self.normalized_shape, self.weight, self.eps)


def _transformers_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """The forward of transformers' RMSNorm modules (LlamaRMSNorm and its copies): normalize in float32, cast
    back to the input's dtype, then multiply by the weight, so the result has promote(weight, input)'s dtype.
    That is one fused call where weight and input share a dtype; else the normalization is fused and the
    product is torch's, as there. Autocast does not touch their forward (no op in it casts), so it is off
    for ours too. TorchScript cannot switch autocast off (it wants the device as a constant), so a scripted
    model holding such a module raises when the module runs."""
    if torch.jit.is_scripting():
        raise RuntimeError("torch_reduce: a converted transformers-style RMSNorm does not run under TorchScript (it "
                           "switches autocast off, which TorchScript cannot); script the unconverted model")
    weight = self.weight
    shape = hidden_states.shape[-1:]
    with torch.autocast(hidden_states.device.type, enabled=False):
        if weight.dtype == hidden_states.dtype:
            return rms_norm(hidden_states, shape, weight, self.variance_epsilon)
        return weight * rms_norm(hidden_states, shape, None, self.variance_epsilon)


_CONVERTED_SUBCLASSES: dict[type, type] = {}
_REMADE_FSDP_CLASSES: dict[tuple[type, type], type] = {}  # (FSDP's class, the converted class beneath it)
# The forwards a converted subclass may have, by the name its pickles give them.
_FORWARDS = {"layer_norm": LayerNorm.forward, "rms_norm": RMSNorm.forward,
             "transformers_rms_norm": _transformers_rms_norm_forward}


def _new_converted(cls: type, forward: str) -> torch.nn.Module:
    """An empty instance of ``cls``'s converted subclass with that forward: what a pickle of a converted module is
    loaded into (pickle then sets its state), in any process, since the subclass is made again if need be."""
    converted = _subclass_with_forward(cls, _FORWARDS[forward])
    return converted.__new__(converted)


def _reduce_converted(self, protocol):
    """Pickles (torch.save, deepcopy, multiprocessing) a module of a converted subclass as its original class
    and forward's name: pickle finds a class by its module and name, which here lead to the original class."""
    cls = type(self)
    _, _, *rest = object.__reduce_ex__(self, protocol)  # (copyreg.__newobj__, (cls,), state, None, None)
    return (_new_converted, (cls._converted_from, cls._converted_forward), *rest)


def _subclass_with_forward(cls: type, forward) -> type:
    """A subclass of ``cls`` that differs in its forward alone (its methods, name and isinstance kept)."""
    if cls not in _CONVERTED_SUBCLASSES:
        name = next(key for key, f in _FORWARDS.items() if f is forward)
        _CONVERTED_SUBCLASSES[cls] = type(cls.__name__, (cls,), {
            "forward": forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__reduce_ex__": _reduce_converted, "_converted_from": cls, "_converted_forward": name})
    return _CONVERTED_SUBCLASSES[cls]


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


def _is_transformers_rms_norm(module: torch.nn.Module) -> bool:
    """A module written like transformers' LlamaRMSNorm: a class named ...RMSNorm with one 1-dim parameter,
    ``weight``, a float ``variance_epsilon``, no children, a forward of one tensor, and that forward computing what
    _transformers_rms_norm_forward computes (checked on a (2, 3, hidden) input in the weight's dtype and in float32,
    so that a look-alike with another formula, such as Gemma's (1 + weight), or one that normalizes another dim, is
    left alone, and so is one whose forward raises on it; a meta weight's module is checked on a copy with a random
    CPU weight)."""
    cls = type(module)
    params = dict(module.named_parameters(recurse=False))
    if not (cls.__name__.endswith("RMSNorm") and list(params) == ["weight"] and params["weight"].dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float) and not list(module.children())
            and cls.forward is not _transformers_rms_norm_forward and _takes_one_tensor(cls.forward)):
        return False
    weight = params["weight"]
    # A generator of its own: converting a model leaves the caller's random stream where it was.
    generator = torch.Generator(weight.device if weight.device.type != "meta" else "cpu").manual_seed(0)
    if weight.device.type == "meta":  # a model built on the meta device, materialized later: probe a CPU stand-in
        module = copy.copy(module)
        module._parameters = {"weight": torch.nn.Parameter(
            torch.randn(weight.shape, dtype=weight.dtype, generator=generator), requires_grad=False)}
        weight = module.weight
    with torch.no_grad(), torch.autocast(weight.device.type, enabled=False):
        for dtype in dict.fromkeys((weight.dtype, torch.float32)):
            x = torch.randn(2, 3, weight.numel(), device=weight.device, dtype=dtype, generator=generator)
            try:
                theirs = cls.forward(module, x)  # not module(x): its hooks are not for this probe
            except Exception:  # e.g. a norm over channels, (N, C, L): not this formula
                return False
            ours = _transformers_rms_norm_forward(module, x)
            if (not isinstance(theirs, torch.Tensor) or theirs.shape != ours.shape or theirs.dtype != ours.dtype
                    or not torch.allclose(theirs.float(), ours.float(), rtol=2e-2, atol=1e-2)):
                return False
    return True


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
    and RMSNorm modules written the way transformers writes them (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, ...:
    a ``weight`` and a ``variance_epsilon``; see ``_is_transformers_rms_norm``). As convert_layernorm, each module
    keeps its identity, Parameter objects, hooks and attributes; only its class changes.
    """
    for child in module.modules():
        def converted(cls, child=child):
            return (_converted_class(cls, torch.nn.LayerNorm, LayerNorm)
                    or _converted_class(cls, torch.nn.RMSNorm, RMSNorm)
                    or (_subclass_with_forward(cls, _transformers_rms_norm_forward)
                        if _is_transformers_rms_norm(child) else None))
        cls = _convert_beneath_torchs_classes(type(child), converted)
        if cls is not None:
            child.__class__ = cls
    return module
