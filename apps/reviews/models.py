"""Reviewer reports: structured findings linked to the experiments in scope."""

from __future__ import annotations

from django.db import models

from apps.core.models import UUIDModel


class ReportStatus(models.TextChoices):
    SUBMITTED = "submitted"
    FINALIZED = "finalized"


# The report's finding lists, in the order reports show them (the submit tool's arguments too).
LIST_FIELDS = (
    "supported_findings",
    "uncertainties",
    "protocol_violations",
    "regressions",
    "missing_comparisons",
    "recommendations",
)


class ReviewReport(UUIDModel):
    """One report of a Reviewer node; several per reviewer are allowed until it finalizes."""

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, related_name="reports")
    reviewer = models.ForeignKey("research.ResearchNode", on_delete=models.PROTECT, related_name="reports")
    status = models.CharField(max_length=16, choices=ReportStatus.choices, default=ReportStatus.SUBMITTED)
    summary = models.TextField()
    supported_findings = models.JSONField(default=list)
    uncertainties = models.JSONField(default=list)
    protocol_violations = models.JSONField(default=list)
    regressions = models.JSONField(default=list)
    missing_comparisons = models.JSONField(default=list)
    recommendations = models.JSONField(default=list)
    observations = models.JSONField(default=list)  # per-experiment integrity observations
    experiments = models.ManyToManyField("experiments.Experiment", related_name="reports", blank=True)
