"""Execution & state tools (DESIGN.md "ExpOS tools"): the research branches and the run's state.

worker_submit and the training gate live in execution.py; these are the others.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import NotFound
from apps.experiments.choices import EXPERIMENT_ACTIVE_STATES
from apps.experiments.models import Event
from apps.expos.harness import seat_token_show
from apps.expos.payloads import decision_refused, node_payload, run_decision, run_node, run_workers
from apps.expos.registry import Category, Role, ToolContext, tool
from apps.expos.schemas import (
    EXPERIMENT,
    EXPERIMENT_BRIEF,
    MAX_TEXT,
    NEW_NODE,
    NODE,
    TIMESTAMP,
    UUID,
    WORKER,
    array,
    closed,
    enum,
    free_object,
    integer,
    nullable,
    number,
    string,
    text,
)
from apps.expos.selectors import experiment_brief, run_quota
from apps.expos.visibility import (
    event_arguments_for,
    owner_node_ids,
    visible_checkpoints,
    visible_events,
    visible_experiments,
)
from apps.flows import agent_reports, runs
from apps.research import services as research
from apps.research.choices import EdgeKind, NodeKind
from apps.research.models import ResearchEdge, ResearchNode

MAIN = {Role.MAIN}
WORKER_ROLE = {Role.WORKER}
ALL = Role.ALL_AGENTS


def _own_node(ctx: ToolContext, args: dict[str, Any]) -> ResearchNode:
    return ctx.node


def _worker_arg(ctx: ToolContext, args: dict[str, Any]) -> ResearchNode:
    return run_node(ctx, args["worker"], kind=NodeKind.WORKER)


@tool(
    "state_add_new_worker",
    category=Category.EXECUTION,
    roles=MAIN,
    description="Create a research branch: a new Worker with a task, within the run's parallel-Worker limit; "
    "its predecessors pass it their experiments and summaries as context. In a harness run the answer carries "
    "the new Worker's token (once): hand it to the sub-agent that plays the Worker.",
    input_schema={
        **closed(
            {
                "task": text(4000),
                "predecessors": array(WORKER, max_items=20, unique=True),
                "decision": {**UUID, "description": "The decision (main_optimizer_update) this branch carries out."},
            },
            optional=("predecessors", "decision"),
        ),
    },
    output_schema=NEW_NODE,
    idempotent_create=True,
    errors=("worker_limit", "run_not_active", "unknown_worker", "unknown_decision"),
    after_refusal=decision_refused,
)
def state_add_new_worker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    node = research.worker_add(
        run=ctx.run,
        task=args["task"],
        predecessors=run_workers(ctx, args.get("predecessors", [])),
        decision=run_decision(ctx, args.get("decision")),
        actor=ctx.actor,
    )
    ctx.result_ref = f"node:{node.uuid}"
    ctx.etag_node = node
    seat_token_show(ctx, node)
    return node_payload(node)


_PREDECESSOR = closed(
    {
        "worker": NODE,
        "experiments": array(EXPERIMENT_BRIEF, max_items=10_000),
    }
)


@tool(
    "state_get_current_worker",
    category=Category.EXECUTION,
    roles=WORKER_ROLE,
    description="The calling Worker: its task, status and experiments, and the summaries and experiments of "
    "its designated predecessors.",
    output_schema=closed(
        {
            "worker": NODE,
            "experiments": array(EXPERIMENT_BRIEF, max_items=10_000),
            "predecessors": array(_PREDECESSOR, max_items=1000),
        }
    ),
)
def state_get_current_worker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    experiments = list(visible_experiments(ctx).select_related("owner").order_by("pk"))
    by_owner: dict[int, list[dict[str, Any]]] = {}
    for experiment in experiments:
        by_owner.setdefault(experiment.owner_id, []).append(experiment_brief(ctx, experiment))
    owners = ResearchNode.objects.filter(pk__in={e.owner_id for e in experiments} | _context_ids(ctx)).exclude(
        pk=ctx.node.pk
    )
    ctx.etag_node = ctx.node
    return {
        "worker": node_payload(ctx.node),
        "experiments": by_owner.get(ctx.node.pk, []),
        "predecessors": [
            {"worker": node_payload(node), "experiments": by_owner.get(node.pk, [])} for node in owners.order_by("pk")
        ],
    }


def _context_ids(ctx: ToolContext) -> set[int]:
    return owner_node_ids(ctx) or set()


@tool(
    "state_get_current_main",
    category=Category.EXECUTION,
    roles=MAIN,
    description="The calling Main Agent: its node (task, status, ETag) and every Worker and Reviewer of the "
    "run with its status, task, summary and ETag (state_inspect_worker and inspect_reviewer_report go deeper).",
    output_schema=closed(
        {"main": NODE, "workers": array(NODE, max_items=10_000), "reviewers": array(NODE, max_items=10_000)}
    ),
)
def state_get_current_main(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    nodes = ResearchNode.objects.filter(run=ctx.run, kind__in=(NodeKind.WORKER, NodeKind.REVIEWER)).order_by("pk")
    payloads = [node_payload(node) for node in nodes]
    ctx.etag_node = ctx.node
    return {
        "main": node_payload(ctx.node),
        "workers": [p for p in payloads if p["kind"] == NodeKind.WORKER],
        "reviewers": [p for p in payloads if p["kind"] == NodeKind.REVIEWER],
    }


@tool(
    "state_inspect_worker",
    category=Category.EXECUTION,
    roles=MAIN,
    description="Inspect one Worker: task, status, summary, its experiments with aggregate scores, and the "
    "Workers and Reviewers downstream of it. The answer's ETag guards a later finalization.",
    input_schema=closed({"worker": WORKER}),
    output_schema=closed(
        {
            "worker": NODE,
            "experiments": array(EXPERIMENT_BRIEF, max_items=10_000),
            "successors": array(string(32), max_items=1000),
            "reviewers": array(string(32), max_items=1000),
        }
    ),
    errors=("unknown_worker",),
)
def state_inspect_worker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    node = run_node(ctx, args["worker"], kind=NodeKind.WORKER)
    downstream = ResearchEdge.objects.filter(upstream=node).select_related("downstream").order_by("downstream__handle")
    experiments = visible_experiments(ctx).filter(owner=node).select_related("owner").order_by("pk")
    ctx.etag_node = node
    return {
        "worker": node_payload(node),
        "experiments": [experiment_brief(ctx, e) for e in experiments],
        "successors": [e.downstream.handle for e in downstream if e.kind == EdgeKind.CONTEXT],
        "reviewers": [e.downstream.handle for e in downstream if e.kind == EdgeKind.REVIEW_SCOPE],
    }


@tool(
    "state_finalize_worker",
    category=Category.EXECUTION,
    roles=MAIN,
    description="Finalize a Worker from the coordinating side (the branch ends; its records stay). "
    "Send If-Match with the Worker's ETag to refuse a stale decision (412).",
    input_schema=closed({"worker": WORKER, "reason": text(4000)}),
    output_schema=NODE,
    errors=("unknown_worker", "node_not_active", "precondition_failed"),
    etag_node=_worker_arg,
)
def state_finalize_worker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    node = run_node(ctx, args["worker"], kind=NodeKind.WORKER)
    summary = node.summary or f"Finalized by the Main Agent: {args['reason']}"
    node = research.node_finalize(
        node=node, summary=summary, experiments=list(node.summary_experiments or []), actor=ctx.actor
    )
    ctx.result_ref = f"node:{node.uuid}"
    ctx.etag_node = node
    return node_payload(node)


@tool(
    "worker_finalize",
    category=Category.EXECUTION,
    roles=WORKER_ROLE,
    description="Finish this Worker's branch with a summary that cites its own experiments by handle; "
    "this wakes the Main Agent. Send If-Match with your ETag to refuse a stale write (412).",
    input_schema=closed(
        {"summary": text(MAX_TEXT), "experiments": array(EXPERIMENT, max_items=500, unique=True)},
        optional=("experiments",),
    ),
    output_schema=NODE,
    errors=("foreign_experiment", "citation_required", "node_not_active", "precondition_failed"),
    etag_node=_own_node,
)
def worker_finalize(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    node = agent_reports.worker_finalize(
        node=ctx.node, summary=args["summary"], experiments=args.get("experiments", []), actor=ctx.actor
    )
    ctx.result_ref = f"node:{node.uuid}"
    ctx.etag_node = node
    return node_payload(node)


@tool(
    "state_sync_results",
    category=Category.EXECUTION,
    roles=ALL,
    description="Reconcile finished jobs with the experiment records (idempotent): ends stale jobs and records "
    "missed transitions; lists the experiments (visible to you) whose status changed.",
    output_schema=closed(
        {
            "changed": array(
                closed({"experiment": string(32), "from": string(16), "to": string(16)}), max_items=10_000
            ),
            "active": integer(),
        }
    ),
)
def state_sync_results(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    changed = runs.run_results_sync(run=ctx.run, actor=ctx.actor)
    visible = set(visible_experiments(ctx).values_list("pk", flat=True))
    return {
        "changed": [{"experiment": e.handle, "from": a, "to": b} for e, a, b in changed if e.pk in visible],
        "active": visible_experiments(ctx).filter(status__in=EXPERIMENT_ACTIVE_STATES).count(),
    }


_EVENT = closed(
    {
        "seq": integer(0, 2**62),
        "type": string(100),
        "actor": string(200),
        "role": string(32),
        "tool": string(100),
        "arguments": free_object(),
        "result_ref": string(200),
        "created_at": TIMESTAMP,
    }
)


@tool(
    "events_tail",
    category=Category.EXECUTION,
    roles=ALL,
    description="Recent structured events of the run that you may see (oldest first; at most limit, "
    "default 50). Pass after_seq to page forward from the last seq you read; before_seq ends the range (the "
    "latest events before it); types and tools filter.",
    input_schema=closed(
        {
            "after_seq": integer(0, 2**62),
            "before_seq": integer(1, 2**62, description="Only events with a smaller seq."),
            "limit": integer(1, 200, default=50),
            "types": array(string(100, min_length=1), max_items=20, unique=True),
            "tools": {
                **array(string(100, min_length=1), max_items=20, unique=True),
                "description": "Only the calls of these tools (tool.called events and others naming a tool).",
            },
        },
        optional=("after_seq", "before_seq", "limit", "types", "tools"),
    ),
    output_schema=closed({"events": array(_EVENT, max_items=200), "last_seq": integer(0, 2**62)}),
)
def events_tail(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    limit = args.get("limit", 50)
    events = visible_events(ctx)
    if args.get("types"):
        events = events.filter(type__in=args["types"])
    if args.get("tools"):
        events = events.filter(tool__in=args["tools"])
    if "before_seq" in args:
        events = events.filter(seq__lt=args["before_seq"])
    if "after_seq" in args:
        rows = list(events.filter(seq__gt=args["after_seq"]).order_by("seq")[:limit])
    else:
        rows = list(events.order_by("-seq")[:limit])[::-1]
    last = rows[-1].seq if rows else args.get("after_seq", 0)
    return {"events": [_event_payload(ctx, e) for e in rows], "last_seq": last}


def _event_payload(ctx: ToolContext, event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "type": event.type,
        "actor": event.actor,
        "role": event.role,
        "tool": event.tool,
        "arguments": event_arguments_for(ctx, event),
        "result_ref": event.result_ref,
        "created_at": event.created_at.isoformat(),
    }


@tool(
    "stop_loop",
    category=Category.EXECUTION,
    roles=MAIN,
    description="Request the run's end: no new work, running jobs finish, then the final evaluation. Refused "
    "while the final evaluation is pending, when the run has ended, or while a person has it paused. The run "
    "returns the checkpoint of your nomination (main_nominate_result, before this call) if it is still accepted, "
    "else of the accepted experiment with the best feedback score (run_result_policy states the rule). "
    "Afterwards run_result_policy still answers (run status, whether the final evaluation finished; never its "
    "score) until the run has finished; then tokens answer 401 saying the run finished.",
    input_schema=closed({"reason": text(4000)}),
    output_schema=closed(
        {"run_status": enum("created", "running", "paused", "stopping", "final_eval", "finished", "failed", "stopped")}
    ),
    errors=("final_eval_pending", "run_finished", "run_paused"),
)
def stop_loop(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.run_stop_request(run=ctx.run, reason=args["reason"], actor=ctx.actor)
    ctx.result_ref = f"run:{run.uuid}"
    return {"run_status": run.status}


_BUDGET = closed({"budget": number(0), "used": number(0), "left": number(0)})
_FEEDBACK_QUOTA = closed(
    {
        "key": string(64),
        "scope": enum("worker", "checkpoint", "run"),
        "subject": string(200),
        "allowance": integer(),
        "used": integer(),
        "left": integer(),
    }
)


@tool(
    "public_check_quota",
    category=Category.EXECUTION,
    roles=ALL,
    description="Budget left: accelerator-seconds (after the final-evaluation reserve), LLM tokens, wall clock, "
    "and for a Worker its remaining feedback evaluations: the tightest of its quotas (its lineage's, the "
    "input checkpoint's across all Workers, the run's) for a submission on θ0 or on `checkpoint`, and each quota.",
    input_schema=closed({"checkpoint": string(64, min_length=1)}, optional=("checkpoint",)),
    output_schema=closed(
        {
            "run_status": string(16),
            "accelerator_seconds": closed(
                {"budget": number(0), "reserved_final": number(0), "used": number(0), "left": number(0)}
            ),
            "llm_tokens": _BUDGET,
            "wall_clock_seconds": closed({"budget": number(0), "elapsed": number(0), "left": number(0)}),
            "feedback_evals": nullable(
                closed(
                    {
                        "allowance": integer(),
                        "used": integer(),
                        "left": integer(),
                        "binding": string(64),
                        "quotas": array(_FEEDBACK_QUOTA, max_items=10),
                    }
                )
            ),
            "parallel_workers": closed({"max": integer(), "active": integer()}),
        }
    ),
    errors=("unknown_checkpoint",),
)
def public_check_quota(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    checkpoint = None
    if "checkpoint" in args:
        # Only a checkpoint the caller may build on (θ0, its lineage's); any other is unknown to it.
        checkpoint = visible_checkpoints(ctx).filter(handle=args["checkpoint"]).first()
        if checkpoint is None:
            raise NotFound("unknown_checkpoint", f"No checkpoint {args['checkpoint']!r} you can build on.")
    return run_quota(run=ctx.run, node=ctx.node, checkpoint=checkpoint)
