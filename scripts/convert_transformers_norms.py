"""convert_norms over every RMSNorm class of the installed transformers: which it converts, with which dtype rule
(Llama's or Olmo2's), and whether each converted module gives the unconverted one's dtype and values in every
(weight, input) pair of float32, bfloat16, float16 and float64 (within 4 roundings of the coarsest dtype; float64
counts as float32, in which both normalize) and its float32 gradients. CPU; about 3 minutes.

    python scripts/convert_transformers_norms.py [--hidden 16]
"""
import argparse
import collections
import copy
import importlib
import pkgutil
import warnings

import torch
import transformers.models

from torch_reduce.nn import convert_norms

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def rms_norm_classes():
    """Every class named ...RMSNorm defined in a transformers modeling module that imports here."""
    classes, unimportable = {}, []
    for package in pkgutil.iter_modules(transformers.models.__path__):
        try:
            models = importlib.import_module(f"transformers.models.{package.name}")
        except Exception:  # noqa: BLE001  (an optional dependency missing)
            unimportable.append(package.name)
            continue
        for module in pkgutil.iter_modules(getattr(models, "__path__", [])):
            if not module.name.startswith("modeling_"):
                continue
            name = f"{models.__name__}.{module.name}"
            try:
                found = vars(importlib.import_module(name))
            except Exception:  # noqa: BLE001
                unimportable.append(name)
                continue
            classes.update({f"{name}.{key}": cls for key, cls in found.items()
                            if key.endswith("RMSNorm") and isinstance(cls, type)
                            and issubclass(cls, torch.nn.Module) and cls.__module__ == name})
    return classes, unimportable


def build(cls, hidden):
    for args, kwargs in (((hidden,), {"eps": 1e-6}), ((hidden,), {}), ((hidden, 1e-6), {})):
        try:
            return cls(*args, **kwargs)
        except Exception:  # noqa: BLE001  (another constructor: a config)
            pass
    return None


def differences(module, converted, hidden):
    """(weight dtype, input dtype, what) wherever the converted module is not the module."""
    found = []
    for weight_dtype in DTYPES:
        for dtype in DTYPES:
            theirs, ours = copy.deepcopy(module).to(weight_dtype), copy.deepcopy(converted).to(weight_dtype)
            x = torch.randn(2, 3, hidden, dtype=dtype)
            results = []
            for norm in (theirs, ours):
                try:
                    results.append(norm(x))
                except Exception as error:  # noqa: BLE001  (compared below: the same error type, or a difference)
                    results.append(error)
            want, got = results
            if isinstance(want, Exception) or isinstance(got, Exception):
                if type(want) is not type(got):
                    found.append((weight_dtype, dtype, f"{want!r:.60} / {got!r:.60}"))
            elif want.dtype != got.dtype:
                found.append((weight_dtype, dtype, f"dtype {want.dtype} / {got.dtype}"))
            else:
                tol = 4 * max(torch.finfo(torch.float32 if d == torch.float64 else d).eps
                              for d in (weight_dtype, dtype, want.dtype))
                if not torch.allclose(want.double(), got.double(), rtol=tol, atol=tol):
                    found.append((weight_dtype, dtype, f"values {(want.double() - got.double()).abs().max():.2e}"))
    theirs, ours = copy.deepcopy(module).float(), copy.deepcopy(converted).float()
    x, dy = torch.randn(2, 3, hidden, requires_grad=True), torch.randn(2, 3, hidden)
    for want, got, what in zip(torch.autograd.grad(theirs(x), (x, theirs.weight), dy),
                               torch.autograd.grad(ours(x), (x, ours.weight), dy), ("input", "weight")):
        if not torch.allclose(want, got, rtol=1e-5, atol=1e-5):
            found.append((torch.float32, torch.float32, f"{what} gradient {(want - got).abs().max():.2e}"))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=16)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    classes, unimportable = rms_norm_classes()
    outcomes = collections.Counter()
    for name, cls in sorted(classes.items()):
        module = build(cls, args.hidden)
        if module is None:
            outcomes["not built (needs a config)"] += 1
            print(f"not built  {name}")
            continue
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn_like(p) * 0.5 + 1)
        converted = convert_norms(copy.deepcopy(module))
        if type(converted) is type(module):
            outcomes["left alone"] += 1
            print(f"left alone {name}")
            continue
        rule = "Olmo2" if type(converted)._weight_in_float32 else "Llama"
        found = differences(module, converted, args.hidden)
        outcomes[f"{rule}'s rule" + (", DIFFERS" if found else "")] += 1
        print(f"{rule:10} {name}" + "".join(f"\n    DIFFERS {w} weight, {x} input: {what}" for w, x, what in found))
    print(f"\n{len(classes)} classes ({len(unimportable)} modules not importable here: {unimportable}): "
          + ", ".join(f"{count} {outcome}" for outcome, count in outcomes.items()))


if __name__ == "__main__":
    main()
