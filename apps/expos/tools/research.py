"""Research & evidence tools: the Main Agent's claims and decisions, candidates, predictions, and
the Reviewer-level paired comparison of two evaluations (DESIGN.md "ExpOS tools")."""

from __future__ import annotations

import math
from typing import Any

from django.db.models import Prefetch

from apps.benchmarks.models import Split
from apps.core.errors import NotFound
from apps.experiments.comparisons import aligned_correctness
from apps.experiments.models import Evaluation, EvaluationSample
from apps.expos.payloads import iso, run_node
from apps.expos.registry import Category, Role, ToolContext, tool
from apps.expos.schemas import (
    EXPERIMENT,
    NODE_HANDLE,
    TIMESTAMP,
    UUID,
    WORKER,
    alternatives,
    array,
    boolean,
    closed,
    enum,
    integer,
    nullable,
    number,
    string,
    text,
)
from apps.expos.selectors import experiment_for, parse_uuid
from apps.expos.visibility import evaluation_read_check, samples_read_check
from apps.flows import agent_reports
from apps.research import services as research
from apps.research.choices import CandidateStatus, DecisionKind, NodeKind, PredictionVerdict, Trigger
from apps.research.models import Candidate, Decision, Guidance, OptimizerClaim, Prediction

MAIN = {Role.MAIN}
DECISION_KINDS = (DecisionKind.CONTINUE, DecisionKind.VERIFY, DecisionKind.BRANCH, DecisionKind.REVISE)
CLAIM_KEY = string(100, min_length=1, pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="A stable claim name.")

_DECISION = closed(
    {
        "uuid": UUID,
        "kind": string(16),
        "trigger": string(32),
        "rationale": string(20_000),
        "subject": nullable(string(32)),
        "guidance": array(UUID, max_items=1000),
        "created_at": TIMESTAMP,
    }
)
_REVISION = closed(
    {"revision": integer(1), "text": string(5000), "evidence": array(string(64), max_items=50), "created_at": TIMESTAMP}
)
_CLAIM = closed(
    {
        "key": string(100),
        "revision": integer(1),
        "text": string(5000),
        "evidence": array(string(64), max_items=50),
        "created_at": TIMESTAMP,
        "history": array(_REVISION, max_items=10_000),
    }
)


def _decision_payload(decision: Decision) -> dict[str, Any]:
    return {
        "uuid": str(decision.uuid),
        "kind": decision.kind,
        "trigger": decision.trigger,
        "rationale": decision.rationale,
        "subject": decision.subject.handle if decision.subject_id else None,
        "guidance": [str(g.uuid) for g in decision.applied_guidance.all()],
        "created_at": decision.created_at.isoformat(),
    }


@tool(
    "main_optimizer_read",
    category=Category.RESEARCH,
    roles=MAIN,
    description="The Main Agent's research claims (latest revision, optionally with history) and its decision "
    "history (continue / verify / branch / revise), newest decisions first.",
    input_schema=closed(
        {"history": {"type": "boolean", "default": False}, "decisions_limit": integer(1, 500, default=50)},
        optional=("history", "decisions_limit"),
    ),
    output_schema=closed({"claims": array(_CLAIM, max_items=10_000), "decisions": array(_DECISION, max_items=500)}),
)
def main_optimizer_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    revisions: dict[str, list[OptimizerClaim]] = {}
    for claim in OptimizerClaim.objects.filter(run=ctx.run).order_by("key", "revision"):
        revisions.setdefault(claim.key, []).append(claim)
    claims = []
    for key, rows in revisions.items():
        latest = rows[-1]
        history = (
            [
                {"revision": r.revision, "text": r.text, "evidence": r.evidence, "created_at": r.created_at.isoformat()}
                for r in rows[:-1]
            ]
            if args.get("history")
            else []
        )
        claims.append(
            {
                "key": key,
                "revision": latest.revision,
                "text": latest.text,
                "evidence": latest.evidence,
                "created_at": latest.created_at.isoformat(),
                "history": history,
            }
        )
    decisions = (
        Decision.objects.filter(run=ctx.run)
        .select_related("subject")
        .prefetch_related(Prefetch("applied_guidance", queryset=Guidance.objects.order_by("pk")))
        .order_by("-created_at", "-pk")[: args.get("decisions_limit", 50)]
    )
    return {"claims": claims, "decisions": [_decision_payload(d) for d in decisions]}


