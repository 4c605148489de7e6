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
# Only what the lent CUDA image lacks (its package list: the device tool's KINDS.md, 2026-11-17,
# which has pandas, pyarrow, accelerate, huggingface-hub, hf-xet, psutil, python-dateutil, six and
# xxhash): trl and datasets with the few dependencies of theirs it does not hold, at the project's
# own pins (pyproject.toml). fsspec and huggingface-hub have a range the check needs
# (gpu_check.NEEDS): fsspec is small and carried for a host whose version is outside it; a host
# with huggingface-hub outside it is told so by the check. pyarrow (49 MB) and pandas (12 MB) were
# 61 of the 74 MB this carried before, over the 64 MiB a device run takes with the tree.
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$OUT/wheels" \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    trl==1.16.0 datasets==5.2.0 fsspec==2026.9.0 dill==0.4.0 multiprocess==0.70.18 \
    pytz==2025.2 tzdata==2025.2 2>&1 | grep -v '^WARNING: Location' || true
cp -r "$MB/theta0" "$OUT/minibench/theta0"
cp -r "$MB/tasks" "$OUT/minibench/tasks"
cp -r "$MB/catalog/arithmetic-clean" "$OUT/minibench/catalog/arithmetic-clean"
cp "$MB/manifest.json" "$OUT/minibench/manifest.json"
du -sh "$OUT/wheels" "$OUT/minibench"
# What a device run carries: the tracked tree plus this folder (carry: var/gpu-check), 64 MiB at most.
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
luggage=$(du -sb "$OUT" | cut -f1)
echo "tree $((tree / 1048576)) MiB + luggage $((luggage / 1048576)) MiB = $(((tree + luggage) / 1048576)) MiB of 64"
[ $((tree + luggage)) -le $((64 * 1048576)) ] || { echo "over the 64 MiB a device run carries" >&2; exit 1; }
