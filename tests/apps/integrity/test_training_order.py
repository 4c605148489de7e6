"""The scanner reads a row as the trainer does: fields by name, in training order, whatever the key order.

Every data format (SFT, DPO, chat) is built with every order of its keys, from sealed items
re-templated into the catalog's own sentence forms (operands and answer kept, the sealed sentence
gone): each layer that catches the prompt-first row catches every other order of it too, and the
texts handed to the layers are the trainer's (``apps.ml.training`` reads ``FORMAT_KEYS`` by name).
"""

from __future__ import annotations

import random
import re
from itertools import permutations
from typing import Any

import pytest

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE, TASKS
from apps.integrity.contamination import ContaminationScanner, row_strings
from apps.ml import training
from apps.ml.row_format import FORMAT_KEYS, row_format, training_texts
from tests.apps.integrity.test_contamination_layers import ARITH

SEALED = ARITH[:40]
FORMS = [  # the catalog's arithmetic sentence forms, not the sealed item's own
    "Our class made {a} books and later {b} more. How many books in total?",
    "Sara has {a} stamps and gets {b} more. How many stamps in total?",
    "A box held {a} eggs and got {b} more. How many eggs in total?",
]


@pytest.fixture(scope="module")
def scanner() -> ContaminationScanner:
    return ContaminationScanner(SEALED, templates=[PROMPT_TEMPLATE])


def retemplated(item: dict[str, str], rng: random.Random) -> tuple[str, str]:
    a, b = re.findall(r"\d+", item["prompt"])[:2]
    question = rng.choice(FORMS).format(a=a, b=b)
    assert question not in item["prompt"]
    return PROMPT_TEMPLATE.replace("{question}", question), " " + item["answer"]


def fields(fmt: str, prompt: str, answer: str, rng: random.Random) -> dict[str, Any]:
    if fmt == "sft":
        return {"prompt": prompt, "completion": answer}
    if fmt == "dpo":
        return {"prompt": prompt, "chosen": answer, "rejected": f" {rng.randint(200, 999)}"}
    return {
        "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer.strip()}],
        "tools": [],
        "metadata": {"source": "notes"},
    }


def every_key_order(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{key: row[key] for key in order} for order in permutations(row)]


def test_the_trainer_and_the_scanner_share_the_fields_by_name():
    assert training._FORMAT_KEYS is FORMAT_KEYS
    row = {"rejected": " 3", "chosen": " 2", "prompt": "Q", "note": "n"}
    assert row_format(row) == "dpo"
    # The prompt once, then each side as the trainer appends it; unread fields last, never dropped.
    assert training_texts(row) == ["Q", " 2", " 3", "n"]
    assert list(row_strings({"completion": " 5", "prompt": "Q"})) == ["Q", " 5"]
    assert training_texts({"x": ["a", {"b": "c"}]}) == ["a", "c"]  # no known format: every string


@pytest.fixture(scope="module")
def layer_scanners(scanner) -> dict[str, ContaminationScanner]:
    alone = {name: ContaminationScanner(SEALED, templates=[PROMPT_TEMPLATE], layers=(name,))
             for name in ("near_dup", "salient")}  # fmt: skip
    return {"all": scanner, **alone}


@pytest.mark.parametrize("fmt", ["sft", "dpo", "chat"])
def test_every_key_order_of_every_format_reads_as_the_training_order(layer_scanners, fmt):
    rng = random.Random(f"order:{fmt}")
    caught = {name: 0 for name in layer_scanners}
    for item in SEALED[:12]:
        prompt, answer = retemplated(item, rng)
        rows = every_key_order(fields(fmt, prompt, answer, rng))
        assert len({tuple(row) for row in rows}) == len(rows) >= 2
        for name, layer_scanner in layer_scanners.items():
            trained = {(m.sample_id, m.kind) for m in layer_scanner.scan_row(rows[0])}  # keys in training order
            for row in rows[1:]:
                assert {(m.sample_id, m.kind) for m in layer_scanner.scan_row(row)} == trained, (name, list(row))
            caught[name] += any(sample_id == item["id"] for sample_id, _ in trained)
    # The whole scanner and the salient layer alone catch every one, in every order (near_dup, by
    # its Jaccard bar, none of these: the catalog's sentence forms share few shingles with these items).
    assert caught["all"] == caught["salient"] == 12, caught


@pytest.mark.parametrize("fmt", ["sft", "dpo"])
def test_verbatim_copies_in_every_key_order_match_exactly(scanner, fmt):
    rng = random.Random(f"verbatim:{fmt}")
    for item in SEALED[:8]:
        prompt = PROMPT_TEMPLATE.replace("{question}", item["prompt"])
        for row in every_key_order(fields(fmt, prompt, " " + item["answer"], rng)):
            kinds = {m.kind for m in scanner.scan_row(row) if m.sample_id == item["id"]}
            assert kinds == {"exact"}, (list(row), kinds)


def test_honest_catalog_rows_stay_clean_in_every_key_order(scanner):
    rng = random.Random("honest-order")
    spec = TASKS["arithmetic"]
    sealed_pairs = {tuple(re.findall(r"\d+", item["prompt"])[:2]) for item in SEALED}
    checked = 0
    while checked < 30:
        item = spec.generate(rng)
        if tuple(re.findall(r"\d+", item.question)[:2]) in sealed_pairs:
            continue
        prompt = PROMPT_TEMPLATE.replace("{question}", item.question)
        for fmt in ("sft", "dpo"):
            for row in every_key_order(fields(fmt, prompt, " " + item.answer, rng)):
                assert scanner.scan_row(row) == [], row
        checked += 1
