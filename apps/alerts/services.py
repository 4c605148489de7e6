"""Alerts: a person is told when a run finishes or fails, is flagged, spends a budget, or a job fails.

Every trigger is already an event of the log (apps.experiments.events), so alerts read them there:
``alerts_on_event`` is registered as the log's append hook and, for the few event types that are
triggers, records one ``AlertDelivery`` per matching rule and sends its id to the default queue on
commit (STYLE.md 10); ``alert_deliver`` (workers.data.tasks.alert_deliver_task, retried with
backoff on transient errors) posts a Slack- or Discord-compatible JSON body, or sends an e-mail
through Django's mail settings.

What a message carries is built from an allow-list of record fields (names, handles, statuses,
budgets, scores): never an event's free text (a reason, a job's error, a rationale), which may
quote sealed items or carry a token; and a webhook's URL, which holds its secret, is never shown
back whole (``target_display``).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import EmailValidator, URLValidator
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.alerts.choices import AlertChannel, AlertTrigger, DeliveryStatus
from apps.alerts.models import AlertDelivery, AlertRule
from apps.core.errors import ApplicationError
from apps.core.queues import Queue, TaskName
from apps.experiments.models import Event, Experiment
from apps.jobs.models import Job
from apps.research.models import Run
from rsiweb.celery import app

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_SECONDS = 10.0
TRIGGER_LABELS = {
    AlertTrigger.RUN_FINISHED: "run finished",
    AlertTrigger.RUN_FAILED: "run failed",
    AlertTrigger.INTEGRITY_FLAG: "integrity flag",
    AlertTrigger.BUDGET_REACHED: "budget reached",
    AlertTrigger.JOB_FAILED: "job failed",
}
# The event types that can be triggers: every other event costs the hook one set look-up.
_TRIGGER_EVENT_TYPES = frozenset(
    {"run.status_changed", "run.flagged", "experiment.integrity_changed", "run.budget_exhausted", "job.failed"}
)


class AlertTransientError(RuntimeError):
    """The receiver did not answer, or answered 429 / 5xx: the task retries with backoff."""


def alert_trigger_of(event: Event) -> str | None:
    """The trigger an event is, or None."""
    arguments = event.arguments or {}
    if event.type == "run.status_changed":
        ends = {"finished": AlertTrigger.RUN_FINISHED, "failed": AlertTrigger.RUN_FAILED}
        return ends.get(str(arguments.get("status")))
    if event.type == "run.flagged":
        return AlertTrigger.INTEGRITY_FLAG
    if event.type == "experiment.integrity_changed" and arguments.get("status") == "flagged":
        return AlertTrigger.INTEGRITY_FLAG
    if event.type == "run.budget_exhausted":
        return AlertTrigger.BUDGET_REACHED
    if event.type == "job.failed":
        return AlertTrigger.JOB_FAILED
    return None


def alert_rule_create(
    *, owner: Any, channel: str, target: str, triggers: list[str], run: Run | None = None
) -> AlertRule:
    """A person's alert rule, for ``run`` or for every run; every mistake answers a clear message."""
    if channel not in AlertChannel.values:
        raise ApplicationError("invalid_channel", f"channel is one of {', '.join(AlertChannel.values)}.")
    unknown = sorted(set(triggers) - set(AlertTrigger.values))
    if unknown or not triggers:
        raise ApplicationError(
            "invalid_triggers",
            f"Choose one or more of {', '.join(AlertTrigger.values)}"
            + (f" (not {', '.join(map(repr, unknown))})." if unknown else "."),
        )
    target = target.strip()
    try:
        if channel == AlertChannel.EMAIL:
            EmailValidator(message="Enter an e-mail address.")(target)
        else:
            URLValidator(schemes=["http", "https"], message="Enter the webhook's http(s) URL.")(target)
    except ValidationError as exc:
        raise ApplicationError("invalid_target", exc.messages[0]) from None
    rule = AlertRule(owner=owner, run=run, channel=channel, target=target,
                     triggers=[t for t in AlertTrigger.values if t in triggers])  # fmt: skip
    rule.full_clean()
    rule.save()
    return rule


def alert_rule_delete(*, rule: AlertRule) -> None:
    """Remove a rule and its delivery history."""
    rule.delete()


def target_display(rule: AlertRule) -> str:
    """The rule's target as a page may show it: a webhook's scheme and host only (its path is its secret)."""
    if rule.channel == AlertChannel.EMAIL:
        return rule.target
    parts = urlsplit(rule.target)
    return f"{parts.scheme}://{parts.netloc}/…"


def _run_url(run: Run) -> str:
    return f"{settings.SITE_URL.rstrip('/')}/runs/{run.uuid}/"


def alert_message(*, event: Event, trigger: str, run: Run) -> dict[str, Any]:
    """What a delivery says, from an allow-list of fields (never an event's free text)."""
    arguments = event.arguments or {}
    title = f"[rsiweb] {TRIGGER_LABELS[AlertTrigger(trigger)]}: {run.name}"
    lines = []
    if trigger == AlertTrigger.RUN_FINISHED:
        result = run.result_checkpoint.handle if run.result_checkpoint is not None else "no accepted checkpoint"
        lines.append(f"The run finished; it returns {result}.")
    elif trigger == AlertTrigger.RUN_FAILED:
        lines.append("The run failed; its page has the record.")
    elif trigger == AlertTrigger.INTEGRITY_FLAG:
        handle = _experiment_handle(event.result_ref)
        flagged = f"Submission {handle} was flagged." if handle else "The run was flagged (shared data or evaluator)."
        lines.append(flagged)
    elif trigger == AlertTrigger.BUDGET_REACHED:
        spent = ", ".join(str(name) for name in arguments.get("exhausted", []) if isinstance(name, str))
        lines.append(f"Budget spent ({spent or 'a budget'}): no new work; then the final evaluation runs.")
    elif trigger == AlertTrigger.JOB_FAILED:
        lines.append(f"A job failed: {_job_label(event.result_ref)}.")
    return {"trigger": trigger, "title": title, "text": " ".join(lines), "run": str(run.uuid),
            "run_name": run.name, "status": run.status, "url": _run_url(run),
            "event": event.type, "at": event.created_at.isoformat()}  # fmt: skip


