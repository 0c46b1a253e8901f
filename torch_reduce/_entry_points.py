"""The C entry points of the drop-ins (csrc/fast_call.cpp): ``install(wrappers)`` hands each Python wrapper to
its entry point, which parses the common call itself and calls the wrapper for every other; torch.compile traces
the wrapper in the entry point's place."""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from . import _C
from ._after_import import after_import

# Read directly by the entry points: neither has a __torch_function__ of its own.
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _is_literal(default) -> bool:
    return default is inspect.Parameter.empty or isinstance(default, (type(None), bool, int, float, str))


class _NotGiven:
    def __repr__(self) -> str:
        return "<not given>"


def docstring(wrapper: Callable) -> str:
    """The wrapper's signature and docstring. A signature whose defaults are all literals becomes the builtin's
    text signature (read by inspect.signature); one with a sentinel default (var_mean's "not given") is shown as
    the doc's first line alone, as torch's builtins show theirs."""
    signature = inspect.signature(wrapper)
    parameters = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    bare = signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)
    if all(_is_literal(p.default) for p in parameters):
        return f"{wrapper.__name__}{bare}\n--\n\n{wrapper.__doc__}"
    shown = str(bare.replace(parameters=[p if _is_literal(p.default) else p.replace(default=_NotGiven())
                                         for p in parameters]))
    return f"{wrapper.__name__}{shown}\n\n{wrapper.__doc__}"


def setup(wrappers: dict[str, Callable]) -> None:
    """Sets the entry points' wrappers (and docstrings), by name."""
    _C._fast_call_setup(PLAIN_TENSOR_TYPES, {name: (w, docstring(w)) for name, w in wrappers.items()})


def install(wrappers: dict[str, Callable]) -> dict[str, Callable]:
    """The entry points of these wrappers, keyed by name, set up and known to torch.compile (once TorchDynamo is
    imported: importing it takes a second, and it imports DTensor)."""
    setup(wrappers)
    entries = {name: getattr(_C, name) for name in wrappers}

    def substitute():
        for name, wrapper in wrappers.items():
            torch.compiler.substitute_in_graph(entries[name], skip_signature_check=True)(wrapper)

    after_import("torch._dynamo", substitute)
    return entries
