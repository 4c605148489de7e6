"""State changes of runs and the research DAG."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.core.errors import ApplicationError, Conflict
from apps.core.handles import next_handle
from apps.experiments.events import event_append
from apps.research.choices import EdgeKind, NodeKind, NodeStatus, RunStatus
from apps.research.models import Decision, ResearchEdge, ResearchNode, Run, RunStatusChange, default_policy

SYSTEM = "system"


def run_create(
    *,
    name: str,
    benchmark: Any,
    base_checkpoint: Any,
    target_capability: str,
    budget_wall_seconds: int,
    budget_accelerator_seconds: int,
    budget_llm_tokens: int,
    max_parallel_workers: int = 2,
    reserved_final_seconds: int = 0,
    policy: dict[str, Any] | None = None,
    agent_mode: str = "heuristic",
    created_by: Any = None,
) -> Run:
    """Create a run and its Main Agent node. The run starts in ``created``."""
    merged_policy = {**default_policy(), **(policy or {})}
    with transaction.atomic():
        run = Run(
            name=name,
            benchmark=benchmark,
            base_checkpoint=base_checkpoint,
            target_capability=target_capability,
            budget_wall_seconds=budget_wall_seconds,
            budget_accelerator_seconds=budget_accelerator_seconds,
            budget_llm_tokens=budget_llm_tokens,
            max_parallel_workers=max_parallel_workers,
            reserved_final_seconds=reserved_final_seconds,
            policy=merged_policy,
            agent_mode=agent_mode,
            created_by=created_by,
        )
        run.full_clean()
        run.save()
        RunStatusChange.objects.create(run=run, to_status=run.status, actor=SYSTEM, reason="created")
        main = ResearchNode(run=run, kind=NodeKind.MAIN, handle="main", task=target_capability)
        main.save()
        event_append(
            run=run,
            type="run.created",
            actor=_actor(created_by),
            role="human" if created_by else SYSTEM,
            arguments={"name": name, "benchmark": str(benchmark.uuid), "policy": merged_policy},
            result_ref=f"run:{run.uuid}",
        )
    return run


def _actor(user: Any) -> str:
    return f"user:{user.get_username()}" if user is not None else SYSTEM


def run_set_status(*, run: Run, status: str, actor: str, reason: str = "") -> Run:
    """Move a run to ``status``, recording the change. Terminal statuses are never left."""
    from apps.research.choices import RUN_TERMINAL_STATES

    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == status:
            return locked
        if locked.status in RUN_TERMINAL_STATES:
            raise Conflict("run_finished", f"Run {run.uuid} is {locked.status}; it cannot become {status}.")
        RunStatusChange.objects.create(run=locked, from_status=locked.status, to_status=status, actor=actor, reason=reason)
        locked.status = status
        locked.save(update_fields=["status", "updated_at"])
        event_append(run=locked, type="run.status_changed", actor=actor, role="system",
                     arguments={"status": status, "reason": reason})
    return locked


def node_create(
    *,
    run: Run,
    kind: str,
    task: str,
    actor: str = "main",
    upstream: list[ResearchNode] | None = None,
    decision: Decision | None = None,
) -> ResearchNode:
    """Add a Worker or Reviewer with its in-edges (context for Workers, review scope for Reviewers)."""
    if kind not in (NodeKind.WORKER, NodeKind.REVIEWER):
        raise ApplicationError("invalid_kind", f"A research node is a worker or a reviewer, not {kind!r}.")
    edge_kind = EdgeKind.CONTEXT if kind == NodeKind.WORKER else EdgeKind.REVIEW_SCOPE
    with transaction.atomic():
        # The run row lock serialises handle numbering and DAG changes of one run.
        locked = Run.objects.select_for_update().get(pk=run.pk)
        node = ResearchNode(
            run=locked,
            kind=kind,
            handle=next_handle(ResearchNode.objects.filter(run=locked), kind),
            task=task,
            created_by_decision=decision,
        )
        node.full_clean()
        node.save()
        for up in upstream or []:
            _edge_add_locked(run=locked, upstream=up, downstream=node, kind=edge_kind)
        event_append(
            run=locked,
            type="node.created",
            actor=actor,
            role="main",
            arguments={"kind": kind, "task": task, "upstream": [u.handle for u in upstream or []]},
            result_ref=f"node:{node.uuid}",
        )
    return node


def dag_edge_add(*, run: Run, upstream: ResearchNode, downstream: ResearchNode, kind: str) -> ResearchEdge:
    """Add one edge to the research DAG, refusing cycles (under the run lock)."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        return _edge_add_locked(run=locked, upstream=upstream, downstream=downstream, kind=kind)


def _edge_add_locked(*, run: Run, upstream: ResearchNode, downstream: ResearchNode, kind: str) -> ResearchEdge:
    if upstream.run_id != run.pk or downstream.run_id != run.pk:
        raise ApplicationError("foreign_node", "Both ends of an edge must belong to this run.")
    if NodeKind.MAIN in (upstream.kind, downstream.kind):
        raise ApplicationError("invalid_edge", "The Main Agent is not a node of the research DAG's edges.")
    if kind == EdgeKind.CONTEXT and (upstream.kind, downstream.kind) != (NodeKind.WORKER, NodeKind.WORKER):
        raise ApplicationError("invalid_edge", "Context edges join two Workers.")
    if kind == EdgeKind.REVIEW_SCOPE and (upstream.kind, downstream.kind) != (NodeKind.WORKER, NodeKind.REVIEWER):
        raise ApplicationError("invalid_edge", "Review-scope edges go from a Worker to a Reviewer.")
    if upstream.pk == downstream.pk or _reaches(downstream.pk, upstream.pk):
        raise ApplicationError(
            "cycle", f"An edge {upstream.handle} -> {downstream.handle} would close a cycle in the research DAG."
        )
    edge = ResearchEdge(run=run, upstream=upstream, downstream=downstream, kind=kind)
    edge.full_clean()
    edge.save()
    return edge


def _reaches(start_id: int, target_id: int) -> bool:
    """Is ``target`` reachable from ``start`` along existing edges? (Run lock held by caller.)"""
    frontier = [start_id]
    seen = {start_id}
    while frontier:
        downstream_ids = ResearchEdge.objects.filter(upstream_id__in=frontier).values_list("downstream_id", flat=True)
        frontier = []
        for node_id in downstream_ids:
            if node_id == target_id:
                return True
            if node_id not in seen:
                seen.add(node_id)
                frontier.append(node_id)
    return False


def node_finalize(*, node: ResearchNode, summary: str, experiments: list[str], actor: str) -> ResearchNode:
    """Mark a Worker or Reviewer finalized with its summary (bumps the ETag version)."""
    with transaction.atomic():
        locked = ResearchNode.objects.select_for_update().get(pk=node.pk)
        if locked.status != NodeStatus.ACTIVE:
            raise Conflict("node_not_active", f"{locked.handle} is already {locked.status}.")
        from django.utils import timezone

        locked.status = NodeStatus.FINALIZED
        locked.summary = summary
        locked.summary_experiments = experiments
        locked.finalized_at = timezone.now()
        locked.version += 1
        locked.save(update_fields=["status", "summary", "summary_experiments", "finalized_at", "version", "updated_at"])
        event_append(run=locked.run, type="node.finalized", actor=actor, role=locked.kind,
                     arguments={"summary": summary, "experiments": experiments}, result_ref=f"node:{locked.uuid}")
    return locked


__all__ = [
    "RunStatus",
    "dag_edge_add",
    "node_create",
    "node_finalize",
    "run_create",
    "run_set_status",
]
