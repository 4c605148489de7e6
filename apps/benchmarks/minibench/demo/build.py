"""Build the minibench `demo` profile: the `ci` build with a reference that trains in minutes.

    python -m apps.benchmarks.minibench.demo OUT_DIR [--seed 0] [--verbose]

What a newcomer's first ``./dev demo`` builds (issue 36, item 8: a finished run within ten
minutes). Everything but the reference is the `ci` profile's, from the same seed: the tokenizer,
θ0, the sealed arithmetic splits and the datapool catalog (traps and honeypot included). The
reference is still a real trained one — θ0 post-trained on the clean catalog set with the
known-good recipe's learning rate, warm-up and cosine schedule — only on half the batch for
half the steps at a higher rate (``DEMO_REFERENCE_HPARAMS``): a quarter of the `ci` reference's compute. It
learns the task (measured in docs/benchmarks.md, "The first ten minutes"), so the integrity
checks and the final evaluation compare against a model that has learnt it, as in every build.

The layout is the minibench's (manifest.json last), so ``minibench_install`` registers it; the
manifest's ``namespace`` ("minibench-demo") keeps its θ0, reference and benchmark apart from a
`ci` build's in the same database: the two references differ, so the handles must too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from apps.ml.hparams import validate_train_config

from .. import build as base
from ..catalog import build_task_data, dataset_card
from ..model import parameter_count, pretrain_theta0, save_checkpoint
from ..task_specs import SIDES, TASKS
from ..tokenizer import train_tokenizer

NAMESPACE = "minibench-demo"
PROFILE = "demo"
DATA_PROFILE = "ci"  # the sealed splits and the catalog are the ci profile's
TASK = "arithmetic"
# The known-good recipe (base.REFERENCE_HPARAMS: lr 1e-3, 1,000 cosine steps of 64) scaled to a demo:
# 500 steps of 32 (a quarter of the examples) at three times the learning rate. Measured on this
# build: 300 steps of 32 at 2e-3 stay before the task's learning transition (0.08 on the feedback
# split), so the schedule must carry as much learning rate as the ci recipe's first 500 steps.
DEMO_REFERENCE_HPARAMS: dict[str, Any] = {
    **base.REFERENCE_HPARAMS,
    "learning_rate": 3e-3,
    "max_steps": 500,
    "batch_size": 32,
}


def demo_source_digest() -> str:
    """sha256 over the base builder's digest and this subpackage's code: the demo build's identity."""
    digest = hashlib.sha256(base.source_digest().encode())
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_demo(out_dir: Path, *, seed: int = 0, verbose: bool = False) -> dict[str, Any]:
    """Build the demo profile into `out_dir` (absent or empty); return the manifest."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    data = {TASK: build_task_data(TASKS[TASK], seed=seed, profile=DATA_PROFILE)}
    tokenizer = train_tokenizer(base._tokenizer_corpus(data, seed))
    torch.set_num_threads(1)  # see base.build_minibench: one thread wins on a small shared CPU
    theta0 = pretrain_theta0(tokenizer, seed=seed)
    save_checkpoint(theta0, tokenizer, out_dir / "theta0")
    base._finish_tokenizer_files(out_dir / "theta0")

    task_data = data[TASK]
    task_dir = out_dir / "tasks" / TASK
    task_dir.mkdir(parents=True)
    base._write_json(task_dir / "task.json", TASKS[TASK].task_json())
    base._write_jsonl(task_dir / "feedback.jsonl", task_data.feedback)
    base._write_jsonl(task_dir / "final.jsonl", task_data.final)
    for ds in task_data.datasets:
        ds_dir = out_dir / "catalog" / ds.name
        ds_dir.mkdir(parents=True)
        base._write_json(ds_dir / "meta.json", ds.meta())
        (ds_dir / "README.md").write_text(dataset_card(ds), encoding="utf-8")
        base._write_jsonl(ds_dir / "data.jsonl", ds.rows)

    from apps.ml.training import TrainHooks, train  # noqa: PLC0415 - heavy (TRL), only here

    hparams = {**DEMO_REFERENCE_HPARAMS, "seed": seed, "num_threads": 1}
    (out_dir / "references").mkdir()
    result = train(
        validate_train_config(hparams),
        base_dir=out_dir / "theta0",
        data_files=[out_dir / "catalog" / f"{TASK}-clean" / "data.jsonl"],
        out_dir=out_dir / "references" / TASK,
        # The lines build_progress follows for the bar ("[task] step N loss L").
        hooks=TrainHooks(on_log=lambda step, m: base._print_log(TASK, step, m)) if verbose else None,
    )
    manifest: dict[str, Any] = {
        "version": base.MANIFEST_VERSION,
        "namespace": NAMESPACE,
        "seed": seed,
        "profile": PROFILE,
        "source_digest": demo_source_digest(),
        "tasks": [TASK],
        "datasets": [ds.name for ds in task_data.datasets],
        "templates": {TASK: {side: list(TASKS[TASK].forms[side]) for side in SIDES}},
        "theta0": "theta0",
        "references": {TASK: f"references/{TASK}"},
        "theta0_params": parameter_count(theta0),
        "vocab_size": len(tokenizer),
        "reference_training": [{"task": TASK, "hparams": hparams, "steps": result.steps,
                                "final_loss": result.final_loss, "seconds": round(result.seconds, 1)}],
        "build_seconds": round(time.monotonic() - started, 1),
    }  # fmt: skip
    base._write_json(out_dir / "manifest.json", manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the minibench demo profile.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print the reference's training log")
    args = parser.parse_args(argv)
    manifest = build_demo(args.out_dir, seed=args.seed, verbose=args.verbose)
    print(json.dumps({k: manifest[k] for k in ("source_digest", "tasks", "build_seconds")}))  # noqa: T201


if __name__ == "__main__":
    main()
