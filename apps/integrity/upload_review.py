"""The contamination review of data an agent uploads (``worker_add_data`` with ``content``).

A workspace or catalog file is registered first and meets the contamination review when a
submission would train on it (apps.integrity.submission_review). Bytes an agent made itself are
reviewed before they are registered, by the same overlap function on the same layers of the run's
policy and against the same tolerance: an upload that would already put more distinct sealed items
into the weights than the run allows is refused, and nothing of it is stored. The refusal is
recorded as the submission review records one — a ``BlockedAttempt`` in ``data_provenance`` with
code ``data_contaminated`` and the overlap evidence, and a ``submission.refused`` event naming the
tool — after the refused call's transaction has rolled back.

The Worker is told which of its own rows (line numbers) match; never which sealed item, nor its
text: the evidence with sample ids and spans is the BlockedAttempt's, for Reviewers and people.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import ApplicationError
from apps.integrity.choices import Subcategory
from apps.integrity.models import BlockedAttempt
from apps.integrity.overlap import rows_overlap, sealed_ids_over_tolerance
from apps.integrity.submission_parts import ContaminationUnchecked
from apps.integrity.submission_refusals import MAX_EVIDENCE_MATCHES, Refusal, record_refusal
from apps.research.models import ResearchNode, Run

TOOL = "worker_add_data"
# How many matching line numbers the refusal's message lists (the rest are counted).
MAX_NAMED_ROWS = 50


class UploadRefused(ApplicationError):
    """An upload whose rows match too many sealed items; :meth:`record` writes the BlockedAttempt."""

    status_code = 403

    def __init__(
        self,
        *,
        run: Run,
        node: ResearchNode,
        request: dict[str, Any],
        sha256: str,
        refusal: Refusal,
        lines: list[int],
    ) -> None:
        super().__init__(
            "data_contaminated",
            refusal.message,
            reasons=[refusal.public()],
            rows=lines[:MAX_NAMED_ROWS],
            rows_matched=len(lines),
            sha256=sha256,
        )
        self.run, self.node, self.request, self.sha256, self.refusal = run, node, request, sha256, refusal
        self.blocked_attempts: list[BlockedAttempt] | None = None

    def record(self) -> list[BlockedAttempt]:
        """Write the BlockedAttempt and the event, in their own transaction (once)."""
        if self.blocked_attempts is None:
            self.blocked_attempts = record_refusal(
                run=self.run, node=self.node, spec=self.request, spec_sha256=self.sha256,
                refusals=[self.refusal], tool=TOOL,
            )  # fmt: skip
        return self.blocked_attempts

    # The REST layer's hook for errors that carry evidence to keep after the rollback.
    record_after_rollback = record


def upload_review(
    *,
    run: Run,
    node: ResearchNode,
    rows: list[dict[str, Any]],
    sha256: str,
    policy: dict[str, Any],
    request: dict[str, Any],
) -> None:
    """Refuse (raise :class:`UploadRefused`) rows that match more sealed items than the run tolerates.

    ``policy`` is the run's (its tolerance and contamination layers, read fresh by the caller);
    ``request`` is what to record of the call (its arguments without the content). Raises
    :class:`ContaminationUnchecked` (503) when a required layer did not run and the layers that
    did found nothing over the tolerance: nothing is registered unchecked.
    """
    tolerance = policy.get("contamination_tolerance", 0) or 0
    overlap = rows_overlap(
        rows=rows, sha256=sha256, label=f"upload {sha256[:12]}", benchmark=run.benchmark, policy=policy
    )
    ids = overlap["sample_ids"]
    if not sealed_ids_over_tolerance(len(ids), overlap["sealed_items"], tolerance):
        if overlap["required_missing"]:
            raise ContaminationUnchecked(
                {name: overlap["layers"][name]["status"] for name in overlap["required_missing"]}
            )
        return
    lines = sorted({m["row"] + 1 for m in overlap["matches"]})
    named = ", ".join(str(n) for n in lines[:MAX_NAMED_ROWS])
    more = overlap["rows_matched"] - min(len(lines), MAX_NAMED_ROWS)
    refusal = Refusal(
        "data_contaminated",
        Subcategory.DATA_PROVENANCE,
        f"The upload overlaps the benchmark's sealed evaluation items: {overlap['rows_matched']} of "
        f"{len(rows)} rows match {overlap['items_matched']} sealed items (tolerance {tolerance}); lines "
        f"{named}{f' and {more} more' if more > 0 else ''}. Nothing was registered; remove those rows "
        "and upload again.",
        evidence={
            "dataset": f"upload:{sha256}",
            "rows_matched": overlap["rows_matched"],
            "items_matched": overlap["items_matched"],
            "by_kind": overlap["by_kind"],
            "tolerance": tolerance,
            "sealed_ids_total": len(ids),
            "layers": {name: layer["status"] for name, layer in overlap["layers"].items()},
            "matches": overlap["matches"][:MAX_EVIDENCE_MATCHES],
        },
    )
    raise UploadRefused(run=run, node=node, request=request, sha256=sha256, refusal=refusal, lines=lines)
