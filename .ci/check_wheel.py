"""Checks a built torch_reduce wheel: ``python .ci/check_wheel.py dist/torch_reduce-*.whl`` (exit 1 on a problem).

Its tag is abi3 for CPython >= 3.10; it holds every module of the source package (subpackages included), _C,
the build record, py.typed and the LICENSE, and nothing else (no objects, caches, tests or sources); _C carries
no host debug info; its metadata requires exactly the torch _C was built against, and nothing else outside the
extras.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def problems(wheel: Path) -> list[str]:
    found = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        tags = re.findall(r"^Tag: (.+)$", z.read(f"{dist_info}/WHEEL").decode(), re.M)
        if not (tags and all(re.fullmatch(r"cp310-abi3-linux_\w+", tag) for tag in tags)):
            found.append(f"tags {tags}: expected cp310-abi3-linux_<arch>")
        if not wheel.name.endswith(f"-{tags[0]}.whl" if tags else ".whl"):
            found.append(f"file name {wheel.name} does not carry the tag {tags}")

        package = ROOT / "torch_reduce"
        wanted = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}
        wanted |= {"torch_reduce/py.typed", "torch_reduce/_C.abi3.so", "torch_reduce/_build_info.py",
                   f"{dist_info}/licenses/LICENSE"}
        found += [f"missing {name}" for name in sorted(wanted - names)]
        junk = [n for n in names - wanted
                if not n.startswith(f"{dist_info}/") or re.search(r"\.(so|o|pyc)$|__pycache__|\.ninja", n)]
        found += [f"unexpected {name}" for name in sorted(junk)]

        metadata = z.read(f"{dist_info}/METADATA").decode()
        build_info: dict = {}
        exec(z.read("torch_reduce/_build_info.py").decode(), build_info)
        torch_pin = f"torch=={build_info['TORCH_VERSION'].split('+')[0]}"
        requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
        unconditional = [r for r in requires if "extra ==" not in r]
        if [r.replace(" ", "") for r in unconditional] != [torch_pin]:
            found.append(f"requires {unconditional} outside the extras: expected [{torch_pin!r}] alone")
        for line in ("License-Expression: BSD-3-Clause", "Provides-Extra: test", "Provides-Extra: bench"):
            if not re.search(f"^{line}$", metadata, re.M):
                found.append(f"METADATA lacks {line!r}")

        with tempfile.TemporaryDirectory() as tmp:
            library = z.extract("torch_reduce/_C.abi3.so", tmp) if "torch_reduce/_C.abi3.so" in names else None
            if library:
                sections = subprocess.run(["readelf", "-S", "-W", library], capture_output=True, text=True,
                                          check=True).stdout
                debug = sorted(set(re.findall(r"\.debug_\w+", sections)))
                if debug:
                    found.append(f"_C carries host debug info: {debug}")
    return found


def main(wheel: str) -> int:
    path = Path(wheel)
    found = problems(path)
    for problem in found:
        print(f"wheel: {problem}", file=sys.stderr)
    print(f"wheel {path.name}: {path.stat().st_size / 2**20:.1f} MiB, {'FAILED' if found else 'ok'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
