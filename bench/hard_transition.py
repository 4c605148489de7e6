"""Where the hard profile's learning transition sits, along the path an agent's line of work takes.

    .venv/bin/python bench/hard_transition.py --variant standard --stages 200 300 300 [--batch 64] [--lr 2e-3]

Builds the named hard variant's data and θ0 in a temporary folder (no reference), then trains one
line of work the way the heuristic Main Agent grows one: a first training from θ0, then each
further stage a continuation from the previous stage's checkpoint (a new training with its own
warm-up and cosine decay, as a ``continue`` decision submits it), on the clean set. After each
stage it scores the sealed feedback split (greedy decoding, the task's evaluator) and prints the
stage's steps, seconds, final loss and exact match. One process, one thread (``num_threads`` 1,
as the gpu worker trains), so two variants can be measured side by side on two cores.

This is the measurement a fair ablation profile is chosen by (issue 32 item 4): the first round's
trainings should stay before the transition and a second round's continuation should pass it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="standard", help="a key of HARD_SIZES")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages", type=int, nargs="+", default=[200, 300, 300])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--dataset", default="addition-drills")
    parser.add_argument(
        "--scheduler",
        nargs="+",
        default=["cosine"],
        help="lr_scheduler_type per stage (the last one repeats for later stages)",
    )
    parser.add_argument("--layers", type=int, default=None, help="θ0's depth (default: the minibench's)")
    args = parser.parse_args()

    import torch

    from apps.benchmarks.minibench import model as shape

    if args.layers:
        shape.NUM_LAYERS = args.layers  # an exploration of depth; builds use the module's own
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="hard-transition-"))
    try:
        _stages(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stages(args: argparse.Namespace, work: Path) -> None:
    from apps.benchmarks.minibench.hard import build as hard
    from apps.benchmarks.minibench.model import pretrain_theta0, save_checkpoint
    from apps.benchmarks.minibench.tokenizer import train_tokenizer
    from apps.ml.checkpoints import load_checkpoint
    from apps.ml.evaluators import score
    from apps.ml.hparams import validate_train_config
    from apps.ml.inference import generate_texts
    from apps.ml.training import train

    started = time.monotonic()
    data = hard.hard_data(args.variant, seed=args.seed)
    rows = {ds.name: ds.rows for ds in data.datasets}[args.dataset]
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = train_tokenizer(data.corpus)
    theta0 = pretrain_theta0(tokenizer, seed=args.seed)
    save_checkpoint(theta0, tokenizer, work / "stage0")
    task = hard.task_json()
    print(json.dumps({"variant": args.variant, "rows": len(rows), "setup_seconds": round(time.monotonic() - started, 1),
                      "params": sum(p.numel() for p in theta0.parameters())}), flush=True)  # fmt: skip
    base, total = work / "stage0", 0
    for i, steps in enumerate(args.stages, start=1):
        out = work / f"stage{i}"
        scheduler = args.scheduler[min(i, len(args.scheduler)) - 1]
        config = validate_train_config({"recipe": "sft", "learning_rate": args.lr, "max_steps": steps,
                                        "batch_size": args.batch, "seed": args.seed + i, "num_threads": 1,
                                        "lr_scheduler_type": scheduler})  # fmt: skip
        t0 = time.monotonic()
        result = train(config, base_dir=base, data_files=[work / "data.jsonl"], out_dir=out)
        train_s = time.monotonic() - t0
        model, tok = load_checkpoint(out)
        prompts = [task["prompt_template"].replace("{question}", r["prompt"]) for r in data.feedback]
        t1 = time.monotonic()
        outputs = generate_texts(model, tok, prompts, max_new_tokens=task["decoding"]["max_new_tokens"],
                                 stop=task["decoding"].get("stop", ()))  # fmt: skip
        em = sum(score(task["evaluator"], o, r["answer"]) for o, r in zip(outputs, data.feedback, strict=True))
        total += steps
        print(json.dumps({"stage": i, "steps": steps, "total_steps": total, "train_seconds": round(train_s, 1),
                          "s_per_step": round(train_s / steps, 3), "eval_seconds": round(time.monotonic() - t1, 1),
                          "final_loss": round(result.final_loss, 3),
                          "feedback_exact_match": em / len(data.feedback)}), flush=True)  # fmt: skip
        base = out


if __name__ == "__main__":
    main()
