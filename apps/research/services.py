"""State changes of runs and the research DAG, each announced to the run page after commit.

Every service here that creates or changes a run, a research node, an edge, a decision, a
prediction or guidance publishes its live event (apps.live.events.LiveEvent) on commit, with
the record as its selector builds it (apps/research/selectors.py): a browser that applies the
events to its snapshot ends with what a fresh snapshot shows. The agent loops' own state
machine and scheduling are in apps/research/agent_loops.py; the run lifecycle (start, pause, stop,
budgets, the final evaluation, the result) crosses apps and is in apps/flows/runs.py.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.errors import ApplicationError, Conflict
from apps.core.handles import next_handle
from apps.experiments.choices import ExperimentStatus
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import run_group
from apps.research.agent_config import DEFAULT_SEARCH_POLICY
from apps.research.agent_loops import (
    agent_loop_wake,
)
from apps.research.choices import (
    RUN_TERMINAL_STATES,
    EdgeKind,
    NodeKind,
    NodeStatus,
    PredictionVerdict,
    RunStatus,
    Trigger,
)
from apps.research.models import (
    Candidate,
    Decision,
    Guidance,
    LLMUsage,
    Prediction,
    ResearchEdge,
    ResearchNode,
    Run,
    RunStatusChange,
    default_policy,
)
from apps.research.selectors import (
    decision_live,
    edge_live,
    guidance_live_get,
    node_live,
    prediction_live_get,
    run_live_get,
)

SYSTEM = "system"


def _publish(run: Run, event: LiveEvent, payload: dict[str, Any]) -> None:
    # On commit (publish_on_commit): a browser told about a row must be able to read it, and a
    # rolled-back change is never announced. The payload is read now, inside the transaction,
    # after the change: the row as it will be committed.
    publish_on_commit(run_group(run.uuid), event, payload)


def run_updated(run: Run) -> None:
    """Announce the run's new state (status, budget use, result) to its page."""
    _publish(run, LiveEvent.RUN_UPDATED, run_live_get(run))


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
    search_policy: str = DEFAULT_SEARCH_POLICY,
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
            search_policy=search_policy,
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
            arguments={
                "name": name,
                "benchmark": str(benchmark.uuid),
                "policy": merged_policy,
                "search_policy": search_policy,
            },
            result_ref=f"run:{run.uuid}",
        )
        run_updated(run)
    return run


RUN_TAGS_MAX = 20
RUN_TAG_CHARS = 40


def run_label(
    *, run: Run, actor: str, name: str | None = None, tags: list[str] | None = None, starred: bool | None = None
) -> Run:
    """Rename, tag or star a run (the people's labels on the runs list); None leaves a label as it is.

    Tags are trimmed, lower-cased and de-duplicated in order. Recorded as ``run.labelled``.
    """
    changes: dict[str, Any] = {}
    if name is not None:
        name = name.strip()
        if not name:
            raise ApplicationError("invalid_name", "A run's name cannot be empty.")
        changes["name"] = name
    if tags is not None:
        cleaned = list(dict.fromkeys(t.strip().lower() for t in tags if t.strip()))
        if len(cleaned) > RUN_TAGS_MAX or any(len(t) > RUN_TAG_CHARS for t in cleaned):
            raise ApplicationError(
                "invalid_tags", f"At most {RUN_TAGS_MAX} tags of at most {RUN_TAG_CHARS} characters each."
            )
        changes["tags"] = cleaned
    if starred is not None:
        changes["starred"] = bool(starred)
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        for field, value in changes.items():
            setattr(locked, field, value)
        locked.full_clean()
        locked.save(update_fields=[*changes, "updated_at"])
        event_append(run=locked, type="run.labelled", actor=actor, role="human", arguments=changes)
        run_updated(locked)
    return locked


def _actor(user: Any) -> str:
    return f"user:{user.get_username()}" if user is not None else SYSTEM


