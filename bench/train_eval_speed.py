"""Training and evaluation throughput of the minibench model on this machine.

    .venv/bin/python bench/train_eval_speed.py [MINIBENCH_DIR] [--steps 40] [--threads 1]

    .venv/bin/python bench/train_eval_speed.py [MINIBENCH_DIR] --quality

MINIBENCH_DIR defaults to $RSI_MINIBENCH_CACHE; if neither holds a build, a ci build is made in a
temp dir first (minutes). Prints training tokens/s (SFT, batch 64, arithmetic-clean) and
evaluation samples/s on the arithmetic feedback split, batched (32) vs one-by-one, with the ratio.
With --quality it instead prints the exact-match score (the task's own evaluator) of θ0 and of
each task's reference on both sealed splits of every task the build holds. With --variants it
scores θ0 and the base task's reference on every generated task variant of the build's tasks: greedy
variants once, sampled ones --repeats times (the spread is what the reliability filter sees).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from apps.benchmarks.minibench.build import build_minibench  # noqa: E402
from apps.ml.hparams import validate_train_config  # noqa: E402
from apps.ml.inference import evaluate  # noqa: E402
from apps.ml.training import train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("minibench", nargs="?", default=os.environ.get("RSI_MINIBENCH_CACHE"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quality", action="store_true", help="score θ0 and the references instead")
    parser.add_argument("--variants", action="store_true", help="score θ0 and the references on the task variants")
    parser.add_argument("--repeats", type=int, default=5, help="evaluations per sampled variant (--variants)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scratch = Path(tempfile.mkdtemp(prefix="rsi-bench-"))
    root = Path(args.minibench) if args.minibench else scratch / "minibench"
    if not (root / "manifest.json").is_file():
        print(f"building ci minibench in {root} ...", flush=True)  # noqa: T201
        build_minibench(root, seed=0, profile="ci")
    if args.quality:
        quality(root)
        return
    if args.variants:
        variant_scores(root, repeats=args.repeats)
        return

    hparams = {"max_steps": args.steps, "batch_size": 64, "num_threads": args.threads, "logging_steps": args.steps}
    data = [root / "catalog" / "arithmetic-clean" / "data.jsonl"]
    result = train(
        validate_train_config(hparams), base_dir=root / "theta0", data_files=data, out_dir=scratch / "trained"
    )

    task = json.loads((root / "tasks" / "arithmetic" / "task.json").read_text())
    lines = (root / "tasks" / "arithmetic" / "feedback.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    checkpoint = root / "references" / "arithmetic"
    timings = {}
    for batch_size in (32, 1):
        started = time.perf_counter()
        evaluate(checkpoint_dir=checkpoint, samples=samples, task=task, batch_size=batch_size)
        timings[batch_size] = len(samples) / (time.perf_counter() - started)

    report = {
        "threads": args.threads,
        "train_steps": result.steps,
        "train_tokens_per_second": round(result.tokens_per_second),
        "train_seconds": round(result.seconds, 1),
        "eval_samples": len(samples),
        "eval_samples_per_second_batched_32": round(timings[32], 1),
        "eval_samples_per_second_one_by_one": round(timings[1], 1),
        "eval_batched_speedup": round(timings[32] / timings[1], 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(report, indent=2))  # noqa: T201


def quality(root: Path) -> None:
    """Exact match of θ0 and the reference on each task's feedback and final splits."""
    manifest = json.loads((root / "manifest.json").read_text())
    rows = []
    for name in manifest["tasks"]:
        task = json.loads((root / "tasks" / name / "task.json").read_text())
        for split in ("feedback", "final"):
            lines = (root / "tasks" / name / f"{split}.jsonl").read_text().splitlines()
            samples = [json.loads(line) for line in lines]
            row: dict[str, object] = {"profile": manifest["profile"], "task": name, "split": split, "n": len(samples)}
            for label, checkpoint in (("theta0", root / "theta0"), ("reference", root / "references" / name)):
                if not (checkpoint / "model.safetensors").is_file():
                    row[label] = None  # not trained (yet)
                    continue
                results = evaluate(checkpoint_dir=checkpoint, samples=samples, task=task)
                row[label] = round(sum(r["correct"] for r in results) / len(results), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)  # noqa: T201
    print(json.dumps({"load_average_1m": round(os.getloadavg()[0], 1)}))  # noqa: T201


def _sampled_accuracy(checkpoint: Path, items: list[dict[str, Any]], contract: dict[str, Any], seed: int) -> float:
    """One sampled evaluation with the contract's decoding (evaluate() decodes greedily only)."""
    from apps.ml.checkpoints import load_checkpoint  # noqa: PLC0415
    from apps.ml.evaluators import score  # noqa: PLC0415
    from apps.ml.inference import render_prompt, truncate_at_stop  # noqa: PLC0415

    model, tokenizer = load_checkpoint(checkpoint)
    tokenizer.padding_side = "left"
    decoding = contract["decoding"]
    torch.manual_seed(seed)
    correct = 0
    for start in range(0, len(items), 32):
        batch = items[start : start + 32]
        prompts = [render_prompt(contract, it["prompt"], tokenizer) for it in batch]
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(  # type: ignore[operator]  # transformers' stub
                **enc,
                max_new_tokens=decoding["max_new_tokens"],
                do_sample=True,
                temperature=decoding.get("temperature", 1.0),
                top_p=decoding.get("top_p", 1.0),
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for it, row in zip(batch, out[:, enc["input_ids"].shape[1] :].tolist(), strict=True):
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            text = truncate_at_stop(str(tokenizer.decode(row, skip_special_tokens=True)), contract["stop"])
            correct += score(contract["evaluator"], text, it["answer"])
    return correct / len(items)


def variant_scores(root: Path, *, repeats: int) -> None:
    """θ0 and the base task's reference on each generated variant, per subset."""
    from apps.benchmarks.minibench import build_task_variants  # noqa: PLC0415

    manifest = json.loads((root / "manifest.json").read_text())
    for variant in build_task_variants(seed=manifest["seed"], tasks=manifest["tasks"]):
        meta = variant.meta()
        for subset, contract in meta["subsets"].items():
            chosen = [it for it in variant.items if it["subset"] == subset]
            row: dict[str, object] = {
                "variant": meta["name"],
                "subset": subset,
                "n": len(chosen),
                "expect": meta["expect"],
            }
            for label, checkpoint in (
                ("theta0", root / "theta0"),
                ("reference", root / "references" / meta["base_task"]),
            ):
                if contract["decoding"].get("do_sample"):
                    row[label] = [round(_sampled_accuracy(checkpoint, chosen, contract, k), 3) for k in range(repeats)]
                else:
                    results = evaluate(checkpoint_dir=checkpoint, samples=chosen, task=contract)
                    row[label] = round(sum(r["correct"] for r in results) / len(results), 3)
            print(json.dumps(row), flush=True)  # noqa: T201
    print(json.dumps({"load_average_1m": round(os.getloadavg()[0], 1)}))  # noqa: T201


if __name__ == "__main__":
    main()
