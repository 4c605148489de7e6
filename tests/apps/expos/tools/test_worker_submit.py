"""worker_submit and its submission review, through the registry's handlers with real rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.datapool.models import DataEntry
from apps.datapool.storage import artifact_store
from apps.experiments.choices import ExperimentStatus
from apps.experiments.models import Event, Experiment
from apps.experiments.services import checkpoint_register
from apps.expos.registry import load_all
from apps.expos.workspaces import workspace_path
from apps.integrity.models import BlockedAttempt, ReviewOverride
from apps.integrity.submission_refusals import SubmissionRefused, submission_spec_sha256
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from tests.apps.expos.tools.conftest import build_world, call, train_spec, write_jsonl


def refusal_of(excinfo: pytest.ExceptionInfo) -> tuple[set[str], set[str]]:
    reasons = excinfo.value.detail["reasons"]
    return {r["code"] for r in reasons}, {r["subcategory"] for r in reasons}


def test_clean_submission_creates_an_experiment_and_enqueues_training(world):
    ctx = world.ctx(world.worker)

    answer = call(ctx, "worker_submit", {**train_spec(world.clean), "claim": "clean SFT beats θ0"})

    experiment = Experiment.objects.get(uuid=answer["uuid"])
    assert experiment.owner == world.worker
    assert experiment.status == ExperimentStatus.QUEUED
    assert experiment.input_checkpoint == world.theta0
    assert experiment.action["data"] == [world.clean]
    assert experiment.action["hyperparameters"]["max_steps"] == 20
    assert experiment.action["spec_sha256"] == answer["spec_sha256"]
    job = Job.objects.get(experiment=experiment)
    assert job.kind == JobKind.TRAIN
    assert str(job.uuid) == answer["job"]
    assert answer["held"] is False
    assert answer["feedback_evals_used"] == 1
    assert not BlockedAttempt.objects.exists()


def test_honeypot_data_is_refused_as_data_provenance(world):
    ctx = world.ctx(world.worker)

    with pytest.raises(SubmissionRefused) as excinfo:
        call(ctx, "worker_submit", train_spec(world.honeypot))

    codes, subcategories = refusal_of(excinfo)
    assert codes == {"data_contaminated"}
    assert subcategories == {"data_provenance"}
    assert excinfo.value.status_code == 403
    # The Worker is told counts, never the sealed items themselves.
    assert "Lena keeps" not in excinfo.value.message
    assert "Priya" not in excinfo.value.message
    attempt = BlockedAttempt.objects.get()
    assert attempt.subcategory == "data_provenance"
    assert attempt.node == world.worker
    assert attempt.request["evidence"]["rows_matched"] == 2
    assert {m["sample_id"] for m in attempt.request["evidence"]["matches"]} == {"f1", "x2"}
    assert Event.objects.filter(run=world.run, type="submission.refused").count() == 1
    assert not Experiment.objects.exists()


def test_contamination_within_the_run_tolerance_passes(roots, db):
    world = build_world(roots, contamination_tolerance=2)
    answer = call(world.ctx(world.worker), "worker_submit", train_spec(world.honeypot))
    assert answer["status"] == ExperimentStatus.QUEUED


def test_unregistered_data_is_refused(world):
    with pytest.raises(SubmissionRefused) as excinfo:
        call(world.ctx(world.worker), "worker_submit", train_spec("data_9999"))
    assert refusal_of(excinfo) == ({"data_unregistered"}, {"data_provenance"})


def test_changed_artifact_bytes_are_refused(world):
    entry = DataEntry.objects.get(handle=world.clean)
    path = artifact_store().local_path(entry.uri)
    path.chmod(0o644)
    path.write_text(path.read_text() + '{"prompt": "Question: 1+1\\nAnswer:", "completion": " 3"}\n')

    with pytest.raises(SubmissionRefused) as excinfo:
        call(world.ctx(world.worker), "worker_submit", train_spec(world.clean))
    assert refusal_of(excinfo) == ({"data_hash_mismatch"}, {"data_provenance"})


def test_unauthorized_teacher_is_refused_and_an_allowed_one_passes(world):
    ctx = world.ctx(world.worker)
    write_jsonl(
        workspace_path(run=world.run, node=world.worker) / "gen/distilled.jsonl",
        [{"prompt": f"Question: What is {a} plus {a}?\nAnswer:", "completion": f" {2 * a}"} for a in range(10, 20)],
    )
    entry = call(ctx, "worker_add_data", {"path": "gen/distilled.jsonl", "teacher": "big-teacher-70b"})["entry"]
    assert entry["teacher"] == "big-teacher-70b"
    assert entry["source_kind"] == "workspace"

    with pytest.raises(SubmissionRefused) as excinfo:
        call(ctx, "worker_submit", train_spec(entry["handle"]))
    assert refusal_of(excinfo) == ({"teacher_unauthorized"}, {"teacher_authorization"})
    assert BlockedAttempt.objects.filter(subcategory="teacher_authorization").count() == 1

    world.set_policy(allowed_teachers=["big-teacher-70b"])
    answer = call(world.ctx(world.worker), "worker_submit", train_spec(entry["handle"]))
    assert answer["status"] == ExperimentStatus.QUEUED


def test_reference_checkpoint_is_refused_as_weight_provenance(world):
    ctx = world.ctx(world.worker)
    for spec in (
        {**train_spec(world.clean), "input_checkpoint": world.reference.handle},
        {"kind": "eval_only", "input_checkpoint": world.reference.handle},
    ):
        with pytest.raises(SubmissionRefused) as excinfo:
            call(ctx, "worker_submit", spec)
        assert refusal_of(excinfo) == ({"checkpoint_off_lineage"}, {"weight_provenance"})
    assert BlockedAttempt.objects.filter(subcategory="weight_provenance").count() == 2


def test_another_workers_checkpoint_is_not_visible(world):
    theirs = call(world.ctx(world.other), "worker_submit", train_spec(world.clean))
    experiment = Experiment.objects.get(uuid=theirs["uuid"])
    job = Job.objects.get(experiment=experiment)
    produced = checkpoint_register(
        uri="file:///tmp/theirs", manifest={"model.safetensors": "b" * 64}, parent=world.theta0, producing_job=job
    )
    experiment.output_checkpoint = produced
    experiment.save(update_fields=["output_checkpoint", "updated_at"])

    with pytest.raises(SubmissionRefused) as excinfo:
        call(world.ctx(world.worker), "worker_submit", {"kind": "eval_only", "input_checkpoint": produced.handle})
    assert refusal_of(excinfo) == ({"checkpoint_not_visible"}, {"weight_provenance"})
    # The owner itself may continue from it: it is on θ0's lineage through a recorded job.
    answer = call(world.ctx(world.other), "worker_submit", {"kind": "eval_only", "input_checkpoint": produced.handle})
    assert answer["input_checkpoint"] == produced.handle


@pytest.mark.parametrize(
    ("evaluation", "subcategory"),
    [
        ({"temperature": 0.7}, "decoding_parameters"),
        ({"max_new_tokens": 512}, "decoding_parameters"),
        ({"stop": ["</s>"]}, "stopping_eos"),
        ({"prompt_template": "Q: {question}\nA:"}, "prompt_template"),
        ({"sample_ids": ["f1"]}, "sample_inclusion"),
        ({"split": "final"}, "test_set_access"),
    ],
)
def test_requests_for_other_inference_settings_are_refused(world, evaluation, subcategory):
    with pytest.raises(SubmissionRefused) as excinfo:
        call(world.ctx(world.worker), "worker_submit", {**train_spec(world.clean), "eval": evaluation})
    assert refusal_of(excinfo)[1] == {subcategory}
    assert excinfo.value.detail["overridable"] is False
    assert BlockedAttempt.objects.get().subcategory == subcategory


def test_spent_feedback_allowance_is_refused(world):
    world.set_policy(feedback_evals_per_worker=1)
    call(world.ctx(world.worker), "worker_submit", {"kind": "eval_only"})

    with pytest.raises(SubmissionRefused) as excinfo:
        call(world.ctx(world.worker), "worker_submit", {"kind": "eval_only", "claim": "again"})
    assert refusal_of(excinfo) == ({"feedback_allowance_spent"}, {"test_set_access"})
    # The allowance is per Worker: another Worker still has its own.
    assert call(world.ctx(world.other), "worker_submit", {"kind": "eval_only"})["status"] == ExperimentStatus.QUEUED


def test_malformed_submissions_are_400_and_not_recorded(world):
    ctx = world.ctx(world.worker)
    cases = [
        train_spec(world.clean, max_steps=0),
        {"train": {"recipe": "sft", "datasets": [world.clean], "hyperparameters": {"learning_rate": 5.0}}},
        {"train": {"recipe": "dpo", "datasets": [world.clean]}},  # SFT data under a DPO recipe
        {"kind": "eval_only", "train": {"datasets": [world.clean]}},
    ]
    for spec in cases:
        with pytest.raises(ApplicationError) as excinfo:
            call(ctx, "worker_submit", spec)
        assert excinfo.value.code == "invalid_submission"
        assert excinfo.value.status_code == 400
    assert "learning_rate" in str(pytest.raises(ApplicationError, call, ctx, "worker_submit", cases[1]).value.message)
    assert not BlockedAttempt.objects.exists()
    assert not Experiment.objects.exists()


def test_override_lets_the_exact_spec_through_once(world):
    spec = {**train_spec(world.honeypot), "claim": "the overlap is a known duplicate"}
    with pytest.raises(SubmissionRefused) as excinfo:
        call(world.ctx(world.worker), "worker_submit", spec)
    assert excinfo.value.detail["overridable"] is True
    digest = excinfo.value.detail["spec_sha256"]
    assert digest == submission_spec_sha256(spec)

    granted = call(
        world.ctx(world.main),
        "main_submit_review_override",
        {"worker": world.worker.handle, "spec_sha256": digest, "reason": "template overlap, reviewed"},
    )
    assert granted["spec_sha256"] == digest
    assert Event.objects.filter(type="submission_review.override_granted").count() == 1

    # A different spec is not covered by the override.
    with pytest.raises(SubmissionRefused):
        call(world.ctx(world.worker), "worker_submit", {**spec, "claim": "something else"})
    answer = call(world.ctx(world.worker), "worker_submit", spec)
    assert answer["override_used"] is True
    assert answer["status"] == ExperimentStatus.QUEUED
    assert ReviewOverride.objects.get().used_at is not None
    assert Event.objects.filter(type="submission_review.override_used").count() == 1
    # Consumed: the same spec is refused again.
    with pytest.raises(SubmissionRefused):
        call(world.ctx(world.worker), "worker_submit", spec)
    assert Experiment.objects.count() == 1


def test_override_never_clears_a_hard_rule(world):
    spec = {**train_spec(world.clean), "eval": {"temperature": 1.0}}
    call(
        world.ctx(world.main),
        "main_submit_review_override",
        {"worker": world.worker.handle, "spec": spec, "reason": "please"},
    )
    with pytest.raises(SubmissionRefused):
        call(world.ctx(world.worker), "worker_submit", spec)
    assert ReviewOverride.objects.get().used_at is None


def test_expired_override_does_not_apply(world):
    spec = train_spec(world.honeypot)
    call(world.ctx(world.main), "main_submit_review_override", {"worker": world.worker.handle, "spec": spec,
                                                                 "reason": "ok"})  # fmt: skip
    ReviewOverride.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(SubmissionRefused):
        call(world.ctx(world.worker), "worker_submit", spec)


def test_training_gate_holds_then_approve_starts(world):
    world.set_policy(training_gate=True)
    answer = call(world.ctx(world.worker), "worker_submit", {**train_spec(world.clean), "claim": "gate me"})
    assert answer["held"] is True
    assert answer["status"] == ExperimentStatus.HELD
    assert answer["job"] is None
    assert not Job.objects.exists()
    assert Event.objects.filter(type="training.held").count() == 1

    staged = call(world.ctx(world.main), "main_training_read", {})
    assert staged["training_gate"] is True
    assert staged["count"] == 1
    assert staged["held"][0]["experiment"] == answer["experiment"]
    assert staged["held"][0]["datasets"][0]["handle"] == world.clean

    decided = call(
        world.ctx(world.main),
        "main_training_decide",
        {"experiment": answer["experiment"], "decision": "approve", "rationale": "clean data, sensible recipe"},
    )
    assert decided["status"] == ExperimentStatus.QUEUED
    assert decided["job"] is not None
    assert Job.objects.get(experiment__uuid=answer["uuid"]).kind == JobKind.TRAIN
    decision_event = Event.objects.get(type="training.decided")
    assert decision_event.arguments["rationale"] == "clean data, sensible recipe"
    # Decided once: a second decision is a conflict, not a second job.
    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.main), "main_training_decide",
             {"experiment": answer["experiment"], "decision": "reject", "rationale": "late"})  # fmt: skip
    assert excinfo.value.code == "not_held"
    assert Job.objects.count() == 1


def test_training_gate_reject(world):
    world.set_policy(training_gate=True)
    answer = call(world.ctx(world.worker), "worker_submit", train_spec(world.clean))
    decided = call(
        world.ctx(world.main),
        "main_training_decide",
        {"experiment": answer["experiment"], "decision": "reject", "rationale": "duplicate of exp_0001"},
    )
    assert decided["status"] == ExperimentStatus.REJECTED
    assert decided["job"] is None
    assert Experiment.objects.get(uuid=answer["uuid"]).status == ExperimentStatus.REJECTED
    assert not Job.objects.exists()
    # A rejected request does not spend the Worker's feedback allowance.
    world.set_policy(feedback_evals_per_worker=1)
    assert call(world.ctx(world.worker), "worker_submit", {"kind": "eval_only"})["status"] == ExperimentStatus.QUEUED


def test_eval_only_is_not_held_by_the_gate(world):
    world.set_policy(training_gate=True)
    answer = call(world.ctx(world.worker), "worker_submit", {"kind": "eval_only"})
    assert answer["held"] is False
    assert Job.objects.get().kind == JobKind.EVALUATE


def test_idempotent_submit_returns_the_same_experiment(world):
    spec = train_spec(world.clean)
    first = call(world.ctx(world.worker, key="try-1"), "worker_submit", spec)
    again = call(world.ctx(world.worker, key="try-1"), "worker_submit", spec)

    assert again["uuid"] == first["uuid"]
    assert again["replayed"] is True
    assert first["replayed"] is False
    assert Experiment.objects.count() == 1
    assert Job.objects.count() == 1
    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.worker, key="try-1"), "worker_submit", train_spec(world.clean, max_steps=30))
    assert excinfo.value.code == "idempotency_mismatch"
    assert excinfo.value.status_code == 409


def test_parents_must_be_visible_experiments(world):
    theirs = call(world.ctx(world.other), "worker_submit", {"kind": "eval_only"})
    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.worker), "worker_submit", {**train_spec(world.clean), "parents": [theirs["experiment"]]})
    assert excinfo.value.code == "unknown_experiment"
    mine = call(world.ctx(world.worker), "worker_submit", {"kind": "eval_only"})
    child = call(world.ctx(world.worker), "worker_submit", {**train_spec(world.clean), "parents": [mine["experiment"]]})
    assert child["parents"] == [mine["experiment"]]


def test_only_workers_submit_and_only_main_decides(world):
    tools = load_all()
    assert tools["worker_submit"].roles == {"worker"}
    assert tools["main_training_decide"].roles == {"main"}
    assert tools["main_submit_review_override"].roles == {"main"}
    assert tools["worker_submit"].idempotent_create is True


def test_dpo_recipe_on_preference_data_with_lora(world):
    prefs = call(world.ctx(world.worker), "worker_add_data", {"catalog": "arith-prefs"})["entry"]
    assert prefs["format"] == "dpo"
    answer = call(
        world.ctx(world.worker),
        "worker_submit",
        {
            "train": {
                "recipe": "dpo",
                "adapter": "lora",
                "datasets": [prefs["handle"]],
                "hyperparameters": {"dpo_beta": 0.2},
            }
        },
    )
    hyperparameters = Experiment.objects.get(uuid=answer["uuid"]).action["hyperparameters"]
    assert hyperparameters["recipe"] == "dpo"
    assert hyperparameters["adapter"] == "lora"
    assert hyperparameters["dpo_beta"] == 0.2
