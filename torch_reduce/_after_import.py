"""``after_import(name, callback)``: callback() right after the module ``name`` is imported (at once if it already
is). What registers with a part of torch that takes seconds to import (DTensor's sharding rules, TorchDynamo's
substitutes for the C entry points) waits for the program to import that part: ``import torch_reduce`` does not."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

_CALLBACKS: dict[str, list[Callable[[], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path while a callback waits: hands out the usual finders' spec for a waited-for module,
    its loader running the callbacks once the module has run."""

    def find_spec(self, fullname, path, target=None):
        callbacks = _CALLBACKS.pop(fullname, None)
        if callbacks is None:
            return None
        if not _CALLBACKS:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the spec the usual finders give
        load = spec.loader.exec_module

        def load_then_call_back(module):
            load(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = load_then_call_back  # this spec's own loader object
        return spec


_FINDER = _Finder()


def after_import(name: str, callback: Callable[[], None]) -> None:
    if name in sys.modules:
        callback()
        return
    _CALLBACKS.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
