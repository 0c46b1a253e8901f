#!/usr/bin/env bash
# Builds torch_reduce._C on a CPU machine for the GPU machine, so that a GPU call spends no time compiling (the
# build took 180 s of each call on the H200 machine): against the GPU machine's torch (TORCH_VERSION, default
# 2.11.0, the wheel for this machine's Python: _C is abi3, so one build serves the GPU machine's Python too) and
# for its GPU alone (TORCH_CUDA_ARCH_LIST, default 9.0). nvcc is needed, no GPU. The build runs in a mirror of the
# tracked files (their working-tree versions), kept between calls, so a second call recompiles what changed; it
# leaves _C.abi3.so and _build_info.py in .prebuilt/ (git-ignored), with the commit and a hash of the diff built.
# On the GPU machine, carry .prebuilt and pass --prebuilt to scripts/gpu_check.sh (it builds there after all if
# the carried extension does not load).
#
#   scripts/prebuild_for_gpu.sh          # about 10 minutes on 2 cores from scratch (the CUDA files dominate)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
CACHE=${TORCH_REDUCE_PREBUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_reduce-prebuild}
SITE=$CACHE/torch-$TORCH_VERSION
MIRROR=$CACHE/tree
mkdir -p "$CACHE" "$MIRROR"
if [ ! -d "$SITE/torch" ]; then
  # torch alone: its Python dependencies and CUDA libraries are this machine's (import only reads the headers'
  # version and links nothing here).
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$CACHE/wheels" "torch==$TORCH_VERSION"
  python3 -m pip install -q --no-deps --no-compile --target "$SITE" "$CACHE"/wheels/torch-"$TORCH_VERSION"-*.whl
fi
# cp -u: only files newer than the mirror's copy, so ninja rebuilds only what changed.
git ls-files -z | xargs -0 cp -u --parents -t "$MIRROR/"
(cd "$MIRROR" && PYTHONPATH="$SITE" TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  python3 setup.py -q build_ext --inplace)
# From the mirror, so that its torch_reduce (with _C) is the one imported, not a source tree without a build.
(cd "$MIRROR" && PYTHONPATH="$SITE" python3 -c "import torch, torch_reduce; print('built against torch', torch.__version__)")
rm -rf .prebuilt && mkdir -p .prebuilt
cp "$MIRROR/torch_reduce/_C.abi3.so" "$MIRROR/torch_reduce/_build_info.py" .prebuilt/
git rev-parse HEAD >.prebuilt/HEAD
git diff HEAD | sha1sum >.prebuilt/diff
echo "$ROOT/.prebuilt: $(du -h .prebuilt/_C.abi3.so | cut -f1) (carry .prebuilt, then scripts/gpu_check.sh --prebuilt ...)"
