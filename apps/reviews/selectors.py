"""Reads of Reviewer reports, whole for their Reviewer and people, redacted for the Main Agent."""

from __future__ import annotations

import re
from typing import Any

from apps.core.records import cut, iso
from apps.reviews.models import LIST_FIELDS, ReviewReport

SEALED_MARK = "[sealed]"
# The run page lists reports with a short summary; the report page shows the whole.
SUMMARY_CHARS = 300


def _sealed_pattern(report: ReviewReport) -> re.Pattern[str] | None:
    """Every sample id of the run's benchmark, as whole words: the instances a report may quote."""
    ids = report.run.benchmark.sample_ids or {}
    words = sorted({str(i) for split in ids.values() if isinstance(split, list) for i in split}, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(w) for w in words) + r")(?![\w-])")


def report_payload(report: ReviewReport, *, redacted: bool) -> dict[str, Any]:
    """A report as the API returns it.

    Redacted (the Main Agent's view): evidence attached to observations is removed and sealed
    sample ids are masked in every text, so the Main learns what was found, not which sealed
    instances or outputs showed it (DESIGN.md, "Roles and what each may see").
    """
    pattern = _sealed_pattern(report) if redacted else None

    def scrub(text: Any) -> Any:
        if pattern is None or not isinstance(text, str):
            return text
        return pattern.sub(SEALED_MARK, text)

    observations = []
    for item in report.observations or []:
        entry = {
            "experiment": item.get("experiment", ""),
            "subcategory": item.get("subcategory", ""),
            "observation": item.get("observation", ""),
            "note": scrub(item.get("note", "")),
        }
        if redacted:
            entry["evidence_redacted"] = bool(item.get("evidence"))
        else:
            entry["evidence"] = item.get("evidence", {})
        observations.append(entry)
    payload: dict[str, Any] = {
        "uuid": str(report.uuid),
        "reviewer": report.reviewer.handle,
        "status": report.status,
        "summary": scrub(report.summary),
        "experiments": sorted(e.handle for e in report.experiments.all()),
        "observations": observations,
        "created_at": report.created_at.isoformat(),
        "redacted": redacted,
    }
    for name in LIST_FIELDS:
        payload[name] = [scrub(x) for x in getattr(report, name) or []]
    return payload


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
