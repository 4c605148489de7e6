"""Alerts (issue 36, item 7): the five triggers, read off the event log the services write, become
deliveries; a real HTTP server on loopback receives the Slack- and Discord-compatible JSON and
Django's locmem backend the e-mail; transient failures retry, and no message carries sealed text,
a token or a webhook's secret path."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.utils import timezone

from apps.alerts.choices import DeliveryStatus
from apps.alerts.models import AlertDelivery, AlertRule
from apps.alerts.services import alert_rule_create, target_display
from apps.core.errors import ApplicationError
from apps.experiments.services import experiment_create, experiment_set_integrity
from apps.flows.runs import run_budget_enforce
from apps.jobs.services import job_claim, job_enqueue, job_fail
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Run
from apps.research.services import node_create, run_set_status
from tests.apps.alerts.conftest import TOKEN
from tests.factories import make_run
from workers.data.tasks import ALERT_MAX_RETRIES, alert_deliver_task

pytestmark = pytest.mark.django_db

SEALED = "SEALED-FEEDBACK-ITEM-7731 answer=42"


@pytest.fixture
def person(db):
    return get_user_model().objects.create_user(username="alerted", password="x")


@pytest.fixture
def run(db):
    return run_set_status(run=make_run(name="alerted run"), status=RunStatus.RUNNING, actor="test")


def _deliver_all() -> list[AlertDelivery]:
    for delivery in AlertDelivery.objects.order_by("pk"):
        alert_deliver_task.apply(kwargs={"delivery_id": delivery.pk})
    return list(AlertDelivery.objects.order_by("pk"))


def test_a_finished_run_is_told_to_slack_discord_and_email_without_sealed_text(run, person, receiver, settings):
    settings.SITE_URL = "http://rsi.example"
    slack = alert_rule_create(owner=person, run=run, channel="slack", target=receiver.url, triggers=["run_finished"])
    alert_rule_create(owner=person, channel="discord", target=receiver.url, triggers=["run_finished", "job_failed"])
    alert_rule_create(owner=person, run=run, channel="email", target="me@example.org", triggers=["run_finished"])
    alert_rule_create(owner=person, run=run, channel="slack", target=receiver.url, triggers=["run_failed"])
    run_set_status(run=run, status=RunStatus.FINISHED, actor=f"user:{TOKEN}", reason=f"done; {SEALED}")
    deliveries = _deliver_all()
    assert [d.trigger for d in deliveries] == ["run_finished"] * 3  # the run_failed rule stays quiet
    assert {d.status for d in deliveries} == {DeliveryStatus.SENT}
    by_kind = {"text" if "text" in body else "content": body for body in receiver.bodies}
    assert set(by_kind) == {"text", "content"}  # Slack's and Discord's shapes
    assert by_kind["content"]["username"] == "rsiweb"
    for text in (by_kind["text"]["text"], by_kind["content"]["content"]):
        assert text.startswith("[rsiweb] run finished: alerted run")
        assert f"http://rsi.example/runs/{run.uuid}/" in text
    [email] = mail.outbox
    assert (email.subject, email.to) == ("[rsiweb] run finished: alerted run", ["me@example.org"])
    everything = json.dumps(receiver.bodies) + email.body + json.dumps([d.message for d in deliveries])
    assert SEALED not in everything
    assert TOKEN not in everything
    assert target_display(slack) == f"http://127.0.0.1:{receiver.server.server_address[1]}/…"


def test_each_trigger_comes_from_the_service_that_records_it(run, person):
    rule = alert_rule_create(owner=person, run=run, channel="email", target="me@example.org",
                             triggers=["integrity_flag", "budget_reached", "job_failed", "run_failed"])  # fmt: skip
    worker = node_create(run=run, kind=NodeKind.WORKER, task="SFT")
    experiment = experiment_create(run=run, owner=worker, kind="train_eval", input_checkpoint=run.base_checkpoint,
                                   action={"recipe": "sft"})  # fmt: skip
    experiment_set_integrity(experiment=experiment, status="flagged", actor="reviewer", reason=SEALED)
    job = job_enqueue(kind="train", spec={"recipe": "sft"}, run=run, experiment=experiment)
    job_fail(job=job_claim(job_id=job.pk, worker="gpu@test"), error=f"Traceback ... {SEALED}")
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - dt.timedelta(hours=2), budget_wall_seconds=60)
    run_budget_enforce(run=run)
    deliveries = list(rule.deliveries.order_by("pk"))
    assert [d.trigger for d in deliveries] == ["integrity_flag", "job_failed", "budget_reached"]
    texts = [d.message["text"] for d in deliveries]
    assert texts[0] == f"Submission {experiment.handle} was flagged."
    assert texts[1].startswith(f"A job failed: train job {str(job.uuid)[:8]} of {experiment.handle}")
    assert "wall_clock" in texts[2]
    assert all(SEALED not in text for text in texts)


def test_transient_failures_retry_until_the_receiver_takes_it(run, person, receiver):
    alert_rule_create(owner=person, run=run, channel="slack", target=receiver.url, triggers=["run_failed"])
    receiver.answers = [503, 429]
    run_set_status(run=run, status=RunStatus.FAILED, actor="test", reason="the Main Agent failed")
    [delivery] = _deliver_all()
    assert (delivery.status, delivery.attempts, len(receiver.bodies)) == (DeliveryStatus.SENT, 3, 3)
    alert_deliver_task.apply(kwargs={"delivery_id": delivery.pk})  # a redelivered message sends nothing again
    assert len(receiver.bodies) == 3


def test_a_receiver_that_keeps_failing_or_refuses_is_recorded_as_failed(run, person, receiver):
    alert_rule_create(owner=person, run=run, channel="slack", target=receiver.url, triggers=["run_failed"])
    receiver.answers = [500] * (ALERT_MAX_RETRIES + 1)
    run_set_status(run=run, status=RunStatus.FAILED, actor="test")
    [delivery] = _deliver_all()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.FAILED, ALERT_MAX_RETRIES + 1)
    assert "webhook answered 500" in delivery.error
    other = make_run(name="refused")
    alert_rule_create(owner=person, run=other, channel="discord", target=receiver.url, triggers=["run_failed"])
    receiver.answers = [404]
    run_set_status(run=other, status=RunStatus.FAILED, actor="test")
    refused = AlertDelivery.objects.get(rule__run=other)
    alert_deliver_task.apply(kwargs={"delivery_id": refused.pk})
    refused.refresh_from_db()
    assert (refused.status, refused.attempts, refused.error) == (DeliveryStatus.FAILED, 1, "webhook answered 404")


@pytest.mark.parametrize(
    ("channel", "target", "triggers", "code"),
    [
        ("pager", "http://127.0.0.1:9/x", ["run_failed"], "invalid_channel"),
        ("slack", "ftp://127.0.0.1/x", ["run_failed"], "invalid_target"),
        ("slack", "not a url", ["run_failed"], "invalid_target"),
        ("email", "nobody", ["run_failed"], "invalid_target"),
        ("email", "me@example.org", [], "invalid_triggers"),
        ("email", "me@example.org", ["run_failed", "coffee_ready"], "invalid_triggers"),
    ],
)
def test_bad_rules_are_refused_and_nothing_is_stored(person, channel, target, triggers, code):
    with pytest.raises(ApplicationError) as refused:
        alert_rule_create(owner=person, channel=channel, target=target, triggers=triggers)
    assert refused.value.code == code
    assert AlertRule.objects.count() == 0


def test_a_person_who_left_is_told_nothing(run, person):
    alert_rule_create(owner=person, channel="email", target="me@example.org", triggers=["run_failed"])
    type(person).objects.filter(pk=person.pk).update(is_active=False)
    run_set_status(run=run, status=RunStatus.FAILED, actor="test")
    assert AlertDelivery.objects.count() == 0
