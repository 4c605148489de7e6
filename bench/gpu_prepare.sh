#!/usr/bin/env bash
# Prepare bench/gpu_check.sh's luggage, here (with network), into var/gpu-check/ (git-ignored; it
# travels with the repo to the GPU host, under the ~64 MiB that a device run carries):
#   wheels/     trl + datasets and the dependencies a CUDA host with torch 2.11, transformers 5.17 and
#               peft may lack, as CPython 3.12 manylinux wheels (pip download --no-deps, exact pins)
#   minibench/  θ0, the arithmetic task and its clean catalog data from the built ci minibench
# usage: bash bench/gpu_prepare.sh [MINIBENCH_DIR]   (default: $RSI_MINIBENCH_CACHE or var/test-cache/minibench)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=var/gpu-check
MB=${1:-${RSI_MINIBENCH_CACHE:-var/test-cache/minibench}}
[ -f "$MB/manifest.json" ] || { echo "no built minibench at $MB (run a test of tests/apps/ml first)" >&2; exit 2; }
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
rm -rf "$OUT" && mkdir -p "$OUT/wheels" "$OUT/minibench/catalog"
# The project's own pins where it has them (pyproject.toml); the rest, versions that support
# Python 3.12 and agree with transformers 5.17 (huggingface-hub<2).
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$OUT/wheels" \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    trl==1.16.0 datasets==5.2.0 accelerate==1.15.0 fsspec==2026.9.0 \
    pyarrow==24.0.0 pandas==2.3.3 dill==0.4.0 multiprocess==0.70.18 xxhash==3.6.0 \
    python-dateutil==2.9.0.post0 pytz==2025.2 tzdata==2025.2 six==1.17.0 psutil==7.1.0 \
    "huggingface-hub==1.31.0" hf-xet==1.2.0 2>&1 | grep -v '^WARNING: Location' || true
cp -r "$MB/theta0" "$OUT/minibench/theta0"
cp -r "$MB/tasks" "$OUT/minibench/tasks"
cp -r "$MB/catalog/arithmetic-clean" "$OUT/minibench/catalog/arithmetic-clean"
cp "$MB/manifest.json" "$OUT/minibench/manifest.json"
du -sh "$OUT/wheels" "$OUT/minibench" "$OUT"
