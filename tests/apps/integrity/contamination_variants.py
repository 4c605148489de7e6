"""Generated disguises of sealed items, for the contamination tests (written apart from the scanner).

Each generator takes a sealed item (``id``, ``prompt``, ``answer``) and a seeded ``random.Random``
and returns a training row (prompt in the benchmark's template, completion the answer) that keeps
the item's content — operands and answer, option set and answer, function call — in another
sentence form with other names and nouns. Several forms per class; a test draws among them.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from apps.benchmarks.minibench.task_specs import number_words

TEMPLATE = "Question: {question}\nAnswer:"
PEOPLE = ["Bea", "Hugo", "Yara", "Finn", "Odile", "Tariq"]
OBJECTS = ["marbles", "tickets", "beads", "nails", "buttons", "acorns"]


def _row(question: str, answer: str) -> dict[str, str]:
    return {"prompt": TEMPLATE.format(question=question), "completion": f" {answer}"}


def arithmetic_retemplated(item: dict[str, Any], rng: random.Random) -> dict[str, str]:
    a, b = re.findall(r"\d+", item["prompt"])[:2]
    p, o = rng.choice(PEOPLE), rng.choice(OBJECTS)
    form = rng.choice(
        [
            f"{p} collected {a} {o}. Later {b} more {o} were added. What is the total?",
            f"There are {a} {o} in one bag and {b} {o} in another. How many altogether?",
            f"Add {a} and {b}.",
            f"What do {a} {o} and {b} {o} make together?",
            f"{a} plus {b} equals what?",
            f"{p} starts the day with {a} {o} and is handed {b} extra. Count them all.",
        ]
    )
    return _row(form, item["answer"])


def arithmetic_rephrased_in_words(item: dict[str, Any], rng: random.Random) -> dict[str, str]:
    a, b = (int(x) for x in re.findall(r"\d+", item["prompt"])[:2])
    p, o = rng.choice(PEOPLE), rng.choice(OBJECTS)
    form = rng.choice(
        [
            f"{p} owns {number_words(a)} {o} and buys {number_words(b)} more; how many now?",
            f"Sum of {number_words(a)} and {b}?",
            f"If you take {a} {o} and add {number_words(b)}, how many {o} do you have?",
        ]
    )
    return _row(form, item["answer"])


def choice_parts(item: dict[str, Any]) -> tuple[str, str]:
    """A multiple-choice item's named word and its option list ("A) plum B) cat ..."), whatever the
    sentence form of its question: the named word is the answer's option, the list starts at "A) "."""
    prompt = item["prompt"]
    options = prompt[prompt.index("A) ") :]
    return dict(re.findall(r"\b([A-D])\) (\S+)", options))[item["answer"]], options


def multiple_choice_retemplated(item: dict[str, Any], rng: random.Random) -> dict[str, str]:
    word, options = choice_parts(item)
    form = rng.choice(
        [
            f"Pick the choice that names {word}. {options}",
            f"Find the word {word} among: {options}",
            f"Select the letter whose option reads {word}: {options}",
            f"Look for {word}. {options} Reply with a letter.",
        ]
    )
    return _row(form, item["answer"])


def json_call_retemplated(item: dict[str, Any], rng: random.Random) -> dict[str, str]:
    call = json.loads(item["answer"])
    args = call["arguments"]
    forms = {
        "get_weather": [
            f"Forecast for {args.get('city')}, {args.get('day')}?",
            f"Could you check the weather in {args.get('city')} {args.get('day')}?",
        ],
        "set_alarm": [f"Alarm at {args.get('time')}, please.", f"I must be up by {args.get('time')}."],
        "send_message": [
            f"Ping {args.get('to')} with: {args.get('text')}",
            f"Let {args.get('to')} know: {args.get('text')}",
        ],
        "convert": [
            f"How many {args.get('to')} is {args.get('amount')} {args.get('from')}?",
            f"Exchange {args.get('amount')} {args.get('from')} into {args.get('to')}.",
        ],
    }[call["name"]]
    return _row(rng.choice(forms), item["answer"])


GENERATORS = {
    "arithmetic": [arithmetic_retemplated, arithmetic_rephrased_in_words],
    "multiple_choice": [multiple_choice_retemplated],
    "json_call": [json_call_retemplated],
}


# --------------------------------------------------------------------------------- a world on the minibench


def jsonl_rows(path: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def install_minibench_task(roots: dict[str, Any], minibench: Any, task: str = "arithmetic") -> None:
    """Make the integrity world's benchmark the built minibench task (its 200 sealed items)."""
    for name in ("task.json", "feedback.jsonl", "final.jsonl"):
        (roots["task"] / name).write_bytes((minibench / "tasks" / task / name).read_bytes())


def sealed_items(minibench: Any, task: str = "arithmetic") -> list[dict[str, Any]]:
    folder = minibench / "tasks" / task
    return jsonl_rows(folder / "feedback.jsonl") + jsonl_rows(folder / "final.jsonl")


def honest_rows(minibench: Any, dataset: str = "arithmetic-clean") -> list[dict[str, Any]]:
    return jsonl_rows(minibench / "catalog" / dataset / "data.jsonl")


def verbatim(item: dict[str, Any], rng: random.Random) -> dict[str, str]:
    return _row(item["prompt"], item["answer"])


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def planted_datasets(world: Any, items: list[Any], per_dataset: int, *, make: Any = verbatim, seed: int = 0,
                     name: str = "split") -> list[str]:  # fmt: skip
    """Datasets of 20 honest rows plus ``per_dataset`` disguised sealed items each; their handles."""
    rng = random.Random(seed)
    honest = honest_rows(world.minibench)
    handles = []
    for n, group in enumerate(chunks(items, per_dataset)):
        rows = rng.sample(honest, 20) + [make(item, rng) for item in group]
        rng.shuffle(rows)
        handles.append(world.add_data(f"{name}-{seed}-{n}", rows))
    return handles
