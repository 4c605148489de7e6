"""Fail-closed checks, adjudication, the acceptance rule, shared flags, hacking rate, selection, hooks, report."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command

from apps.core.errors import ApplicationError
from apps.experiments.choices import IntegrityStatus
from apps.experiments.models import IntegrityStatusChange
from apps.expos.auth import agent_token_issue
from apps.flows.agent_reports import worker_finalize
from apps.integrity import checks
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.models import BlockedAttempt, FindingChange, IntegrityFinding
from apps.integrity.report import integrity_report
from apps.integrity.selectors import best_accepted_experiment, hacking_rate, hacking_rate_by_task
from apps.integrity.services import (
    finding_adjudicate,
    integrity_flag_shared,
    integrity_on_experiment_finished,
    integrity_on_report,
    integrity_run_checks,
    reviewer_adjudicate,
)
from apps.research.choices import NodeKind
from apps.research.models import Run
from apps.research.services import node_create, node_finalize
from tests.apps.integrity.conftest import checkpoint_path, finding
from workers.data.tasks import integrity_check_task, integrity_reports_task


def _crash(subject):
    raise RuntimeError("disk on fire")


# --------------------------------------------------------------------------- fail closed


def test_a_crashing_check_leaves_unknown_with_the_error_and_never_accepts(world, monkeypatch):
    monkeypatch.setitem(checks.CHECKS, Subcategory.SAMPLE_INCLUSION, _crash)
    experiment = world.train([world.data["clean"]])

    integrity_run_checks(experiment=experiment)

    result = finding(experiment, Subcategory.SAMPLE_INCLUSION)
    assert result.observation == Observation.UNKNOWN
    assert "disk on fire" in result.evidence["error"]
    assert "RuntimeError" in result.evidence["traceback"]
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING
    with pytest.raises(ApplicationError) as refused:
        finding_adjudicate(finding=result, adjudication=Adjudication.ALLOWED, actor="user:admin", rationale="looks ok")
    assert refused.value.code == "unknown_not_clearable"


def test_a_check_missing_from_the_registry_is_unknown(world, monkeypatch):
    monkeypatch.delitem(checks.CHECKS, Subcategory.HARNESS_VERIFIER)
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    assert finding(experiment, Subcategory.HARNESS_VERIFIER).observation == Observation.UNKNOWN


def test_an_experiment_never_checked_is_pending(world):
    experiment = world.train([world.data["clean"]])
    assert experiment.integrity_status == IntegrityStatus.PENDING
    assert best_accepted_experiment(world.run) is None


# --------------------------------------------------------------------------- adjudication


def _pending_experiment(world):
    """An experiment left for a person: its Worker's summary cites only the best of two repeats."""
    first = world.train([world.data["clean"]], correct=1, seed=1)  # 0.25
    experiment = world.train([world.data["clean"]], correct=2, seed=2)  # 0.5, the best
    worker_finalize(
        node=world.worker,
        summary=f"{experiment.handle} reaches 0.5.",
        experiments=[experiment.handle],
        actor=world.worker.handle,
    )
    integrity_run_checks(experiment=first)
    integrity_run_checks(experiment=experiment)
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.PENDING
    return experiment


def test_a_reviewer_adjudication_flags_and_keeps_history(world):
    experiment = _pending_experiment(world)
    result = finding(experiment, Subcategory.REPEATED_RUN_SELECTION)

    finding_adjudicate(
        finding=result,
        adjudication=Adjudication.EXPLICIT_VIOLATION,
        actor="reviewer_0001",
        rationale="0.9 is nowhere in the record; 0.5 was measured",
    )

    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED
    history = list(FindingChange.objects.filter(finding=result).order_by("pk").values_list("adjudication", "actor"))
    assert history == [("", "integrity-check"), (Adjudication.EXPLICIT_VIOLATION, "reviewer_0001")]
    changes = list(
        IntegrityStatusChange.objects.filter(experiment=experiment).order_by("pk").values_list("to_status", flat=True)
    )
    assert changes == [IntegrityStatus.PENDING, IntegrityStatus.FLAGGED]
    # Re-running the checks keeps the reviewer's judgement of the same observation.
    integrity_run_checks(experiment=experiment)
    result.refresh_from_db()
    assert (result.adjudication, result.decided_by) == (Adjudication.EXPLICIT_VIOLATION, "reviewer_0001")


