"""Execution tools: submissions, the training gate, and review overrides (DESIGN.md "ExpOS tools").

- ``worker_submit``: one submission = one experiment (``apps.flows.submissions``). The
  handles a submission names are resolved here, through the Worker's visibility rules, and the
  objects go to the submission review (``apps.integrity.submission_review``) and the service.
- ``main_training_read`` / ``main_training_decide``: the Main Agent's view of the gate, and its
  approval (the pipeline starts) or rejection (with a rationale).
- ``main_submit_review_override``: a time-limited exception for one exact specification.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from apps.core.errors import NotFound
from apps.datapool.models import DataEntry
from apps.experiments.choices import ExperimentKind, ExperimentStatus
from apps.experiments.models import Checkpoint, Experiment
from apps.expos.registry import Category, Role, ToolContext, obj, tool
from apps.expos.schemas import alternatives
from apps.expos.visibility import visible_checkpoints, visible_datapool, visible_experiments
from apps.flows.submissions import (
    OVERRIDE_TTL_DEFAULT,
    OVERRIDE_TTL_MAX,
    Submission,
    review_override_grant,
    submission_create,
    training_decide,
)
from apps.integrity.submission_parts import (
    AGENT_HYPERPARAMETERS,
    FEEDBACK_SPLIT,
    MAX_DATASETS,
    MAX_PARENTS,
    SubmissionSubjects,
)
from apps.integrity.submission_review import (
    MAX_CLAIM_CHARS,
    SubmissionRequest,
    sealed_split_attempt_record,
    submission_parse,
)
from apps.ml.hparams import _BOUNDS as HYPERPARAMETER_BOUNDS
from apps.ml.hparams import ADAPTERS, CHAT_TEMPLATE_MODES, EOS_HANDLING, LR_SCHEDULERS, RECIPES, TrainConfig

# --- schemas -------------------------------------------------------------------------------------------

# Rules across fields that JSON Schema cannot state: validate_train_config enforces them, and the
# field's description says so (tests/apps/expos/tools/test_schema_bounds.py checks both agree).
WARMUP_RULE = "Must be smaller than max_steps (the server refuses warmup_steps >= max_steps)."
EOS_RULE = "'none' only with recipe 'sft' (the server refuses it with 'dpo')."

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
        if name in HYPERPARAMETER_BOUNDS:
            # The bounds validate_train_config enforces, stated where clients read them.
            low, high, low_inclusive = HYPERPARAMETER_BOUNDS[name]
            schema["minimum" if low_inclusive else "exclusiveMinimum"] = low
            schema["maximum"] = high
        if name == "warmup_steps":
            schema["description"] = WARMUP_RULE
        properties[name] = schema
    return {
        **obj(properties),
        "description": "Training hyper-parameters, within the bounds shown (warmup_steps also below max_steps).",
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
                "description": f"append: completions end with EOS so the model learns to stop. {EOS_RULE}",
            },
            "max_steps": {
                "type": "integer",
                "minimum": HYPERPARAMETER_BOUNDS["max_steps"][0],
                "maximum": HYPERPARAMETER_BOUNDS["max_steps"][1],
                "default": TrainConfig.max_steps,
            },
            "accelerators": {
                "type": "integer",
                "minimum": 1,
                "maximum": 8,
                "default": 1,
                "description": "Devices for this training, all on one host (DDP; hyperparameters.batch_size stays "
                "the global batch). At most the run policy's accelerators_per_job; the budget is charged "
                "per device-second.",
            },
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
# train_eval (the default kind) needs its train object; eval_only has none.
SUBMIT_IN.update(
    alternatives(
        {"properties": {"kind": {"const": ExperimentKind.TRAIN_EVAL.value}}, "required": ["train"]},
        {
            "properties": {"kind": {"const": ExperimentKind.EVAL_ONLY.value}},
            "required": ["kind"],
            "not": {"required": ["train"]},
        },
        code="invalid_submission",
        message="A train_eval submission (the default kind) needs a 'train' object (recipe, datasets, "
        "hyper-parameters); an eval_only one has none.",
    )
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


def submission_subjects(ctx: ToolContext, request: SubmissionRequest) -> SubmissionSubjects:
    """Resolve the handles a submission names, as the calling Worker sees them.

    A parent or checkpoint that does not exist is a 404; one that exists but is not the Worker's
    to build on is the review's to refuse (and record), so it is resolved and marked, not hidden.
    """
    parents: list[Experiment] = []
    if request.parent_handles:  # without the query for which experiments the Worker sees
        found = {e.handle: e for e in visible_experiments(ctx).filter(handle__in=request.parent_handles)}
        missing = [h for h in request.parent_handles if h not in found]
        if missing:
            raise NotFound(
                "unknown_experiment",
                f"No experiment {', '.join(missing)} among yours or your predecessors'; "
                "parents must be experiments you can see.",
            )
        parents = [found[h] for h in request.parent_handles]
    datasets = {e.handle: e for e in visible_datapool(ctx).filter(handle__in=request.dataset_handles)}
    handle = request.checkpoint_handle
    if handle is None:
        return SubmissionSubjects(
            input_checkpoint=ctx.run.base_checkpoint, checkpoint_visible=True, parents=parents, datasets=datasets
        )
    checkpoint = Checkpoint.objects.filter(handle=handle).first()
    if checkpoint is None:
        raise NotFound("unknown_checkpoint", f"There is no checkpoint {handle!r}.")
    visible = visible_checkpoints(ctx).filter(pk=checkpoint.pk).exists()
    return SubmissionSubjects(
        input_checkpoint=checkpoint, checkpoint_visible=visible, parents=parents, datasets=datasets
    )


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


def _sealed_split_audit(ctx: ToolContext, args: dict[str, Any]) -> None:
    # A refused submission that also asked for a sealed split is still counted as that attempt.
    sealed_split_attempt_record(run=ctx.run, node=ctx.node, spec=args)


@tool(
    "worker_submit",
    category=Category.EXECUTION,
    roles={Role.WORKER},
    description=(
        "Submit one experiment: train (sft/dpo on registered datapool entries) then evaluate on the feedback "
        "split, or evaluate an existing checkpoint (eval_only). Reviewed before any compute: unregistered or "
        "contaminated data, unauthorised teachers, checkpoints off θ0's lineage, other inference settings and a "
        "spent feedback allowance are refused (and recorded). Held for the Main Agent when the run has a "
        "training gate. Send an Idempotency-Key so a retry never creates a second experiment. Latency: the "
        "contamination review of the training data runs inside the call, about 0.5 s per 1,000 rows the first "
        "time a dataset is reviewed (cached after): a few seconds for minibench-sized data, tens of seconds for a "
        "large dataset. A client with a shorter timeout (an MCP client's 10 s) "
        "retries with the same Idempotency-Key: while "
        "the first call runs the retry answers 409 in_progress at once (nothing is done twice); once it has "
        'committed, the retry answers with its result ("replayed": true).'
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
        "contamination_unchecked",
    ),
    audit_refused=_sealed_split_audit,
)
def worker_submit(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    request = submission_parse(args)
    submission = submission_create(
        worker=ctx.node,
        request=request,
        subjects=submission_subjects(ctx, request),
        idempotency_key=ctx.idempotency_key,
    )
    return _submission_answer(submission, ctx)


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
        run=ctx.run,
        actor=ctx.actor,
        role=ctx.role,
        experiment=args["experiment"],
        decision=args["decision"],
        rationale=args["rationale"],
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
            "reason": {"type": "string", "minLength": 1, "maxLength": 4000, "pattern": r"\S"},
            "ttl_seconds": {
                "type": "integer",
                "minimum": 60,
                "maximum": OVERRIDE_TTL_MAX,
                "default": OVERRIDE_TTL_DEFAULT,
            },
        },
        required=["worker", "reason"],
    )
    | alternatives(
        {"required": ["spec"], "not": {"required": ["spec_sha256"]}},
        {"required": ["spec_sha256"], "not": {"required": ["spec"]}},
        code="invalid_override",
        message="Give exactly one of spec (the exact submission) or spec_sha256 (from the refusal's detail).",
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
        run=ctx.run,
        actor=ctx.actor,
        role=ctx.role,
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
