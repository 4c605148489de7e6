"""Submissions: how a Worker's request becomes an experiment, and the Main Agent's gates on it.

- ``submission_create``: one submission = one experiment (train + evaluate on feedback, or
  evaluate an existing checkpoint). The submission review (``apps.integrity.submission_review``)
  runs first, before any compute; with the run's training gate on, a training submission is
  created ``held`` and waits for the Main Agent.
- ``training_decide``: the Main Agent approves a held submission (the pipeline starts) or rejects
  it, with a rationale.
- ``review_override_grant``: a time-limited exception for one exact specification.

The ExpOS tools (``apps.expos.tools.execution``) declare these, resolve the handles a request
names through the caller's visibility rules, and shape the answers; the state changes are here.
"""

from __future__ import annotations

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
from apps.experiments.services import experiment_create
from apps.flows.pipeline import experiment_set_status, experiment_start
from apps.integrity.models import ReviewOverride
from apps.integrity.submission_parts import SubmissionSubjects
from apps.integrity.submission_refusals import SubmissionRefused, submission_spec_sha256
from apps.integrity.submission_review import ReviewResult, SubmissionRequest, override_consume, submission_review
from apps.jobs.models import Job
from apps.research.choices import NodeKind, NodeStatus, RunStatus, Trigger
from apps.research.models import ResearchNode, Run
from apps.research.services import main_trigger

# A submission may be made while the run is being set up or running; a paused run takes no new
# work, a stopping one only finishes what runs, and a finished one is history.
SUBMITTABLE_RUN_STATES = (RunStatus.CREATED, RunStatus.RUNNING)
OVERRIDE_TTL_DEFAULT = 3600
OVERRIDE_TTL_MAX = 7 * 24 * 3600
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SUBMIT_TOOL = "worker_submit"


@dataclass(frozen=True)
class Submission:
    experiment: Experiment
    job: Job | None
    review: ReviewResult | None  # None for an idempotent replay
    replayed: bool = False


def submission_create(
    *,
    worker: ResearchNode,
    request: SubmissionRequest,
    subjects: SubmissionSubjects,
    idempotency_key: str | None = None,
) -> Submission:
    """Review and create one submission of ``worker``; start it unless the training gate holds it.

    Locks the Worker's node row for the whole review, so two concurrent submissions of one Worker
    cannot both pass the feedback allowance, and a retry with the same Idempotency-Key finds the
    first one's experiment. A refusal raises :class:`SubmissionRefused` with nothing written; it
    is recorded here when no outer transaction would roll the record back, and otherwise by the
    REST layer after its rollback (``SubmissionRefused.record``).
    """
    if worker.kind != NodeKind.WORKER:
        raise PermissionDenied("forbidden_role", "Only a Worker submits experiments.")
    spec = request.spec
    try:
        with transaction.atomic():
            # The lock that serialises one Worker's submissions (allowance, idempotency key).
            locked = ResearchNode.objects.select_for_update().select_related("run").get(pk=worker.pk)
            if idempotency_key:
                existing = Experiment.objects.filter(owner=locked, idempotency_key=idempotency_key).first()
                if existing is not None:
                    return _replay(existing, spec, idempotency_key)
            if locked.status != NodeStatus.ACTIVE:
                raise Conflict("node_not_active", f"{locked.handle} is {locked.status}; it takes no new submissions.")
            run = locked.run
            if run.status not in SUBMITTABLE_RUN_STATES:
                raise Conflict("run_not_running", f"Run {run.name!r} is {run.status}; it takes no new submissions.")
            review = submission_review(run=run, worker=locked, request=request, subjects=subjects)
            spent = review.override is not None and review.overridden and not override_consume(override=review.override)
            if not review.passed or spent:
                # spent: the override was used up by a concurrent submission meanwhile.
                raise SubmissionRefused(
                    run=run, node=locked, spec=spec, spec_sha256=review.spec_sha256, refusals=review.refusals
                )
            held = bool((run.policy or {}).get("training_gate")) and review.kind == ExperimentKind.TRAIN_EVAL
            experiment = experiment_create(
                run=run,
                owner=locked,
                kind=review.kind,
                input_checkpoint=review.input_checkpoint,
                action=review.action(),
                parents=review.parents,
                claim=request.claim,
                idempotency_key=idempotency_key or None,
                status=ExperimentStatus.HELD if held else ExperimentStatus.QUEUED,
            )
            if review.overridden:
                _override_used_event(experiment, review)
            if held:
                event_append(
                    run=run,
                    type="training.held",
                    actor=locked.handle,
                    role=NodeKind.WORKER,
                    tool=SUBMIT_TOOL,
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
        role=NodeKind.WORKER,
        tool=SUBMIT_TOOL,
        arguments={
            "override": review.override.pk,
            "spec_sha256": review.spec_sha256,
            "reasons": [{"code": r.code, "subcategory": r.subcategory} for r in review.refusals],
        },
        result_ref=f"experiment:{experiment.uuid}",
    )


def training_decide(
    *, run: Run, actor: str, role: str, experiment: str, decision: str, rationale: str
) -> tuple[Experiment, Job | None]:
    """The Main Agent approves (the pipeline starts) or rejects a submission held at the training gate."""
    if decision not in ("approve", "reject"):
        raise ApplicationError("invalid_decision", "decision is 'approve' or 'reject'.")
    if not rationale.strip():
        raise ApplicationError("rationale_required", "A training decision needs a rationale.")
    with transaction.atomic():
        # Locked: two decisions on one request serialise, and the second sees it is no longer held.
        held = Experiment.objects.select_for_update().select_related("run").filter(run=run, handle=experiment).first()
        if held is None:
            raise NotFound("unknown_experiment", f"There is no experiment {experiment!r} in this run.")
        if held.status != ExperimentStatus.HELD:
            raise Conflict("not_held", f"{held.handle} is {held.status}; only a held submission is decided.")
        event_append(
            run=run,
            type="training.decided",
            actor=actor,
            role=role,
            tool="main_training_decide",
            arguments={"experiment": held.handle, "decision": decision, "rationale": rationale},
            result_ref=f"experiment:{held.uuid}",
        )
        status = ExperimentStatus.QUEUED if decision == "approve" else ExperimentStatus.REJECTED
        experiment_set_status(
            experiment=held, status=status, reason=f"training gate: {decision}d", actor=actor, role=role
        )
        job = experiment_start(experiment=held) if status == ExperimentStatus.QUEUED else None
    return held, job


def review_override_grant(
    *,
    run: Run,
    actor: str,
    role: str,
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
    target = ResearchNode.objects.filter(run=run, handle=worker, kind=NodeKind.WORKER).first()
    if target is None:
        raise NotFound("unknown_worker", f"There is no Worker {worker!r} in this run.")
    digest = spec_sha256 if spec_sha256 is not None else submission_spec_sha256(spec)
    with transaction.atomic():
        override = ReviewOverride(
            run=run,
            worker=target,
            spec_sha256=digest,
            reason=reason,
            expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
        )
        override.full_clean()
        override.save()
        event_append(
            run=run,
            type="submission_review.override_granted",
            actor=actor,
            role=role,
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
