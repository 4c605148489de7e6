"""Alert rules (who is told what, where) and their deliveries (one per rule and event, retried)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.alerts.choices import AlertChannel, DeliveryStatus
from apps.core.models import UUIDModel


class AlertRule(UUIDModel):
    """A person's alert: a channel and a target, for one run or (``run`` empty) for every run."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_rules")
    run = models.ForeignKey("research.Run", on_delete=models.CASCADE, null=True, blank=True, related_name="alert_rules")
    channel = models.CharField(max_length=16, choices=AlertChannel.choices)
    # A webhook URL (it may hold the hook's secret: never shown back whole) or an e-mail address.
    target = models.CharField(max_length=500)
    triggers = models.JSONField(default=list)  # AlertTrigger values
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(channel__in=AlertChannel.values), name="alert_rule_channel_valid"),
            models.CheckConstraint(condition=~Q(target=""), name="alert_rule_target_set"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} alert of {self.owner_id}"


class AlertDelivery(UUIDModel):
    """One notification: the rule, the event it tells of, the message sent, and how it went."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.BigIntegerField()  # apps.experiments Event (the log is append-only; no FK needed)
    trigger = models.CharField(max_length=32)
    message = models.JSONField(default=dict)  # what was sent (built from an allow-list of fields)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One delivery per rule and event: a hook run twice, or a redelivered task, tells once.
            models.UniqueConstraint(fields=["rule", "event_id"], name="alert_delivery_once_per_event"),
            models.CheckConstraint(condition=Q(status__in=DeliveryStatus.values), name="alert_delivery_status_valid"),
        ]
