"""A built minibench for the test session, and small hand-written task and catalog folders.

The built one is expensive (tokenizer, θ0, a reference trained 1,000 steps): it is built once
per session with the one-task ``ci`` profile, or reused from ``RSI_MINIBENCH_CACHE`` when that
folder already holds a build (a fresh cache folder is filled on first use).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TASK_JSON: dict[str, Any] = {
    "name": "addition",
    "evaluator": "exact_match",
    "description": "Add two numbers; answer with the number only.",
    "prompt_template": "Question: {question}\nAnswer:",
    "decoding": {"max_new_tokens": 8, "do_sample": False},
    "stop": ["\n"],
    "use_chat_template": False,
}

FEEDBACK = [
    {"id": "add-feedback-0001", "prompt": "Tom has 12 apples and gets 34 more. How many apples does Tom have now?",
     "answer": "46"},
    {"id": "add-feedback-0002", "prompt": "What is 51 plus 17?", "answer": "68"},
    {"id": "add-feedback-0003", "prompt": "A box holds 23 pens. Ana adds 45 pens. How many pens are in the box?",
     "answer": "68"},
]  # fmt: skip
FINAL = [
    {"id": "add-final-0001", "prompt": "There are 31 cups on a shelf and 27 on a table. How many cups are there?",
     "answer": "58"},
    {"id": "add-final-0002", "prompt": "What is 60 plus 22?", "answer": "82"},
]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_task_dir(root: Path, *, task: dict[str, Any] | None = None) -> Path:
    """A task folder in the minibench layout: task.json, feedback.jsonl, final.jsonl."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.json").write_text(json.dumps(task or TASK_JSON, indent=2), encoding="utf-8")
    write_jsonl(root / "feedback.jsonl", FEEDBACK)
    write_jsonl(root / "final.jsonl", FINAL)
    return root


def sft(question: str, answer: str) -> dict[str, str]:
    return {"prompt": f"Question: {question}\nAnswer:", "completion": f" {answer}"}


def minibench_root(tmp_path_factory: Any) -> Path:
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)
