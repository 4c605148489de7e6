"""Build the minibench directory: tokenizer, θ0, sealed task splits, catalog and references.

    python -m apps.benchmarks.minibench OUT_DIR [--seed 0] [--profile full|ci] [--verbose]

The layout is a contract that the benchmark registry, the datapool and the tests read:

    manifest.json                       written last: its presence means the build is complete
    theta0/                             HF checkpoint (safetensors) + tokenizer files
    tasks/<task>/{task.json,feedback.jsonl,final.jsonl}
    references/<task>/                  θ0 post-trained with the known-good recipe
    catalog/<dataset>/{meta.json,README.md,data.jsonl}

Version 2 (minibench v2): sealed splits and catalog data are written in disjoint template
families and share no salient content (see task_specs.Item.key), over wider vocabularies; θ0 has
8 heads of 32 dims (vLLM's CPU build serves head_dim 32, not 16) and a 1,024-token vocabulary.
The generated task variants (variants.py, `build_task_variants`) are not part of a build: they
are a pure function of the seed, generated on demand, so editing them rebuilds no cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from apps.ml.hparams import validate_train_config

from .catalog import TaskData, build_task_data, dataset_card
from .model import parameter_count, pretrain_theta0, save_checkpoint
from .task_specs import SIDES, TASKS, noise_text
from .tokenizer import train_tokenizer

MANIFEST_VERSION = 2
PROFILES = ("full", "ci")
# The ci profile builds one task so the whole ML test session fits in a few CPU minutes.
CI_TASKS = ("arithmetic",)

# The known-good recipe. Measured on ci arithmetic (1,000-step cosine): 0.10 exact match at step 250,
# 0.97 at 500, 1.0 at 750. Learning is a sharp transition: the same recipe with a 500-step cosine
# schedule ends at 0.14, so the ci profile trains its reference just as long.
REFERENCE_HPARAMS: dict[str, Any] = {
    "recipe": "sft",
    "learning_rate": 1e-3,
    "max_steps": 1000,
    "batch_size": 64,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 20,
}
_SUMMARY_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "vocab_size",
)


def source_digest() -> str:
    """sha256 over the code a build depends on: this package, the training core and its config.

    Recorded in the manifest so that a cached build made by older code can be recognised as stale.
    Inference is left out on purpose: the build never evaluates, so an evaluation change must not
    force a rebuild of every cache.
    """
    package = Path(__file__).resolve().parent
    apps_dir = package.parents[1]
    # variants.py is generated on demand, never written by a build (see the module docstring).
    files = sorted(p for p in package.glob("*.py") if p.name != "variants.py") + [
        apps_dir / "ml" / "__init__.py",
        apps_dir / "ml" / "checkpoints.py",
        apps_dir / "ml" / "training.py",
        apps_dir / "ml" / "hparams.py",
        apps_dir / "ml" / "row_format.py",  # the fields by name that training reads
    ]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(apps_dir).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _tokenizer_corpus(data: dict[str, TaskData], seed: int) -> list[str]:
    """Every string the build writes, so no character of any dataset maps to <unk>."""
    corpus: list[str] = []
    for task_data in data.values():
        for row in task_data.feedback + task_data.final:
            corpus += [row["prompt"], row["answer"]]
        for ds in task_data.datasets:
            for data_row in ds.rows:
                corpus += list(data_row.values())
    rng = random.Random(f"minibench:{seed}:tokenizer")  # noqa: S311 - seeded data, not crypto
    corpus += [noise_text(rng, 512) for _ in range(64)]
    # Templates and the chat template's role names are rendered at inference time.
    corpus += [spec.prompt_template for spec in TASKS.values()] + ["System: User: Assistant:"]
    return corpus


def _finish_tokenizer_files(checkpoint: Path) -> None:
    """Make the tokenizer files loadable by older transformers too (e.g. inside a vLLM image).

    transformers 5 names the class `TokenizersBackend` and no longer writes
    special_tokens_map.json; 4.x needs `PreTrainedTokenizerFast` and reads that map.
    """
    config_path = checkpoint / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    _write_json(config_path, config)
    special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in config}
    _write_json(checkpoint / "special_tokens_map.json", special)


def _print_log(task: str, step: int, metrics: dict[str, float]) -> None:
    print(f"[{task}] step {step} loss {metrics.get('loss', float('nan')):.4f}", flush=True)  # noqa: T201


def _train_reference(task: str, root: str, seed: int, verbose: bool) -> dict[str, Any]:
    """Train one reference checkpoint (runs in a worker process; returns plain data)."""
    # TRL takes seconds to import; callers of source_digest() (the test fixtures) need none of it.
    from apps.ml.training import TrainHooks, train  # noqa: PLC0415 - heavy (TRL), only here

    base = Path(root)
    hparams = {**REFERENCE_HPARAMS, "seed": seed, "num_threads": 1}
    result = train(
        validate_train_config(hparams),
        base_dir=base / "theta0",
        data_files=[base / "catalog" / f"{task}-clean" / "data.jsonl"],
        out_dir=base / "references" / task,
        hooks=TrainHooks(on_log=lambda step, m: _print_log(task, step, m)) if verbose else None,
    )
    return {
        "task": task,
        "hparams": hparams,
        "steps": result.steps,
        "final_loss": result.final_loss,
        "seconds": round(result.seconds, 1),
    }


def build_minibench(out_dir: Path, *, seed: int = 0, profile: str = "full", verbose: bool = False) -> dict[str, Any]:
    """Build the minibench into `out_dir` (which must be absent or empty); return the manifest.

    Data, splits and the tokenizer are a pure function of `seed`; weights are too on a given
    machine and thread count (float summation order differs across CPUs).
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    task_names = list(CI_TASKS if profile == "ci" else TASKS)
    data = {name: build_task_data(TASKS[name], seed=seed, profile=profile) for name in task_names}

    tokenizer = train_tokenizer(_tokenizer_corpus(data, seed))
    # One thread: on a shared small CPU, multi-threaded BLAS spin-waits and loses to one thread
    # (measured on the 2-core dev box under load: 1 thread 3-5k tokens/s, 2 threads 0.5-2k).
    torch.set_num_threads(1)
    theta0 = pretrain_theta0(tokenizer, seed=seed)
    save_checkpoint(theta0, tokenizer, out_dir / "theta0")
    _finish_tokenizer_files(out_dir / "theta0")

    datasets: list[str] = []
    for name, task_data in data.items():
        task_dir = out_dir / "tasks" / name
        task_dir.mkdir(parents=True)
        _write_json(task_dir / "task.json", TASKS[name].task_json())
        _write_jsonl(task_dir / "feedback.jsonl", task_data.feedback)
        _write_jsonl(task_dir / "final.jsonl", task_data.final)
        for ds in task_data.datasets:
            ds_dir = out_dir / "catalog" / ds.name
            ds_dir.mkdir(parents=True)
            _write_json(ds_dir / "meta.json", ds.meta())
            (ds_dir / "README.md").write_text(dataset_card(ds), encoding="utf-8")
            _write_jsonl(ds_dir / "data.jsonl", ds.rows)
            datasets.append(ds.name)

    # References train in parallel single-threaded processes: on a small CPU two 1-thread jobs
    # nearly double the throughput of one 2-thread job.
    workers = min(len(task_names), max(1, os.cpu_count() or 1))
    (out_dir / "references").mkdir()
    if workers == 1:
        references = [_train_reference(n, str(out_dir), seed, verbose) for n in task_names]
    else:
        # spawn: a forked child would inherit torch's thread pools and the parent's locks.
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_train_reference, n, str(out_dir), seed, verbose) for n in task_names]
            references = [f.result() for f in futures]

    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "seed": seed,
        "profile": profile,
        "source_digest": source_digest(),
        "tasks": task_names,
        "datasets": datasets,
        # The sentence forms of each side: sealed splits use only "sealed", catalog data only "catalog".
        "templates": {name: {side: list(TASKS[name].forms[side]) for side in SIDES} for name in task_names},
        "theta0": "theta0",
        "references": {name: f"references/{name}" for name in task_names},
        "theta0_params": parameter_count(theta0),
        "theta0_config": {k: getattr(theta0.config, k) for k in _SUMMARY_FIELDS},
        "vocab_size": len(tokenizer),
        "reference_training": references,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    _write_json(out_dir / "manifest.json", manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the minibench.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", choices=PROFILES, default="full")
    parser.add_argument("--verbose", action="store_true", help="print reference training logs")
    args = parser.parse_args(argv)
    manifest = build_minibench(args.out_dir, seed=args.seed, profile=args.profile, verbose=args.verbose)
    print(json.dumps({k: manifest[k] for k in ("tasks", "theta0_params", "build_seconds")}))  # noqa: T201


if __name__ == "__main__":
    main()