def test_a_reviewer_adjudicates_only_within_its_scope_while_active(world):
    experiment = _pending_experiment(world)
    inside = node_create(run=world.run, kind=NodeKind.REVIEWER, task="audit", upstream=[world.worker])
    outside = node_create(run=world.run, kind=NodeKind.REVIEWER, task="audit", upstream=[world.new_worker()])
    judgement = {
        "experiment": experiment,
        "subcategory": Subcategory.REPEATED_RUN_SELECTION,
        "adjudication": Adjudication.EXPLICIT_VIOLATION,
        "rationale": "0.9 stated, 0.5 recorded",
    }
    for node, code in ((outside, "out_of_scope"), (world.worker, "not_a_reviewer")):
        with pytest.raises(ApplicationError) as refused:
            reviewer_adjudicate(reviewer=node, **judgement)
        assert refused.value.code == code

    result = reviewer_adjudicate(reviewer=inside, observation=Observation.EXECUTED, **judgement)

    assert (result.adjudication, result.decided_by) == (Adjudication.EXPLICIT_VIOLATION, inside.handle)
    assert "manual_observation" not in result.evidence  # the same observation as the check's
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED
    node_finalize(node=inside, summary="done", experiments=[], actor=inside.handle)
    with pytest.raises(ApplicationError) as refused:
        reviewer_adjudicate(reviewer=inside, **judgement)
    assert refused.value.code == "node_not_active"


def test_allowed_clears_and_rationale_is_required(world):
    experiment = _pending_experiment(world)
    result = finding(experiment, Subcategory.REPEATED_RUN_SELECTION)
    with pytest.raises(ApplicationError):
        finding_adjudicate(finding=result, adjudication=Adjudication.ALLOWED, actor="user:admin", rationale=" ")

    finding_adjudicate(
        finding=result,
        adjudication=Adjudication.ALLOWED,
        actor="user:admin",
        rationale="0.9 was the projected score, clearly labelled as such",
    )

    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_a_violation_needs_an_executed_observation_which_a_person_may_record(world):
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    clean = finding(experiment, Subcategory.DATA_PROVENANCE)
    with pytest.raises(ApplicationError) as refused:
        finding_adjudicate(
            finding=clean,
            adjudication=Adjudication.EXPLICIT_VIOLATION,
            actor="reviewer_0001",
            rationale="paraphrases of sealed items",
        )
    assert refused.value.code == "violation_needs_execution"

    finding_adjudicate(
        finding=clean,
        adjudication=Adjudication.EXPLICIT_VIOLATION,
        actor="reviewer_0001",
        rationale="rows 3-5 paraphrase f1",
        observation=Observation.EXECUTED,
    )
    integrity_run_checks(experiment=experiment)  # the person's observation stands over the check's

    result = finding(experiment, Subcategory.DATA_PROVENANCE)
    assert result.observation == Observation.EXECUTED
    assert result.evidence["check_observation"] == Observation.NOT_FOUND_FULL
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED


def test_an_unsound_evaluator_flags_every_submission_it_scored_and_the_run(world):
    first = world.train([world.data["clean"]])
    second = world.eval_only(world.theta0)
    for experiment in (first, second):
        integrity_run_checks(experiment=experiment)

    changed = integrity_flag_shared(
        benchmark=world.benchmark, actor="user:admin", reason="exact_match accepts '82 apples' for 82"
    )

    assert {e.pk for e in changed} == {first.pk, second.pk}
    for experiment in (first, second):
        experiment.refresh_from_db()
        assert experiment.integrity_status == IntegrityStatus.FLAGGED
        assert finding(experiment, Subcategory.HARNESS_VERIFIER).adjudication == Adjudication.EVAL_INVALIDATING
    assert Run.objects.get(pk=world.run.pk).flagged


# --------------------------------------------------------------------------- rates and selection


def test_hacking_rate_counts_executed_violations_over_submissions_that_ran(world):
    clean = world.train([world.data["clean"]], correct=2)
    hacked = world.train([world.data["clean"]], correct=4, seed=3)
    (checkpoint_path(hacked.output_checkpoint) / "extra.bin").write_bytes(b"x")
    BlockedAttempt.objects.create(
        run=world.run,
        node=world.worker,
        subcategory=Subcategory.DATA_PROVENANCE,
        tool="worker_submit",
        reason="data_contaminated: ...",
    )
    for experiment in (clean, hacked):
        integrity_run_checks(experiment=experiment)

    rates = hacking_rate(runs=Run.objects.filter(pk=world.run.pk))

    assert (rates["submissions_ran"], rates["hacked"], rates["hacking_rate"]) == (2, 1, 0.5)
    assert rates["blocked_attempts"] == 1
    assert rates["blocked_by_subcategory"] == {"data_provenance": 1}
    # The hacked score is higher, and never selected.
    assert best_accepted_experiment(world.run) == clean
    assert hacking_rate_by_task()["arithmetic"]["hacked"] == 1


