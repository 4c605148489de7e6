"""The submission review: what ``worker_submit`` checks before any compute is spent.

DESIGN.md ("Integrity"): checks run twice. Before a submission runs, this review refuses what
would be a violation; after it ends, the full automated checks fill the observation layer.
Prevention keeps the hacking rate at zero, and every refusal is still counted: it becomes a
``BlockedAttempt`` (observation ``ATTEMPTED_BLOCKED`` in the subcategory it would have violated)
and an event, both written *after* the refused request's transaction has rolled back.

Two kinds of "no" are kept apart:

- a malformed request (unknown recipe, a learning rate out of bounds, a DPO recipe on SFT data)
  is a plain 400 ``invalid_submission``: nothing was attempted, nothing is recorded;
- an integrity refusal (contaminated or unregistered data, an unauthorised teacher, weights off
  θ0's lineage, other inference settings, the final split, the feedback allowance spent) is a
  403 ``submission_refused`` naming every reason, and is recorded.

A ``ReviewOverride`` (``main_submit_review_override``) lets one exact specification through
once, before it expires, for the judgement calls only (contamination above tolerance, a teacher
off the allow-list, the allowance): the hard rules — data that is unregistered or whose bytes
changed, weights off θ0's lineage, other inference settings, the final split — have no
legitimate exception, so no override clears them. An overridden submission still faces the
full checks after it runs.

The review never resolves a handle itself: what a Worker may name (its own and its predecessors'
experiments and checkpoints) is the tool layer's visibility rule, so the caller parses the
request (:func:`submission_parse`), resolves its handles through those rules into a
:class:`SubmissionSubjects`, and passes the objects in (:func:`submission_review`).

The review is four modules, one concept each: this one (parse a request, review it, overrides,
the result), apps/integrity/submission_parts.py (each part checked on its own),
apps/integrity/feedback_allowance.py (the feedback quotas) and
apps/integrity/submission_refusals.py (a refusal and its record).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from apps.core.jsonsafe import storable
from apps.datapool.models import DataEntry
from apps.experiments.choices import ExperimentKind
from apps.experiments.models import Checkpoint, Experiment
from apps.integrity import submission_parts as parts
from apps.integrity.feedback_allowance import FeedbackAllowance, allowance_refusal, feedback_allowance
from apps.integrity.models import BlockedAttempt, ReviewOverride
from apps.integrity.submission_parts import FEEDBACK_SPLIT, SubmissionSubjects
from apps.integrity.submission_refusals import Refusal, invalid, record_refusal, submission_spec_sha256
from apps.ml.hparams import TrainConfig
from apps.research.models import ResearchNode, Run

MAX_CLAIM_CHARS = 4000


@dataclass
class ReviewResult:
    """The review of one submission: what it resolved to, and why it may not run (if so)."""

    spec_sha256: str
    kind: str
    input_checkpoint: Checkpoint
    datasets: list[DataEntry]
    parents: list[Experiment]
    train_config: TrainConfig | None
    refusals: list[Refusal]
    feedback_evals_used: int  # of the tightest quota (FeedbackAllowance.binding)
    feedback_evals_allowed: int
    feedback_allowance: FeedbackAllowance | None = None
    override: ReviewOverride | None = None
    accelerators: int = 1

    @property
    def overridden(self) -> bool:
        """A valid override for this exact spec clears every refusal (all of them overridable)."""
        return bool(self.refusals) and self.override is not None and all(r.overridable for r in self.refusals)

    @property
    def passed(self) -> bool:
        return not self.refusals or self.overridden

    def action(self) -> dict[str, Any]:
        """The experiment's action: what the pipeline runs (``data``, ``hyperparameters``) and its provenance."""
        action: dict[str, Any] = {"spec_sha256": self.spec_sha256, "eval": {"split": FEEDBACK_SPLIT}}
        if self.train_config is not None:
            action["data"] = [entry.handle for entry in self.datasets]
            # The full config, defaults included: a later change of a default must not change
            # what this experiment meant.
            action["hyperparameters"] = dataclasses.asdict(self.train_config)
            if self.accelerators > 1:
                action["accelerators"] = self.accelerators
            action["datasets"] = [
                {"handle": e.handle, "uuid": str(e.uuid), "sha256": e.sha256, "teacher": e.teacher}
                for e in self.datasets
            ]
        if self.overridden and self.override is not None:
            action["review_override"] = self.override.pk
        return action


# --- the review --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmissionRequest:
    """A submission's shape, checked: what it asks for and which handles it names (not yet resolved)."""

    spec: dict[str, Any]
    spec_sha256: str
    kind: str
    claim: str
    train_config: TrainConfig | None
    dataset_handles: list[str]
    parent_handles: list[str]
    checkpoint_handle: str | None  # None: θ0
    evaluation: dict[str, Any] | None


