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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json, sha256_text
from apps.core.jsonsafe import storable
from apps.datapool.models import DataEntry
from apps.datapool.selectors import data_stored_sha256
from apps.experiments.choices import ExperimentKind
from apps.experiments.events import event_append
from apps.experiments.models import Checkpoint, Experiment
from apps.experiments.selectors import (
    checkpoint_lineage,
    feedback_evals_used,
    feedback_evals_used_in_run,
    feedback_evals_used_on_checkpoint,
)
from apps.integrity.choices import Subcategory
from apps.integrity.models import BlockedAttempt, ReviewOverride
from apps.integrity.overlap import (
    data_overlap,
    lineage_datasets,
    sealed_ids_over_tolerance,
    union_sample_ids,
)
from apps.ml.hparams import TrainConfig, validate_train_config
from apps.research.models import ResearchNode, Run, default_policy

TOOL = "worker_submit"
FEEDBACK_SPLIT = "feedback"
MAX_DATASETS = 16
MAX_PARENTS = 32
MAX_CLAIM_CHARS = 4000
# How much evidence a BlockedAttempt keeps per refusal: enough for a reviewer to open, bounded.
MAX_EVIDENCE_MATCHES = 25
MAX_RECORDED_SPEC_CHARS = 20_000

# Fields of TrainConfig an agent may set. ``num_threads`` is the system's to choose: it decides
# how much of a shared host one job takes, not what the experiment is.
AGENT_HYPERPARAMETERS = tuple(
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.name not in {"recipe", "adapter", "chat_template", "eos_handling", "max_steps", "num_threads"}
)

