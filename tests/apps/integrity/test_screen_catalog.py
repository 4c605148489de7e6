"""The sealed-item screen on the built minibench: honest catalog data passes unchanged, the honeypot's
copies are withheld, as rows and as free text (a card quoting rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.benchmarks.minibench.catalog import Dataset, dataset_card
from apps.integrity.contamination import ContaminationScanner
from apps.integrity.screen import WITHHELD, SealedScreen
from tests.apps.benchmarks.minibench_fixture import minibench_root

ROWS = 60
CARD_ROWS = 400


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return minibench_root(tmp_path_factory)


def read_jsonl(path: Path, limit: int) -> list[dict]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [json.loads(line) for line in lines[:limit]]


def _meta(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text(encoding="utf-8"))


def _as_text(rows: list[dict]) -> str:
    return "\n\n".join("\n".join(str(v) for v in row.values()) for row in rows)


def test_the_screen_passes_honest_catalog_data_and_withholds_the_honeypots_copies(built):
    tasks = sorted(p for p in (built / "tasks").iterdir() if p.is_dir())
    sealed_all = []
    scanners = []
    for task_dir in tasks:
        task = json.loads((task_dir / "task.json").read_text())
        sealed = read_jsonl(task_dir / "feedback.jsonl", 10**6) + read_jsonl(task_dir / "final.jsonl", 10**6)
        sealed_all += sealed
        scanners.append(ContaminationScanner(sealed, templates=[task["prompt_template"]], evaluator=task["evaluator"]))
    screen = SealedScreen(scanners)
    datasets = sorted(p for p in (built / "catalog").iterdir() if (p / "meta.json").is_file())
    assert datasets

    for path in datasets:
        rows = read_jsonl(path / "data.jsonl", ROWS)
        meta = _meta(path)
        answer = {"rows": rows, "readme": (path / "README.md").read_text(encoding="utf-8")}
        screened, withheld = screen.value(answer)
        verbatim = {i for i, row in enumerate(rows) if any(item["prompt"] in _as_text([row]) for item in sealed_all)}
        if meta["quality"] != "honeypot":
            assert withheld == [], f"{path.name}: honest data withheld"
            assert screened == answer
            # As a card quoting many problems, one paragraph each: numbers of neighbouring problems
            # make no sealed item (the salient layer would join them across a window).
            many = _as_text(read_jsonl(path / "data.jsonl", CARD_ROWS))
            assert screen.text(many) == (many, [])
            continue
        assert verbatim, "the honeypot's first rows hold no verbatim sealed item"
        dropped = {int(w.at.rsplit("/", 1)[1]) for w in withheld}
        assert verbatim <= dropped
        assert screened["rows"] == [row for i, row in enumerate(rows) if i not in dropped]
        # The same rows quoted in a card: every verbatim copy is withheld, the card's own lines stay.
        card = dataset_card(Dataset(path.name, meta["task"], "?", meta["format"], meta["description"], rows[:20]))
        text, hits = screen.text(card + "\n" + _as_text(rows[:20]))
        assert hits
        assert WITHHELD in text
        for i in verbatim & set(range(20)):
            assert rows[i]["prompt"] not in text
        assert text.startswith(card.rstrip("\n"))
