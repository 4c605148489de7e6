"""Execution tools: submissions, the training gate, and review overrides (DESIGN.md "ExpOS tools").

- ``worker_submit``: one submission = one experiment (train + evaluate on feedback, or evaluate
  an existing checkpoint). The submission review (``apps.expos.submission_review``) runs first,
  before any compute; with the run's training gate on, a training submission is created
  ``held`` and waits for the Main Agent.
- ``main_training_read`` / ``main_training_decide``: the Main Agent's view of the gate, and its
  approval (the pipeline starts) or rejection (with a rationale).
- ``main_submit_review_override``: a time-limited exception for one exact specification.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.core.errors import ApplicationError, Conflict, NotFound, PermissionDenied
from apps.experiments.choices import ExperimentKind, ExperimentStatus
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.experiments.pipeline import experiment_start
from apps.experiments.services import experiment_create
from apps.expos.registry import Category, Role, ToolContext, obj, tool
from apps.expos.submission_review import (
    AGENT_HYPERPARAMETERS,
    FEEDBACK_SPLIT,
    MAX_CLAIM_CHARS,
    MAX_DATASETS,
    MAX_PARENTS,
    ReviewResult,
    SubmissionRefused,
    override_consume,
    review_submission,
    submission_spec_sha256,
)
from apps.integrity.models import ReviewOverride
from apps.jobs.models import Job
from apps.live.events import publish_on_commit
from apps.live.groups import run_group
from apps.research.choices import NodeKind, NodeStatus, RunStatus, Trigger
from apps.research.models import ResearchNode
from apps.research.services import main_trigger
from workers.gpu.hparams import ADAPTERS, CHAT_TEMPLATE_MODES, EOS_HANDLING, LR_SCHEDULERS, RECIPES, TrainConfig

# A submission may be made while the run is being set up or running; a paused run takes no new
# work, a stopping one only finishes what runs, and a finished one is history.
SUBMITTABLE_RUN_STATES = (RunStatus.CREATED, RunStatus.RUNNING)
OVERRIDE_TTL_DEFAULT = 3600
OVERRIDE_TTL_MAX = 7 * 24 * 3600
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Submission:
    experiment: Experiment
    job: Job | None
    review: ReviewResult | None  # None for an idempotent replay
    replayed: bool = False


# --- services ------------------------------------------------------------------------------------------


def submission_create(*, ctx: ToolContext, spec: dict[str, Any]) -> Submission:
    """Review and create one submission of the calling Worker; start it unless the gate holds it.

    Locks the Worker's node row for the whole review, so two concurrent submissions of one Worker
    cannot both pass the feedback allowance, and a retry with the same Idempotency-Key finds the
    first one's experiment. A refusal raises :class:`SubmissionRefused` with nothing written; it
    is recorded here when no outer transaction would roll the record back, and otherwise by the
    REST layer after its rollback (``SubmissionRefused.record``).
    """
    node = ctx.node
    if ctx.role != Role.WORKER or node.kind != NodeKind.WORKER:
        raise PermissionDenied("forbidden_role", "Only a Worker submits experiments.")
    key = ctx.idempotency_key
    try:
        with transaction.atomic():
            locked = ResearchNode.objects.select_for_update().select_related("run").get(pk=node.pk)
            if key:
                existing = Experiment.objects.filter(owner=locked, idempotency_key=key).first()
                if existing is not None:
                    return _replay(existing, spec, key)
            if locked.status != NodeStatus.ACTIVE:
                raise Conflict("node_not_active", f"{locked.handle} is {locked.status}; it takes no new submissions.")
            run = locked.run
            if run.status not in SUBMITTABLE_RUN_STATES:
                raise Conflict("run_not_running", f"Run {run.name!r} is {run.status}; it takes no new submissions.")
            review = review_submission(ctx=ctx, spec=spec)
            if not review.passed or (review.overridden and not override_consume(override=review.override)):
                # The second half: the override was spent by a concurrent submission meanwhile.
                raise SubmissionRefused(ctx=ctx, spec=spec, spec_sha256=review.spec_sha256, refusals=review.refusals)
            held = bool((run.policy or {}).get("training_gate")) and review.kind == ExperimentKind.TRAIN_EVAL
            experiment = experiment_create(
                run=run,
                owner=locked,
                kind=review.kind,
                input_checkpoint=review.input_checkpoint,
                action=review.action(),
                parents=review.parents,
                claim=spec.get("claim", ""),
                idempotency_key=key or None,
                status=ExperimentStatus.HELD if held else ExperimentStatus.QUEUED,
            )
            if review.overridden:
                _override_used_event(experiment, review)
            if held:
                event_append(
                    run=run,
                    type="training.held",
                    actor=locked.handle,
                    role=Role.WORKER,
                    tool="worker_submit",
                    arguments={"experiment": experiment.handle, "spec_sha256": review.spec_sha256},
                    result_ref=f"experiment:{experiment.uuid}",
                )
                # A request waiting at the gate is one of the Main Agent's triggers (DESIGN.md).
                main_trigger(
                    run=run,
                    trigger=Trigger.TRAINING_GATE,
                    node=locked,
                    actor=locked.handle,
                    detail={"experiment": experiment.handle},
                )
                _publish(experiment)
                job = None
            else:
                job = experiment_start(experiment=experiment)
    except SubmissionRefused as exc:
        if not connection.in_atomic_block:
            exc.record()
        raise
    return Submission(experiment=experiment, job=job, review=review)


def _replay(existing: Experiment, spec: dict[str, Any], key: str) -> Submission:
    if (existing.action or {}).get("spec_sha256") != submission_spec_sha256(spec):
        raise Conflict(
            "idempotency_mismatch",
            f"Idempotency-Key {key!r} was used for a different submission ({existing.handle}); "
            "use a new key for a new submission.",
        )
    job = Job.objects.filter(experiment=existing).order_by("pk").first()
    return Submission(experiment=existing, job=job, review=None, replayed=True)


def _override_used_event(experiment: Experiment, review: ReviewResult) -> None:
    assert review.override is not None
    event_append(
        run=experiment.run,
        type="submission_review.override_used",
        actor=experiment.owner.handle,
        role=Role.WORKER,
        tool="worker_submit",
        arguments={
            "override": review.override.pk,
            "spec_sha256": review.spec_sha256,
            "reasons": [{"code": r.code, "subcategory": r.subcategory} for r in review.refusals],
        },
        result_ref=f"experiment:{experiment.uuid}",
    )


def _publish(experiment: Experiment) -> None:
    publish_on_commit(
        run_group(experiment.run.uuid),
        "experiment.updated",
        {"uuid": str(experiment.uuid), "handle": experiment.handle, "status": experiment.status},
    )


def training_decide(
    *, ctx: ToolContext, experiment: str, decision: str, rationale: str
) -> tuple[Experiment, Job | None]:
    """The Main Agent approves (the pipeline starts) or rejects a submission held at the training gate."""
    if decision not in ("approve", "reject"):
        raise ApplicationError("invalid_decision", "decision is 'approve' or 'reject'.")
    if not rationale.strip():
        raise ApplicationError("rationale_required", "A training decision needs a rationale.")
    with transaction.atomic():
        # Locked: two decisions on one request serialise, and the second sees it is no longer held.
        held = Experiment.objects.select_for_update().filter(run=ctx.run, handle=experiment).first()
        if held is None:
            raise NotFound("unknown_experiment", f"There is no experiment {experiment!r} in this run.")
        if held.status != ExperimentStatus.HELD:
            raise Conflict("not_held", f"{held.handle} is {held.status}; only a held submission is decided.")
        status = ExperimentStatus.QUEUED if decision == "approve" else ExperimentStatus.REJECTED
        held.status = status
        held.save(update_fields=["status", "updated_at"])
        event_append(
            run=ctx.run,
            type="training.decided",
            actor=ctx.actor,
            role=ctx.role,
            tool="main_training_decide",
            arguments={"experiment": held.handle, "decision": decision, "rationale": rationale},
            result_ref=f"experiment:{held.uuid}",
        )
        event_append(
            run=ctx.run,
            type="experiment.status_changed",
            actor=ctx.actor,
            role=ctx.role,
            arguments={"from": ExperimentStatus.HELD, "to": status, "reason": f"training gate: {decision}d"},
            result_ref=f"experiment:{held.uuid}",
        )
        _publish(held)
        job = experiment_start(experiment=held) if status == ExperimentStatus.QUEUED else None
    return held, job


def review_override_grant(
    *,
    ctx: ToolContext,
    worker: str,
    reason: str,
    spec: dict[str, Any] | None = None,
    spec_sha256: str | None = None,
    ttl_seconds: int = OVERRIDE_TTL_DEFAULT,
) -> ReviewOverride:
    """Grant one Worker a one-time exception for one exact submission, until it expires (audited)."""
    if (spec is None) == (spec_sha256 is None):
        raise ApplicationError(
            "invalid_override",
            "Give exactly one of spec (the exact submission) or spec_sha256 (from the refusal's detail).",
        )
    if spec_sha256 is not None and not _SHA256.match(spec_sha256):
        raise ApplicationError("invalid_override", "spec_sha256 is 64 lower-case hex characters.")
    if not reason.strip():
        raise ApplicationError("reason_required", "An override needs a reason; it is part of the audit record.")
    if not 60 <= ttl_seconds <= OVERRIDE_TTL_MAX:
        raise ApplicationError("invalid_override", f"ttl_seconds must be between 60 and {OVERRIDE_TTL_MAX}.")
    target = ResearchNode.objects.filter(run=ctx.run, handle=worker, kind=NodeKind.WORKER).first()
    if target is None:
        raise NotFound("unknown_worker", f"There is no Worker {worker!r} in this run.")
    digest = spec_sha256 if spec_sha256 is not None else submission_spec_sha256(spec)
    with transaction.atomic():
        override = ReviewOverride(
            run=ctx.run,
            worker=target,
            spec_sha256=digest,
            reason=reason,
            expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
        )
        override.full_clean()
        override.save()
        event_append(
            run=ctx.run,
            type="submission_review.override_granted",
            actor=ctx.actor,
            role=ctx.role,
            tool="main_submit_review_override",
            arguments={
                "override": override.pk,
                "worker": target.handle,
                "spec_sha256": digest,
                "reason": reason,
                "expires_at": override.expires_at.isoformat(),
            },
            result_ref=f"review_override:{override.pk}",
        )
    return override


# --- schemas -------------------------------------------------------------------------------------------

HANDLE = {"type": "string", "minLength": 1, "maxLength": 64}
NULLABLE_STR = {"type": ["string", "null"]}
_JSON_TYPE = {int: "integer", float: "number", str: "string"}


def _hyperparameter_schema() -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    properties: dict[str, Any] = {}
    for name in AGENT_HYPERPARAMETERS:
        default = fields[name].default
        schema: dict[str, Any] = {"type": _JSON_TYPE[type(default)], "default": default}
        if name == "lr_scheduler_type":
            schema["enum"] = list(LR_SCHEDULERS)
        properties[name] = schema
    return {
        **obj(properties),
        "description": "Training hyper-parameters; bounds are checked and named in the error when exceeded.",
    }


TRAIN_SCHEMA = {
    **obj(
        {
            "recipe": {"type": "string", "enum": list(RECIPES), "default": "sft"},
            "datasets": {
                "type": "array",
                "items": HANDLE,
                "minItems": 1,
                "maxItems": MAX_DATASETS,
                "description": "Datapool handles (data_0001, ...); register data with worker_add_data first.",
            },
            "adapter": {"type": "string", "enum": list(ADAPTERS), "default": "full"},
            "chat_template": {
                "type": "string",
                "enum": list(CHAT_TEMPLATE_MODES),
                "default": "keep",
                "description": "keep: train on the raw prompt text; apply: wrap rows in the tokenizer's chat template.",
            },
            "eos_handling": {
                "type": "string",
                "enum": list(EOS_HANDLING),
                "default": "append",
                "description": "append: completions end with EOS so the model learns to stop.",
            },
            "max_steps": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 1000},
            "hyperparameters": _hyperparameter_schema(),
        },
        required=["datasets"],
    ),
    "description": "The training action (train_eval only).",
}

# Deliberately open: every field besides ``split`` asks for inference settings the benchmark has
# fixed, and the submission review must see such a request to refuse *and record* it — a closed
# schema would turn the attempt into an unrecorded typo.
EVAL_SCHEMA = {
    "type": "object",
    "properties": {
        "split": {
            "type": "string",
            "default": FEEDBACK_SPLIT,
            "description": "Always 'feedback'. Decoding, template and stop settings are the benchmark's and "
            "cannot be requested: any other field is refused and recorded.",
        }
    },
    "additionalProperties": True,
    "description": "The evaluation part; the benchmark's sealed settings always apply.",
}

SUBMIT_IN = obj(
    {
        "kind": {
            "type": "string",
            "enum": list(ExperimentKind.values),
            "default": ExperimentKind.TRAIN_EVAL,
            "description": "train_eval: train on input_checkpoint, then evaluate; "
            "eval_only: evaluate input_checkpoint.",
        },
        "input_checkpoint": {**HANDLE, "description": "A checkpoint on θ0's lineage you can see; default θ0."},
        "parents": {
            "type": "array",
            "items": HANDLE,
            "maxItems": MAX_PARENTS,
            "description": "Earlier experiments (yours or your predecessors') this one continues.",
        },
        "claim": {"type": "string", "maxLength": MAX_CLAIM_CHARS, "description": "The hypothesis this tests."},
        "train": TRAIN_SCHEMA,
        "eval": EVAL_SCHEMA,
    }
)
SUBMIT_OUT = obj(
    {
        "experiment": {"type": "string"},
        "uuid": {"type": "string"},
        "kind": {"type": "string"},
        "status": {"type": "string"},
        "held": {"type": "boolean"},
        "job": NULLABLE_STR,
        "input_checkpoint": {"type": "string"},
        "parents": {"type": "array", "items": {"type": "string"}},
        "spec_sha256": {"type": "string"},
        "feedback_evals_used": {"type": ["integer", "null"]},
        "feedback_evals_allowed": {"type": ["integer", "null"]},
        "override_used": {"type": "boolean"},
        "replayed": {"type": "boolean"},
    },
    required=["experiment", "uuid", "kind", "status", "held", "job", "spec_sha256", "replayed"],
)

HELD_ITEM = obj(
    {
        "experiment": {"type": "string"},
        "uuid": {"type": "string"},
        "worker": {"type": "string"},
        "worker_task": {"type": "string"},
        "kind": {"type": "string"},
        "submitted_at": {"type": "string"},
        "input_checkpoint": {"type": "string"},
        "parents": {"type": "array", "items": {"type": "string"}},
        "claim": {"type": "string"},
        "datasets": {
            "type": "array",
            "items": obj(
                {
                    "handle": {"type": "string"},
                    "name": {"type": "string"},
                    "rows": {"type": "integer"},
                    "format": {"type": "string"},
                    "teacher": {"type": "string"},
                }
            ),
        },
        "hyperparameters": {"type": "object"},
    },
    required=["experiment", "uuid", "worker", "kind", "submitted_at", "input_checkpoint"],
)


# --- tools ---------------------------------------------------------------------------------------------


def _submission_answer(submission: Submission, ctx: ToolContext) -> dict[str, Any]:
    experiment = submission.experiment
    review = submission.review
    ctx.result_ref = f"experiment:{experiment.uuid}"
    return {
        "experiment": experiment.handle,
        "uuid": str(experiment.uuid),
        "kind": experiment.kind,
        "status": experiment.status,
        "held": experiment.status == ExperimentStatus.HELD,
        "job": str(submission.job.uuid) if submission.job is not None else None,
        "input_checkpoint": experiment.input_checkpoint.handle,
        "parents": list(experiment.parents.order_by("pk").values_list("handle", flat=True)),
        "spec_sha256": (experiment.action or {}).get("spec_sha256", ""),
        "feedback_evals_used": review.feedback_evals_used + 1 if review is not None else None,
        "feedback_evals_allowed": review.feedback_evals_allowed if review is not None else None,
        "override_used": bool(review is not None and review.overridden),
        "replayed": submission.replayed,
    }


@tool(
    "worker_submit",
    category=Category.EXECUTION,
    roles={Role.WORKER},
    description=(
        "Submit one experiment: train (sft/dpo on registered datapool entries) then evaluate on the feedback "
        "split, or evaluate an existing checkpoint (eval_only). Reviewed before any compute: unregistered or "
        "contaminated data, unauthorised teachers, checkpoints off θ0's lineage, other inference settings and a "
        "spent feedback allowance are refused (and recorded). Held for the Main Agent when the run has a "
        "training gate. Send an Idempotency-Key so a retry never creates a second experiment."
    ),
    input_schema=SUBMIT_IN,
    output_schema=SUBMIT_OUT,
    idempotent_create=True,
    errors=(
        "invalid_submission",
        "submission_refused",
        "unknown_checkpoint",
        "unknown_experiment",
        "idempotency_mismatch",
        "node_not_active",
        "run_not_running",
        "seal_broken",
    ),
)
def worker_submit(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return _submission_answer(submission_create(ctx=ctx, spec=args), ctx)


@tool(
    "main_training_read",
    category=Category.EXECUTION,
    roles={Role.MAIN},
    description="List training submissions held at the training gate, with their data, recipe and claim.",
    input_schema=obj({"limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}}),
    output_schema=obj(
        {
            "training_gate": {"type": "boolean"},
            "held": {"type": "array", "items": HELD_ITEM},
            "count": {"type": "integer"},
        },
        required=["training_gate", "held", "count"],
    ),
)
def main_training_read(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    from apps.datapool.models import DataEntry

    held = (
        Experiment.objects.filter(run=ctx.run, status=ExperimentStatus.HELD)
        .select_related("owner", "input_checkpoint")
        .prefetch_related("parents")
        .order_by("created_at", "pk")
    )
    count = held.count()
    items = []
    for experiment in held[: args.get("limit", 50)]:
        action = experiment.action or {}
        handles = action.get("data", [])
        entries = {e.handle: e for e in DataEntry.objects.filter(handle__in=handles)}
        items.append(
            {
                "experiment": experiment.handle,
                "uuid": str(experiment.uuid),
                "worker": experiment.owner.handle,
                "worker_task": experiment.owner.task,
                "kind": experiment.kind,
                "submitted_at": experiment.created_at.isoformat(),
                "input_checkpoint": experiment.input_checkpoint.handle,
                "parents": sorted(p.handle for p in experiment.parents.all()),
                "claim": experiment.claim,
                "datasets": [
                    {
                        "handle": h,
                        "name": entries[h].name,
                        "rows": entries[h].rows,
                        "format": entries[h].format,
                        "teacher": entries[h].teacher,
                    }
                    for h in handles
                    if h in entries
                ],
                "hyperparameters": action.get("hyperparameters", {}),
            }
        )
    return {"training_gate": bool((ctx.run.policy or {}).get("training_gate")), "held": items, "count": count}


@tool(
    "main_training_decide",
    category=Category.EXECUTION,
    roles={Role.MAIN},
    description="Approve (the training starts) or reject a submission held at the training gate, with a rationale.",
    input_schema=obj(
        {
            "experiment": HANDLE,
            "decision": {"type": "string", "enum": ["approve", "reject"]},
            "rationale": {"type": "string", "minLength": 1, "maxLength": 4000},
        },
        required=["experiment", "decision", "rationale"],
    ),
    output_schema=obj(
        {
            "experiment": {"type": "string"},
            "uuid": {"type": "string"},
            "decision": {"type": "string"},
            "status": {"type": "string"},
            "job": NULLABLE_STR,
        },
        required=["experiment", "uuid", "decision", "status", "job"],
    ),
    errors=("unknown_experiment", "not_held", "rationale_required", "invalid_decision"),
)
def main_training_decide(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    experiment, job = training_decide(
        ctx=ctx, experiment=args["experiment"], decision=args["decision"], rationale=args["rationale"]
    )
    ctx.result_ref = f"experiment:{experiment.uuid}"
    return {
        "experiment": experiment.handle,
        "uuid": str(experiment.uuid),
        "decision": args["decision"],
        "status": experiment.status,
        "job": str(job.uuid) if job is not None else None,
    }


@tool(
    "main_submit_review_override",
    category=Category.EXECUTION,
    roles={Role.MAIN},
    description=(
        "Grant a Worker a one-time, time-limited exception to a refused submission review, for one exact "
        "submission (its spec, or the spec_sha256 named in the refusal). Covers judgement calls only "
        "(contamination above tolerance, a teacher off the allow-list, the feedback allowance); the submission "
        "still faces the full integrity checks after it runs. Audited."
    ),
    input_schema=obj(
        {
            "worker": {**HANDLE, "description": "The Worker's handle (worker_0002)."},
            "spec": {"type": "object", "description": "The exact worker_submit arguments to allow."},
            "spec_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "reason": {"type": "string", "minLength": 1, "maxLength": 4000},
            "ttl_seconds": {
                "type": "integer",
                "minimum": 60,
                "maximum": OVERRIDE_TTL_MAX,
                "default": OVERRIDE_TTL_DEFAULT,
            },
        },
        required=["worker", "reason"],
    ),
    output_schema=obj(
        {
            "override": {"type": "integer"},
            "worker": {"type": "string"},
            "spec_sha256": {"type": "string"},
            "expires_at": {"type": "string"},
            "reason": {"type": "string"},
        },
        required=["override", "worker", "spec_sha256", "expires_at", "reason"],
    ),
    # Each override is one more run of the spec: a retried grant must not become a second one.
    idempotent_create=True,
    errors=("invalid_override", "reason_required", "unknown_worker"),
)
def main_submit_review_override(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    override = review_override_grant(
        ctx=ctx,
        worker=args["worker"],
        reason=args["reason"],
        spec=args.get("spec"),
        spec_sha256=args.get("spec_sha256"),
        ttl_seconds=args.get("ttl_seconds", OVERRIDE_TTL_DEFAULT),
    )
    ctx.result_ref = f"review_override:{override.pk}"
    return {
        "override": override.pk,
        "worker": override.worker.handle,
        "spec_sha256": override.spec_sha256,
        "expires_at": override.expires_at.isoformat(),
        "reason": override.reason,
    }
