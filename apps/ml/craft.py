"""RSI-Craft's task-environment steps as pure functions (RSI-Dojo, issue 18).

    split_subsets(name, subsets, items)          -> [TaskCandidate]   one task per metric
    size_filter(candidate, config)                -> Decision (+ the kept, maybe downsampled, task)
    reliability(candidate, strong, config)        -> Decision (+ the strong model's outputs)
    mutation_check(candidate, outputs, config)    -> Decision
    discriminability(base, strong, config)        -> Decision

Each step returns a `Decision` with the numbers that justify it; the caller (apps.dojo's build
service) records every one as an event. Reliability and the mutation check run on the *strong*
model's outputs: θ0 scores 0 on every task, so its score would never move under any mutation.
Django-free: the gpu worker and the bench script call these directly.
"""

from __future__ import annotations

import apps.ml.offline  # noqa: F401 - before transformers: the Hub stays off

# isort: split
import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from apps.ml.checkpoints import load_checkpoint
from apps.ml.craft_config import CraftConfig
from apps.ml.evaluators import score
from apps.ml.inference import generate_texts, render_prompt, uses_special_tokens
from apps.ml.seeds import is_sampled, max_tokens_of, stop_strings_of

CRAFT_VERSION = 1
Row = dict[str, Any]

# Why a task was rejected; the names match the minibench variants' `expect`.
TOO_SMALL = "too_small"
UNSTABLE = "unstable"
METRIC_IGNORES_OUTPUT = "metric_ignores_output"
TOO_EASY = "too_easy"
TOO_HARD = "too_hard"
NOT_DISCRIMINATIVE = "not_discriminative"
REJECTIONS = (TOO_SMALL, UNSTABLE, METRIC_IGNORES_OUTPUT, TOO_EASY, TOO_HARD, NOT_DISCRIMINATIVE)


@dataclass(frozen=True)
class TaskCandidate:
    """One task over the evaluator contract: a contract (evaluator, template, decoding, stop) and items."""

    name: str
    source: str
    subset: str
    contract: dict[str, Any]
    items: list[Row]

    @property
    def sample_ids(self) -> list[str]:
        return [str(it["id"]) for it in self.items]


@dataclass
class Decision:
    """One step's verdict on one task, with its numbers."""

    step: str
    task: str
    kept: bool
    reason: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "task": self.task, "kept": self.kept, "reason": self.reason, **self.numbers}