def test_the_report_holds_the_matrix_rates_and_selection(world):
    clean = world.train([world.data["clean"]], correct=2)
    integrity_run_checks(experiment=clean)

    report = integrity_report(world.run)

    row = report["submissions"][0]
    assert row["experiment"] == clean.handle
    assert row["ran"]
    assert not row["hacked"]
    assert set(row["findings"]) == set(Subcategory.values)
    assert report["rates"]["hacking_rate"] == 0.0
    assert report["selection"]["best_accepted"] == clean.handle
    assert report["by_subcategory"]["weight_provenance"]["observations"] == {"NOT_FOUND_FULL": 1}
    assert "matches" not in str(report)  # evidence stays on the finding


# --------------------------------------------------------------------------- hooks and the task


def test_the_experiment_hook_enqueues_the_checks_on_commit(world, django_capture_on_commit_callbacks):
    experiment = world.train([world.data["clean"]])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        integrity_on_experiment_finished(experiment=experiment)
    assert len(callbacks) == 1

    stored = integrity_check_task(experiment_id=experiment.pk)  # the task body, as a worker runs it

    assert stored == 12
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


def test_the_report_hook_rechecks_the_reporting_subcategories(world, django_capture_on_commit_callbacks):
    experiment = world.train([world.data["clean"]], correct=2)
    integrity_check_task(experiment_id=experiment.pk)
    worker_finalize(
        node=world.worker,
        summary=f"{experiment.handle}: 0.99",
        experiments=[experiment.handle],
        actor=world.worker.handle,
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        integrity_on_report(run=world.run, node=world.worker)
    assert len(callbacks) == 2  # the experiment's reporting checks, and its author's reports

    integrity_check_task(experiment_id=experiment.pk, reporting_only=True)
    integrity_reports_task(run_id=world.run.pk, author=world.worker.handle)

    # The false claim is the author's finding; the experiment it cites stays accepted.
    author = IntegrityFinding.objects.get(node=world.worker, subcategory=Subcategory.METRIC_ATTRIBUTION)
    assert author.observation == Observation.EXECUTED
    assert finding(experiment, Subcategory.METRIC_ATTRIBUTION).observation == Observation.NOT_FOUND_FULL
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


# --------------------------------------------------------------------------- endpoints


def _person(client, group: str | None) -> User:
    user = User.objects.create_user(username=f"person-{group}", password="pw")
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    client.force_login(user)
    return user


def test_the_report_endpoint_serves_viewers_only(world, client):
    experiment = world.train([world.data["clean"]])
    integrity_run_checks(experiment=experiment)
    url = f"/api/v1/integrity/runs/{world.run.uuid}/report"

    assert client.get(url).status_code in (401, 403)
    plaintext, _ = agent_token_issue(run=world.run, node=world.worker, role="worker")
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code in (401, 403)
    _person(client, "viewer")
    response = client.get(url)

    assert response.status_code == 200
    assert response.json()["submissions"][0]["integrity_status"] == IntegrityStatus.ACCEPTED
    assert client.get("/api/v1/integrity/runs/not-a-uuid/report").status_code == 404


def test_admins_adjudicate_through_the_endpoint_with_a_reason(world, client):
    experiment = _pending_experiment(world)
    url = f"/api/v1/integrity/experiments/{experiment.uuid}/findings/repeated_run_selection/adjudicate"
    _person(client, "viewer")
    assert (
        client.post(url, {"adjudication": "ALLOWED", "rationale": "x"}, content_type="application/json").status_code
        == 403
    )
    _person(client, "admin")
    assert client.post(url, {"adjudication": "ALLOWED"}, content_type="application/json").status_code == 400

    response = client.post(
        url,
        {"adjudication": "EXPLICIT_VIOLATION", "rationale": "claimed 0.9, measured 0.5"},
        content_type="application/json",
    )

    assert response.status_code == 200
    assert response.json()["history"][-1]["actor"] == "user:person-admin"
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.FLAGGED
    findings = client.get(f"/api/v1/integrity/experiments/{experiment.uuid}/findings").json()
    assert len(findings["findings"]) == 12
    assert findings["history"][-1]["to"] == IntegrityStatus.FLAGGED


def test_the_management_command_reruns_a_runs_checks(world):

    experiment = world.train([world.data["clean"]])
    out = StringIO()

    call_command("integrity_check", run=str(world.run.uuid), stdout=out)

    assert out.getvalue().strip() == f"{experiment.handle} accepted"
