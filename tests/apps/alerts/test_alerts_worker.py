"""Alerts delivered by a real Celery worker (issue 36, item 7): a run that finishes is told to a
webhook receiver on loopback by a `celery worker` process on the default queue, and a first 500
from the receiver is retried by the worker until it takes the message.

The test only changes the run's status through its service; the event hook records the delivery
and sends its task on commit, and the worker posts it (no task is called in this process).
"""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model

from apps.alerts.choices import DeliveryStatus
from apps.alerts.models import AlertDelivery
from apps.alerts.services import alert_rule_create
from apps.research.choices import RunStatus
from apps.research.services import run_set_status
from tests.apps.jobs.conftest import artifact_root, celery_worker, wait_for  # noqa: F401 - the job engine's fixtures
from tests.factories import make_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_worker_delivers_a_run_finished_webhook_and_retries_after_a_500(celery_worker, receiver):  # noqa: F811
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # no message of an earlier session
    worker = celery_worker("alerts", queues="default")
    person = get_user_model().objects.create_user(username="told-by-worker", password="x")
    run = run_set_status(run=make_run(name="worker-told run"), status=RunStatus.RUNNING, actor="test")
    alert_rule_create(owner=person, run=run, channel="slack", target=receiver.url, triggers=["run_finished"])
    receiver.answers = [500]

    run_set_status(run=run, status=RunStatus.FINISHED, actor="test", reason="done")

    def sent() -> AlertDelivery | None:
        delivery = AlertDelivery.objects.get(rule__run=run)
        return delivery if delivery.status != DeliveryStatus.PENDING else None

    delivery = wait_for(sent, timeout=60, what="the worker to deliver the alert", logs=worker.log)
    assert (delivery.status, delivery.attempts, delivery.trigger) == (DeliveryStatus.SENT, 2, "run_finished")
    assert len(receiver.bodies) == 2  # the refused post, then the retry the receiver took
    assert receiver.bodies[0] == receiver.bodies[1]
    assert receiver.bodies[1]["text"].startswith("[rsiweb] run finished: worker-told run")
    log = worker.log()
    assert "alert_deliver_task" in log, log[-3000:]
    assert "Retry in" in log, log[-3000:]  # the worker's own retry of the refused post
