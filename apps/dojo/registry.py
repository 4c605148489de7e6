"""The task registry: every source of tasks speaks the one evaluator contract.

A source is named by a spec string:

    minibench-variants:arithmetic[,json_call]   the generated minibench v2 variants (variants.py)
    folder:/path/to/tasks                       local datasets: one folder per task with
                                                variant.json (a "subsets" map of contracts) and
                                                items.jsonl ({"id", "prompt", "answer", "subset"})

A contract is what a sealed task.json holds (evaluator, prompt_template, decoding, stop), so
every task is scored by the built-in evaluators through `apps.ml.inference`. Inspect tasks are
planned behind the same contract (the evaluator-contract work of issue 12).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.benchmarks.minibench.task_specs import TASKS
from apps.benchmarks.minibench.variants import build_task_variants
from apps.core.errors import ApplicationError
from apps.ml.evaluators import EVALUATORS

_CONTRACT_KEYS = ("evaluator", "prompt_template", "decoding")


@dataclass(frozen=True)
class TaskSource:
    """One registered task before the filters: its subsets' contracts and its items."""

    name: str
    subsets: dict[str, dict[str, Any]]
    items: list[dict[str, Any]]
    origin: str


def _bad(message: str) -> ApplicationError:
    return ApplicationError("invalid_task_source", message)


def _check(source: TaskSource) -> TaskSource:
    if not source.subsets:
        raise _bad(f"task {source.name!r} declares no subsets")
    for subset, contract in source.subsets.items():
        missing = [k for k in _CONTRACT_KEYS if k not in contract]
        if missing:
            raise _bad(f"task {source.name!r} subset {subset!r}: contract lacks {missing}")
        if contract["evaluator"] not in EVALUATORS:
            raise _bad(
                f"task {source.name!r} subset {subset!r}: unknown evaluator {contract['evaluator']!r}; "
                f"known: {sorted(EVALUATORS)}"
            )
    for row in source.items:
        if not {"id", "prompt", "answer", "subset"} <= set(row):
            raise _bad(f"task {source.name!r}: every item needs id, prompt, answer and subset; got {sorted(row)}")
        if row["subset"] not in source.subsets:
            raise _bad(f"task {source.name!r}: item {row['id']!r} names unknown subset {row['subset']!r}")
    ids = [str(r["id"]) for r in source.items]
    if len(set(ids)) != len(ids):
        raise _bad(f"task {source.name!r}: item ids are not unique")
    return source


def _minibench_variants(arg: str, seed: int) -> list[TaskSource]:
    tasks = [t for t in arg.split(",") if t]
    unknown = sorted(set(tasks) - set(TASKS))
    if not tasks or unknown:
        raise _bad(f"minibench-variants needs task names from {sorted(TASKS)}; got {arg!r}")
    return [
        _check(TaskSource(v.name, v.subsets, v.items, f"minibench-variants@seed{seed}:{v.expect}"))
        for v in build_task_variants(seed=seed, tasks=tasks)
    ]


def _folder(arg: str) -> list[TaskSource]:
    root = Path(arg)
    if not root.is_dir():
        raise _bad(f"folder {arg!r} does not exist")
    sources = []
    for meta_path in sorted(root.glob("*/variant.json")):
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            lines = (meta_path.parent / "items.jsonl").read_text(encoding="utf-8").splitlines()
            items = [json.loads(line) for line in lines if line.strip()]
        except (OSError, json.JSONDecodeError) as exc:
            raise _bad(f"{meta_path.parent}: unreadable task ({exc})") from exc
        name = str(meta.get("name") or meta_path.parent.name)
        sources.append(_check(TaskSource(name, dict(meta.get("subsets") or {}), items, f"folder:{meta_path.parent}")))
    if not sources:
        raise _bad(f"folder {arg!r} holds no task folders (<name>/variant.json + items.jsonl)")
    return sources


def task_sources(spec: str, *, seed: int = 0) -> list[TaskSource]:
    """Resolve a source spec into its tasks; a bad spec is a 400 naming what to fix."""
    kind, _, arg = spec.partition(":")
    if kind == "minibench-variants":
        return _minibench_variants(arg, seed)
    if kind == "folder":
        return _folder(arg)
    raise _bad(f"unknown task source {spec!r}; use 'minibench-variants:<task>[,<task>]' or 'folder:<path>'")
