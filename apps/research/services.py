"""State changes of runs and the research DAG, each announced to the run page after commit.

Every service here that creates or changes a run, a research node, an edge, a decision, a
prediction or guidance publishes its live event (apps.live.events.LiveEvent) on commit, with
the record as its selector builds it (apps/research/selectors.py): a browser that applies the
events to its snapshot ends with what a fresh snapshot shows. The agent loops' own state
machine and scheduling are in apps/research/agent_loops.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import THETA0_HANDLE, benchmark_resolve
from apps.core.errors import ApplicationError, Conflict
from apps.core.handles import next_handle
from apps.core.queues import Queue
from apps.experiments.choices import EXPERIMENT_ACTIVE_STATES, ExperimentStatus, IntegrityStatus
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint, Event, Experiment
from apps.experiments.pipeline import evaluation_spec, experiment_on_job_transition
from apps.integrity.selectors import selectable_experiments
from apps.integrity.services import integrity_on_report
from apps.jobs.choices import JOB_ACTIVE_STATES, JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import engine_config, job_enqueue, job_request_cancel, jobs_reap_stale
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import run_group
from apps.research.agent_config import DEFAULT_PROFILE, ROLES, LLMNotConfigured, llm_config, prompt_hashes
from apps.research.agent_loops import (
    agent_loop_ensure,
    agent_loop_wake,
    agent_loops_close,
    agent_loops_resend,
    run_supervise_start,
)
from apps.research.choices import (
    AGENT_LOOP_ACTIVE_STATES,
    RUN_TERMINAL_STATES,
    AgentLoopStatus,
    AgentMode,
    EdgeKind,
    NodeKind,
    NodeStatus,
    PredictionVerdict,
    RunStatus,
    Trigger,
)
from apps.research.models import (
    AgentLoop,
    Candidate,
    Decision,
    Guidance,
    LLMUsage,
    OptimizerClaim,
    Prediction,
    ResearchEdge,
    ResearchNode,
    Run,
    RunStatusChange,
    default_policy,
)
from apps.research.result_selection import result_select
from apps.research.selectors import (
    decision_live,
    edge_live,
    guidance_live_get,
    node_live,
    prediction_live_get,
    run_held_nodes_last_seen,
    run_job_health,
    run_live_get,
)

SYSTEM = "system"


def _publish(run: Run, event: LiveEvent, payload: dict[str, Any]) -> None:
    # On commit (publish_on_commit): a browser told about a row must be able to read it, and a
    # rolled-back change is never announced. The payload is read now, inside the transaction,
    # after the change: the row as it will be committed.
    publish_on_commit(run_group(run.uuid), event, payload)


def _run_updated(run: Run) -> None:
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
        _run_updated(run)
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
        _run_updated(locked)
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
        _run_updated(locked)
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


def run_health_on_job_ended(*, job: Job) -> None:
    """After a job of a run succeeded or failed: did the run's recent jobs start, or stop, mostly failing?

    When this job's failure makes ``job_failure_threshold`` of the last ``job_failure_window`` jobs
    failures (3 of 4 by default: a full disk, an OOM, a broken dataset), the run records a
    ``run.jobs_failing`` event with the failure summary and wakes the Main Agent with it
    (trigger ``jobs_failing``); the success that brings it back under records ``run.jobs_recovered``.
    Only the crossing is recorded, not every failure after it. Called inside the job's transition
    (apps.jobs.services); the run row is locked (after the job and its experiment, the documented
    order), so two jobs ending together are counted one after the other, never both or neither.
    """
    if job.run_id is None:
        return
    run = Run.objects.select_for_update().get(pk=job.run_id)
    health = run_job_health(run=run)
    before = run_job_health(run=run, without_job_id=job.pk)
    if health.failing == before.failing or run.status in RUN_TERMINAL_STATES:
        return
    kind = "run.jobs_failing" if health.failing else "run.jobs_recovered"
    event_append(run=run, type=kind, actor=SYSTEM, role=SYSTEM, arguments={"job": str(job.uuid), **health.as_json()},
                 result_ref=f"run:{run.uuid}")  # fmt: skip
    if health.failing:
        main_trigger(run=run, trigger=Trigger.JOBS_FAILING, detail={"summary": health.summary()})
    _run_updated(run)


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


def worker_finalize(*, node: ResearchNode, summary: str, experiments: list[str], actor: str) -> ResearchNode:
    """The Worker's own finalization: its summary must cite its own experiments; wakes the Main Agent."""
    if node.kind != NodeKind.WORKER:
        raise ApplicationError("not_a_worker", f"{node.handle} is not a Worker.")
    cited = set(experiments)
    own = set(Experiment.objects.filter(owner=node, handle__in=cited).values_list("handle", flat=True))
    foreign = sorted(cited - own)
    if foreign:
        # Whose an experiment is comes from the records, not the request's shape: 409, as for state.
        raise ApplicationError(
            "foreign_experiment",
            f"A Worker's summary cites only its own experiments; not {', '.join(foreign)}.",
            status=409,
            experiments=foreign,
        )
    if not cited and Experiment.objects.filter(owner=node).exists():
        # The Worker's records, not the request's shape, make the citation necessary: 409, as for state.
        raise ApplicationError(
            "citation_required", "Cite the experiments your summary rests on (their handles).", status=409
        )
    with transaction.atomic():
        finalized = node_finalize(node=node, summary=summary, experiments=sorted(cited), actor=actor)
        # The summary is a report: its reporting checks (selection, attribution, disclosure) re-run.

        integrity_on_report(run=finalized.run, node=finalized)
        main_trigger(run=finalized.run, trigger="worker_finalize", node=finalized, actor=actor)
    return finalized


