"""rsiweb's own tools on top of the paper's inventory (DESIGN.md "Ours on top"): review requests,
guidance, lineage, job control, training curves and paired comparisons with bootstrap CIs."""

from __future__ import annotations

from typing import Any

from apps.core.errors import ApplicationError, PermissionDenied
from apps.experiments.comparisons import aligned_correctness, paired_bootstrap
from apps.experiments.selectors import metric_history, metric_keys
from apps.experiments.services import metric_points_log_at_once, metric_points_log_owned
from apps.expos.harness import seat_token_show
from apps.expos.payloads import (
    decision_refused,
    job_brief,
    job_for,
    node_payload,
    run_decision,
    run_workers,
    scope_handles,
)
from apps.expos.registry import Category, Role, ToolContext, tool
from apps.expos.schemas import (
    EXPERIMENT,
    EXPERIMENT_BRIEF,
    JOB,
    NODE,
    SEAT_TOKEN,
    TIMESTAMP,
    UUID,
    WORKER,
    alternatives,
    array,
    boolean,
    closed,
    free_object,
    integer,
    nullable,
    number,
    string,
    text,
)
from apps.expos.selectors import experiment_for, feedback_evaluation, lineage_payload
from apps.expos.visibility import SealedAccessDenied, in_review_scope, is_agent, score_for
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.jobs.selectors import job_hardware as job_hardware_evidence
from apps.jobs.selectors import job_log_tail
from apps.jobs.services import job_request_cancel
from apps.research import services as research
from apps.research.choices import NodeKind, NodeStatus
from apps.research.models import ResearchNode

ALL = Role.ALL_AGENTS


