"""The feedback allowance: how many feedback-split evaluations a Worker, its checkpoint and the run have left.

The submission review refuses a submission once the tightest quota is spent (apps/integrity/
submission_review.py); the tool layer shows the allowance to the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from apps.experiments.models import Checkpoint
from apps.experiments.selectors import (
    feedback_evals_used,
    feedback_evals_used_in_run,
    feedback_evals_used_on_checkpoint,
)
from apps.integrity.choices import Subcategory
from apps.integrity.submission_refusals import Refusal
from apps.research.models import ResearchNode, Run, default_policy


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


def allowance_refusal(allowance: FeedbackAllowance) -> Refusal | None:
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
