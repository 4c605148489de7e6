"""What the agents report about their experiments: a Worker's final summary, the Main Agent's claims.

Each is recorded in the research app (the node finalized, the claim's next revision) and makes
the reporting checks of the experiments it cites re-run (apps.integrity: selection, attribution,
disclosure, on commit), so the step crosses apps and lives in the process layer.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Max

from apps.core.errors import ApplicationError
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.integrity.services import integrity_on_report
from apps.research.choices import NodeKind
from apps.research.models import OptimizerClaim, ResearchNode, Run
from apps.research.services import main_trigger, node_finalize


def worker_finalize(*, node: ResearchNode, summary: str, experiments: list[str], actor: str) -> ResearchNode:
    """The Worker's own finalization: its summary must cite its own experiments; wakes the Main Agent."""
    if node.kind != NodeKind.WORKER:
        raise ApplicationError("not_a_worker", f"{node.handle} is not a Worker.")
    cited = set(experiments)
    own = set(Experiment.objects.filter(owner=node, handle__in=cited).values_list("handle", flat=True))
    foreign = sorted(cited - own)
    if foreign:
        # Whose an experiment is comes from the records, not the request's shape: 409, as for state.
        raise ApplicationError(
            "foreign_experiment",
            f"A Worker's summary cites only its own experiments; not {', '.join(foreign)}.",
            status=409,
            experiments=foreign,
        )
    if not cited and Experiment.objects.filter(owner=node).exists():
        # The Worker's records, not the request's shape, make the citation necessary: 409, as for state.
        raise ApplicationError(
            "citation_required", "Cite the experiments your summary rests on (their handles).", status=409
        )
    with transaction.atomic():
        finalized = node_finalize(node=node, summary=summary, experiments=sorted(cited), actor=actor)
        # The summary is a report: its reporting checks (selection, attribution, disclosure) re-run.
        integrity_on_report(run=finalized.run, node=finalized)
        main_trigger(run=finalized.run, trigger="worker_finalize", node=finalized, actor=actor)
    return finalized


def claim_revise(*, run: Run, key: str, text: str, evidence: list[str], actor: str = "main") -> OptimizerClaim:
    """Add the next revision of a research claim; earlier revisions stay as its history."""
    with transaction.atomic():
        # Revisions are numbered under the run lock; the unique (run, key, revision) backs it up.
        locked = Run.objects.select_for_update().get(pk=run.pk)
        latest = OptimizerClaim.objects.filter(run=locked, key=key).aggregate(m=Max("revision"))["m"] or 0
        claim = OptimizerClaim(run=locked, key=key, revision=latest + 1, text=text, evidence=evidence)
        claim.full_clean()
        claim.save()
        event_append(
            run=locked,
            type="claim.revised",
            actor=actor,
            role="main",
            arguments={"key": key, "revision": claim.revision, "text": text, "evidence": evidence},
        )
        integrity_on_report(run=locked, handles=evidence, text=text)
    return claim