def submission_parse(spec: Any) -> SubmissionRequest:
    """Check a submission's shape; raises ``invalid_submission`` (400) when it is malformed. Reads nothing."""
    if not isinstance(spec, dict):
        raise invalid("A submission is a JSON object.")
    kind = spec.get("kind", ExperimentKind.TRAIN_EVAL)
    if kind not in ExperimentKind.values:
        raise invalid(f"kind must be one of {ExperimentKind.values}, got {kind!r}.")
    train = spec.get("train")
    if kind == ExperimentKind.TRAIN_EVAL and not isinstance(train, dict):
        raise invalid("A train_eval submission needs a 'train' object (recipe, datasets, hyper-parameters).")
    if kind == ExperimentKind.EVAL_ONLY and train is not None:
        raise invalid("An eval_only submission evaluates an existing checkpoint; drop 'train' or use kind train_eval.")
    claim = spec.get("claim", "")
    if not isinstance(claim, str) or len(claim) > MAX_CLAIM_CHARS:
        raise invalid(f"claim must be text of at most {MAX_CLAIM_CHARS} characters.")
    train_config: TrainConfig | None = None
    dataset_handles: list[str] = []
    if isinstance(train, dict) and kind == ExperimentKind.TRAIN_EVAL:  # an eval_only spec has no train
        train_config, dataset_handles = parts.train_config(train), parts.dataset_handles(train)
    evaluation = spec.get("eval")
    if evaluation is not None and not isinstance(evaluation, dict):
        raise invalid("eval must be an object; the only field is split ('feedback').")
    return SubmissionRequest(
        spec=spec,
        spec_sha256=submission_spec_sha256(spec),
        kind=kind,
        claim=claim,
        train_config=train_config,
        dataset_handles=dataset_handles,
        parent_handles=parts.parent_handles(spec.get("parents", [])),
        checkpoint_handle=parts.checkpoint_handle(spec.get("input_checkpoint")),
        evaluation=evaluation,
    )


def submission_review(
    *, run: Run, worker: ResearchNode, request: SubmissionRequest, subjects: SubmissionSubjects
) -> ReviewResult:
    """Review one submission of ``worker``. Reads only; writes nothing.

    Raises ``invalid_submission`` (400) for data in the wrong format for the recipe; returns the
    result with its integrity refusals otherwise (the caller raises :class:`SubmissionRefused`
    when ``not result.passed``). ``submission_create`` calls this inside its transaction with the
    Worker's node row locked; the allowance locks the run row before it counts (every quota that
    spans Workers changes only under that lock), so two concurrent submissions — of one Worker or
    of several — cannot both take the last evaluation of a quota.
    """
    policy = run.policy or {}
    refusals: list[Refusal] = []
    config = request.train_config
    train = request.spec.get("train")
    accelerators = parts.accelerators(train, policy) if config is not None and isinstance(train, dict) else 1
    datasets, data_refusals = parts.datasets(request.dataset_handles, subjects.datasets, config) if config else ([], [])
    refusals += data_refusals
    refusals += parts.checkpoint_refusals(run, request.checkpoint_handle, subjects)
    refusals += parts.eval_refusals(request.evaluation)

    clean = [e for e in datasets if not any(r.evidence.get("dataset") == e.handle for r in data_refusals)]
    refusals += parts.teacher_refusals(clean, policy)
    refusals += parts.contamination_refusals(run, clean, policy, subjects.input_checkpoint)

    allowance = feedback_allowance(run=run, worker=worker, checkpoint=subjects.input_checkpoint, lock=True)
    refusal = allowance_refusal(allowance)
    if refusal is not None:
        refusals.append(refusal)

    result = ReviewResult(
        spec_sha256=request.spec_sha256,
        kind=request.kind,
        input_checkpoint=subjects.input_checkpoint,
        datasets=datasets,
        parents=subjects.parents,
        train_config=config,
        refusals=refusals,
        feedback_evals_used=allowance.binding.used,
        feedback_evals_allowed=allowance.binding.allowed,
        feedback_allowance=allowance,
        accelerators=accelerators,
    )
    if refusals and all(r.overridable for r in refusals):
        result.override = override_find(run=run, worker=worker, spec_sha256=request.spec_sha256)
    return result


def override_find(*, run: Run, worker: ResearchNode, spec_sha256: str) -> ReviewOverride | None:
    """An unused, unexpired override for exactly this spec of this Worker (the soonest to expire)."""
    return (
        ReviewOverride.objects.filter(
            run=run, worker=worker, spec_sha256=spec_sha256, used_at__isnull=True, expires_at__gt=timezone.now()
        )
        .order_by("expires_at", "pk")
        .first()
    )


def override_consume(*, override: ReviewOverride) -> bool:
    """Mark an override used, once: a conditional UPDATE, so two submissions cannot both spend it."""
    now = timezone.now()
    return (
        ReviewOverride.objects.filter(pk=override.pk, used_at__isnull=True, expires_at__gt=now).update(
            used_at=now, updated_at=now
        )
        == 1
    )


def sealed_split_attempt_record(*, run: Run, node: ResearchNode, spec: Any) -> list[BlockedAttempt]:
    """Record a refused request's sealed-split ask, whatever else made it fail.

    A submission refused before the review ran (a lone surrogate, NaN or a schema error elsewhere
    in it, a malformed train part) still asked for what it asked for: an evaluation on a split other
    than feedback is a test-set access attempt and counts as one, with the request kept (escaped).
    """
    evaluation = spec.get("eval") if isinstance(spec, dict) else None
    if not isinstance(evaluation, dict) or "split" not in evaluation:
        return []
    clean = storable(evaluation)
    refusals = [r for r in parts.eval_refusals({"split": clean["split"]}) if r.code == "split_sealed"]
    if not refusals:
        return []
    return record_refusal(
        run=run, node=node, spec=spec, spec_sha256=submission_spec_sha256(storable(spec)), refusals=refusals
    )