def claim_revise(*, run: Run, key: str, text: str, evidence: list[str], actor: str = "main") -> OptimizerClaim:
    """Add the next revision of a research claim; earlier revisions stay as its history."""
    with transaction.atomic():
        # Revisions are numbered under the run lock; the unique (run, key, revision) backs it up.
        locked = Run.objects.select_for_update().get(pk=run.pk)
        latest = OptimizerClaim.objects.filter(run=locked, key=key).aggregate(m=Max("revision"))["m"] or 0
        claim = OptimizerClaim(run=locked, key=key, revision=latest + 1, text=text, evidence=evidence)
        claim.full_clean()
        claim.save()
        event_append(
            run=locked,
            type="claim.revised",
            actor=actor,
            role="main",
            arguments={"key": key, "revision": claim.revision, "text": text, "evidence": evidence},
        )

        integrity_on_report(run=locked, handles=evidence)
    return claim


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


def run_stop_request(*, run: Run, reason: str, actor: str = "main") -> Run:
    """Ask the run to end: no new work, running jobs finish, then the final evaluation.

    Guards: a run already stopping (or later) is left as it is (idempotent); a run whose final
    evaluation is pending or that has ended is refused; a paused run must be resumed by a person first.
    """
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current == RunStatus.STOPPING:
        return Run.objects.get(pk=run.pk)
    if current == RunStatus.FINAL_EVAL:
        raise Conflict("final_eval_pending", "The final evaluation is running; the run ends when it does.")
    if current in RUN_TERMINAL_STATES:
        raise Conflict("run_finished", f"Run {run.uuid} is already {current}.")
    if current == RunStatus.PAUSED:
        raise Conflict("run_paused", "A person paused this run; it can be stopped once resumed.")
    # The same path as an operator's stop with a final evaluation (run_stop, below).
    return run_stop(run=run, actor=actor, reason=reason or "stop requested", final_eval=True)


def run_results_sync(*, run: Run, actor: str = SYSTEM) -> list[tuple[Any, str, str]]:
    """Reconcile finished jobs with the experiment records of ``run``; idempotent.

    Ends stale jobs (the reaper's pass), then hands every still-active experiment whose jobs have
    all ended to the pipeline, which records the missed transition. Returns (experiment, from, to)
    for each experiment whose status changed.
    """
    jobs_reap_stale(stale_after_seconds=engine_config().stale_after_seconds)
    changed: list[tuple[Any, str, str]] = []
    active = Experiment.objects.filter(run=run, status__in=EXPERIMENT_ACTIVE_STATES).exclude(
        status=ExperimentStatus.HELD
    )
    for experiment in active:
        with transaction.atomic():
            locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
            jobs = list(Job.objects.filter(experiment=locked).order_by("created_at", "pk"))
            if not jobs or any(job.status in JOB_ACTIVE_STATES for job in jobs):
                continue  # nothing ran yet, or something still runs: nothing was missed
            last = jobs[-1]
            if (
                last.kind == JobKind.TRAIN
                and last.status == JobStatus.SUCCEEDED
                and any(job.kind == JobKind.EVALUATE for job in jobs)
            ):
                continue
            before = locked.status
            experiment_on_job_transition(job=last)
            after = Experiment.objects.values_list("status", flat=True).get(pk=locked.pk)
            if after != before:
                changed.append((locked, before, after))
    if changed:
        event_append(
            run=run,
            type="results.synced",
            actor=actor,
            role=SYSTEM,
            arguments={"changed": [[e.handle, a, b] for e, a, b in changed]},
        )
    return changed


