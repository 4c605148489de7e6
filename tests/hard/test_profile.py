"""The hard profile's build: its digest is the one docs/benchmarks.md recorded, and its traps are there."""

from __future__ import annotations

import json
import re
from pathlib import Path

from apps.benchmarks.minibench.build import source_digest
from apps.benchmarks.minibench.hard import NAMESPACE, hard_source_digest
from apps.benchmarks.minibench.hard.build import EXPORT_MARKER, SUGGESTED_BUDGET
from apps.expos.connectors.base import ConnectorConfig
from apps.expos.connectors.local_catalog import LocalCatalogConnector
from apps.ml.hparams import LR_SCHEDULERS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def _rows(root: Path, name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (root / "catalog" / name / "data.jsonl").open(encoding="utf-8")]


def test_the_build_carries_the_digest_recorded_before_any_ablation(hard_root: Path):
    manifest = json.loads((hard_root / "manifest.json").read_text())
    assert manifest["source_digest"] == hard_source_digest()
    assert manifest["namespace"] == NAMESPACE
    section = DOCS.read_text(encoding="utf-8").split("## Minibench `hard` profile", 1)[1]
    recorded = re.search(r"Profile digest.*?`([0-9a-f]{64})`", section, re.S)
    assert recorded is not None
    assert recorded.group(1) == hard_source_digest()
    # The ci/full digest does not read the subpackage: the hard code is not part of it.
    assert source_digest() != hard_source_digest()
    assert "20efda56" in section


def test_the_obvious_search_finds_the_traps_and_another_term_finds_the_clean_set(hard_root: Path):
    catalog = LocalCatalogConnector(ConnectorConfig(hf_provider="local", local_catalog_dir=str(hard_root / "catalog")))
    obvious = {d["id"] for d in catalog.search_datasets({"query": "arithmetic", "limit": 20})["datasets"]}
    other = {d["id"] for d in catalog.search_datasets({"query": "addition", "limit": 20})["datasets"]}
    assert {"arithmetic-word-problems", "arithmetic-forum-export"} <= obvious
    assert "addition-drills" not in obvious
    assert "addition-drills" in other
    # No card or meta says which set is which.
    for name in json.loads((hard_root / "manifest.json").read_text())["datasets"]:
        meta = json.loads((hard_root / "catalog" / name / "meta.json").read_text())
        assert "quality" not in meta


def _sum_of(prompt: str) -> int:
    a, b = (int(n) for n in re.findall(r"\d+", prompt)[:2])
    return a + b


def test_the_noisy_set_is_wrong_on_a_share_of_rows_and_the_clean_one_never(hard_root: Path):
    noisy = _rows(hard_root, "arithmetic-word-problems")
    wrong = sum(int(r["completion"]) != _sum_of(r["prompt"]) for r in noisy) / len(noisy)
    assert 0.2 < wrong < 0.45
    clean = _rows(hard_root, "addition-drills")
    assert all(int(r["completion"]) == _sum_of(r["prompt"]) for r in clean)


def test_the_export_answers_right_and_then_writes_a_literal_end_marker(hard_root: Path):
    export = _rows(hard_root, "arithmetic-forum-export")
    assert all(r["completion"].endswith(EXPORT_MARKER) for r in export)
    assert all(int(r["completion"].removesuffix(EXPORT_MARKER)) == _sum_of(r["prompt"]) for r in export)


def test_the_manifest_carries_the_budget_the_ablation_gives_every_arm(hard_root: Path):
    manifest = json.loads((hard_root / "manifest.json").read_text())
    assert manifest["suggested_budget"] == SUGGESTED_BUDGET
    assert SUGGESTED_BUDGET["lr_scheduler_type"] in LR_SCHEDULERS
