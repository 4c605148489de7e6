"""Integrity observations and adjudications per (submission, subcategory)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from apps.core.models import BaseModel
from apps.integrity.choices import Adjudication, Observation, Subcategory


class IntegrityFinding(BaseModel):
    """The two layers for one (experiment, subcategory): what was observed, and how it was judged.

    A report's finding is the author's: what a Worker's summary or a Main Agent claim states about
    the record is judged on the author's node (``node``, no experiment), so a false claim flags
    whoever made it and leaves the cited experiments' own findings alone."""

    experiment = models.ForeignKey(
        "experiments.Experiment", on_delete=models.PROTECT, related_name="findings", null=True, blank=True
    )
    node = models.ForeignKey(
        "research.ResearchNode", on_delete=models.PROTECT, related_name="report_findings", null=True, blank=True
    )
    subcategory = models.CharField(max_length=32, choices=Subcategory.choices)
    observation = models.CharField(max_length=24, choices=Observation.choices, default=Observation.UNKNOWN)
    adjudication = models.CharField(max_length=40, choices=Adjudication.choices, blank=True)
    evidence = models.JSONField(default=dict, blank=True)  # reviewer-visible; may hold sealed spans
    rationale = models.TextField(blank=True)
    decided_by = models.CharField(max_length=200, blank=True)  # auto, reviewer_0001, user:admin

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["experiment", "subcategory"], name="finding_unique"),
            models.UniqueConstraint(
                fields=["node", "subcategory"], condition=Q(node__isnull=False), name="finding_node_unique"
            ),
            models.CheckConstraint(
                condition=Q(experiment__isnull=False, node__isnull=True)
                | Q(experiment__isnull=True, node__isnull=False),
                name="finding_experiment_or_author",
            ),
            models.CheckConstraint(condition=Q(subcategory__in=Subcategory.values), name="finding_subcategory_valid"),
            models.CheckConstraint(condition=Q(observation__in=Observation.values), name="finding_observation_valid"),
            models.CheckConstraint(
                condition=Q(adjudication="") | Q(adjudication__in=Adjudication.values),
                name="finding_adjudication_valid",
            ),
        ]


class FindingChange(BaseModel):
    """History of every observation/adjudication change (append-only)."""

    finding = models.ForeignKey(IntegrityFinding, on_delete=models.PROTECT, related_name="changes")
    observation = models.CharField(max_length=24)
    adjudication = models.CharField(max_length=40, blank=True)
    actor = models.CharField(max_length=200)
    rationale = models.TextField(blank=True)


class BlockedAttempt(BaseModel):
    """A submission or read refused before any compute: counted apart from the hacking rate."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, related_name="blocked_attempts")
    node = models.ForeignKey("research.ResearchNode", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    subcategory = models.CharField(max_length=32, choices=Subcategory.choices)
    tool = models.CharField(max_length=100)
    reason = models.TextField()
    request = models.JSONField(default=dict)


class ReviewOverride(BaseModel):
    """A time-limited exception to one rejected submission review, for one exact specification."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, related_name="overrides")
    worker = models.ForeignKey("research.ResearchNode", on_delete=models.PROTECT, related_name="overrides")
    spec_sha256 = models.CharField(max_length=64)  # canonical hash of the exact submission allowed
    reason = models.TextField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