def _experiment_handle(ref: str) -> str:
    if not ref.startswith("experiment:"):
        return ""
    return Experiment.objects.filter(uuid=ref.split(":", 1)[1]).values_list("handle", flat=True).first() or ""


def _job_label(ref: str) -> str:
    job = Job.objects.filter(uuid=ref.split(":", 1)[1]).select_related("experiment").first() if ":" in ref else None
    if job is None:
        return "a job of the run"
    on = f" of {job.experiment.handle}" if job.experiment_id and job.experiment is not None else ""
    return f"{job.kind} job {str(job.uuid)[:8]}{on} (attempt {job.attempt})"


def _send(delivery_id: int) -> None:
    app.send_task(TaskName.ALERT_DELIVER, kwargs={"delivery_id": delivery_id}, queue=Queue.DEFAULT)


def _send_all(delivery_ids: list[int]) -> None:
    for delivery_id in delivery_ids:
        _send(delivery_id)


def alerts_on_event(event: Event) -> list[AlertDelivery]:
    """The log's append hook: record the deliveries an event triggers and send them on commit.

    Runs inside the transaction that appends the event, in a savepoint: an alert that cannot be
    recorded is logged and never undoes the state change the event records.
    """
    if event.type not in _TRIGGER_EVENT_TYPES or event.run_id is None:
        return []
    trigger = alert_trigger_of(event)
    if trigger is None:
        return []
    # A person who left (inactive) is told nothing more.
    candidates = AlertRule.objects.filter(
        Q(run__isnull=True) | Q(run_id=event.run_id), active=True, owner__is_active=True
    ).order_by("pk")
    rules = [rule for rule in candidates if trigger in rule.triggers]
    if not rules:
        return []
    deliveries = []
    try:
        with transaction.atomic():
            run = Run.objects.select_related("result_checkpoint").get(pk=event.run_id)
            message = alert_message(event=event, trigger=trigger, run=run)
            for rule in rules:
                delivery, created = AlertDelivery.objects.get_or_create(
                    rule=rule, event_id=event.pk, defaults={"trigger": trigger, "message": message}
                )
                if created:
                    deliveries.append(delivery)
            # After commit: the task must find the row (and never tell of a rolled-back change).
            sent = [delivery.pk for delivery in deliveries]
            transaction.on_commit(lambda: _send_all(sent))
    except DatabaseError:
        logger.exception("alerts of event %s (%s) not recorded", event.pk, event.type)
        return []
    return deliveries


def alert_body(delivery: AlertDelivery) -> dict[str, Any]:
    """The JSON a webhook receives: Slack's ``text`` or Discord's ``content``, plus the plain fields."""
    message = delivery.message
    text = f"{message['title']}\n{message['text']}\n{message['url']}"
    if delivery.rule.channel == AlertChannel.DISCORD:
        return {"content": text[:2000], "username": "rsiweb"}
    return {"text": text}


def alert_deliver(*, delivery_id: int) -> AlertDelivery | None:
    """Send one delivery; raises ``AlertTransientError`` when a retry may succeed. Idempotent once sent."""
    delivery = AlertDelivery.objects.select_related("rule").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return delivery
    AlertDelivery.objects.filter(pk=delivery.pk).update(attempts=delivery.attempts + 1, updated_at=timezone.now())
    rule = delivery.rule
    if rule.channel == AlertChannel.EMAIL:
        message = delivery.message
        try:
            send_mail(message["title"], f"{message['text']}\n\n{message['url']}\n", settings.DEFAULT_FROM_EMAIL,
                      [rule.target])  # fmt: skip
        except OSError as exc:  # SMTP refused or unreachable: smtplib's errors are OSErrors
            raise AlertTransientError(f"mail not sent: {exc.__class__.__name__}") from None
    else:
        try:
            answer = httpx.post(rule.target, json=alert_body(delivery), timeout=WEBHOOK_TIMEOUT_SECONDS)
        except httpx.HTTPError as exc:
            raise AlertTransientError(f"webhook unreachable: {exc.__class__.__name__}") from None
        if answer.status_code == 429 or answer.status_code >= 500:
            raise AlertTransientError(f"webhook answered {answer.status_code}")
        if answer.status_code >= 400:
            # The receiver refuses this message (a deleted hook, a bad URL): retrying will not help.
            return alert_delivery_fail(delivery_id=delivery.pk, error=f"webhook answered {answer.status_code}")
    AlertDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(
        status=DeliveryStatus.SENT, sent_at=timezone.now(), error="", updated_at=timezone.now()
    )
    return AlertDelivery.objects.get(pk=delivery.pk)


def alert_delivery_fail(*, delivery_id: int, error: str) -> AlertDelivery | None:
    """The delivery's last attempt failed (the task's ``on_failure``): recorded, never sent."""
    AlertDelivery.objects.filter(pk=delivery_id, status=DeliveryStatus.PENDING).update(
        status=DeliveryStatus.FAILED, error=error[:1000], updated_at=timezone.now()
    )
    return AlertDelivery.objects.filter(pk=delivery_id).first()