@tool(
    "main_optimizer_update",
    category=Category.RESEARCH,
    roles=MAIN,
    description="Revise research claims (each update is a new revision; history is kept) and/or record a "
    "decision (continue / verify / branch / revise) with its trigger, rationale, subject node and the "
    "guidance ids (from main_guidance_read) it applies.",
    input_schema={
        **closed(
            {
                "claims": array(
                    closed(
                        {
                            "key": CLAIM_KEY,
                            "text": text(5000),
                            "evidence": array(string(64, min_length=1), max_items=50),
                        },
                        optional=("evidence",),
                    ),
                    max_items=20,
                    min_items=1,
                ),
                "decision": closed(
                    {
                        "kind": enum(*DECISION_KINDS),
                        "trigger": enum(*Trigger.values),
                        "rationale": text(20_000),
                        "subject": NODE_HANDLE,
                        "guidance": array(UUID, max_items=100, unique=True),
                    },
                    optional=("subject", "guidance"),
                ),
            },
            optional=("claims", "decision"),
        ),
        "minProperties": 1,
    },
    output_schema=closed(
        {
            "claims": array(closed({"key": string(100), "revision": integer(1)}), max_items=20),
            "decision": nullable(_DECISION),
        }
    ),
    idempotent_create=True,
    errors=("unknown_worker", "unknown_reviewer", "unknown_guidance", "guidance_already_applied"),
)
def main_optimizer_update(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    revised = [
        agent_reports.claim_revise(
            run=ctx.run, key=c["key"], text=c["text"], evidence=c.get("evidence", []), actor=ctx.actor
        )
        for c in args.get("claims", [])
    ]
    decision_out = None
    if "decision" in args:
        spec = args["decision"]
        subject = None
        if "subject" in spec:
            kind = NodeKind.WORKER if spec["subject"].startswith("worker_") else NodeKind.REVIEWER
            subject = run_node(ctx, spec["subject"], kind=kind)
        guidance = []
        for value in spec.get("guidance", []):
            item = Guidance.objects.filter(run=ctx.run, uuid=parse_uuid(value)).first()
            if item is None:
                raise NotFound("unknown_guidance", f"No guidance {value} in this run.")
            guidance.append(item)
        decision = research.decision_record(
            run=ctx.run,
            kind=spec["kind"],
            trigger=spec["trigger"],
            rationale=spec["rationale"],
            subject=subject,
            guidance=guidance,
            actor=ctx.actor,
        )
        ctx.result_ref = f"decision:{decision.uuid}"
        decision_out = _decision_payload(decision)
    return {"claims": [{"key": c.key, "revision": c.revision} for c in revised], "decision": decision_out}


_CANDIDATE = closed(
    {
        "uuid": UUID,
        "title": string(200),
        "description": string(5000),
        "status": string(16),
        "proposer": string(32),
        "created_at": TIMESTAMP,
    }
)


def _candidate_payload(candidate: Candidate) -> dict[str, Any]:
    return {
        "uuid": str(candidate.uuid),
        "title": candidate.title,
        "description": candidate.description,
        "status": candidate.status,
        "proposer": candidate.proposer.handle,
        "created_at": candidate.created_at.isoformat(),
    }


@tool(
    "research_candidates_read",
    category=Category.RESEARCH,
    roles=Role.ALL_AGENTS,
    description="Candidate directions and proposed interventions of this run, newest first.",
    input_schema=closed(
        {"status": enum(*CandidateStatus.values), "limit": integer(1, 200, default=50)},
        optional=("status", "limit"),
    ),
    output_schema=closed({"candidates": array(_CANDIDATE, max_items=200)}),
)
def research_candidates_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    candidates = Candidate.objects.filter(run=ctx.run).select_related("proposer")
    if "status" in args:
        candidates = candidates.filter(status=args["status"])
    rows = candidates.order_by("-created_at", "-pk")[: args.get("limit", 50)]
    return {"candidates": [_candidate_payload(c) for c in rows]}


@tool(
    "worker_propose_candidate",
    category=Category.RESEARCH,
    roles={Role.WORKER},
    description="Propose a candidate direction or intervention for the Main Agent and the other agents to see.",
    input_schema=closed({"title": text(200), "description": string(5000)}, optional=("description",)),
    output_schema=_CANDIDATE,
    idempotent_create=True,
)
def worker_propose_candidate(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    candidate = research.candidate_propose(
        run=ctx.run, proposer=ctx.node, title=args["title"], description=args.get("description", "")
    )
    ctx.result_ref = f"candidate:{candidate.uuid}"
    return _candidate_payload(candidate)


_PREDICTION = closed(
    {
        "uuid": UUID,
        "text": string(5000),
        "metric": string(100),
        "expected_value": nullable(number()),
        "worker": nullable(string(32)),
        "verdict": string(16),
        "observed_value": nullable(number()),
        "reconciliation": string(5000),
        "reconciled_at": nullable(TIMESTAMP),
        "created_at": TIMESTAMP,
    }
)


def _prediction_payload(prediction: Prediction) -> dict[str, Any]:
    return {
        "uuid": str(prediction.uuid),
        "text": prediction.text,
        "metric": prediction.metric,
        "expected_value": prediction.expected_value,
        "worker": prediction.worker.handle if prediction.worker_id else None,
        "verdict": prediction.verdict,
        "observed_value": prediction.observed_value,
        "reconciliation": prediction.reconciliation,
        "reconciled_at": iso(prediction.reconciled_at),
        "created_at": prediction.created_at.isoformat(),
    }


def _prediction(ctx: ToolContext, value: str) -> Prediction:
    parsed = parse_uuid(value)
    prediction = (
        Prediction.objects.filter(run=ctx.run, uuid=parsed).select_related("worker").first() if parsed else None
    )
    if prediction is None:
        raise NotFound("unknown_prediction", f"No prediction {value} in this run.")
    return prediction


@tool(
    "main_prediction_read",
    category=Category.RESEARCH,
    roles=MAIN,
    description="Predictions of this run (optionally of one Worker or one verdict), with their reconciliation.",
    input_schema=closed(
        {"worker": WORKER, "verdict": enum(*PredictionVerdict.values), "limit": integer(1, 500, default=100)},
        optional=("worker", "verdict", "limit"),
    ),
    output_schema=closed({"predictions": array(_PREDICTION, max_items=500)}),
)
def main_prediction_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    predictions = Prediction.objects.filter(run=ctx.run).select_related("worker")
    if "worker" in args:
        predictions = predictions.filter(worker=run_node(ctx, args["worker"], kind=NodeKind.WORKER))
    if "verdict" in args:
        predictions = predictions.filter(verdict=args["verdict"])
    rows = predictions.order_by("-created_at", "-pk")[: args.get("limit", 100)]
    return {"predictions": [_prediction_payload(p) for p in rows]}


@tool(
    "main_prediction_bind_worker",
    category=Category.RESEARCH,
    roles=MAIN,
    description="Bind a prediction to a Worker before its branch has results: give an existing unbound "
    "prediction's uuid, or the text (and metric, expected value) of a new one.",
    input_schema={
        **closed(
            {
                "worker": WORKER,
                "prediction": UUID,
                "text": text(5000),
                "metric": string(100, min_length=1, default="feedback_score"),
                "expected_value": number(-1e12, 1e12),
            },
            optional=("prediction", "text", "metric", "expected_value"),
        ),
        "oneOf": [{"required": ["prediction"]}, {"required": ["text"]}],
    },
    output_schema=_PREDICTION,
    idempotent_create=True,
    errors=("unknown_worker", "unknown_prediction", "prediction_bound", "branch_already_ran"),
)
def main_prediction_bind_worker(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    worker = run_node(ctx, args["worker"], kind=NodeKind.WORKER)
    existing = _prediction(ctx, args["prediction"]) if "prediction" in args else None
    prediction = research.prediction_bind(
        run=ctx.run,
        worker=worker,
        prediction=existing,
        text=args.get("text", ""),
        metric=args.get("metric", "feedback_score"),
        expected_value=args.get("expected_value"),
        actor=ctx.actor,
    )
    ctx.result_ref = f"prediction:{prediction.uuid}"
    return _prediction_payload(Prediction.objects.select_related("worker").get(pk=prediction.pk))


@tool(
    "main_prediction_reconcile",
    category=Category.RESEARCH,
    roles=MAIN,
    description="Reconcile a prediction with the evidence: confirmed, refuted or inconclusive, with the observed "
    "value and a note. A prediction is reconciled once.",
    input_schema=closed(
        {
            "prediction": UUID,
            "verdict": enum(PredictionVerdict.CONFIRMED, PredictionVerdict.REFUTED, PredictionVerdict.INCONCLUSIVE),
            "observed_value": nullable(number(-1e12, 1e12)),
            "note": text(5000),
        },
        optional=("observed_value",),
    ),
    output_schema=_PREDICTION,
    errors=("unknown_prediction", "prediction_reconciled"),
)
def main_prediction_reconcile(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    prediction = research.prediction_reconcile(
        prediction=_prediction(ctx, args["prediction"]),
        verdict=args["verdict"],
        observed_value=args.get("observed_value"),
        note=args["note"],
        actor=ctx.actor,
    )
    ctx.result_ref = f"prediction:{prediction.uuid}"
    return _prediction_payload(Prediction.objects.select_related("worker").get(pk=prediction.pk))


# --- Reviewer-level detail ------------------------------------------------------------------------

_EVAL_BRIEF = closed(
    {
        "uuid": UUID,
        "experiment": nullable(string(32)),
        "split": string(16),
        "score": nullable(number(0, 1)),
        "sample_count": integer(),
    }
)
_SAMPLE_PAIR = closed(
    {
        "sample_id": string(100),
        "a_correct": boolean(),
        "b_correct": boolean(),
        "a_output": string(100_000),
        "b_output": string(100_000),
    }
)


# compare_eval_samples' a and b: what its sibling compare_experiments takes (an experiment handle),
# or one evaluation of it by uuid.
_EVALUATION_REF = {
    **alternatives(
        EXPERIMENT,
        UUID,
        code="invalid_identifier",
        message="a and b are each an experiment handle (exp_0003: its latest feedback evaluation) or an "
        "evaluation uuid (reviewer_inspect_experiment lists them).",
    ),
    "description": "An experiment handle (exp_0003: its latest feedback evaluation) or an evaluation uuid.",
}


def _evaluation(ctx: ToolContext, value: str) -> Evaluation:
    """An evaluation of the run by uuid, or an experiment's (by handle) latest feedback evaluation."""
    evaluations = Evaluation.objects.select_related("experiment")
    if value.startswith("exp_"):
        experiment = experiment_for(ctx, value)
        evaluation = evaluations.filter(experiment=experiment, split=Split.FEEDBACK).order_by("-created_at").first()
        if evaluation is None:
            raise NotFound("unknown_evaluation", f"{value} has no feedback evaluation yet.")
        return evaluation
    parsed = parse_uuid(value)
    evaluation = evaluations.filter(uuid=parsed).first() if parsed else None
    if evaluation is None or evaluation.run_id != ctx.run.pk:
        raise NotFound(
            "unknown_evaluation",
            f"No evaluation {value} in this run: give an evaluation uuid (reviewer_inspect_experiment lists an "
            "experiment's evaluations) or an experiment handle (exp_0003).",
        )
    return evaluation


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value over the discordant pairs (b: only A right, c: only B right)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


@tool(
    "compare_eval_samples",
    category=Category.RESEARCH,
    roles={Role.REVIEWER},
    description="Align two evaluations of your scope by stable sample id and return paired diagnostics "
    "(agreement counts, exact McNemar p) and the model outputs of the samples where they differ. a and b "
    "are experiment handles, as for compare_experiments (each its latest feedback evaluation), or "
    "evaluation uuids. Reference answers are never returned.",
    input_schema=closed(
        {
            "a": _EVALUATION_REF,
            "b": _EVALUATION_REF,
            "limit": integer(0, 500, default=50),
            "only_disagreements": {"type": "boolean", "default": True},
        },
        optional=("limit", "only_disagreements"),
    ),
    output_schema=closed(
        {
            "a": _EVAL_BRIEF,
            "b": _EVAL_BRIEF,
            "n_common": integer(),
            "only_in_a": integer(),
            "only_in_b": integer(),
            "both_correct": integer(),
            "a_only_correct": integer(),
            "b_only_correct": integer(),
            "neither_correct": integer(),
            "mcnemar_p": number(0, 1),
            "samples": array(_SAMPLE_PAIR, max_items=500),
        }
    ),
    errors=("unknown_evaluation", "unknown_experiment", "invalid_identifier", "sealed"),
)
def compare_eval_samples(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    first, second = _evaluation(ctx, args["a"]), _evaluation(ctx, args["b"])
    for evaluation in (first, second):
        evaluation_read_check(ctx, evaluation, tool="compare_eval_samples")
        samples_read_check(ctx, evaluation, tool="compare_eval_samples")
    common, a, b, only_a, only_b = aligned_correctness(first, second)
    both = int((a & b).sum())
    a_only = int((a & ~b).sum())
    b_only = int((~a & b).sum())
    chosen = [s for s, x, y in zip(common, a, b, strict=True) if x != y or not args.get("only_disagreements", True)]
    chosen = chosen[: args.get("limit", 50)]
    outputs = {
        (row.evaluation_id, row.sample_id): row
        for row in EvaluationSample.objects.filter(evaluation__in=[first, second], sample_id__in=chosen)
    }
    samples = []
    for sample_id in chosen:
        left, right = outputs[(first.pk, sample_id)], outputs[(second.pk, sample_id)]
        samples.append(
            {
                "sample_id": sample_id,
                "a_correct": left.correct,
                "b_correct": right.correct,
                "a_output": left.output[:100_000],
                "b_output": right.output[:100_000],
            }
        )

    def brief(evaluation: Evaluation) -> dict[str, Any]:
        return {
            "uuid": str(evaluation.uuid),
            "experiment": evaluation.experiment.handle if evaluation.experiment_id else None,
            "split": evaluation.split,
            "score": evaluation.score,
            "sample_count": evaluation.sample_count,
        }

    return {
        "a": brief(first),
        "b": brief(second),
        "n_common": len(common),
        "only_in_a": only_a,
        "only_in_b": only_b,
        "both_correct": both,
        "a_only_correct": a_only,
        "b_only_correct": b_only,
        "neither_correct": len(common) - both - a_only - b_only,
        "mcnemar_p": mcnemar_exact(a_only, b_only),
        "samples": samples,
    }