def run_set_status(*, run: Run, status: str, actor: str, reason: str = "") -> Run:
    """Move a run to ``status``, recording the change. Terminal statuses are never left."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == status:
            return locked
        if locked.status in RUN_TERMINAL_STATES:
            raise Conflict("run_finished", f"Run {run.uuid} is {locked.status}; it cannot become {status}.")
        RunStatusChange.objects.create(
            run=locked, from_status=locked.status, to_status=status, actor=actor, reason=reason
        )
        locked.status = status
        locked.save(update_fields=["status", "updated_at"])
        event_append(
            run=locked,
            type="run.status_changed",
            actor=actor,
            role="system",
            arguments={"status": status, "reason": reason},
        )
        run_updated(locked)
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
        if kind == NodeKind.REVIEWER and (locked.policy or {}).get("reviewers") is False:
            # The --no-reviewer ablation is the server's rule, not a promise of the Main Agent's policy.
            raise Conflict("reviewers_disabled", f"Run {locked.name!r} runs without Reviewers (its policy).")
        node = ResearchNode(
            run=locked,
            kind=kind,
            handle=next_handle(ResearchNode.objects.filter(run=locked), kind),
            task=task,
            created_by_decision=decision,
        )
        node.full_clean()
        node.save()
        # Announced before its edges (on_commit keeps the order): the browser draws ends first.
        _publish(locked, LiveEvent.NODE_CREATED, node_live(node))
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
    _publish(run, LiveEvent.EDGE_CREATED, edge_live(edge))
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

        locked.status = NodeStatus.FINALIZED
        locked.summary = summary
        locked.summary_experiments = experiments
        locked.finalized_at = timezone.now()
        locked.version += 1
        locked.save(update_fields=["status", "summary", "summary_experiments", "finalized_at", "version", "updated_at"])
        event_append(
            run=locked.run,
            type="node.finalized",
            actor=actor,
            role=locked.kind,
            arguments={"summary": summary, "experiments": experiments},
            result_ref=f"node:{locked.uuid}",
        )
        _publish(locked.run, LiveEvent.NODE_UPDATED, node_live(locked))
    return locked


# --- the Main Agent's trigger and the research records it keeps (ExpOS research tools) -----------


def main_trigger(
    *,
    run: Run,
    trigger: str,
    node: ResearchNode | None = None,
    actor: str = SYSTEM,
    detail: dict[str, Any] | None = None,
) -> None:
    """Wake the Main Agent: a Worker finished, a Reviewer reported, the gate holds a request, guidance came.

    The trigger is recorded as an event and put into the Main Agent's loop inbox; a waiting Main
    loop is scheduled on commit (apps/research/agent_loops.py), a running one takes it at its next step.
    """
    if trigger not in Trigger.values:
        raise ApplicationError("invalid_trigger", f"trigger must be one of {Trigger.values}.")
    event_append(
        run=run,
        type="main.triggered",
        actor=actor,
        role=SYSTEM,
        arguments={"trigger": trigger, "node": node.handle if node is not None else None, **(detail or {})},
        result_ref=f"node:{node.uuid}" if node is not None else f"run:{run.uuid}",
    )

    main = ResearchNode.objects.filter(run=run, kind=NodeKind.MAIN).first()
    if main is not None:
        # The trigger goes into the Main loop's inbox in this transaction; its planning step is
        # enqueued on commit (a run without our agent loops, e.g. external agents, only records it).
        agent_loop_wake(
            node=main, trigger=trigger, detail={"node": node.handle if node is not None else None, **(detail or {})}
        )


# Runs in these states still take new branches; stopping/final-eval/terminal runs do not.
_RUN_OPEN_STATES = (RunStatus.CREATED, RunStatus.RUNNING)


def _require_open(run: Run) -> None:
    if run.status not in _RUN_OPEN_STATES:
        raise Conflict("run_not_active", f"Run {run.uuid} is {run.status}; it takes no new research nodes.")


def worker_add(
    *, run: Run, task: str, predecessors: list[ResearchNode], decision: Decision | None = None, actor: str = "main"
) -> ResearchNode:
    """Spawn a Worker within ``max_parallel_workers``; its predecessors become context in-edges."""
    with transaction.atomic():
        # The run lock makes count-then-create atomic: two Main calls cannot both take the last slot.
        locked = Run.objects.select_for_update().get(pk=run.pk)
        _require_open(locked)
        active = ResearchNode.objects.filter(run=locked, kind=NodeKind.WORKER, status=NodeStatus.ACTIVE).count()
        if active >= locked.max_parallel_workers:
            raise Conflict(
                "worker_limit",
                f"{active} Workers are active and the run allows {locked.max_parallel_workers} in parallel; "
                "finalize one first.",
                active=active,
                max_parallel_workers=locked.max_parallel_workers,
            )
        for predecessor in predecessors:
            if predecessor.run_id != locked.pk or predecessor.kind != NodeKind.WORKER:
                raise ApplicationError("invalid_predecessor", f"{predecessor.handle} is not a Worker of this run.")
        return node_create(
            run=locked, kind=NodeKind.WORKER, task=task, actor=actor, upstream=predecessors, decision=decision
        )


def reviewer_add(
    *, run: Run, question: str, scope: list[ResearchNode], decision: Decision | None = None, actor: str = "main"
) -> ResearchNode:
    """Spawn a Reviewer whose review-scope in-edges are ``scope`` (several = a cross-Worker review)."""
    if not scope:
        raise ApplicationError("empty_scope", "A Reviewer needs at least one Worker in its scope.")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        _require_open(locked)
        return node_create(
            run=locked, kind=NodeKind.REVIEWER, task=question, actor=actor, upstream=scope, decision=decision
        )


def decision_record(
    *,
    run: Run,
    kind: str,
    trigger: str,
    rationale: str,
    subject: ResearchNode | None = None,
    guidance: list[Guidance] | None = None,
    actor: str = "main",
) -> Decision:
    """Record one decision of the Main Agent (continue / verify / branch / revise) and the guidance it applied."""
    with transaction.atomic():
        decision = Decision(run=run, kind=kind, trigger=trigger, rationale=rationale, subject=subject)
        decision.full_clean()
        decision.save()
        _publish(run, LiveEvent.DECISION_CREATED, decision_live(decision))
        now = timezone.now()
        for item in guidance or []:
            # Conditional update: a guidance item is applied by one decision, never re-bound.
            bound = Guidance.objects.filter(pk=item.pk, run=run, applied_decision__isnull=True).update(
                applied_decision=decision, applied_at=item.applied_at or now, updated_at=now
            )
            if not bound:
                raise Conflict("guidance_already_applied", f"Guidance {item.uuid} is already bound to a decision.")
            _publish(run, LiveEvent.GUIDANCE_UPDATED, guidance_live_get(item))
        event_append(
            run=run,
            type="decision.recorded",
            actor=actor,
            role="main",
            arguments={
                "kind": kind,
                "trigger": trigger,
                "rationale": rationale,
                "subject": subject.handle if subject else None,
                "guidance": [str(g.uuid) for g in guidance or []],
            },
            result_ref=f"decision:{decision.uuid}",
        )
    return decision


def guidance_mark_read(*, run: Run, actor: str = "main") -> list[Guidance]:
    """The pending human guidance of the run, marked applied now (the planning step has read it)."""
    with transaction.atomic():
        pending = list(
            Guidance.objects.select_for_update().filter(run=run, applied_at__isnull=True).order_by("created_at", "pk")
        )
        if not pending:
            return []
        now = timezone.now()
        Guidance.objects.filter(pk__in=[g.pk for g in pending]).update(applied_at=now, updated_at=now)
        for item in pending:
            item.applied_at = now
            # Pending -> applied on the run page as soon as the planning step has read it.
            _publish(run, LiveEvent.GUIDANCE_UPDATED, guidance_live_get(item))
        event_append(
            run=run,
            type="guidance.read",
            actor=actor,
            role="main",
            arguments={"guidance": [str(g.uuid) for g in pending]},
        )
    return pending


def guidance_refusal_announce(*, run: Run, decision: str) -> None:
    """A tool call made for ``decision`` was refused: re-announce the guidance that decision applied.

    The run page shows what the applying decision failed to do (guidance_live ``refused``); the
    refusal is recorded after the decision, so its guidance changes then. Called by the tool-call
    recorder inside the refusal's transaction, after the refusal's event was appended.
    """
    try:
        key = UUID(str(decision))
    except ValueError:
        return  # not a decision id: the call was refused for that too, and no guidance changes
    for item in Guidance.objects.filter(run=run, applied_decision__uuid=key).order_by("pk"):
        _publish(run, LiveEvent.GUIDANCE_UPDATED, guidance_live_get(item))


def candidate_propose(*, run: Run, proposer: ResearchNode, title: str, description: str = "") -> Candidate:
    """A Worker proposes a direction or intervention; every agent of the run can read it."""
    with transaction.atomic():
        candidate = Candidate(run=run, proposer=proposer, title=title, description=description)
        candidate.full_clean()
        candidate.save()
        event_append(
            run=run,
            type="candidate.proposed",
            actor=proposer.handle,
            role=proposer.kind,
            arguments={"title": title},
            result_ref=f"candidate:{candidate.uuid}",
        )
    return candidate


def prediction_bind(
    *,
    run: Run,
    worker: ResearchNode,
    prediction: Prediction | None = None,
    text: str = "",
    metric: str = "feedback_score",
    expected_value: float | None = None,
    actor: str = "main",
) -> Prediction:
    """Bind a prediction (an existing one, or a new one) to a Worker before its branch has results."""
    if worker.run_id != run.pk or worker.kind != NodeKind.WORKER:
        raise ApplicationError("invalid_worker", f"{worker.handle} is not a Worker of this run.")
    if Experiment.objects.filter(owner=worker, status=ExperimentStatus.SUCCEEDED).exists():
        raise Conflict("branch_already_ran", f"{worker.handle} already has results; predict before a branch runs.")
    with transaction.atomic():
        if prediction is None:
            if not text.strip():
                raise ApplicationError("text_required", "A new prediction needs its text.")
            prediction = Prediction(run=run, text=text, metric=metric, expected_value=expected_value, worker=worker)
            prediction.full_clean()
            prediction.save()
            event = LiveEvent.PREDICTION_CREATED
        else:
            # Conditional update: a prediction is bound once; rebinding would rewrite what was predicted.
            if not Prediction.objects.filter(pk=prediction.pk, run=run, worker__isnull=True).update(worker=worker):
                raise Conflict("prediction_bound", f"Prediction {prediction.uuid} is already bound to a Worker.")
            prediction.refresh_from_db()
            event = LiveEvent.PREDICTION_UPDATED
        _publish(run, event, prediction_live_get(prediction))
        event_append(
            run=run,
            type="prediction.bound",
            actor=actor,
            role="main",
            arguments={
                "worker": worker.handle,
                "text": prediction.text,
                "metric": prediction.metric,
                "expected_value": prediction.expected_value,
            },
            result_ref=f"prediction:{prediction.uuid}",
        )
    return prediction


def prediction_reconcile(
    *, prediction: Prediction, verdict: str, observed_value: float | None, note: str, actor: str = "main"
) -> Prediction:
    """Close a prediction against the evidence: confirmed, refuted or inconclusive. Once only."""
    if verdict == PredictionVerdict.OPEN or verdict not in PredictionVerdict.values:
        raise ApplicationError("invalid_verdict", "verdict is confirmed, refuted or inconclusive.")
    with transaction.atomic():
        locked = Prediction.objects.select_for_update().get(pk=prediction.pk)
        if locked.verdict != PredictionVerdict.OPEN:
            raise Conflict(
                "prediction_reconciled", f"Prediction {locked.uuid} was already reconciled ({locked.verdict})."
            )
        locked.verdict = verdict
        locked.observed_value = observed_value
        locked.reconciliation = note
        locked.reconciled_at = timezone.now()
        locked.full_clean()
        locked.save(update_fields=["verdict", "observed_value", "reconciliation", "reconciled_at", "updated_at"])
        event_append(
            run=locked.run,
            type="prediction.reconciled",
            actor=actor,
            role="main",
            arguments={"verdict": verdict, "observed_value": observed_value, "note": note},
            result_ref=f"prediction:{locked.uuid}",
        )
        _publish(locked.run, LiveEvent.PREDICTION_UPDATED, prediction_live_get(locked))
    return locked


__all__ = [
    "RunStatus",
    "candidate_propose",
    "dag_edge_add",
    "decision_record",
    "guidance_mark_read",
    "main_trigger",
    "node_create",
    "node_finalize",
    "prediction_bind",
    "prediction_reconcile",
    "reviewer_add",
    "run_create",
    "run_label",
    "run_set_status",
    "worker_add",
]


# --- a person's guidance and the agents' LLM usage -----------------------------------------------
#
# Starting, pausing, stopping, budgets and the final evaluation cross apps: they are the run
# lifecycle of the process layer (apps/flows/runs.py).


def guidance_post(*, run: Run, author: Any, text: str) -> Guidance:
    """A person gives the Main Agent guidance; it is pending until a planning step reads it."""
    if not text.strip():
        raise ApplicationError("empty_guidance", "Guidance needs some text.")
    if run.status in RUN_TERMINAL_STATES:
        raise Conflict("run_finished", f"Run {run.uuid} is {run.status}; guidance would never be read.")
    with transaction.atomic():
        guidance = Guidance(run=run, author=author, text=text.strip())
        guidance.full_clean()
        guidance.save()
        _publish(run, LiveEvent.GUIDANCE_CREATED, guidance_live_get(guidance))
        event_append(run=run, type="guidance.posted", actor=_actor(author), role="human",
                     arguments={"guidance": str(guidance.uuid), "text": guidance.text},
                     result_ref=f"guidance:{guidance.uuid}")  # fmt: skip
        main_trigger(run=run, trigger=Trigger.GUIDANCE, actor=_actor(author),
                     detail={"guidance": str(guidance.uuid)})  # fmt: skip
    return guidance


def llm_usage_record(*, run: Run, node: ResearchNode, model: str, prompt_tokens: int, completion_tokens: int,
                     cost_usd: float = 0.0) -> Any:  # fmt: skip
    """Record one model call's tokens and cost for ``node`` and add them to the run's total."""
    with transaction.atomic():
        usage = LLMUsage.objects.create(run=run, node=node, model=model[:200], prompt_tokens=max(0, prompt_tokens),
                                        completion_tokens=max(0, completion_tokens),
                                        cost_usd=Decimal(str(round(cost_usd, 6))))  # fmt: skip
        # F(): several agents of one run record usage concurrently; each adds, none overwrites.
        Run.objects.filter(pk=run.pk).update(used_llm_tokens=F("used_llm_tokens") + usage.prompt_tokens
                                             + usage.completion_tokens)  # fmt: skip
        run_updated(run)
    return usage


__all__ += [
    "guidance_post",
    "llm_usage_record",
]
