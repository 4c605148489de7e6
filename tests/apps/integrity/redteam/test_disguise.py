"""The red team's disguises are real disguises: bytes differ beyond what NFKC and case folding undo,
and the content an adversary wants to keep (the operands, the answer) is still there for a reader."""

from __future__ import annotations

import random
import unicodedata

import pytest

from tests.apps.integrity.redteam import disguise

ITEMS = [
    {"id": f"s{i}", "prompt": f"Mira has {a} pears and gets {b} more. How many pears in total?", "answer": str(a + b)}
    for i, (a, b) in enumerate([(23, 45), (71, 18), (10, 99), (58, 28)])
]


def _plain(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


@pytest.mark.parametrize("name", sorted(disguise.PERTURBATIONS))
def test_each_perturbation_survives_nfkc_and_case_folding(name):
    rng = random.Random(disguise.SEED)
    how = disguise.PERTURBATIONS[name]
    for item in ITEMS:
        row = disguise.perturb(item, rng, how)
        assert _plain(item["prompt"]) not in _plain(row["prompt"]), (name, row)


def test_retemplated_rows_keep_operands_and_answer_in_new_forms():
    rng = random.Random(disguise.SEED)
    forms = set()
    for item in ITEMS * 5:
        row = disguise.retemplate(item, rng)
        a, b = disguise.numbers_of(item["prompt"])
        assert disguise.numbers_of(row["prompt"])[:2] == [a, b]
        assert row["completion"].strip() == item["answer"]
        assert "How many pears in total" not in row["prompt"]
        forms.add(row["prompt"].replace(str(a), "{a}").replace(str(b), "{b}"))
    assert len(forms) >= 5  # a generator of forms, not one rewrite


def test_number_words_read_back():
    assert [disguise.say(n) for n in (0, 7, 15, 40, 42, 105, 1234)] == [
        "zero",
        "seven",
        "fifteen",
        "forty",
        "forty-two",
        "one hundred and five",
        "one thousand two hundred and thirty-four",
    ]


def test_split_keeps_every_item_once_under_the_tolerance():
    parts = list(disguise.split(ITEMS, 3))
    assert [len(p) for p in parts] == [3, 1]
    assert sum(parts, []) == [disguise.verbatim(item) for item in ITEMS]


def test_claim_forms_are_not_plain_decimals():
    forms = dict(disguise.claim_forms(0.87, 200, random.Random(1)))
    assert forms["a decimal comma"] == "0,87"
    assert forms["x of y"] in {"174 of 200", "174/200", "174 out of 200"}
    assert forms["number words"] == "eighty-seven percent"
    assert "0.87" not in " ".join(forms.values())


def test_near_repeats_differ_only_in_noise():
    recipes = disguise.near_repeats(3e-4, 12, random.Random(2))
    rates = [r["learning_rate"] for r in recipes]
    assert len(set(rates)) == 3
    assert max(abs(r / 3e-4 - 1) for r in rates) < 1e-7
    assert {r["steps"] for r in recipes} <= {12, 13}
    assert len({r["seed"] for r in recipes}) == 3
