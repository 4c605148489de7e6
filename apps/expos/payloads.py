"""Look-ups and answer shapes shared by the tool handlers (each matching a schema in apps.expos.schemas)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from apps.core.errors import NotFound
from apps.expos.registry import ToolContext
from apps.expos.selectors import parse_uuid
from apps.expos.visibility import Caller, visible_jobs, visible_nodes
from apps.jobs.models import Job
from apps.research.choices import EdgeKind, NodeKind
from apps.research.models import Decision, ResearchEdge, ResearchNode
from apps.research.services import guidance_refusal_announce


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def etag_value(node: ResearchNode) -> str:
    return f'"{node.uuid}.{node.version}"'


def node_payload(node: ResearchNode) -> dict[str, Any]:
    upstream = ResearchEdge.objects.filter(downstream=node).order_by("pk").values_list("upstream__handle", flat=True)
    return {
        "handle": node.handle,
        "uuid": str(node.uuid),
        "kind": node.kind,
        "status": node.status,
        "task": node.task,
        "summary": node.summary,
        "summary_experiments": list(node.summary_experiments or []),
        "upstream": list(upstream),
        "version": node.version,
        "etag": etag_value(node),
        "created_at": node.created_at.isoformat(),
        "finalized_at": iso(node.finalized_at),
    }


def run_node(ctx: ToolContext, handle: str, *, kind: str) -> ResearchNode:
    """A Worker or Reviewer of the caller's run by handle, among the nodes the caller may see."""
    node = visible_nodes(ctx).filter(handle=handle, kind=kind).first()
    if node is None:
        raise NotFound(f"unknown_{kind}", f"There is no {kind} {handle!r} visible in this run.")
    return node


def run_workers(ctx: ToolContext, handles: list[str]) -> list[ResearchNode]:
    found = {n.handle: n for n in visible_nodes(ctx).filter(kind=NodeKind.WORKER, handle__in=handles)}
    missing = [h for h in handles if h not in found]
    if missing:
        raise NotFound("unknown_worker", f"No Worker {', '.join(missing)} in this run.", workers=missing)
    return [found[h] for h in handles]


def decision_refused(ctx: ToolContext, args: dict[str, Any]) -> None:
    """``after_refusal`` of the tools that act for a decision (spawning a Worker or a Reviewer).

    A refused call made for a decision (a spawn answered 409 worker_limit): the guidance that
    decision applied was not carried out, and the run page must say so.
    """
    if ctx.run is not None and args.get("decision"):
        guidance_refusal_announce(run=ctx.run, decision=str(args["decision"]))


def run_decision(ctx: ToolContext, value: str | None) -> Decision | None:
    if value is None:
        return None
    decision = Decision.objects.filter(run=ctx.run, uuid=parse_uuid(value)).first() if parse_uuid(value) else None
    if decision is None:
        raise NotFound("unknown_decision", f"No decision {value} in this run (main_optimizer_update records one).")
    return decision


def job_for(caller: Caller, value: str) -> Job:
    parsed = parse_uuid(value)
    job = visible_jobs(caller).select_related("experiment").filter(uuid=parsed).first() if parsed else None
    if job is None:
        raise NotFound("unknown_job", f"No job {value} is visible to this caller.")
    return job


def job_brief(job: Job) -> dict[str, Any]:
    error = job.error.strip().splitlines()[-1][:500] if job.error.strip() else ""
    return {
        "uuid": str(job.uuid),
        "kind": job.kind,
        "status": job.status,
        "queue": job.queue,
        "attempt": job.attempt,
        "progress": job.progress,
        "experiment": job.experiment.handle if job.experiment_id is not None else None,
        "cancel_requested": job.cancel_requested,
        "error": error,
        "created_at": job.created_at.isoformat(),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "resource_seconds": job.resource_seconds,
    }


def scope_handles(reviewer: ResearchNode) -> list[str]:
    return list(
        ResearchEdge.objects.filter(downstream=reviewer, kind=EdgeKind.REVIEW_SCOPE)
        .order_by("upstream__handle")
        .values_list("upstream__handle", flat=True)
    )
