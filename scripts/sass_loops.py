"""The SASS of the CUDA kernels whose demangled names match a pattern, without a GPU: each kernel's instruction
count, its loops (backward branches: start, end, length) and the opcode counts of its longest loop, which is a row
kernel's row loop. Instructions a row beside a measured time say how much of a kernel is issue: the LayerNorm
backward's bfloat16 shared-memory row kernel (2 vectors a thread) issues 522 instructions a row, RMSNorm's 399, 86
of the difference FADDs, and LayerNorm's takes 1.15x RMSNorm's time (16384x4096 on the H200: 125.4 against 109.5 us,
benchmarks/results/nvidia-h200/layernorm_bwd_variants.md).

Reads an object file of the build (build/temp.*/csrc/cuda/NAME.o: seconds) or the extension (torch_reduce/_C.abi3.so:
every kernel, about 100 s). Needs cuobjdump and nvdisasm: on PATH, in CUDA_HOME/bin, or from the `sass` extra
(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm).

    python3 scripts/sass_loops.py 'row_norm_bwd_rows_kernel<HopperTuning, \\(RowNorm\\)0, 0u, 0u, 2, 1, 2, 1' \\
        build/temp.linux-x86_64-cpython-311/csrc/cuda/layer_norm_bwd.o [--dump]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:`\(\.L_x_\d+\)|(0x[0-9a-f]+))")
NAMESPACES = re.compile(r"torch_reduce::(cuda::)?(\(anonymous namespace\)::)?")


def tool_dirs() -> list[str]:
    """Where cuobjdump and nvdisasm may be: PATH, the CUDA toolkit, the NVIDIA wheels' bin directories."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    dirs += [os.path.join(home, "bin") for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if home]
    dirs += [str(p / "nvidia" / "cu13" / "bin") for p in map(Path, sys.path) if p.is_dir()]  # the sass extra's
    return dirs


def find_tool(name: str) -> str:
    path = shutil.which(name, path=os.pathsep.join(tool_dirs()))
    if path is None:
        raise SystemExit(f"{name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (the sass extra)")
    return path


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass text -> {mangled name: [(address, instruction)]}."""
    out, current = {}, None
    for line in sass.splitlines():
        if "Function : " in line:
            current = out.setdefault(line.split("Function : ", 1)[1].strip(), [])
        elif current is not None and (m := INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(instruction: str) -> str:
    """The opcode without predicate and modifiers: '@!P0 LDG.E.128 R4, [R2]' -> 'LDG'."""
    words = instruction.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def loops(code: list[tuple[int, str]]) -> list[tuple[int, int, int]]:
    """(start, end, instructions) of each backward branch's range, in address order."""
    found = []
    for address, instruction in code:
        m = BRANCH.search(instruction)
        if m and m.group(1) and int(m.group(1), 16) < address:  # not the branch to itself after EXIT
            start = int(m.group(1), 16)
            found.append((start, address, sum(1 for a, _ in code if start <= a <= address)))
    return found


def demangle(names: list[str]) -> list[str]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        return names
    done = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=True)
    return [NAMESPACES.sub("", name) for name in done.stdout.splitlines()]


def report(name: str, code: list[tuple[int, str]]) -> str:
    lines = [name, f"  instructions {len(code)}"]
    found = loops(code)
    for start, end, length in found:
        lines.append(f"  loop {start:#06x}..{end:#06x}: {length} instructions")
    if found:
        start, end, length = max(found, key=lambda loop: loop[2])
        counts = collections.Counter(opcode(i) for a, i in code if start <= a <= end)
        lines.append("  longest loop: " + ", ".join(f"{op} {n}" for op, n in counts.most_common()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pattern", help="a regular expression searched in the demangled kernel names")
    parser.add_argument("file", nargs="?", default="torch_reduce/_C.abi3.so", help="an object file, cubin or .so")
    parser.add_argument("--dump", action="store_true", help="print the matching kernels' SASS too")
    args = parser.parse_args(argv)
    nvdisasm = find_tool("nvdisasm")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(nvdisasm), os.environ.get("PATH", "")]))
    done = subprocess.run([find_tool("cuobjdump"), "-sass", args.file], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return done.returncode
    found = functions(done.stdout)
    matched = [(name, code) for name, code in zip(demangle(list(found)), found.values())
               if re.search(args.pattern, name)]
    for name, code in matched:
        print(report(name, code))
        if args.dump:
            print("\n".join(f"  {address:#06x}  {instruction}" for address, instruction in code))
    print(f"{len(matched)} of {len(found)} kernels matched")
    return 0 if matched else 1


if __name__ == "__main__":
    sys.exit(main())