@tool(
    "state_add_new_reviewer",
    category=Category.OURS,
    roles={Role.MAIN},
    description="Request a review: a new Reviewer with a question and a scope — a list of Worker handles "
    '(several = a cross-Worker review) or "all_completed" for every finalized Worker. In a harness run the '
    "answer carries the new Reviewer's token (once): hand it to the sub-agent that plays the Reviewer.",
    input_schema=closed(
        {
            "question": text(4000),
            "scope": {
                "oneOf": [
                    array(WORKER, min_items=1, max_items=50, unique=True),
                    {"type": "string", "enum": ["all_completed"]},
                ]
            },
            "decision": UUID,
        },
        optional=("decision",),
    ),
    output_schema=closed(
        {"reviewer": NODE, "scope": array(string(32), max_items=1000), "token": SEAT_TOKEN}, optional=("token",)
    ),
    idempotent_create=True,
    errors=("unknown_worker", "empty_scope", "run_not_active", "unknown_decision"),
    after_refusal=decision_refused,
)
def state_add_new_reviewer(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    if args["scope"] == "all_completed":
        scope = list(
            ResearchNode.objects.filter(run=ctx.run, kind=NodeKind.WORKER, status=NodeStatus.FINALIZED).order_by("pk")
        )
        if not scope:
            raise ApplicationError(
                "empty_scope", "No Worker has finalized yet; name the Workers to review.", status=409
            )
    else:
        scope = run_workers(ctx, args["scope"])
    node = research.reviewer_add(
        run=ctx.run,
        question=args["question"],
        scope=scope,
        decision=run_decision(ctx, args.get("decision")),
        actor=ctx.actor,
    )
    ctx.result_ref = f"node:{node.uuid}"
    ctx.etag_node = node
    seat_token_show(ctx, node)
    return {"reviewer": node_payload(node), "scope": scope_handles(node)}


@tool(
    "main_guidance_read",
    category=Category.OURS,
    roles={Role.MAIN},
    description="Pending human guidance for this run. Reading it marks it applied now; cite the returned ids "
    "in the decision that acts on it (main_optimizer_update decision.guidance).",
    output_schema=closed(
        {
            "guidance": array(
                closed(
                    {
                        "uuid": UUID,
                        "text": string(100_000),
                        "author": string(150),
                        "created_at": TIMESTAMP,
                        "applied_at": TIMESTAMP,
                    }
                ),
                max_items=10_000,
            )
        }
    ),
)
def main_guidance_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    items = research.guidance_mark_read(run=ctx.run, actor=ctx.actor)
    authors = {g.pk: g.author.get_username() for g in items}
    return {
        "guidance": [
            {
                "uuid": str(g.uuid),
                "text": g.text,
                "author": authors[g.pk],
                "created_at": g.created_at.isoformat(),
                "applied_at": g.applied_at.isoformat(),
            }
            for g in items
        ]
    }


_LINEAGE_ROW = closed({**EXPERIMENT_BRIEF["properties"], "depth": integer(1)})


@tool(
    "get_lineage",
    category=Category.OURS,
    roles=ALL,
    description="The lineage of an experiment you may see: the experiments it continues and those continuing "
    "it (others are only counted), and its checkpoint's parent chain back to θ0.",
    input_schema=closed({"experiment": EXPERIMENT}),
    output_schema=closed(
        {
            "experiment": string(32),
            "ancestors": array(_LINEAGE_ROW, max_items=100_000),
            "descendants": array(_LINEAGE_ROW, max_items=100_000),
            "hidden": integer(),
            "checkpoint": closed(
                {
                    "handle": string(64),
                    "path": array(string(64), max_items=100_000),
                    "reaches_base": boolean(),
                    "reason": string(2000),
                }
            ),
        }
    ),
    errors=("unknown_experiment",),
)
def get_lineage(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return lineage_payload(ctx, experiment_for(ctx, args["experiment"]))


def _jobs_arg(ctx: ToolContext, args: dict[str, Any]) -> list[Job]:
    if "job" in args:
        return [job_for(ctx, args["job"])]
    experiment = experiment_for(ctx, args["experiment"])
    return list(Job.objects.filter(experiment=experiment).select_related("experiment").order_by("created_at", "pk"))


_JOB_SELECTOR = {
    **closed({"job": UUID, "experiment": EXPERIMENT}, optional=("job", "experiment")),
    "oneOf": [{"required": ["job"]}, {"required": ["experiment"]}],
}


@tool(
    "job_status",
    category=Category.OURS,
    roles=ALL,
    description="Status of one job (by uuid) or of every job of an experiment you may see: kind, status, "
    "attempt, progress, times, the last line of any error.",
    input_schema=_JOB_SELECTOR,
    output_schema=closed({"jobs": array(JOB, max_items=1000)}),
    errors=("unknown_job", "unknown_experiment"),
)
def job_status(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": [job_brief(j) for j in _jobs_arg(ctx, args)]}


# Evaluation logs can quote sealed prompts and outputs: only people and in-scope Reviewers read them.
_SEALED_LOG_KINDS = (JobKind.EVALUATE, JobKind.FINAL_EVAL)


@tool(
    "job_logs",
    category=Category.OURS,
    roles=ALL,
    description="Log lines of a job you may see, after a sequence number. Evaluation jobs' logs are sealed "
    "(Reviewers of the experiment's scope only).",
    input_schema=closed(
        {"job": UUID, "after_seq": integer(0), "limit": integer(1, 500, default=200)},
        optional=("after_seq", "limit"),
    ),
    output_schema=closed(
        {
            "job": UUID,
            "lines": array(closed({"seq": integer(), "text": string(1_000_000), "at": TIMESTAMP}), max_items=500),
            "last_seq": integer(),
        }
    ),
    errors=("unknown_job", "sealed"),
)
def job_logs(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    job = job_for(ctx, args["job"])
    if job.kind in _SEALED_LOG_KINDS and not (job.experiment_id and in_review_scope(ctx, job.experiment.owner)):
        raise SealedAccessDenied(
            ctx, what=f"the log of {job.kind} job {job.uuid}", tool="job_logs", request={"job": str(job.uuid)}
        )
    lines = job_log_tail(job=job, after_seq=args.get("after_seq", 0), limit=args.get("limit", 200))
    return {
        "job": str(job.uuid),
        "lines": [{"seq": line.seq, "text": line.text, "at": line.created_at.isoformat()} for line in lines],
        "last_seq": lines[-1].seq if lines else args.get("after_seq", 0),
    }


_GPU_PEAK = closed(
    {"index": integer(), "memory_mib": number(0), "memory_total_mib": number(0), "util_percent": number(0),
     "temperature_c": number()}
)  # fmt: skip
_HARDWARE = closed(
    {
        "job": UUID,
        "kind": string(32),
        "status": string(16),
        "accelerators": integer(1, 8),
        "summary": closed(
            {
                "runtime_seconds": nullable(number(0)),
                "samples": integer(),
                "peak_ram_mib": nullable(number(0)),
                "peak_cpu_percent": nullable(number(0)),
                "gpus": array(_GPU_PEAK, max_items=8),
                "oom": boolean(),
            }
        ),
        "samples": array(free_object(), max_items=100_000),
    },
    optional=("samples",),
)


@tool(
    "job_hardware",
    category=Category.OURS,
    roles={Role.MAIN, Role.REVIEWER},
    description="Hardware evidence of one job (by uuid) or of every job of an experiment you may see: runtime, "
    "peak RAM and CPU of the job's processes, peak memory, utilisation and temperature per GPU, and whether it "
    "ran out of memory; with samples=true also the points, sampled every 10 s by default. Use peak memory and "
    "runtime to size the next job.",
    input_schema={
        **closed(
            {"job": UUID, "experiment": EXPERIMENT, "samples": boolean(default=False)},
            optional=("job", "experiment", "samples"),
        ),
        "oneOf": [{"required": ["job"]}, {"required": ["experiment"]}],
    },
    output_schema=closed({"jobs": array(_HARDWARE, max_items=1000)}),
    errors=("unknown_job", "unknown_experiment"),
)
def job_hardware(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    with_samples = bool(args.get("samples", False))
    return {"jobs": [job_hardware_evidence(job=j, with_samples=with_samples) for j in _jobs_arg(ctx, args)]}


@tool(
    "cancel_job",
    category=Category.OURS,
    roles={Role.MAIN, Role.WORKER},
    description="Cancel a job: a queued one at once, a running one cooperatively. Workers cancel their own "
    "experiments' jobs; the Main Agent any job of the run.",
    input_schema=closed({"job": UUID, "reason": string(2000)}, optional=("reason",)),
    output_schema=JOB,
    errors=("unknown_job", "not_your_job", "job_finished"),
)
def cancel_job(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    job = job_for(ctx, args["job"])
    if ctx.role == Role.WORKER and (job.experiment is None or job.experiment.owner_id != ctx.node.pk):
        raise PermissionDenied("not_your_job", "A Worker cancels only the jobs of its own experiments.")
    actor = f"{ctx.actor}: {args['reason']}" if args.get("reason") else ctx.actor
    cancelled = job_request_cancel(job=job, actor=actor[:200])
    ctx.result_ref = f"job:{cancelled.uuid}"
    return job_brief(Job.objects.select_related("experiment").get(pk=cancelled.pk))


# A training metric's name as the trainer logs it (loss, learning_rate, grad_norm, ...).
METRIC_KEY_ANY = string(100, min_length=1)
# A curve's answer holds at most this many points unless max_points asks for more (a 1,000-step
# curve with every point was 45 KB); longer ranges are down-sampled evenly, first and last kept.
CURVE_DEFAULT_POINTS = 200
CURVE_MAX_POINTS = 100_000
_CURVE_IN = {
    **closed(
        {
            "job": UUID,
            "experiment": EXPERIMENT,
            "keys": {
                **array(METRIC_KEY_ANY, max_items=50, min_items=1, unique=True),
                "description": 'Metrics to return, e.g. ["loss"] (default: every metric logged).',
            },
            "from_step": integer(0, 2**62, description="First step to include (default: the first)."),
            "to_step": integer(0, 2**62, description="Last step to include (default: the last)."),
            "max_points": integer(
                2,
                CURVE_MAX_POINTS,
                default=CURVE_DEFAULT_POINTS,
                description=f"At most this many points (default {CURVE_DEFAULT_POINTS}): a longer range is "
                "down-sampled evenly, its first and last points kept.",
            ),
        },
        optional=("job", "experiment", "keys", "from_step", "to_step", "max_points"),
    ),
    "oneOf": [{"required": ["job"]}, {"required": ["experiment"]}],
}


def downsample(items: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` (>= 2) of ``items``, evenly spaced, the first and the last always kept."""
    if len(items) <= limit:
        return items
    last = len(items) - 1
    picks = sorted({round(i * last / (limit - 1)) for i in range(limit)})
    return [items[i] for i in picks]


@tool(
    "training_curve_read",
    category=Category.OURS,
    roles=ALL,
    description="The training curve (loss and the other logged metrics per step) of a training job, by job "
    "uuid or by experiment handle (its latest training attempt). keys picks metrics, from_step/to_step a "
    f"step range; at most max_points points come back (default {CURVE_DEFAULT_POINTS}, down-sampled evenly "
    "with the first and last kept; total_points says how many the range holds).",
    input_schema=_CURVE_IN,
    output_schema=closed(
        {
            "job": UUID,
            "status": string(16),
            "total_points": integer(0, 2**62),
            "downsampled": {"type": "boolean"},
            "points": array(
                closed(
                    {
                        "step": nullable(integer(0, 2**62)),
                        "metrics": {"type": "object", "additionalProperties": {"type": "number"}},
                    }
                ),
                max_items=100_000,
            ),
            "last": free_object(),
        }
    ),
    errors=("unknown_job", "unknown_experiment", "not_a_training_job"),
)
def training_curve_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    jobs = [j for j in _jobs_arg(ctx, args) if j.kind == JobKind.TRAIN]
    if not jobs:
        raise ApplicationError("not_a_training_job", "No training job there; training curves belong to train jobs.")
    job = jobs[-1]
    metrics = job.metrics or {}
    points: list[dict[str, Any]] = []
    for point in metrics.get("points", []) if isinstance(metrics, dict) else []:
        if not isinstance(point, dict):
            continue
        step = point.get("step")
        values = {
            str(k): float(v)
            for k, v in point.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and v == v  # drop NaN
        }
        points.append(
            {"step": int(step) if isinstance(step, int | float) and step == step else None, "metrics": values}
        )
    keys = set(args.get("keys") or ())
    low, high = args.get("from_step"), args.get("to_step")
    if keys:
        points = [{**p, "metrics": {k: v for k, v in p["metrics"].items() if k in keys}} for p in points]
    if low is not None or high is not None:
        points = [
            p
            for p in points
            if p["step"] is not None and (low is None or p["step"] >= low) and (high is None or p["step"] <= high)
        ]
    shown = downsample(points, args.get("max_points", CURVE_DEFAULT_POINTS))
    last = metrics.get("last", {}) if isinstance(metrics, dict) else {}
    last = last if isinstance(last, dict) else {}
    return {
        "job": str(job.uuid),
        "status": job.status,
        "total_points": len(points),
        "downsampled": len(shown) < len(points),
        "points": shown,
        "last": {k: v for k, v in last.items() if k in keys} if keys else last,
    }


# (run pk, Worker pk, handle) -> uuid of an experiment this process has logged metrics on: a
# uuid never changes, so a later call's event (which names it) can travel with its INSERT.
_LOGGED_ON: dict[tuple[int, int, str], str] = {}
_LOGGED_ON_MAX = 10_000
METRIC_KEY = string(100, min_length=1, pattern=r"^[A-Za-z0-9_.\-/ ]+$", description="A metric name, e.g. rows_kept.")
STEP = integer(0, 2**62)
MAX_HISTORY = 25_000


def _log_metrics_at_once(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any] | None:
    """experiment_log_metrics's common call, on an experiment this process has logged on before: the
    points and the call's event in one statement that commits itself. None when that statement
    refuses (not the caller's experiment, a conflicting point): the handler then runs as usual."""
    known = _LOGGED_ON.get((ctx.run.pk, ctx.node.pk, args["experiment"]))
    if known is None or ctx.success_event is None:
        return None
    points = [(point["key"], point["step"], float(point["value"])) for point in args["points"]]
    logged = metric_points_log_at_once(run=ctx.run, owner=ctx.node, handle=args["experiment"], uuid=known,
                                       points=points, event=ctx.success_event(f"experiment:{known}"))  # fmt: skip
    if logged is None:
        return None
    count, unchanged = logged
    return {"experiment": args["experiment"], "logged": count, "unchanged": unchanged}


@tool(
    "experiment_log_metrics",
    category=Category.OURS,
    roles={Role.WORKER},
    description="Log metric points (key, step, value) on one of your own experiments: your own measurements — "
    "data statistics, checks you ran — shown to Reviewers as agent-reported, never as evaluation scores "
    "(those come only from the sealed evaluator). 1 to 10,000 points per call; one value per key and step: "
    "re-sending identical points changes nothing, a different value for a logged step is refused (409).",
    input_schema=closed(
        {
            "experiment": EXPERIMENT,
            "points": array(
                closed({"key": METRIC_KEY, "step": STEP, "value": number()}), min_items=1, max_items=10_000
            ),
        }
    ),
    output_schema=closed({"experiment": string(32), "logged": integer(), "unchanged": integer()}),
    errors=("unknown_experiment", "not_your_experiment", "duplicate_point", "metric_conflict"),
    at_once=_log_metrics_at_once,
)
def experiment_log_metrics(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    # Values are finite: the view refuses infinities.
    points = [(point["key"], point["step"], float(point["value"])) for point in args["points"]]
    key = (ctx.run.pk, ctx.node.pk, args["experiment"])
    known = _LOGGED_ON.get(key)
    event = None
    if known is not None and ctx.success_event is not None:
        # The event names the experiment by uuid; known from an earlier call, it is written by the
        # INSERT's statement (one round trip), and rolled back with it if the points are refused.
        event = ctx.success_event(f"experiment:{known}")
    # Ownership is checked by the insert itself; only a refusal pays for telling 404 from 403.
    logged = metric_points_log_owned(run=ctx.run, owner=ctx.node, handle=args["experiment"], points=points, event=event)
    if logged is None:
        _LOGGED_ON.pop(key, None)
        experiment_for(ctx, args["experiment"])  # 404 unless the caller may see it
        raise PermissionDenied("not_your_experiment", "A Worker logs metrics only on its own experiments.")
    experiment, count, unchanged = logged
    if known is not None and known != str(experiment.uuid):
        # Only a database recreated under this process gets here (experiments are never deleted or
        # renamed): forget, roll back (the event named the old uuid) and let the agent call again.
        _LOGGED_ON.pop(key, None)
        raise ApplicationError("retry", f"{experiment.handle} was not the experiment this server remembered; "
                               "nothing was logged: send the same call again.", status=503)  # fmt: skip
    if len(_LOGGED_ON) >= _LOGGED_ON_MAX:
        _LOGGED_ON.clear()
    _LOGGED_ON[key] = str(experiment.uuid)
    if not ctx.recorded:
        ctx.result_ref = f"experiment:{experiment.uuid}"
    return {"experiment": experiment.handle, "logged": count, "unchanged": unchanged}


@tool(
    "experiment_metrics_read",
    category=Category.OURS,
    roles=ALL,
    description="The history of one agent-logged metric (key) of an experiment you may see, in step order, "
    "after after_step and up to to_step: a page of up to limit points (default and most 25,000; pass "
    "next_after_step back as after_step for the next), or with max_points the whole range down-sampled "
    "evenly to at most that many (first and last kept; no next page); and the keys logged there.",
    input_schema={
        **closed(
            {
                "experiment": EXPERIMENT,
                "key": METRIC_KEY,
                "after_step": STEP,
                "to_step": {**STEP, "description": "Last step to include (default: the last)."},
                "limit": integer(1, MAX_HISTORY, default=MAX_HISTORY),
                "max_points": integer(
                    2, MAX_HISTORY, description="Down-sample the whole range to at most this many points."
                ),
            },
            optional=("after_step", "to_step", "limit", "max_points"),
        ),
        **alternatives(
            {"not": {"required": ["limit", "max_points"]}},
            code="invalid_input",
            message="Give limit (a page) or max_points (the range down-sampled), not both.",
        ),
    },
    output_schema=closed(
        {
            "experiment": string(32),
            "key": string(100),
            "keys": array(string(100), max_items=100_000),
            # logged_ms: when the point was logged, in Unix milliseconds (UTC).
            "points": array(
                closed({"step": STEP, "value": number(), "logged_ms": integer(0, 2**62)}), max_items=MAX_HISTORY
            ),
            "next_after_step": nullable(STEP),
        }
    ),
    errors=("unknown_experiment",),
)
def experiment_metrics_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    experiment = experiment_for(ctx, args["experiment"])
    # The record names what was read (points are append-only); no digest of a 10,000-point answer.
    ctx.result_ref = f"experiment:{experiment.uuid}"
    rows, more = metric_history(
        experiment_id=experiment.pk,
        key=args["key"],
        after_step=args.get("after_step"),
        limit=args.get("limit", MAX_HISTORY),
        to_step=args.get("to_step"),
        sample=args.get("max_points"),
    )
    return {
        "experiment": experiment.handle,
        "key": args["key"],
        "keys": metric_keys(experiment_id=experiment.pk),
        "points": [{"step": step, "value": value, "logged_ms": ms} for step, value, ms in rows],
        "next_after_step": rows[-1][0] if more else None,
    }


_SIDE = closed({"handle": string(32), "evaluation": UUID, "score": number(0, 1)})


@tool(
    "compare_experiments",
    category=Category.OURS,
    roles=ALL,
    description="Compare two experiments you may see on their feedback evaluations: the paired difference in "
    "accuracy (b - a) over common samples with a bootstrap confidence interval and p-value, computed "
    "server-side. Workers get the aggregate (rounded) only.",
    input_schema=closed(
        {
            "a": EXPERIMENT,
            "b": EXPERIMENT,
            "n_boot": integer(100, 20_000, default=2000),
            "confidence": number(0.5, 0.999, default=0.95),
            "seed": integer(0, 2**31 - 1, default=0),
        },
        optional=("n_boot", "confidence", "seed"),
    ),
    output_schema=closed(
        {
            "a": _SIDE,
            "b": _SIDE,
            "n_common": integer(),
            "difference": number(-1, 1),
            "ci_low": number(-1, 1),
            "ci_high": number(-1, 1),
            "confidence": number(0, 1),
            "n_boot": integer(),
            "p_value": number(0, 1),
            "rounded": boolean(),
        }
    ),
    errors=("unknown_experiment", "not_evaluated", "no_common_samples"),
)
def compare_experiments(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    first, second = experiment_for(ctx, args["a"]), experiment_for(ctx, args["b"])
    eval_a, eval_b = feedback_evaluation(first), feedback_evaluation(second)
    _common, a, b, _only_a, _only_b = aligned_correctness(eval_a, eval_b)
    result = paired_bootstrap(
        a, b, n_boot=args.get("n_boot", 2000), confidence=args.get("confidence", 0.95), seed=args.get("seed", 0)
    )
    rounded = is_agent(ctx) and ctx.role == Role.WORKER

    def shown(value: float) -> float:
        return score_for(ctx, value) if rounded else value  # type: ignore[return-value]

    return {
        "a": {"handle": first.handle, "evaluation": str(eval_a.uuid), "score": shown(eval_a.score or 0.0)},
        "b": {"handle": second.handle, "evaluation": str(eval_b.uuid), "score": shown(eval_b.score or 0.0)},
        "n_common": result.n_common,
        "difference": shown(result.difference),
        "ci_low": shown(result.ci_low),
        "ci_high": shown(result.ci_high),
        "confidence": args.get("confidence", 0.95),
        "n_boot": args.get("n_boot", 2000),
        "p_value": round(result.p_value, 3) if rounded else result.p_value,
        "rounded": rounded,
    }
