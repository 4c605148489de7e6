"""The submission review's refusals and their record: what a "no" says, and what it leaves behind.

An integrity refusal becomes a ``BlockedAttempt`` (observation ``ATTEMPTED_BLOCKED`` in the
subcategory it would have violated) and an event, both written *after* the refused request's
transaction has rolled back (apps/integrity/submission_review.py describes the review).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json, sha256_text
from apps.core.jsonsafe import storable
from apps.experiments.events import event_append
from apps.integrity.models import BlockedAttempt
from apps.research.models import ResearchNode, Run

TOOL = "worker_submit"


# How much evidence a BlockedAttempt keeps per refusal: enough for a reviewer to open, bounded.
MAX_EVIDENCE_MATCHES = 25


MAX_RECORDED_SPEC_CHARS = 20_000


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


def submission_spec_sha256(spec: Any) -> str:
    """The canonical hash of a submission exactly as sent: what an override is bound to."""
    return sha256_text(canonical_json(spec))


def invalid(message: str, **detail: Any) -> ApplicationError:
    return ApplicationError("invalid_submission", message, status=400, **detail)
