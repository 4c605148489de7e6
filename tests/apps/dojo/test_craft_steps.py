"""RSI-Craft's steps on hand-made tasks: the decisions and their numbers (no model needed)."""

from __future__ import annotations

import pytest

from apps.dojo.choices import RejectionReason
from apps.ml import craft
from apps.ml.craft_config import craft_config

SUM = {"evaluator": "exact_match", "prompt_template": "{question} =", "decoding": {"max_new_tokens": 4}, "stop": []}
CHOICE = {**SUM, "evaluator": "multiple_choice"}


def _items(n: int, subset: str = "sum", prefix: str = "q") -> list[dict]:
    return [{"id": f"{prefix}-{i:03d}", "prompt": f"{i}+1", "answer": str(i + 1), "subset": subset} for i in range(n)]


def _task(n: int) -> craft.TaskCandidate:
    return craft.TaskCandidate("t", "t", "sum", SUM, _items(n))


def test_rejection_names_match_the_database_choices():
    assert set(craft.REJECTIONS) == set(RejectionReason.values)


def test_subsets_with_different_metrics_become_separate_tasks():
    items = _items(60, "sum", "a") + _items(70, "choice", "b")
    decision, tasks = craft.split_subsets("mixed", {"sum": SUM, "choice": CHOICE}, items)
    assert sorted(t.name for t in tasks) == ["mixed/choice", "mixed/sum"]
    assert {t.subset: len(t.items) for t in tasks} == {"sum": 60, "choice": 70}
    assert decision.numbers["metrics"] == {"choice": "multiple_choice", "sum": "exact_match"}


def test_subsets_with_one_contract_stay_one_task():
    _, tasks = craft.split_subsets("same", {"x": SUM, "y": SUM}, _items(30, "x", "a") + _items(30, "y", "b"))
    assert [(t.name, len(t.items)) for t in tasks] == [("same", 60)]


def test_size_filter_drops_under_50_and_keeps_50():
    config = craft.CraftConfig()
    decision, kept = craft.size_filter(_task(49), config)
    assert (decision.kept, decision.reason, kept) == (False, "too_small", None)
    decision, kept = craft.size_filter(_task(50), config)
    assert decision.kept
    assert kept is not None
    assert len(kept.items) == 50


def test_downsampling_is_seeded_frozen_and_changes_with_the_seed():
    first = craft.size_filter(_task(400), craft.CraftConfig())[1]
    again = craft.size_filter(_task(400), craft.CraftConfig())[1]
    other = craft.size_filter(_task(400), craft.CraftConfig(seed=1))[1]
    assert first is not None
    assert again is not None
    assert other is not None
    assert len(first.items) == 300
    assert first.sample_ids == again.sample_ids
    assert first.sample_ids != other.sample_ids
    assert set(first.sample_ids) <= {it["id"] for it in _task(400).items}


def test_mutation_check_keeps_a_metric_that_reads_the_output():
    task = _task(60)
    outputs = [it["answer"] for it in task.items]  # a perfect strong model
    decision = craft.mutation_check(task, outputs, craft.CraftConfig())
    assert decision.kept
    assert decision.numbers["scores"]["strong"] == 1.0
    assert decision.numbers["scores"]["blank"] == 0.0
    assert decision.numbers["scores"]["shuffled"] < 0.1  # every output moved to another item


def test_mutation_check_rejects_a_metric_no_output_can_move():
    task = craft.TaskCandidate("blind", "blind", "sum", {**SUM, "evaluator": "json_call"}, _items(60))
    decision = craft.mutation_check(task, [it["answer"] for it in task.items], craft.CraftConfig())
    assert (decision.kept, decision.reason) == (False, "metric_ignores_output")
    assert set(decision.numbers["scores"].values()) == {0.0}


@pytest.mark.parametrize(
    ("base", "strong", "reason"),
    [(0.0, 0.5, ""), (0.85, 0.95, "too_easy"), (0.05, 0.15, "too_hard"), (0.4, 0.45, "not_discriminative"),
     (0.30, 0.40, "")],
)  # fmt: skip
def test_discriminability_thresholds(base, strong, reason):
    decision = craft.discriminability(_task(60), base=base, strong=strong, config=craft.CraftConfig())
    assert decision.reason == reason
    assert decision.kept is (reason == "")


def test_thresholds_are_configurable():
    config = craft_config({"min_gap": 0.5})
    assert craft.discriminability(_task(60), base=0.0, strong=0.45, config=config).reason == "not_discriminative"


@pytest.mark.parametrize(
    ("values", "message"),
    [({"min_gpa": 0.1}, "unknown filter setting"), ({"min_gap": 10}, "fraction"), ({"repeats": 1}, "at least 2"),
     ({"min_items": 400}, "exceeds max_items")],
)  # fmt: skip
def test_bad_thresholds_are_refused_with_the_reason(values, message):
    with pytest.raises(ValueError, match=message):
        craft_config(values)
