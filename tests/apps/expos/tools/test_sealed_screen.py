"""Every read an agent makes of catalog or outside data passes the sealed-item screen (issue 33, item 13).

The discovery tools run for real against the local catalog and, for the Hub provider, against the
loopback fake of the Hub and its dataset viewer (tests/fakes/hf_hub.py). The sealed items are the
tools world's benchmark (conftest FEEDBACK / FINAL); the variants that carry them are generated
per seed by the red-team disguise generators (re-templated, fields re-ordered, number forms,
look-alike characters), mixed with honest rows written in the same forms with other numbers.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from apps.experiments.models import Event
from apps.integrity.models import BlockedAttempt
from tests.apps.expos.tools.conftest import CLEAN, FEEDBACK, FINAL, TEMPLATE, call
from tests.apps.integrity.redteam import disguise
from tests.fakes.hf_hub import FakeDataset, FakeDatasetsServer, FakeHub

SEALED = [{"id": i, "prompt": q, "answer": a} for i, q, a in FEEDBACK + FINAL]
SEALED_IDS = {item["id"] for item in SEALED}
SEALED_PAIRS = {tuple(sorted(disguise.numbers_of(item["prompt"])[:2])) for item in SEALED}
SEEDS = (disguise.SEED, disguise.SEED + 1)


def _answer_first(row: dict[str, Any]) -> dict[str, Any]:
    return dict(reversed(list(row.items())))


def _qa(row: dict[str, Any]) -> dict[str, Any]:
    question = row["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:")
    return {"answer": row["completion"].strip(), "question": question}  # answer written first


# Variant classes: each turns a (sealed or honest) item into a row. The same classes make the
# honest rows, so only the numbers tell them apart.
VARIANTS = {
    "verbatim, completion first": lambda item, rng: _answer_first(disguise.verbatim(item)),
    "re-templated": disguise.retemplate,
    "re-templated, completion first": lambda item, rng: _answer_first(disguise.retemplate(item, rng)),
    "question/answer fields, answer first": lambda item, rng: _qa(disguise.verbatim(item)),
    **{
        name: lambda item, rng, how=how: disguise.perturb(item, rng, how)
        for name, how in disguise.PERTURBATIONS.items()
    },
    "mixed forms": disguise.mixed,
}


def honest_item(rng: random.Random) -> dict[str, Any]:
    """An addition problem in a sealed item's sentence form, with operands no sealed item has."""
    template = rng.choice(SEALED)["prompt"]
    while True:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if tuple(sorted((a, b))) not in SEALED_PAIRS:
            break
    operands = iter((str(a), str(b)))
    prompt = re.sub(r"\d+", lambda m: next(operands, m.group()), template)
    return {"id": "honest", "prompt": prompt, "answer": str(a + b)}


def mixed_rows(seed: int) -> tuple[list[dict[str, Any]], set[int]]:
    """Rows of every variant class, sealed and honest, shuffled; and the indices of the sealed ones."""
    rng = random.Random(seed)
    rows: list[tuple[bool, dict[str, Any]]] = []
    for make in VARIANTS.values():
        rows.append((True, make(rng.choice(SEALED), rng)))
        rows += [(False, make(honest_item(rng), rng)) for _ in range(2)]
    rng.shuffle(rows)
    return [row for _, row in rows], {i for i, (sealed, _) in enumerate(rows) if sealed}


HUB_DATASETS = {seed: mixed_rows(seed) for seed in SEEDS}
HONEST_CARD = "# Sums\n\nAddition problems written by volunteers.\n\n## Example\n\n{example}\n\nLicense: MIT.\n"


def _card_item(seed: int) -> tuple[str, str]:
    """A card's example: a sealed item in a generated disguise, and an honest one in the same form."""
    rng = random.Random(seed)
    make = rng.choice(list(VARIANTS.values()))
    sealed = make(rng.choice(SEALED), rng)
    honest = make(honest_item(rng), rng)
    return "\n".join(str(v) for v in sealed.values()), "\n".join(str(v) for v in honest.values())


def _fake(seed: int, kind: str, rows: list[dict[str, Any]], example: str) -> FakeDataset:
    return FakeDataset(
        id=f"acme/sums-{kind}-{seed}",
        description="Addition word problems",
        tags=["task_categories:question-answering"],
        card_yaml="license: mit\n",
        card_body=HONEST_CARD.format(example=example),
        rows={"default": {"train": rows}},
    )


FAKES = [
    fake
    for seed in SEEDS
    for fake in (
        _fake(seed, "mixed", HUB_DATASETS[seed][0], _card_item(seed)[0]),
        _fake(seed, "honest", [r for i, r in enumerate(HUB_DATASETS[seed][0]) if i not in HUB_DATASETS[seed][1]],
              _card_item(seed)[1]),
    )
]  # fmt: skip


@pytest.fixture(scope="module")
def hub():
    with FakeHub(FAKES) as fake_hub, FakeDatasetsServer(FAKES) as viewer:
        yield {"hf_provider": "hub", "hf_endpoint": fake_hub.url, "hf_datasets_server_url": viewer.url}


def _withholdings(world: Any) -> tuple[int, int]:
    return (
        BlockedAttempt.objects.filter(run=world.run, subcategory="test_set_access").count(),
        Event.objects.filter(run=world.run, type="access.withheld").count(),
    )


