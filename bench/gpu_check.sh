#!/usr/bin/env bash
# The GPU check, for a CUDA host like the one the project is sometimes lent (Python 3.12, torch
# 2.11, transformers 5.17 and peft present; no trl, datasets or vLLM; no network). Never needed by CI.
#   here, with network:  bash bench/gpu_prepare.sh      (fills var/gpu-check/: wheels + minibench)
#   on the GPU host:     bash bench/gpu_check.sh        (train with TRL on CUDA, evaluate, samples/s)
#   here, to check it:   bash bench/gpu_check.sh --device cpu
# Finishes in well under 5 minutes (9 with the multi-device case); says plainly that the vLLM step
# cannot run there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# 5 minutes on the GPU host; the CPU dry path on a loaded 2-core machine gets 10.
limit=290
case " $* " in *" --device cpu "*) limit=600 ;; esac
timeout "$limit" "$PY" bench/gpu_check.py "$@"
# The multi-device case (issue 37): 2 ranks of the tiny model under Accelerate's launcher (DDP over
# NCCL), against 1. Skipped with the reason printed on a host with fewer than 2 CUDA devices.
case " $* " in
  *" --device cpu "*) echo "multi-device case skipped: --device cpu (the CPU path is CI's tests/apps/ml/test_launch.py)" ;;
  # trl and datasets from the luggage gpu_check.py installed (var/gpu-check/site), for the ranks too.
  *) PYTHONPATH="$PWD/var/gpu-check/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 \
       timeout 240 "$PY" bench/multi_device.py --devices 2 --require-devices --steps 20 ;;
esac
