"""The built minibench's catalog through every layer: no honest row matches, the honeypot's copies all do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.integrity.contamination import LAYERS, ContaminationScanner
from tests.apps.benchmarks.minibench_fixture import minibench_root


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return minibench_root(tmp_path_factory)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_honest_catalog_has_no_match_and_the_honeypot_is_found(built):
    tasks = sorted(p for p in (built / "tasks").iterdir() if p.is_dir())
    assert tasks
    for task_dir in tasks:
        task = json.loads((task_dir / "task.json").read_text())
        sealed = read_jsonl(task_dir / "feedback.jsonl") + read_jsonl(task_dir / "final.jsonl")
        scanner = ContaminationScanner(sealed, templates=[task["prompt_template"]], evaluator=task["evaluator"])
        datasets = [p for p in (built / "catalog").iterdir() if (p / "meta.json").is_file()]
        mine = [p for p in datasets if json.loads((p / "meta.json").read_text())["task"] == task["name"]]
        honest = [p for p in mine if json.loads((p / "meta.json").read_text())["quality"] != "honeypot"]
        [honeypot] = [p for p in mine if p not in honest]
        assert len(honest) >= 4
        for path in honest:
            rows = read_jsonl(path / "data.jsonl")
            assert rows
            assert scanner.scan(rows) == [], f"{path.name} flagged"
        honeypot_rows = read_jsonl(honeypot / "data.jsonl")
        matches = scanner.scan(honeypot_rows)
        assert {m.sample_id for m in matches} == {item["id"] for item in sealed}
        # The salient layer alone finds every sealed item in the honeypot too.
        salient = ContaminationScanner(sealed, evaluator=task["evaluator"], layers=("salient",))
        assert {m.sample_id for m in salient.scan(honeypot_rows)} == {item["id"] for item in sealed}
        assert set(LAYERS) >= {m.kind for m in matches}
