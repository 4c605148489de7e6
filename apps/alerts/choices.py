from __future__ import annotations

from django.db import models


class AlertTrigger(models.TextChoices):
    """What a person can be told about (each one read off the event log, apps.alerts.services)."""

    RUN_FINISHED = "run_finished"
    RUN_FAILED = "run_failed"
    INTEGRITY_FLAG = "integrity_flag"  # a submission flagged, or the run flagged (contaminated data)
    BUDGET_REACHED = "budget_reached"
    JOB_FAILED = "job_failed"


class AlertChannel(models.TextChoices):
    SLACK = "slack"  # an incoming webhook: {"text": ...}
    DISCORD = "discord"  # a webhook: {"content": ...}
    EMAIL = "email"  # Django's mail settings (EMAIL_BACKEND, EMAIL_HOST, ...)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # every retry failed; ``error`` says why
