"""State changes of Reviewer reports: submit structured findings, finalize the review.

Each change is announced to the run page after commit (``report.*`` events, ``report_live``).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.core.errors import ApplicationError, Conflict
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import run_group
from apps.research.choices import EdgeKind, NodeKind, NodeStatus
from apps.research.models import ResearchEdge, ResearchNode
from apps.research.services import main_trigger, node_finalize
from apps.reviews.models import LIST_FIELDS, ReportStatus, ReviewReport
from apps.reviews.selectors import report_live_get

__all__ = ["LIST_FIELDS", "review_finalize", "review_submit", "scope_experiments"]


def scope_experiments(*, reviewer: ResearchNode) -> Any:
    """The experiments a Reviewer judges: those owned by the Workers on its review-scope in-edges."""
    scope = ResearchEdge.objects.filter(downstream=reviewer, kind=EdgeKind.REVIEW_SCOPE).values("upstream_id")
    return Experiment.objects.filter(run=reviewer.run_id, owner_id__in=scope)


def review_submit(
    *,
    reviewer: ResearchNode,
    summary: str,
    experiments: list[str],
    observations: list[dict[str, Any]],
    findings: dict[str, list[Any]],
) -> ReviewReport:
    """Store one structured report of an active Reviewer, linked to experiments of its scope only."""
    # Its status now: the caller's node may be a cached token's copy, older than a finalize.
    reviewer = ResearchNode.objects.get(pk=reviewer.pk)
    if reviewer.kind != NodeKind.REVIEWER:
        raise ApplicationError("not_a_reviewer", f"{reviewer.handle} is not a Reviewer.")
    if reviewer.status != NodeStatus.ACTIVE:
        raise Conflict("node_not_active", f"{reviewer.handle} is {reviewer.status}; it submits no more reports.")
    # An observation names an experiment, or a Worker whose reports (summary) it judges.
    cited = set(experiments) | {o["experiment"] for o in observations if "experiment" in o}
    in_scope = {e.handle: e for e in scope_experiments(reviewer=reviewer).filter(handle__in=cited)}
    outside = sorted(cited - set(in_scope))
    if outside:
        raise ApplicationError(
            "out_of_scope",
            f"A report covers experiments of this Reviewer's scope only; not {', '.join(outside)}.",
            experiments=outside,
        )
    authors = {o["node"] for o in observations if "node" in o}
    scope = set(
        ResearchEdge.objects.filter(downstream=reviewer, kind=EdgeKind.REVIEW_SCOPE).values_list(
            "upstream__handle", flat=True
        )
    )
    foreign = sorted(authors - scope)
    if foreign:
        raise ApplicationError(
            "out_of_scope",
            f"A report judges the Workers of this Reviewer's scope only; not {', '.join(foreign)}.",
            nodes=foreign,
        )
    with transaction.atomic():
        report = ReviewReport(
            run_id=reviewer.run_id,
            reviewer=reviewer,
            summary=summary,
            observations=observations,
            **{name: list(findings.get(name, [])) for name in LIST_FIELDS},
        )
        # Empty lists are valid findings ("no regressions"); the model's blank check would refuse them.
        report.full_clean(exclude=[*LIST_FIELDS, "observations"])
        report.save()
        linked = sorted(cited)
        report.experiments.set([in_scope[h] for h in linked])
        event_append(
            run=reviewer.run,
            type="review.submitted",
            actor=reviewer.handle,
            role="reviewer",
            arguments={"experiments": linked, "observations": len(observations)},
            result_ref=f"report:{report.uuid}",
        )
        publish_on_commit(run_group(reviewer.run.uuid), LiveEvent.REPORT_CREATED, report_live_get(report))
    return report


def review_finalize(*, reviewer: ResearchNode, summary: str, actor: str) -> ResearchNode:
    """Finalize a Reviewer: its reports become final and the Main Agent is woken to read them."""
    reports = ReviewReport.objects.filter(reviewer=reviewer)
    if not reports.exists():
        raise Conflict("no_report", f"{reviewer.handle} has submitted no report; submit one before finalizing.")
    with transaction.atomic():
        finalized = node_finalize(
            node=reviewer,
            summary=summary or reports.order_by("-created_at", "-pk").values_list("summary", flat=True).first() or "",
            experiments=sorted(set(reports.values_list("experiments__handle", flat=True)) - {None}),
            actor=actor,
        )
        submitted = list(reports.filter(status=ReportStatus.SUBMITTED).select_for_update())
        reports.filter(pk__in=[r.pk for r in submitted]).update(status=ReportStatus.FINALIZED,
                                                                updated_at=timezone.now())  # fmt: skip
        group = run_group(finalized.run.uuid)
        for report in submitted:
            publish_on_commit(group, LiveEvent.REPORT_UPDATED, report_live_get(report))
        main_trigger(run=finalized.run, trigger="review_report", node=finalized, actor=actor)
    return finalized
