"""Generated number disguises (``number_forms``) read as their number, and disguised copies are caught.

Each class draws fresh variants from its seeded generator (``RSI_REDTEAM_SEED`` picks another
draw): the canonical form reads every variant as the number, the scanner finds every sealed item
re-templated with its operands and answer so written, and honest numbers a space, comma, dash or
word apart stay apart.
"""

from __future__ import annotations

import random
import re

import pytest

from apps.benchmarks.minibench.task_specs import PROMPT_TEMPLATE
from apps.integrity.canonical import canonical_tokens
from apps.integrity.contamination import ContaminationScanner
from tests.apps.integrity.redteam import disguise, number_forms
from tests.apps.integrity.test_contamination_layers import ARITH

SEALED = ARITH[:60]
FORMS = [
    "{name} stacked {a} crates, then {b} more crates came. How many crates now?",
    "Add {a} to {b}.",
    "Tally: {a} and {b} more.",
]


@pytest.fixture(scope="module")
def scanners() -> dict[str, ContaminationScanner]:
    return {
        "all": ContaminationScanner(SEALED, templates=[PROMPT_TEMPLATE]),
        "salient": ContaminationScanner(SEALED, templates=[PROMPT_TEMPLATE], layers=("salient",)),
    }


@pytest.mark.parametrize("cls", number_forms.CLASSES)
def test_every_generated_variant_reads_as_its_number(cls):
    rng = random.Random(f"{disguise.SEED}:read:{cls}")
    for _ in range(300):
        number = rng.randint(0, 999)
        written = number_forms.disguise(number, cls, rng)
        assert canonical_tokens(f"has {written} pears") == ["has", str(number), "pears"], (cls, ascii(written))


def test_the_generator_draws_from_unicode_not_a_short_list():
    assert len(number_forms.separators()) > 300
    assert len(number_forms.digit_scripts()) > 50
    assert {"\u2009", "\u2800", "\u00b7", "\u2027", "\u0640", "\u200b"} <= set(number_forms.separators())


@pytest.mark.parametrize("cls", number_forms.CLASSES)
def test_sealed_items_with_disguised_numbers_are_caught(scanners, cls):
    rng = random.Random(f"{disguise.SEED}:scan:{cls}")
    for item in SEALED:
        a, b = (int(x) for x in re.findall(r"\d+", item["prompt"])[:2])
        question = rng.choice(FORMS).format(
            name=rng.choice(["Ines", "Kofi", "Lena"]),
            a=number_forms.disguise(a, cls, rng),
            b=number_forms.disguise(b, cls, rng),
        )
        row = {"prompt": PROMPT_TEMPLATE.replace("{question}", question),
               "completion": " " + number_forms.disguise(int(item["answer"]), cls, rng)}  # fmt: skip
        for name, scanner in scanners.items():
            assert item["id"] in {m.sample_id for m in scanner.scan_row(row)}, (name, cls, ascii(row))


def test_honest_separate_numbers_stay_separate():
    rng = random.Random(f"{disguise.SEED}:apart")
    for _ in range(200):
        a, b = rng.randint(1, 99), rng.randint(0, 99)
        if a < 10 and b < 10:
            b += 10  # two single digits one space apart are one number, by the rule
        for between in (" ", ", ", " and ", "\n", " – ", " + ", "-", "/", " x "):
            tokens = [t for t in canonical_tokens(f"{a}{between}{b}") if t[0].isdigit()]
            assert tokens == [str(a), str(b)], (a, between, b, tokens)
