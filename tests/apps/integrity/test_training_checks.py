"""Training subcategories: weight provenance, data provenance, teacher authorization — planted cases."""

from __future__ import annotations

import shutil

from apps.datapool.models import DataEntry
from apps.datapool.services import data_transform
from apps.datapool.storage import artifact_store
from apps.experiments.choices import ExperimentKind, IntegrityStatus
from apps.experiments.pipeline import experiment_start
from apps.experiments.services import experiment_create
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.services import integrity_run_checks
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.services import job_claim, job_fail
from apps.research.models import Run
from tests.apps.integrity.conftest import (
    CLEAN_ROWS,
    FEEDBACK,
    FINAL,
    TEMPLATE,
    checkpoint_path,
    finding,
    store_checkpoint,
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
