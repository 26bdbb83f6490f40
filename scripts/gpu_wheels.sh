#!/usr/bin/env bash
# The wheels a GPU machine lacks and cannot fetch (no registry there), downloaded here
# into .whl/ (git ignores it) for the device tool to carry (`carry: [".whl"]`), where
# scripts/gpu_check.sh installs them. Today: NIXL (the nixl backend's GPU tests,
# tests/gpu/test_nixl_vram.py) for the image's Python 3.12 and CUDA 13. The CUDA-13
# build is about 59 MB of the 64 MiB a call may carry: carry nothing else beside it.
#
# usage: scripts/gpu_wheels.sh [PYTHON_VERSION] [CUDA_MAJOR]    (default 3.12 13)
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
CUDA="${2:-13}"
VERSION=$(sed -n 's/^nixl==//p' constraints.txt)
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
# the meta package (pure Python: it picks the CUDA build) and the build for that CUDA;
# their own needs (numpy; torch, which the GPU image has) are on the image already
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
    --implementation cp "${platforms[@]}" -d .whl "nixl==$VERSION" "nixl-cu$CUDA==$VERSION"
du -ch .whl/*.whl
