"""A Reviewer report as the API returns it, and the Main Agent's redacted view of it.

A read model across apps: the report (apps.reviews), the sealed-item screen every agent read
passes (apps.integrity.screen) over the run's benchmark (apps.benchmarks) and its model outputs
(apps.experiments), so it sits in the process layer rather than in the reviews app below them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max

from apps.benchmarks.services import SealBroken
from apps.experiments.models import EvaluationSample
from apps.integrity.contamination import ContaminationScanner
from apps.integrity.screen import SampleIdFinder, SealedScreen, benchmark_screen, items_scanner
from apps.research.choices import Trigger
from apps.research.models import Decision, Run
from apps.reviews.models import LIST_FIELDS, ReviewReport
from apps.reviews.selectors import SEALED_MARK

# Model outputs of at least this many canonical tokens are redacted where a report quotes them.
MIN_OUTPUT_TOKENS = 4
_OUTPUT_SCANNERS: dict[tuple[int, int, int], ContaminationScanner | None] = {}
_MAX_OUTPUT_SCANNERS = 16


def _output_scanner(run_id: int) -> ContaminationScanner | None:
    """The run's per-sample model outputs as items to find (cached until the run has new outputs)."""
    samples = EvaluationSample.objects.filter(evaluation__run_id=run_id)
    stats = samples.aggregate(count=Count("pk"), last=Max("pk"))
    key = (run_id, stats["count"] or 0, stats["last"] or 0)
    if key not in _OUTPUT_SCANNERS:
        outputs = dict(samples.order_by("pk").values_list("output", "sample_id"))
        if len(_OUTPUT_SCANNERS) >= _MAX_OUTPUT_SCANNERS:
            _OUTPUT_SCANNERS.pop(next(iter(_OUTPUT_SCANNERS)))
        _OUTPUT_SCANNERS[key] = items_scanner(
            [{"id": sample_id, "prompt": output} for output, sample_id in outputs.items()],
            min_tokens=MIN_OUTPUT_TOKENS,
        )
    return _OUTPUT_SCANNERS[key]


def run_evidence_screen(run: Run) -> tuple[SealedScreen | None, SampleIdFinder]:
    """What the Main Agent may not read of a run's review evidence: its benchmark's sealed items
    (both splits) with the run's model outputs as extra items, as one screen marking
    :data:`SEALED_MARK`, and a finder of the benchmark's sealed sample ids. The screen is None when
    the sealed items cannot be checked (the callers fail closed)."""
    benchmark = run.benchmark
    ids = benchmark.sample_ids or {}
    finder = SampleIdFinder(str(i) for split in ids.values() if isinstance(split, list) for i in split)
    try:
        screen = benchmark_screen([benchmark], marker=SEALED_MARK)
    except SealBroken:
        return None, finder
    outputs = _output_scanner(run.pk)
    if outputs is not None:
        screen.scanners.append(outputs)
    return screen, finder


def main_scrub(report: ReviewReport) -> Callable[[Any], Any]:
    """How the Main Agent's view cleans a report's free text: sealed sample ids in any disguise,
    sealed items' text (the screen every agent read passes) and the run's model outputs become
    :data:`SEALED_MARK`. Fails closed: when the benchmark's sealed items cannot be checked, every
    free text is withheld."""
    screen, finder = run_evidence_screen(report.run)

    def scrub(text: Any) -> Any:
        if not isinstance(text, str) or not text:
            return text
        if screen is None:
            return SEALED_MARK
        return finder.redact(screen.text(text)[0], SEALED_MARK)

    return scrub


def report_payload(
    report: ReviewReport, *, redacted: bool, scrub: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """A report as the API returns it.

    Redacted (the Main Agent's view): evidence attached to observations is removed, and every free
    text passes :func:`main_scrub`, so the Main learns what was found, not which sealed instances
    or outputs showed it (DESIGN.md, "Roles and what each may see").
    """
    if not redacted:
        scrub = _unchanged
    elif scrub is None:
        scrub = main_scrub(report)  # a list of one run's reports passes one scrub for all (its reads once)

    observations = []
    for item in report.observations or []:
        entry = {
            "experiment": item.get("experiment", ""),
            **({"node": item["node"]} if "node" in item else {}),  # a Worker's reports, judged on its node
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


def _unchanged(text: Any) -> Any:
    return text


@dataclass(frozen=True)
class ChangedDecision:
    """A decision the Main Agent took on a Reviewer's report, with what that report cited."""

    decision: Decision
    report: ReviewReport
    reviewer: str
    evidence: list[str]


@dataclass(frozen=True)
class ReviewStory:
    reports: list[ReviewReport]
    changed: list[ChangedDecision]


# The report fields that carry its evidence (per-sample counts, compared scores and intervals).
_EVIDENCE_FIELDS = ("supported_findings", "uncertainties", "regressions", "protocol_violations")
_MAX_EVIDENCE = 6


def run_review_story(*, run: Any) -> ReviewStory:
    """The run's Reviewer reports and the decisions taken on them (trigger ``review_report``).

    Each such decision is paired with the latest report submitted before it — the one it read —
    and that report's evidence lines, as the report states them. What the run page shows under
    "Reviews that changed a decision" and what ``manage.py demo`` prints at the end.
    """
    reports = list(ReviewReport.objects.filter(run=run).select_related("reviewer").order_by("created_at", "pk"))
    changed: list[ChangedDecision] = []
    decisions = Decision.objects.filter(run=run, trigger=Trigger.REVIEW_REPORT).order_by("created_at", "pk")
    for decision in decisions:
        before = [r for r in reports if r.created_at <= decision.created_at]
        if not before:
            continue
        report = before[-1]
        evidence = [str(line) for name in _EVIDENCE_FIELDS for line in (getattr(report, name) or [])]
        changed.append(ChangedDecision(decision, report, report.reviewer.handle, evidence[:_MAX_EVIDENCE]))
    return ReviewStory(reports, changed)