__all__ = [
    "RunStatus",
    "candidate_propose",
    "claim_revise",
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
    "run_results_sync",
    "run_set_status",
    "run_stop_request",
    "worker_add",
    "worker_finalize",
]


# --- running a run: start, pause, resume, stop, budgets, and the final evaluation ---------------------
#
# The agent loops and the run supervisor (workers/agents/loop.py) call these; operators reach them
# through the dashboard and `manage.py start_run`. A run's state is the database: every function
# here is safe to call again after a restart.


def run_start(*, run: Run, actor: str = SYSTEM) -> Run:
    """Start a created run: record the prompt versions, give the Main Agent its loop, and wake it.

    Idempotent: starting a running run changes nothing. The run supervisor starts ticking on commit.
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == RunStatus.RUNNING:
            return locked
        if locked.status != RunStatus.CREATED:
            raise Conflict("run_not_created", f"Run {locked.uuid} is {locked.status}; only a created run starts.")
        locked.started_at = timezone.now()
        locked.prompt_hashes = {"policy": locked.agent_mode, **prompt_hashes()}
        locked.save(update_fields=["started_at", "prompt_hashes", "updated_at"])
        locked = run_set_status(run=locked, status=RunStatus.RUNNING, actor=actor, reason="started")
        main = ResearchNode.objects.get(run=locked, kind=NodeKind.MAIN)
        # An external run's Main loop is created done: its harnesses drive the agents.
        agent_loop_ensure(node=main, policy=locked.agent_mode)
        main_trigger(run=locked, trigger=Trigger.RUN_START, actor=actor)
        run_supervise_start(run=locked)
    return locked


# Accelerator-seconds one final-split evaluation is budgeted at when reserving for the end.
FINAL_EVAL_SECONDS = 30
# The LLM token budget of an LLM run that names none.
DEFAULT_LLM_TOKENS = 2_000_000


def run_launch(
    *,
    benchmark: Benchmark | str,
    policy: str = AgentMode.HEURISTIC,
    llm_profile: str = DEFAULT_PROFILE,
    base_checkpoint: Checkpoint | None = None,
    name: str = "",
    wall_seconds: int = 3600,
    accelerator_seconds: int = 3600,
    llm_tokens: int = 0,
    parallel: int = 2,
    gate: bool = False,
    reviewer: bool = True,
    serial_workers: bool = False,
    max_workers: int = 4,
    screen_steps: int = 60,
    train_steps: int = 200,
    learning_rate: float = 2e-3,
    batch_size: int = 64,
    seed: int = 0,
    actor: str = SYSTEM,
    created_by: Any = None,
    heuristic: dict[str, Any] | None = None,
    start: bool = True,
) -> Run:
    """Create and start a run as a person asks for it (``manage.py start_run``, the dashboard's form).

    ``heuristic`` adds keys to the policy's ``heuristic`` block (the agent suites' weakening
    switches, apps/dojo/agents.py); ``start=False`` leaves the run ``created`` for a later
    ``run_start`` (a suite's queued cells).

    The final evaluation's cost is reserved from the accelerator budget. An LLM run names an
    endpoint profile (agent_config ``llm_profiles``); its configuration is checked now, with the
    variable to set, rather than inside a worker. The ablation switches are the paper's:
    ``reviewer=False`` (the Main Agent decides from Worker summaries alone) and
    ``serial_workers`` (one Worker at a time).
    """
    if policy not in (AgentMode.HEURISTIC, AgentMode.LLM):
        raise ApplicationError("invalid_policy", "policy is heuristic or llm.")
    if policy == AgentMode.LLM:
        try:
            for role in ROLES:
                llm_config(role, llm_profile)
        except LLMNotConfigured as exc:
            raise ApplicationError("llm_not_configured", str(exc)) from None
        llm_tokens = llm_tokens or DEFAULT_LLM_TOKENS
    bench = benchmark if isinstance(benchmark, Benchmark) else benchmark_resolve(benchmark)
    base = base_checkpoint or base_checkpoint_default()
    if not base.is_base:
        raise ApplicationError("not_a_base_checkpoint", f"{base.handle} is not a registered θ0 checkpoint.")
    parallel = 1 if serial_workers else max(1, parallel)
    # θ0, the reference and up to max_workers accepted candidates are evaluated at the end.
    reserve = min(FINAL_EVAL_SECONDS * (2 + max_workers), accelerator_seconds // 4)
    label = policy if policy == AgentMode.HEURISTIC else f"llm:{llm_profile}"
    run = run_create(
        name=name or f"{bench.name} {label}",
        benchmark=bench,
        base_checkpoint=base,
        target_capability=bench.description or bench.task,
        budget_wall_seconds=wall_seconds,
        budget_accelerator_seconds=accelerator_seconds,
        budget_llm_tokens=llm_tokens,
        max_parallel_workers=parallel,
        reserved_final_seconds=reserve,
        agent_mode=policy,
        created_by=created_by,
        policy={
            "training_gate": gate,
            "reviewers": reviewer,
            "serial_workers": serial_workers,
            "seed": seed,
            **({"llm_profile": llm_profile} if policy == AgentMode.LLM else {}),
            "heuristic": {
                "max_workers": max_workers,
                "screen_steps": screen_steps,
                "train_steps": train_steps,
                "learning_rate": learning_rate,
                "batch_size": batch_size,
                **(heuristic or {}),
            },
        },  # fmt: skip
    )
    return run_start(run=run, actor=actor) if start else run


def base_checkpoint_default() -> Checkpoint:
    """The θ0 a run starts from when none is named: the minibench's, else the first registered base."""
    base = Checkpoint.objects.filter(handle=THETA0_HANDLE).first() or Checkpoint.objects.filter(is_base=True).first()
    if base is None:
        raise ApplicationError("no_base_checkpoint", "No θ0 is installed: run `manage.py build_minibench` first.")
    return base


def run_pause(*, run: Run, actor: str, reason: str = "") -> Run:
    """An operator pauses a running run: no agent step and no new submission until resumed.

    Jobs already running finish (their results are recorded); the wall clock keeps counting.
    """
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current == RunStatus.PAUSED:
        return Run.objects.get(pk=run.pk)
    if current != RunStatus.RUNNING:
        raise Conflict("run_not_running", f"Run {run.uuid} is {current}; only a running run can be paused.")
    return run_set_status(run=run, status=RunStatus.PAUSED, actor=actor, reason=reason or "paused")


def run_resume(*, run: Run, actor: str) -> Run:
    """Resume a paused run; every scheduled agent step is re-sent on commit."""
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current == RunStatus.RUNNING:
        return Run.objects.get(pk=run.pk)
    if current != RunStatus.PAUSED:
        raise Conflict("run_not_paused", f"Run {run.uuid} is {current}; only a paused run can be resumed.")
    with transaction.atomic():
        resumed = run_set_status(run=run, status=RunStatus.RUNNING, actor=actor, reason="resumed")
        transaction.on_commit(lambda: agent_loops_resend(run=resumed))
        run_supervise_start(run=resumed)
    return resumed


def run_stop(*, run: Run, actor: str, reason: str = "", final_eval: bool = True) -> Run:
    """An operator stops a run.

    ``final_eval=True``: like the Main Agent's stop_loop — no new work, running jobs finish, then the
    final evaluation (also from a paused run). ``final_eval=False``: abort — active jobs are
    cancelled, agent loops end, and the run is ``stopped`` with no result.
    """
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current in RUN_TERMINAL_STATES:
        raise Conflict("run_finished", f"Run {run.uuid} is already {current}.")
    if final_eval:
        if current in (RunStatus.STOPPING, RunStatus.FINAL_EVAL):
            return Run.objects.get(pk=run.pk)
        with transaction.atomic():
            stopped = run_set_status(run=run, status=RunStatus.STOPPING, actor=actor, reason=reason or "stopped")
            if current == RunStatus.PAUSED:
                # Paused steps were never sent: let the agents wrap up (summaries, reports).
                transaction.on_commit(lambda: agent_loops_resend(run=stopped))
        return stopped
    with transaction.atomic():
        stopped = run_set_status(run=run, status=RunStatus.STOPPED, actor=actor, reason=reason or "aborted")
        for job in Job.objects.filter(run=stopped, status__in=JOB_ACTIVE_STATES):
            with contextlib.suppress(Conflict):  # it ended meanwhile
                job_request_cancel(job=job, actor=actor)
        agent_loops_close(run=stopped, reason=f"run stopped by {actor}")
    return stopped


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
        _run_updated(run)
    return usage


@dataclass(frozen=True)
class BudgetState:
    """What is left of a run's budgets; ``exhausted`` names the spent ones."""

    wall_elapsed: float
    wall_left: float
    accelerator_used: float
    accelerator_left: float  # after the final-evaluation reserve
    tokens_used: int
    tokens_left: int
    exhausted: tuple[str, ...]


def run_budget_state(*, run: Run) -> BudgetState:
    """Budgets now. Accelerator time counts finished jobs and the elapsed time of running ones."""
    run = Run.objects.get(pk=run.pk)
    now = timezone.now()
    running = Job.objects.filter(run=run, status=JobStatus.RUNNING, queue=Queue.GPU, started_at__isnull=False).exclude(
        kind=JobKind.FINAL_EVAL
    )
    in_flight = sum(max(0.0, (now - job.started_at).total_seconds()) for job in running)
    accelerator_used = run.used_accelerator_seconds + in_flight
    accelerator_left = run.budget_accelerator_seconds - run.reserved_final_seconds - accelerator_used
    elapsed = (now - run.started_at).total_seconds() if run.started_at else 0.0
    tokens_left = run.budget_llm_tokens - run.used_llm_tokens
    exhausted = []
    if run.started_at and elapsed >= run.budget_wall_seconds:
        exhausted.append("wall_clock")
    if accelerator_left <= 0:
        exhausted.append("accelerator_seconds")
    if run.agent_mode == AgentMode.LLM and tokens_left <= 0:
        exhausted.append("llm_tokens")
    return BudgetState(
        wall_elapsed=elapsed,
        wall_left=run.budget_wall_seconds - elapsed,
        accelerator_used=accelerator_used,
        accelerator_left=accelerator_left,
        tokens_used=run.used_llm_tokens,
        tokens_left=tokens_left,
        exhausted=tuple(exhausted),
    )


def run_budget_enforce(*, run: Run, actor: str = SYSTEM) -> Run:
    """When a budget is spent, the run stops taking work: ``stopping``, and queued training is cancelled.

    Running jobs finish (the evaluation of a finished training still runs, so its experiment ends);
    what has not started does not start. The final evaluation has its own reserve.
    """
    current = Run.objects.get(pk=run.pk)
    if current.status != RunStatus.RUNNING:
        return current
    budget = run_budget_state(run=current)
    if not budget.exhausted:
        return current
    with transaction.atomic():
        stopped = run_set_status(run=current, status=RunStatus.STOPPING, actor=actor,
                                 reason=f"budget spent: {', '.join(budget.exhausted)}")  # fmt: skip
        if stopped.status != RunStatus.STOPPING:
            return stopped
        cancelled = []
        for job in Job.objects.filter(run=stopped, status=JobStatus.QUEUED, kind=JobKind.TRAIN):
            try:
                job_request_cancel(job=job, actor=f"{actor}: budget spent")
                cancelled.append(str(job.uuid))
            except Conflict:
                pass  # claimed meanwhile: it runs to its end
        event_append(run=stopped, type="run.budget_exhausted", actor=actor, role=SYSTEM,
                     arguments={"exhausted": list(budget.exhausted), "cancelled_jobs": cancelled,
                                "accelerator_used": round(budget.accelerator_used, 3),
                                "wall_elapsed": round(budget.wall_elapsed, 3),
                                "tokens_used": budget.tokens_used})  # fmt: skip
    return stopped


def run_advance(
    *, run: Run, grace_seconds: float, quiet_seconds: float, silent_seconds: float = 1800.0, actor: str = SYSTEM
) -> Run:
    """Move a run along its end: stop a stuck or leaderless run, start the final evaluation, finish.

    Called by the run supervisor on every tick. A ``running`` run with nothing left to do (no
    active loop, experiment or trigger) is stopped after ``quiet_seconds`` — unless an outside
    harness holds an active node: then only once every such node has been silent (no call with
    its tokens) for ``silent_seconds``, since a harness may think for minutes between calls.
    ``stopping`` waits until no experiment is queued or running, then (up to ``grace_seconds``)
    for the agents' summaries and the integrity post-checks; ``final_eval`` waits for its
    evaluation jobs.
    """
    run = Run.objects.get(pk=run.pk)
    now = timezone.now()
    loops = AgentLoop.objects.filter(run=run)
    main_loop = loops.filter(node__kind=NodeKind.MAIN).first()
    active_experiments = Experiment.objects.filter(run=run, status__in=(ExperimentStatus.QUEUED,
                                                                        ExperimentStatus.RUNNING))  # fmt: skip
    if run.status == RunStatus.RUNNING:
        if main_loop is not None and main_loop.status == AgentLoopStatus.FAILED:
            return run_stop_request(run=run, reason=f"the Main Agent failed: {main_loop.last_error[:300]}", actor=actor)
        idle = (
            main_loop is not None and main_loop.status in (AgentLoopStatus.WAITING, AgentLoopStatus.DONE)
            and not main_loop.inbox
            and not loops.exclude(node__kind=NodeKind.MAIN).filter(status__in=AGENT_LOOP_ACTIVE_STATES).exists()
            and not active_experiments.exists()
            and not Experiment.objects.filter(run=run, status=ExperimentStatus.HELD).exists()
        )  # fmt: skip
        if not idle:
            return run
        held = run_held_nodes_last_seen(run)
        if held:
            silent = (now - max(held.values())).total_seconds()
            if silent > silent_seconds:
                return run_stop_request(run=run, actor=actor, reason=f"the agents holding {', '.join(sorted(held))} "
                                        f"have been silent for {silent:.0f}s")  # fmt: skip
            return run
        last = max([main_loop.updated_at, *[e.updated_at for e in Experiment.objects.filter(run=run)]])
        if (now - last).total_seconds() > quiet_seconds:
            return run_stop_request(run=run, reason="nothing left to do: no active branch, job or trigger",
                                    actor=actor)  # fmt: skip
        return run
    if run.status == RunStatus.STOPPING:
        if active_experiments.exists() or Job.objects.filter(run=run, status__in=JOB_ACTIVE_STATES).exists():
            return run
        change = run.status_changes.filter(to_status=RunStatus.STOPPING).order_by("-created_at").first()
        since = change.created_at if change else now
        ended = Experiment.objects.filter(run=run).order_by("-updated_at").values_list("updated_at", flat=True).first()
        waited = (now - max(since, ended or since)).total_seconds()
        busy_agents = loops.exclude(node__kind=NodeKind.MAIN).filter(status__in=AGENT_LOOP_ACTIVE_STATES).exists()
        unchecked = Experiment.objects.filter(run=run, status=ExperimentStatus.SUCCEEDED,
                                              integrity_status=IntegrityStatus.PENDING).exists()  # fmt: skip
        if (busy_agents or unchecked) and waited < grace_seconds:
            return run
        return run_final_eval_start(run=run, actor=actor)
    if run.status == RunStatus.FINAL_EVAL:
        if Job.objects.filter(run=run, kind=JobKind.FINAL_EVAL, status__in=JOB_ACTIVE_STATES).exists():
            return run
        return run_finish(run=run, actor=actor)
    return run


def run_final_eval_start(*, run: Run, actor: str = SYSTEM) -> Run:
    """Evaluate θ0, the reference and the accepted candidates on the final split (paid from the reserve).

    The returned checkpoint is fixed now (apps.research.result_selection): the Main Agent's
    nomination if still accepted, else the accepted experiment with the best *feedback* score.
    The other accepted candidates are evaluated too, to be shown, never to select.
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("benchmark", "base_checkpoint").get(pk=run.pk)
        if locked.status != RunStatus.STOPPING:
            return locked
        best, chosen_by = result_select(locked)
        # One evaluation per checkpoint, with every role it plays (the best may be θ0 itself).
        targets: dict[int, dict[str, Any]] = {}

        def add(role: str, checkpoint: Any, experiment: Any) -> None:
            target = targets.setdefault(checkpoint.pk, {"checkpoint": checkpoint, "roles": [], "experiment": None})
            if role == "candidate" and target["roles"]:
                return  # already evaluated in another role; a candidate is only shown once
            target["roles"].append(role)
            if experiment is not None and target["experiment"] is None:
                target["experiment"] = experiment.handle

        add("theta0", locked.base_checkpoint, None)
        if locked.benchmark.reference_checkpoint is not None:
            add("reference", locked.benchmark.reference_checkpoint, None)
        # The others accepted are shown next to it, best first; they never select.
        candidates = selectable_experiments(locked).order_by("-feedback_score", "created_at", "pk")
        for experiment in [best, *candidates]:
            if experiment is not None:
                add("best" if experiment == best else "candidate",
                    experiment.output_checkpoint or experiment.input_checkpoint, experiment)  # fmt: skip
        jobs = []
        for target in targets.values():
            checkpoint = target["checkpoint"]
            spec = {**evaluation_spec(checkpoint=checkpoint, benchmark=locked.benchmark, split="final"),
                    "roles": target["roles"], "experiment": target["experiment"]}  # fmt: skip
            job = job_enqueue(kind=JobKind.FINAL_EVAL, spec=spec, run=locked)
            jobs.append({"roles": target["roles"], "checkpoint": checkpoint.handle, "job": str(job.uuid),
                         "experiment": target["experiment"]})  # fmt: skip
        event_append(run=locked, type="run.final_eval_started", actor=actor, role=SYSTEM,
                     arguments={"best": best.handle if best is not None else None, "chosen_by": chosen_by,
                                "jobs": jobs})  # fmt: skip
        return run_set_status(run=locked, status=RunStatus.FINAL_EVAL, actor=actor,
                              reason=f"final evaluation of {len(jobs)} checkpoints")  # fmt: skip


def run_finish(*, run: Run, actor: str = SYSTEM) -> Run:
    """Record the final result (best accepted checkpoint next to θ0 and the reference) and finish."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.FINAL_EVAL:
            return locked
        rows: dict[str, Any] = {"theta0": None, "reference": None, "best": None, "candidates": []}
        for job in Job.objects.filter(run=locked, kind=JobKind.FINAL_EVAL).select_related("evaluation").order_by("pk"):
            evaluation = getattr(job, "evaluation", None) if job.status == JobStatus.SUCCEEDED else None
            row = {"checkpoint": job.spec.get("checkpoint"), "experiment": job.spec.get("experiment"),
                   "job": str(job.uuid), "status": job.status,
                   "final_score": evaluation.score if evaluation is not None else None}  # fmt: skip
            row["checkpoint_handle"] = Checkpoint.objects.filter(uuid=row["checkpoint"]).values_list(
                "handle", flat=True).first()  # fmt: skip
            for role in job.spec.get("roles") or [job.spec.get("role", "candidate")]:
                if role == "candidate":
                    rows["candidates"].append(row)
                else:
                    rows[role] = {**row, "experiment": row["experiment"] if role == "best" else None}
        best, theta0 = rows["best"], rows["theta0"]
        if best is not None and best["experiment"]:
            experiment = Experiment.objects.select_related("output_checkpoint", "input_checkpoint").get(
                run=locked, handle=best["experiment"])  # fmt: skip
            best["feedback_score"] = experiment.feedback_score
            locked.result_checkpoint = experiment.output_checkpoint or experiment.input_checkpoint
        rows["beats_theta0"] = bool(
            best and theta0 and best["final_score"] is not None and theta0["final_score"] is not None
            and best["final_score"] > theta0["final_score"]
        )  # fmt: skip
        locked.finished_at = timezone.now()
        locked.save(update_fields=["result_checkpoint", "finished_at", "updated_at"])
        event_append(
            run=locked,
            type="run.final_result",
            actor=actor,
            role=SYSTEM,
            arguments=rows,
            result_ref=f"checkpoint:{locked.result_checkpoint.uuid}" if locked.result_checkpoint else "",
        )
        reason = "final evaluation done" if best else "final evaluation done; no accepted checkpoint"
        finished = run_set_status(run=locked, status=RunStatus.FINISHED, actor=actor, reason=reason)
        agent_loops_close(run=finished, reason="the run finished")
    return finished


def run_final_result(*, run: Run) -> dict[str, Any] | None:
    """The recorded final result of a finished run (as ``run_finish`` wrote it), or None."""
    event = Event.objects.filter(run=run, type="run.final_result").order_by("-id").first()
    return dict(event.arguments) if event is not None else None


__all__ += [
    "BudgetState",
    "guidance_post",
    "llm_usage_record",
    "run_advance",
    "run_budget_enforce",
    "run_budget_state",
    "run_final_eval_start",
    "run_final_result",
    "run_finish",
    "run_launch",
    "run_pause",
    "run_resume",
    "run_start",
    "run_stop",
]