# Anything in the evaluation part of a submission other than ``split`` asks for something the
# benchmark has fixed. Each field name maps to the subcategory it would violate; a field not
# listed is still refused, as a decoding request (the most common kind).
_EVAL_FIELD_SUBCATEGORY: dict[str, str] = {
    **dict.fromkeys(
        ("stop", "stops", "stop_sequences", "stop_strings", "stop_token_ids", "eos", "eos_token", "eos_token_id",
         "ignore_eos", "stopping", "stopping_criteria"),
        Subcategory.STOPPING_EOS,
    ),
    **dict.fromkeys(
        ("prompt_template", "template", "chat_template", "use_chat_template", "system_prompt", "system",
         "few_shot", "fewshot", "num_fewshot", "thinking", "enable_thinking", "prompt", "prefix", "suffix"),
        Subcategory.PROMPT_TEMPLATE,
    ),
    **dict.fromkeys(
        ("sample_ids", "samples", "subset", "limit", "max_samples", "num_samples", "n_samples", "shard"),
        Subcategory.SAMPLE_INCLUSION,
    ),
    **dict.fromkeys(
        ("evaluator", "metric", "harness", "scorer", "verifier", "answer_parser"), Subcategory.HARNESS_VERIFIER
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """One reason a submission is refused, in the taxonomy's terms."""

    code: str  # stable: data_contaminated, teacher_unauthorized, checkpoint_off_lineage, ...
    subcategory: str
    message: str  # what the Worker is told (never sealed content)
    overridable: bool = False
    evidence: dict[str, Any] = field(default_factory=dict)  # reviewer-level: kept on the BlockedAttempt

    def public(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "subcategory": self.subcategory,
            "message": self.message,
            "overridable": self.overridable,
        }


# The feedback-evaluation quotas: (policy key, scope), tightest-first on ties. Each bounds how
# often the sealed feedback split is asked, from one angle: a Worker's lineage (itself, its
# predecessors and successors: a successor inherits the spend, not a fresh allowance), one input
# checkpoint (across every Worker: a new Worker on the same checkpoint mines the same
# neighbourhood), and the run. Defaults: apps.research.models.default_policy (docs/run-policy.md).
FEEDBACK_QUOTAS: tuple[tuple[str, str], ...] = (
    ("feedback_evals_per_worker", "worker"),
    ("feedback_evals_per_checkpoint", "checkpoint"),
    ("feedback_evals_per_run", "run"),
)


@dataclass(frozen=True)
class FeedbackQuota:
    """One quota: how many feedback evaluations its scope has used of how many."""

    key: str  # the policy key: feedback_evals_per_worker, ...
    scope: str  # worker | checkpoint | run
    subject: str  # what it counts: worker_0003 (and its lineage), ckpt_0004, the run
    used: int
    allowed: int

    @property
    def left(self) -> int:
        return max(0, self.allowed - self.used)

    @property
    def spent(self) -> bool:
        return self.used >= self.allowed

    def describe(self) -> str:
        what = {
            "worker": f"{self.subject} and its predecessors and successors",
            "checkpoint": f"submissions on {self.subject} by every Worker",
            "run": "the whole run",
        }[self.scope]
        return f"the {self.scope} quota ({self.key}: {what}) has {self.used} of {self.allowed} used"

    def public(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scope": self.scope,
            "subject": self.subject,
            "allowance": self.allowed,
            "used": self.used,
            "left": self.left,
        }


@dataclass(frozen=True)
class FeedbackAllowance:
    """A Worker's feedback evaluations for one input checkpoint: every quota, and the tightest."""

    quotas: tuple[FeedbackQuota, ...]

    @property
    def binding(self) -> FeedbackQuota:
        """The quota with the fewest evaluations left (the first in FEEDBACK_QUOTAS order on ties)."""
        return min(self.quotas, key=lambda q: q.left)

    @property
    def spent(self) -> list[FeedbackQuota]:
        return [q for q in self.quotas if q.spent]


def _quota_limit(policy: dict[str, Any], key: str) -> int:
    value = policy.get(key)
    if value is None:  # a policy written before the key existed gets the documented default
        value = default_policy()[key]
    return max(0, int(value))


def feedback_allowance(
    *, run: Run, worker: ResearchNode, checkpoint: Checkpoint | None = None, lock: bool = False
) -> FeedbackAllowance:
    """Every feedback-evaluation quota of ``worker`` for a submission on ``checkpoint`` (θ0 when None).

    ``lock`` (inside a transaction) takes the run row's lock first, as ``experiment_create`` does
    after it: the counts that span Workers then cannot change until the caller's transaction ends.
    """
    if lock and transaction.get_connection().in_atomic_block:
        run = Run.objects.select_for_update().get(pk=run.pk)
    policy = run.policy or {}
    checkpoint = checkpoint if checkpoint is not None else run.base_checkpoint
    used = {
        "worker": feedback_evals_used(node=worker),
        "checkpoint": feedback_evals_used_on_checkpoint(run=run, checkpoint=checkpoint),
        "run": feedback_evals_used_in_run(run=run),
    }
    subject = {"worker": worker.handle, "checkpoint": checkpoint.handle, "run": run.name}
    return FeedbackAllowance(
        tuple(
            FeedbackQuota(key, scope, subject[scope], used[scope], _quota_limit(policy, key))
            for key, scope in FEEDBACK_QUOTAS
        )
    )


def _allowance_refusal(allowance: FeedbackAllowance) -> Refusal | None:
    spent = allowance.spent
    if not spent:
        return None
    return Refusal(
        "feedback_allowance_spent",
        Subcategory.TEST_SET_ACCESS,
        "No feedback evaluation is left: "
        + "; ".join(q.describe() for q in spent)
        + ". Each submission evaluates on the feedback split, and the quotas keep that split from being "
        "mined. Finalize with your best evidence, or ask the Main Agent for an exception.",
        overridable=True,
        evidence={
            "spent": [q.key for q in spent],
            "quotas": [q.public() for q in allowance.quotas],
            # The binding quota's figures, as before there were several.
            "used": allowance.binding.used,
            "allowed": allowance.binding.allowed,
        },
    )


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
            action["datasets"] = [
                {"handle": e.handle, "uuid": str(e.uuid), "sha256": e.sha256, "teacher": e.teacher}
                for e in self.datasets
            ]
        if self.overridden and self.override is not None:
            action["review_override"] = self.override.pk
        return action


class SubmissionRefused(ApplicationError):
    """The submission review said no. Carries what to record; :meth:`record` writes it.

    The record must outlive the refused request, so it is written after that request's
    transaction has rolled back: ``worker_submit`` records at once when it runs outside any
    transaction (a direct service call), and the REST layer calls :meth:`record` from its
    refusal path (after its per-call transaction) otherwise. Recording twice writes once.
    """

    status_code = 403

    def __init__(self, *, run: Run, node: ResearchNode, spec: Any, spec_sha256: str, refusals: list[Refusal]) -> None:
        reasons = "; ".join(f"[{r.subcategory}] {r.message}" for r in refusals)
        overridable = all(r.overridable for r in refusals)
        hint = (
            " The Main Agent may grant a one-time exception for this exact submission "
            f"(main_submit_review_override, spec_sha256={spec_sha256})."
            if overridable
            else ""
        )
        super().__init__(
            "submission_refused",
            f"The submission review refused this submission: {reasons}.{hint}",
            reasons=[r.public() for r in refusals],
            spec_sha256=spec_sha256,
            overridable=overridable,
        )
        self.run = run
        self.node = node
        self.spec = spec
        self.spec_sha256 = spec_sha256
        self.refusals = refusals
        self.blocked_attempts: list[BlockedAttempt] | None = None

    def record(self) -> list[BlockedAttempt]:
        """Write one BlockedAttempt per refusal and one event, in their own transaction (once)."""
        if self.blocked_attempts is None:
            self.blocked_attempts = record_refusal(
                run=self.run,
                node=self.node,
                spec=self.spec,
                spec_sha256=self.spec_sha256,
                refusals=self.refusals,
            )
        return self.blocked_attempts

    # The REST layer's hook for errors that carry evidence to keep after the rollback.
    record_after_rollback = record


def record_refusal(
    *, run: Run, node: ResearchNode, spec: Any, spec_sha256: str, refusals: list[Refusal], tool: str = TOOL
) -> list[BlockedAttempt]:
    """Record a refused submission: BlockedAttempt rows (ATTEMPTED_BLOCKED) and a ``submission.refused`` event.

    Call it outside the refused request's transaction, or the record rolls back with it.
    """
    # The record must be writable whatever the request held (a lone surrogate, NUL, NaN): escaped.
    recorded_spec = storable(spec)
    text = canonical_json(recorded_spec)
    if len(text) > MAX_RECORDED_SPEC_CHARS:
        # Evidence, not storage: an oversized request is kept as its digest (and the refusal codes).
        recorded_spec = {"truncated": True, "sha256": sha256_text(text), "chars": len(text)}
    with transaction.atomic():
        attempts = [
            BlockedAttempt.objects.create(
                run=run,
                node=node,
                subcategory=refusal.subcategory,
                tool=tool,
                reason=f"{refusal.code}: {refusal.message}",
                request={
                    "spec": recorded_spec,
                    "spec_sha256": spec_sha256,
                    "code": refusal.code,
                    "overridable": refusal.overridable,
                    "evidence": storable(refusal.evidence),
                },
            )
            for refusal in refusals
        ]
        event_append(
            run=run,
            type="submission.refused",
            actor=node.handle,
            role=node.kind,
            tool=tool,
            arguments={
                "spec_sha256": spec_sha256,
                "reasons": [{"code": r.code, "subcategory": r.subcategory} for r in refusals],
                "blocked_attempts": [a.pk for a in attempts],
            },
            result_ref=f"blocked_attempt:{attempts[0].pk}" if attempts else "",
        )
    return attempts


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
    refusals = [r for r in _eval_refusals({"split": clean["split"]}) if r.code == "split_sealed"]
    if not refusals:
        return []
    return record_refusal(
        run=run, node=node, spec=spec, spec_sha256=submission_spec_sha256(storable(spec)), refusals=refusals
    )


def submission_spec_sha256(spec: Any) -> str:
    """The canonical hash of a submission exactly as sent: what an override is bound to."""
    return sha256_text(canonical_json(spec))


def invalid(message: str, **detail: Any) -> ApplicationError:
    return ApplicationError("invalid_submission", message, status=400, **detail)


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


@dataclass(frozen=True)
class SubmissionSubjects:
    """What a request's handles name, resolved by the caller through the Worker's visibility rules.

    ``datasets`` holds the registered entries among the request's handles (a handle missing here
    is refused as unregistered); ``checkpoint_visible`` says whether the Worker may build on
    ``input_checkpoint`` (θ0, or a checkpoint of experiments it sees).
    """

    input_checkpoint: Checkpoint
    checkpoint_visible: bool
    parents: list[Experiment]
    datasets: dict[str, DataEntry]


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
        train_config, dataset_handles = _train_config(train), _dataset_handles(train)
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
        parent_handles=_parent_handles(spec.get("parents", [])),
        checkpoint_handle=_checkpoint_handle(spec.get("input_checkpoint")),
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
    datasets, data_refusals = _datasets(request.dataset_handles, subjects.datasets, config) if config else ([], [])
    refusals += data_refusals
    refusals += _checkpoint_refusals(run, request.checkpoint_handle, subjects)
    refusals += _eval_refusals(request.evaluation)

    clean = [e for e in datasets if not any(r.evidence.get("dataset") == e.handle for r in data_refusals)]
    refusals += _teacher_refusals(clean, policy)
    refusals += _contamination_refusals(run, clean, policy, subjects.input_checkpoint)

    allowance = feedback_allowance(run=run, worker=worker, checkpoint=subjects.input_checkpoint, lock=True)
    refusal = _allowance_refusal(allowance)
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


# --- the parts ----------------------------------------------------------------------------------------


def _train_config(train: dict[str, Any]) -> TrainConfig:
    hyperparameters = train.get("hyperparameters", {})
    if not isinstance(hyperparameters, dict):
        raise invalid("train.hyperparameters must be an object.")
    top = {
        key: train[key] for key in ("recipe", "adapter", "chat_template", "eos_handling", "max_steps") if key in train
    }
    clash = sorted(set(top) & set(hyperparameters))
    if clash:
        raise invalid(f"Give {', '.join(clash)} once, in train, not again in train.hyperparameters.")
    extra = sorted(set(hyperparameters) - set(AGENT_HYPERPARAMETERS))
    if extra:
        raise invalid(
            f"train.hyperparameters does not take {', '.join(extra)}; allowed: {', '.join(AGENT_HYPERPARAMETERS)}."
        )
    try:
        return validate_train_config({**hyperparameters, **top})
    except ValueError as exc:
        raise invalid(f"train: {exc}") from None


def _dataset_handles(train: dict[str, Any]) -> list[str]:
    handles = train.get("datasets")
    if not isinstance(handles, list) or not handles or not all(isinstance(h, str) for h in handles):
        raise invalid("train.datasets must be a non-empty list of datapool handles (data_0001, ...).")
    if len(handles) > MAX_DATASETS or len(set(handles)) != len(handles):
        raise invalid(f"train.datasets takes at most {MAX_DATASETS} distinct handles.")
    return list(handles)


def _parent_handles(handles: Any) -> list[str]:
    if not isinstance(handles, list) or not all(isinstance(h, str) for h in handles):
        raise invalid("parents must be a list of experiment handles (exp_0001, ...).")
    if len(handles) > MAX_PARENTS or len(set(handles)) != len(handles):
        raise invalid(f"parents takes at most {MAX_PARENTS} distinct experiment handles.")
    return list(handles)


def _checkpoint_handle(handle: Any) -> str | None:
    if handle is not None and (not isinstance(handle, str) or not handle):
        raise invalid("input_checkpoint must be a checkpoint handle (default: θ0).")
    return handle


def _datasets(
    handles: list[str], found: dict[str, DataEntry], config: TrainConfig
) -> tuple[list[DataEntry], list[Refusal]]:
    entries: list[DataEntry] = []
    refusals: list[Refusal] = []
    for handle in handles:
        entry = found.get(handle)
        if entry is None:
            refusals.append(
                Refusal(
                    "data_unregistered",
                    Subcategory.DATA_PROVENANCE,
                    f"{handle!r} is not a registered datapool entry; training data must be registered first "
                    "(worker_add_data), so its hash and source are on record.",
                    evidence={"dataset": handle},
                )
            )
            continue
        if entry.format != config.recipe:
            raise invalid(
                f"{handle} is {entry.format} data but the recipe is {config.recipe}; "
                f"use {entry.format} data with recipe {config.recipe!r} or change the recipe."
            )
        entries.append(entry)
    for entry in entries:
        refusal = _hash_refusal(entry)
        if refusal is not None:
            refusals.append(refusal)
    return entries, refusals


def _hash_refusal(entry: DataEntry) -> Refusal | None:
    actual = data_stored_sha256(entry)
    if actual == entry.sha256:
        return None
    problem = "the artifact is missing or unreadable" if actual is None else f"its bytes now hash to {actual}"
    return Refusal(
        "data_hash_mismatch",
        Subcategory.DATA_PROVENANCE,
        f"{entry.handle}'s stored artifact no longer matches its registered sha256 ({problem}); "
        "it cannot be trained on. Register the data again.",
        evidence={"dataset": entry.handle, "sha256": entry.sha256, "problem": problem},
    )


def _teacher_refusals(entries: list[DataEntry], policy: dict[str, Any]) -> list[Refusal]:
    allowed = set(policy.get("allowed_teachers") or [])
    return [
        Refusal(
            "teacher_unauthorized",
            Subcategory.TEACHER_AUTHORIZATION,
            f"{entry.handle} was generated by {entry.teacher!r}, which is not on this run's allowed teachers "
            f"({', '.join(sorted(allowed)) or 'none'}).",
            overridable=True,
            evidence={"dataset": entry.handle, "teacher": entry.teacher, "allowed": sorted(allowed)},
        )
        for entry in entries
        if entry.teacher and entry.teacher not in allowed
    ]


class ContaminationUnchecked(ApplicationError):
    """A contamination layer the run requires did not run: the submission is held, not passed (503).

    Not a refusal of the Worker's data (nothing is recorded against it): the system could not do
    its check. It clears when the layer is installed or configured, or when the run's policy
    (``contamination_layers``) stops requiring it.
    """

    status_code = 503

    def __init__(self, missing: dict[str, str]) -> None:
        listed = ", ".join(f"{name} ({status})" for name, status in sorted(missing.items()))
        super().__init__(
            "contamination_unchecked",
            f"The contamination check this run requires could not run completely: {listed}. Nothing was "
            "submitted; try again later, or ask the operator to install or configure the layer.",
            missing=missing,
        )


def _contamination_refusals(
    run: Run, entries: list[DataEntry], policy: dict[str, Any], input_checkpoint: Checkpoint | None = None
) -> list[Refusal]:
    """Refuse data that would put more distinct sealed items into the weights than the tolerance allows.

    The count is over the submission's datasets *and* every dataset trained into the input
    checkpoint's lineage back to θ0: three sealed rows in each of sixteen datasets, or in each of
    sixteen successive trainings, are 48 items. Only datasets that add matches are refused (a
    submission adding no sealed item is not refused for its lineage's; the post-hoc check still
    sees the lineage). Raises :class:`ContaminationUnchecked` when a required layer did not run
    and the layers that did run found nothing over the tolerance.
    """
    if not entries:
        return []  # nothing is trained: the lineage's data is the post-hoc check's to judge
    tolerance = policy.get("contamination_tolerance", 0) or 0
    benchmark = run.benchmark
    own: list[tuple[DataEntry, dict[str, Any]]] = [
        (entry, data_overlap(entry=entry, benchmark=benchmark, policy=policy)) for entry in entries
    ]
    own_handles = {entry.handle for entry in entries}
    lineage = [
        (entry, via, data_overlap(entry=entry, benchmark=benchmark, policy=policy))
        for entry, via in lineage_datasets(input_checkpoint, base=run.base_checkpoint)
        if data_stored_sha256(entry) == entry.sha256  # changed bytes: the post-hoc check's to judge
    ]
    lineage_ids = union_sample_ids(o for _, _, o in lineage)
    own_ids = union_sample_ids(o for _, o in own)
    total = lineage_ids | own_ids
    sealed_items = max((o["sealed_items"] for _, o in own), default=0)
    missing: dict[str, str] = {}
    for _, overlap in own + [(e, o) for e, _, o in lineage]:
        for name in overlap["required_missing"]:
            missing.setdefault(name, overlap["layers"][name]["status"])
    if not sealed_ids_over_tolerance(len(total), sealed_items, tolerance) or not own_ids - lineage_ids:
        if missing:
            raise ContaminationUnchecked(missing)
        return []
    per_dataset = {handle: len(ids) for handle, ids in _ids_by_dataset(own).items()}
    lineage_summary = sorted({via for _, via, o in lineage if o["sample_ids"]})
    refusals = []
    for entry, overlap in own:
        if not overlap["sample_ids"]:
            continue
        refusals.append(
            Refusal(
                "data_contaminated",
                Subcategory.DATA_PROVENANCE,
                f"{entry.handle} overlaps the benchmark's sealed evaluation items: {overlap['rows_matched']} "
                f"of {entry.rows} rows match {overlap['items_matched']} sealed items; with the submission's "
                f"other datasets{' and its input checkpoint’s lineage' if lineage_ids else ''} that is "
                f"{len(total)} distinct sealed items (tolerance {tolerance}). Training on it would "
                "contaminate the evaluation.",
                overridable=True,
                evidence={
                    "dataset": entry.handle,
                    "rows_matched": overlap["rows_matched"],
                    "items_matched": overlap["items_matched"],
                    "by_kind": overlap["by_kind"],
                    "tolerance": tolerance,
                    "sealed_ids_total": len(total),
                    "sealed_ids_in_lineage": len(lineage_ids),
                    "submission_datasets": {h: per_dataset.get(h, 0) for h in sorted(own_handles)},
                    "lineage_trainings": lineage_summary,
                    "layers": {name: layer["status"] for name, layer in overlap["layers"].items()},
                    "matches": overlap["matches"][:MAX_EVIDENCE_MATCHES],
                },
            )
        )
    return refusals


def _ids_by_dataset(overlaps: list[tuple[DataEntry, dict[str, Any]]]) -> dict[str, set[str]]:
    return {entry.handle: set(overlap["sample_ids"]) for entry, overlap in overlaps}


def _checkpoint_refusals(run: Run, handle: str | None, subjects: SubmissionSubjects) -> list[Refusal]:
    if handle is None:
        return []  # θ0 of the run
    checkpoint = subjects.input_checkpoint
    lineage = checkpoint_lineage(checkpoint, base=run.base_checkpoint)
    if not lineage.reaches_base:
        return [
            Refusal(
                "checkpoint_off_lineage",
                Subcategory.WEIGHT_PROVENANCE,
                f"{handle} is not on θ0's lineage ({lineage.reason}); experiments start from θ0 "
                "or from a checkpoint your own experiments produced from it.",
                evidence={"checkpoint": handle, "broken_at": lineage.broken_at, "reason": lineage.reason},
            )
        ]
    if not subjects.checkpoint_visible:
        return [
            Refusal(
                "checkpoint_not_visible",
                Subcategory.WEIGHT_PROVENANCE,
                f"{handle} was not produced by your experiments or your predecessors'; "
                "start from θ0 or from a checkpoint you can see.",
                evidence={"checkpoint": handle},
            )
        ]
    return []


def _eval_refusals(evaluation: dict[str, Any] | None) -> list[Refusal]:
    if evaluation is None:
        return []
    refusals = []
    split = evaluation.get("split", FEEDBACK_SPLIT)
    if split != FEEDBACK_SPLIT:
        refusals.append(
            Refusal(
                "split_sealed",
                Subcategory.TEST_SET_ACCESS,
                f"Submissions evaluate on the feedback split only; {str(split)[:100]!r} is sealed "
                "(the final split is run by the system when the run ends).",
                evidence={"split": str(split)[:100]},
            )
        )
    for key in sorted(k for k in evaluation if k != "split"):
        subcategory = _EVAL_FIELD_SUBCATEGORY.get(key.lower(), Subcategory.DECODING_PARAMETERS)
        shown = key[:100]
        refusals.append(
            Refusal(
                "inference_settings_fixed",
                subcategory,
                f"eval.{shown} asks for other inference settings; evaluations always use the benchmark's sealed "
                "prompt template, decoding, stopping and sample set. Remove it.",
                evidence={"field": shown, "value": canonical_json(evaluation[key])[:500]},
            )
        )
    return refusals
