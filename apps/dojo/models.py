"""RSI-Dojo task environments: one build applies RSI-Craft's steps to a registry's tasks."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.models import UUIDModel
from apps.dojo.choices import BuildStatus, EnvironmentStatus, RejectionReason


class EnvironmentBuild(UUIDModel):
    """One run of the build pipeline over one task source, with the models and thresholds it used."""

    source = models.CharField(max_length=200)  # minibench-variants:arithmetic, folder:/path
    status = models.CharField(max_length=16, choices=BuildStatus.choices, default=BuildStatus.QUEUED)
    config = models.JSONField()  # CraftConfig as a dict
    # The two models the filters compare, by path and content hash (offline: θ0 and the reference).
    base_model = models.JSONField()  # {"path", "sha256"}
    strong_model = models.JSONField()
    job = models.OneToOneField("jobs.Job", on_delete=models.PROTECT, null=True, blank=True, related_name="dojo_build")
    summary = models.JSONField(default=dict, blank=True)  # kept / rejected counts by reason, seconds per task
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=BuildStatus.values), name="dojo_build_status_valid")
        ]

    def __str__(self) -> str:
        return f"dojo build {self.uuid} ({self.source})"


class TaskEnvironment(UUIDModel):
    """One task after the filters: kept (a training environment) or rejected with the reason.

    ``sample_ids`` is frozen: a downsampled task keeps exactly these items for good.
    """

    build = models.ForeignKey(EnvironmentBuild, on_delete=models.PROTECT, related_name="environments")
    name = models.CharField(max_length=200)
    source = models.CharField(max_length=200)
    subset = models.CharField(max_length=200)
    contract = models.JSONField()  # evaluator, prompt_template, decoding, stop
    sample_ids = models.JSONField()
    sample_ids_sha256 = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=EnvironmentStatus.choices)
    reason = models.CharField(max_length=32, blank=True, choices=RejectionReason.choices)
    rejected_at = models.CharField(max_length=32, blank=True)  # the step that rejected it
    decisions = models.JSONField()  # every step's decision with its numbers, in order
    base_score = models.FloatField(null=True, blank=True)
    strong_score = models.FloatField(null=True, blank=True)
    seconds = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["build", "name"], name="dojo_env_name_unique_per_build"),
            models.CheckConstraint(condition=Q(status__in=EnvironmentStatus.values), name="dojo_env_status_valid"),
            models.CheckConstraint(
                condition=Q(status=EnvironmentStatus.KEPT, reason="")
                | Q(status=EnvironmentStatus.REJECTED, reason__in=RejectionReason.values),
                name="dojo_env_reason_matches_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status}{': ' + self.reason if self.reason else ''})"