def _assert_recorded(world: Any, before: tuple[int, int], tool: str, places: list[dict[str, Any]]) -> None:
    assert _withholdings(world) == (before[0] + 1, before[1] + 1)
    attempt = BlockedAttempt.objects.filter(run=world.run).latest("pk")
    assert attempt.tool == tool
    assert attempt.node_id == world.worker.pk
    assert set(attempt.request["evidence"]["sample_ids"]) <= SEALED_IDS
    assert attempt.request["evidence"]["sample_ids"]
    event = Event.objects.filter(run=world.run, type="access.withheld").latest("pk")
    assert event.actor == world.worker.handle
    # What the reader may see of its own record names the places, never the sealed items.
    assert event.arguments["withheld"] == places
    assert not SEALED_IDS & set(json.dumps(event.arguments).replace('"', " ").split())


@pytest.mark.parametrize("seed", SEEDS)
def test_hub_sample_withholds_every_generated_sealed_variant_and_passes_honest_rows(world, settings, hub, seed):
    settings.RSI_CONNECTORS = hub
    rows, sealed = HUB_DATASETS[seed]
    before = _withholdings(world)

    got = call(world.ctx(world.worker), "hf_dataset_sample", {"dataset": f"acme/sums-mixed-{seed}", "n": 100})

    assert got["rows"] == [row for i, row in enumerate(rows) if i not in sealed]  # honest rows unchanged
    assert [w["at"] for w in got["withheld"]] == [f"/rows/{i}" for i in sorted(sealed)]
    assert all("sealed evaluation item" in w["reason"] for w in got["withheld"])
    _assert_recorded(world, before, "hf_dataset_sample", got["withheld"])


@pytest.mark.parametrize("seed", SEEDS)
def test_honest_hub_data_and_card_come_through_unchanged_and_unrecorded(world, settings, hub, seed):
    settings.RSI_CONNECTORS = hub
    rows, sealed = HUB_DATASETS[seed]
    before = _withholdings(world)
    ctx = world.ctx(world.worker)

    sample = call(ctx, "hf_dataset_sample", {"dataset": f"acme/sums-honest-{seed}", "n": 100})
    card = call(ctx, "hf_dataset_readme", {"dataset": f"acme/sums-honest-{seed}"})

    assert sample["rows"] == [row for i, row in enumerate(rows) if i not in sealed]
    assert sample["withheld"] == card["withheld"] == []
    assert card["readme"].endswith(HONEST_CARD.format(example=_card_item(seed)[1]))
    assert _withholdings(world) == before


@pytest.mark.parametrize("seed", SEEDS)
def test_a_dataset_card_with_a_sealed_item_is_screened_line_by_line(world, settings, hub, seed):
    settings.RSI_CONNECTORS = hub
    before = _withholdings(world)
    sealed_example = _card_item(seed)[0]

    card = call(world.ctx(world.worker), "hf_dataset_readme", {"dataset": f"acme/sums-mixed-{seed}"})

    for line in sealed_example.splitlines():
        if any(ch.isdigit() for ch in line) or len(line) > 20:
            assert line not in card["readme"]
    assert "[withheld: matches a sealed evaluation item]" in card["readme"]
    # The honest text around the item is still there, line for line.
    for line in ("# Sums", "Addition problems written by volunteers.", "## Example", "License: MIT."):
        assert line in card["readme"].splitlines()
    assert [w["at"] for w in card["withheld"]] == ["/readme"]
    assert "lines" in card["withheld"][0]
    _assert_recorded(world, before, "hf_dataset_readme", card["withheld"])


def test_catalog_honeypot_sample_withholds_what_worker_inspect_data_withholds(world):
    ctx = world.ctx(world.worker)
    before = _withholdings(world)

    sample = call(ctx, "hf_dataset_sample", {"dataset": "arith-honeypot", "n": 20})
    inspected = call(ctx, "worker_inspect_data", {"data": world.honeypot, "rows": 20})

    # The honeypot (conftest): rows 3 and 6 are a feedback and a final item, in the task template.
    assert [w["at"] for w in sample["withheld"]] == ["/rows/3", "/rows/6"]
    assert [w["at"] for w in inspected["withheld"]] == ["/sample/3", "/sample/6"]
    assert sample["rows"] == inspected["sample"] == [{"prompt": p, "completion": c} for p, c in CLEAN[:5]]
    text = json.dumps(sample)
    for _, question, _ in FEEDBACK + FINAL:
        assert question not in text
    assert _withholdings(world) == (before[0] + 2, before[1] + 2)
    assert list(
        BlockedAttempt.objects.filter(run=world.run, subcategory="test_set_access")
        .order_by("pk")
        .values_list("tool", flat=True)
    )[-2:] == ["hf_dataset_sample", "worker_inspect_data"]


def test_a_catalog_readme_and_every_role_go_through_the_screen(world, roots):
    readme = roots["catalog"] / "arith-honeypot" / "README.md"
    readme.write_text(
        readme.read_text(encoding="utf-8") + f"\nA hard one:\n{TEMPLATE.format(question=FINAL[0][1])} {FINAL[0][2]}\n",
        encoding="utf-8",
    )
    for node in (world.worker, world.main, world.reviewer):
        card = call(world.ctx(node), "hf_dataset_readme", {"dataset": "arith-honeypot"})
        assert FINAL[0][1] not in card["readme"]
        assert "A hard one:" in card["readme"]
        assert [w["at"] for w in card["withheld"]] == ["/readme"]
    clean = call(world.ctx(world.worker), "hf_dataset_readme", {"dataset": "arith-clean"})
    assert clean["withheld"] == []
    assert "# arith-clean" in clean["readme"]
