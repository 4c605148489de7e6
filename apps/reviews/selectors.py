"""Reads of Reviewer reports, whole for their Reviewer and people, redacted for the Main Agent."""

from __future__ import annotations

from typing import Any

from apps.core.records import cut, iso
from apps.reviews.models import ReviewReport

SEALED_MARK = "[sealed]"
# The run page lists reports with a short summary; the report page shows the whole.
SUMMARY_CHARS = 300


def report_live(report: ReviewReport) -> dict[str, Any]:
    """A Reviewer report (``report.*`` events and the run page's snapshot)."""
    return {
        "uuid": str(report.uuid),
        "reviewer": str(report.reviewer.uuid),
        "status": report.status,
        "summary": cut(report.summary, SUMMARY_CHARS),
        "created_at": iso(report.created_at),
    }


def report_live_get(report: ReviewReport) -> dict[str, Any]:
    """``report_live`` of the report as committed now."""
    return report_live(ReviewReport.objects.select_related("reviewer").get(pk=report.pk))
