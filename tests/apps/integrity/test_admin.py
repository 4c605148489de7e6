"""The Django admin shows the audited records and edits none; its one edit, an adjudication, is the service's."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.urls import reverse

from apps.core.admin import ReadOnlyAdmin
from apps.datapool.models import DataEntry
from apps.experiments.choices import IntegrityStatus
from apps.experiments.models import Evaluation, Event
from apps.flows.agent_reports import worker_finalize
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.models import FindingChange, IntegrityFinding
from apps.integrity.services import integrity_check_reports, integrity_run_checks
from apps.jobs.models import JobTransition
from tests.apps.integrity.conftest import finding

PROJECT_APPS = ("benchmarks", "datapool", "experiments", "expos", "integrity", "jobs", "research", "reviews")


def test_an_admin_override_in_the_admin_is_audited(world, client):
    experiment = world.train([world.data["clean"]], correct=2)
    worker_finalize(
        node=world.worker,
        summary=f"{experiment.handle} reaches 0.9.",
        experiments=[experiment.handle],
        actor=world.worker.handle,
    )
    integrity_run_checks(experiment=experiment)
    # The false claim is the author's finding (its node's), adjudicated like any other.
    [target] = integrity_check_reports(run=world.run, authors=[world.worker.handle])
    assert target.observation == Observation.EXECUTED
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = f"/admin/integrity/integrityfinding/{target.pk}/change/"

    refused = client.post(url, {"new_adjudication": Adjudication.ALLOWED, "new_observation": "", "reason": ""})
    assert refused.status_code == 200  # the form comes back with its error; nothing changed
    target.refresh_from_db()
    assert target.adjudication == ""

    client.post(url, {"new_adjudication": Adjudication.ALLOWED, "new_observation": "", "reason": "projected, labelled"})

    target.refresh_from_db()
    assert (target.adjudication, target.decided_by) == (Adjudication.ALLOWED, "user:root")
    assert FindingChange.objects.filter(finding=target, actor="user:root").exists()
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED


# --------------------------------------------------------------------------- the admin is a viewer


@pytest.fixture
def root(client):
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return user


def admin_url(obj, view: str = "change") -> str:
    meta = obj._meta
    return reverse(f"admin:{meta.app_label}_{meta.model_name}_{view}", args=[obj.pk])


def test_every_admin_registration_is_read_only_but_the_audited_adjudication():
    editable = {
        model._meta.label
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in PROJECT_APPS and not isinstance(model_admin, ReadOnlyAdmin)
    }
    assert editable == {"integrity.IntegrityFinding"}
    assert set(PROJECT_APPS) <= {model._meta.app_label for model in admin.site._registry}


def test_an_admin_cannot_change_a_final_score(world, client, root):
    experiment = world.train([world.data["clean"]], correct=2)
    final = Evaluation.objects.create(
        run=world.run,
        experiment=experiment,
        checkpoint=experiment.output_checkpoint,
        benchmark=world.benchmark,
        split="final",
        score=0.0,
        correct=0,
        sample_count=2,
    )
    feedback = Evaluation.objects.get(experiment=experiment, split="feedback")

    for evaluation in (final, feedback):
        shown = client.get(admin_url(evaluation))
        assert shown.status_code == 200  # the values are shown ...
        assert f"{evaluation.score}" in shown.content.decode()
        assert 'name="_save"' not in shown.content.decode()  # ... with nothing to save
        posted = client.post(admin_url(evaluation), {"score": "0.99", "split": "final", "status": "ok"})
        assert posted.status_code == 403
        assert client.post(admin_url(evaluation, "delete"), {"post": "yes"}).status_code == 403
    assert client.get(reverse("admin:experiments_evaluation_add")).status_code == 403
    final.refresh_from_db()
    assert (final.score, final.split) == (0.0, "final")
    assert Evaluation.objects.get(pk=feedback.pk).score == feedback.score


def test_an_admin_cannot_edit_an_experiments_integrity_or_score(world, client, root):
    experiment = world.train([world.data["clean"]], correct=2)
    before = (experiment.integrity_status, experiment.feedback_score, experiment.integrity_changes.count())
    events = Event.objects.count()

    assert client.get(admin_url(experiment)).status_code == 200
    posted = client.post(
        admin_url(experiment), {"integrity_status": IntegrityStatus.ACCEPTED, "feedback_score": "0.99"}
    )

    assert posted.status_code == 403
    experiment.refresh_from_db()
    assert (experiment.integrity_status, experiment.feedback_score, experiment.integrity_changes.count()) == before
    assert Event.objects.count() == events
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    "record",
    [
        lambda w, e: e.output_checkpoint,
        lambda w, e: DataEntry.objects.get(handle=w.data["clean"]),
        lambda w, e: e.integrity_changes.first(),
        lambda w, e: Event.objects.filter(run=w.run).first(),
        lambda w, e: JobTransition.objects.filter(job__experiment=e).first(),
        lambda w, e: IntegrityFinding.objects.filter(experiment=e).first().changes.first(),
    ],
    ids=["checkpoint", "data_entry", "integrity_change", "event", "job_transition", "finding_change"],
)
def test_audited_records_are_shown_not_edited(world, client, root, record):
    experiment = world.train([world.data["clean"]], correct=2)
    integrity_run_checks(experiment=experiment)
    obj = record(world, experiment)
    assert client.get(admin_url(obj)).status_code == 200
    assert client.post(admin_url(obj), {}).status_code == 403
    assert client.post(admin_url(obj, "delete"), {"post": "yes"}).status_code == 403


def test_a_bare_save_or_a_refused_adjudication_changes_and_logs_nothing(world, client, root):
    experiment = world.train([world.data["clean"]], correct=2)
    integrity_run_checks(experiment=experiment)
    target = finding(experiment, Subcategory.METRIC_ATTRIBUTION)
    history = target.changes.count()
    url = admin_url(target)

    bare = client.post(url, {"new_adjudication": "", "new_observation": "", "reason": "just looking"})
    assert bare.status_code == 200  # the form comes back with its error
    # A violation needs an EXECUTED observation: the service refuses, and the admin says so.
    violation = client.post(
        url, {"new_adjudication": Adjudication.EXPLICIT_VIOLATION, "new_observation": "", "reason": "gut feeling"}
    )
    assert violation.status_code == 302
    assert "EXECUTED" in " ".join(str(m) for m in get_messages(violation.wsgi_request))
    assert "changed successfully" not in " ".join(str(m) for m in get_messages(violation.wsgi_request))

    target.refresh_from_db()
    assert (target.adjudication, target.changes.count()) == ("", history)
    assert not LogEntry.objects.exists()
