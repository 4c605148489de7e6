"""Honest training data in the forms people write it, built only from the minibench catalog (issue 33, item 3).

Nothing here copies a sealed item: every question and answer is a catalog row, which the minibench
draws apart from its sealed splits. The forms put many catalog items' numbers side by side, which
is where a rule reading "the item's numbers in order, any gap" finds sealed items that are not
there:

- ``few_shot``  k solved catalog questions, then one more to answer (k from 2 to 8);
- ``packed``    practice notes: 8 to 30 catalog questions with their answers in one completion;
- ``long``      a long document: paragraphs of prose around catalog questions and their answers;
- ``dense``     number-dense honest text: the catalog's answers and operands as tables and lists,
                and the catalog's own datasets (noisy, wrong format, irrelevant, preferences).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import cache
from typing import Any

from apps.benchmarks.minibench.catalog import TaskData, build_task_data
from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE, TASKS

FORMATS = ("few_shot", "packed", "long", "dense")
Row = dict[str, Any]
_PROSE = [
    "Counting problems are easier when you write the two amounts down before adding them.",
    "In the workshop we went through several exercises, one after the other.",
    "Remember to carry the tens when the ones add up to ten or more.",
    "The notes below were written during the afternoon session.",
    "Each exercise is followed by its worked result.",
]


@cache
def task_data(task: str, seed: int = 0) -> TaskData:
    return build_task_data(TASKS[task], seed=seed, profile="ci")


def sealed_items(task: str, seed: int = 0) -> list[Row]:
    data = task_data(task, seed)
    return data.feedback + data.final


def catalog_pairs(task: str, seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) of the catalog's clean dataset, template stripped."""
    clean = next(d for d in task_data(task, seed).datasets if d.name.endswith("-clean"))
    head, tail = PROMPT_TEMPLATE.split("{question}")
    return [(r["prompt"].removeprefix(head).removesuffix(tail), r["completion"].strip()) for r in clean.rows]


def _few_shot(pairs: list[tuple[str, str]], rng: random.Random) -> Row:
    shots = rng.sample(pairs, rng.randint(3, 9))
    *solved, (question, answer) = shots
    text = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in solved)
    return {"prompt": text + f"Question: {question}\nAnswer:", "completion": f" {answer}"}


def _packed(pairs: list[tuple[str, str]], rng: random.Random) -> Row:
    notes = rng.sample(pairs, rng.randint(8, 30))
    style = rng.choice(["{n}. {q} -> {a}", "{q} = {a}", "Q{n}: {q} A: {a}", "- {q} ({a})"])
    body = "\n".join(style.format(n=n, q=q, a=a) for n, (q, a) in enumerate(notes, start=1))
    return {"prompt": "Practice notes:\n", "completion": body}


def _long(pairs: list[tuple[str, str]], rng: random.Random) -> Row:
    paragraphs = []
    for q, a in rng.sample(pairs, rng.randint(6, 16)):
        paragraphs.append(f"{rng.choice(_PROSE)} {q} The answer worked out to {a}. {rng.choice(_PROSE)}")
    return {"prompt": "Write up today's lesson.\n", "completion": "\n\n".join(paragraphs)}


def _dense(pairs: list[tuple[str, str]], rng: random.Random) -> Row:
    rows = rng.sample(pairs, rng.randint(10, 40))
    cells = [" ".join(ch for ch in q if ch.isdigit() or ch == " ").split() + [a] for q, a in rows]
    sep = rng.choice([" | ", ", ", "\t", " "])
    table = "\n".join(sep.join(c) for c in cells)
    return {"prompt": "Table of exercises (operands, result):\n", "completion": table}


_MAKERS = {"few_shot": _few_shot, "packed": _packed, "long": _long, "dense": _dense}


def honest_corpus(task: str, per_format: int, seed: int = 0) -> Iterator[tuple[str, Row]]:
    """(format, row) for ``per_format`` rows of each format, then the catalog's other datasets' rows
    (as ``dense``), seeded."""
    rng = random.Random(f"honest:{task}:{seed}")
    pairs = catalog_pairs(task, seed)
    for fmt in FORMATS:
        for _ in range(per_format):
            yield fmt, _MAKERS[fmt](pairs, rng)
    for dataset in task_data(task, seed).datasets:
        if dataset.name.endswith(("-noisy", "-wrongformat", "-irrelevant", "-prefs")):
            for row in rng.sample(dataset.rows, min(per_format, len(dataset.rows))):
                yield "dense", row