def ids_sha256(ids: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()


def split_subsets(
    source: str, subsets: dict[str, dict[str, Any]], items: list[Row]
) -> tuple[Decision, list[TaskCandidate]]:
    """Subsets with different contracts (metric, template, decoding) become separate tasks."""
    groups: dict[str, list[str]] = {}
    for subset, contract in sorted(subsets.items()):
        key = json.dumps(contract, sort_keys=True)
        groups.setdefault(key, []).append(subset)
    unknown = {str(it.get("subset")) for it in items} - set(subsets)
    if unknown:
        raise ValueError(f"{source}: items name subsets without a contract: {sorted(unknown)}")
    candidates = []
    for members in groups.values():
        name = source if len(groups) == 1 else f"{source}/{'+'.join(members)}"
        chosen = [it for it in items if it["subset"] in members]
        candidates.append(TaskCandidate(name, source, "+".join(members), subsets[members[0]], chosen))
    numbers = {
        "subsets": {s: sum(1 for it in items if it["subset"] == s) for s in sorted(subsets)},
        "metrics": {s: subsets[s].get("evaluator") for s in sorted(subsets)},
        "tasks": [c.name for c in candidates],
    }
    return Decision("subset_split", source, True, "", numbers), candidates


def size_filter(candidate: TaskCandidate, config: CraftConfig) -> tuple[Decision, TaskCandidate | None]:
    """Drop a task under `min_items`; downsample one over `max_items` to a seeded, frozen id set."""
    n = len(candidate.items)
    if n < config.min_items:
        return Decision("size", candidate.name, False, TOO_SMALL, {"items": n, "min_items": config.min_items}), None
    if n <= config.max_items:
        numbers = {"items": n, "kept_items": n, "ids_sha256": ids_sha256(candidate.sample_ids)}
        return Decision("size", candidate.name, True, "", numbers), candidate
    # Seeded by the task's name too, so adding a task never changes another task's sample.
    rng = random.Random(f"rsi-craft:{config.seed}:{candidate.name}")  # noqa: S311 - a seeded sample, not crypto
    keep = set(rng.sample(sorted(candidate.sample_ids), config.max_items))
    items = [it for it in candidate.items if str(it["id"]) in keep]
    kept = TaskCandidate(candidate.name, candidate.source, candidate.subset, candidate.contract, items)
    numbers = {
        "items": n,
        "kept_items": len(items),
        "downsampled": True,
        "seed": config.seed,
        "ids_sha256": ids_sha256(kept.sample_ids),
    }
    return Decision("size", candidate.name, True, "", numbers), kept


class ModelRunner:
    """One checkpoint loaded once, answering tasks with each task's own prompt, decoding and stop."""

    def __init__(self, checkpoint_dir: Path, *, batch_size: int = 32) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self.model, self.tokenizer = load_checkpoint(self.checkpoint_dir)
        self.batch_size = batch_size

    def outputs(self, candidate: TaskCandidate, *, seed: int) -> list[str]:
        contract = candidate.contract
        decoding = contract.get("decoding", {})
        sampling = None
        if is_sampled(decoding):
            sampling = {"temperature": decoding.get("temperature", 1.0), "top_p": decoding.get("top_p", 1.0)}
            torch.manual_seed(seed)
        prompts = [render_prompt(contract, str(it["prompt"]), self.tokenizer) for it in candidate.items]
        return generate_texts(
            self.model,
            self.tokenizer,
            prompts,
            max_new_tokens=max_tokens_of(decoding),
            stop=stop_strings_of(contract),
            batch_size=self.batch_size,
            add_special_tokens=uses_special_tokens(contract),
            sampling=sampling,
        )


def correctness(candidate: TaskCandidate, outputs: Sequence[str]) -> list[bool]:
    evaluator = str(candidate.contract["evaluator"])
    return [score(evaluator, out, str(it["answer"])) for it, out in zip(candidate.items, outputs, strict=True)]


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


def reliability(candidate: TaskCandidate, strong: ModelRunner, config: CraftConfig) -> tuple[Decision, list[str]]:
    """K evaluations of the strong model with the task's decoding; unstable scores reject the task.

    Returns the first repeat's outputs for the mutation check. Flips (items right in some repeats
    and wrong in others) catch instability that the aggregate can hide by luck.
    """
    runs = [strong.outputs(candidate, seed=config.seed + k) for k in range(config.repeats)]
    correct = [correctness(candidate, outs) for outs in runs]
    scores = [round(_mean(c), 4) for c in correct]
    flips = sum(1 for per_item in zip(*correct, strict=True) if len(set(per_item)) > 1)
    flip_rate = flips / len(candidate.items)
    spread = max(scores) - min(scores)
    unstable = spread > config.max_score_range or flip_rate > config.max_flip_rate
    numbers = {
        "repeats": config.repeats,
        "scores": scores,
        "score_range": round(spread, 4),
        "flip_rate": round(flip_rate, 4),
        "max_score_range": config.max_score_range,
        "max_flip_rate": config.max_flip_rate,
        "sampled": bool(candidate.contract.get("decoding", {}).get("do_sample")),
    }
    return Decision("reliability", candidate.name, not unstable, UNSTABLE if unstable else "", numbers), runs[0]


def _derangement(n: int, seed: int, name: str) -> list[int]:
    """A seeded permutation moving every index (a rotation of a shuffled order)."""
    order = list(range(n))
    random.Random(f"rsi-craft:{seed}:{name}:shuffle").shuffle(order)  # noqa: S311 - seeded, not crypto
    target = [0] * n
    for i in range(n):
        target[order[i]] = order[(i + 1) % n]
    return target


def mutation_check(candidate: TaskCandidate, outputs: list[str], config: CraftConfig) -> Decision:
    """Does the metric read the output? Score the strong outputs blanked, shuffled and replaced by gold.

    Blanking and shuffling can only move a score down, so on a task where the strong model scores
    near 0 they prove nothing; the gold answers as outputs move it up for any metric that reads the
    output. A metric whose score stays put under all of them ignores the output.
    """
    n = len(outputs)
    perm = _derangement(n, config.seed, candidate.name)
    variants = {
        "strong": outputs,
        "blank": [""] * n,
        "shuffled": [outputs[perm[i]] for i in range(n)],
        "gold": [str(it["answer"]) for it in candidate.items],
    }
    scores = {key: round(_mean(correctness(candidate, outs)), 4) for key, outs in variants.items()}
    move = max(scores.values()) - min(scores.values())
    ignores = move < config.min_mutation_move
    numbers = {"scores": scores, "move": round(move, 4), "min_move": config.min_mutation_move}
    return Decision("mutation", candidate.name, not ignores, METRIC_IGNORES_OUTPUT if ignores else "", numbers)


def discriminability(candidate: TaskCandidate, *, base: float, strong: float, config: CraftConfig) -> Decision:
    """Keep a task only when strong − base ≥ `min_gap`, and not both above / both below the bounds."""
    gap = strong - base
    if base > config.both_above and strong > config.both_above:
        reason = TOO_EASY
    elif base < config.both_below and strong < config.both_below:
        reason = TOO_HARD
    elif gap < config.min_gap:
        reason = NOT_DISCRIMINATIVE
    else:
        reason = ""
    numbers = {
        "base": round(base, 4),
        "strong": round(strong, 4),
        "gap": round(gap, 4),
        "min_gap": config.min_gap,
        "both_above": config.both_above,
        "both_below": config.both_below,
    }
    return Decision("discriminability", candidate.name, not reason, reason, numbers)


def base_score(candidate: TaskCandidate, base: ModelRunner, config: CraftConfig) -> float:
    """The base model's score with the task's decoding (one evaluation, the first seed)."""
    return _mean(correctness(candidate, base.outputs(candidate, seed=config.seed)))
