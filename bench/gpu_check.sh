#!/usr/bin/env bash
# The GPU check, for a CUDA host like the one the project is sometimes lent (Python 3.12, torch
# 2.11, transformers 5.17 and peft present; no trl, datasets or vLLM; no network). Never needed by CI.
#   here, with network:  bash bench/gpu_prepare.sh      (fills var/gpu-check/: wheels + minibench)
#   on the GPU host:     bash bench/gpu_check.sh        (train with TRL on CUDA, evaluate, samples/s)
#   here, to check it:   bash bench/gpu_check.sh --device cpu
# Finishes in well under 5 minutes; says plainly that the vLLM step cannot run there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# 5 minutes on the GPU host; the CPU dry path on a loaded 2-core machine gets 10.
limit=290
case " $* " in *" --device cpu "*) limit=600 ;; esac
exec timeout "$limit" "$PY" bench/gpu_check.py "$@"
