"""The run supervisor's tick: budgets, lost steps, new loops, integrity reconciliation, the end of the run.

One tick reads and moves a run across apps (the agent loops of research, the experiments and
their integrity findings, the run lifecycle of apps.flows.runs), so it is a flow; the agents
worker's task body (workers/agents/tasks.py) calls ``run_supervise`` and nothing else.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef

from apps.core.clock import db_now
from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES
from apps.experiments.models import Experiment
from apps.flows import runs
from apps.integrity.choices import Subcategory
from apps.integrity.models import IntegrityFinding
from apps.integrity.services import integrity_on_experiment_finished, integrity_on_report
from apps.research.agent_config import loop_config
from apps.research.agent_loops import (
    agent_loops_close,
    agent_loops_recover,
    agent_loops_sync,
    agent_loops_wake_on_results,
    run_supervise_next,
    run_supervise_tick_claim,
    run_supervisor_state_add,
    run_supervisor_state_get,
)
from apps.research.choices import RUN_TERMINAL_STATES, AgentMode, EdgeKind, NodeKind, NodeStatus, RunStatus
from apps.research.models import ResearchEdge, ResearchNode, Run
from apps.research.services import reviewer_add


def run_supervise(*, run_id: int, tick: int) -> None:
    """One supervisor tick: budgets, lost steps, new loops, integrity reconciliation, the end of the run."""
    config = loop_config()
    if not run_supervise_tick_claim(run_id=run_id, tick=tick):
        return
    run = Run.objects.select_related("benchmark").filter(pk=run_id).first()
    if run is None or run.status in RUN_TERMINAL_STATES:
        if run is not None:
            agent_loops_close(run=run, reason=f"the run is {run.status}")
        return
    if run.status != RunStatus.PAUSED:
        run = runs.run_budget_enforce(run=run)
        harness_reviews_request(run)
        agent_loops_sync(run=run)
        agent_loops_recover(run=run, config=config)
        agent_loops_wake_on_results(run=run)
        _integrity_reconcile(run)
        run = runs.run_advance(
            run=run, grace_seconds=config.final_grace_seconds, quiet_seconds=config.quiet_seconds,
            silent_seconds=config.silent_seconds,
        )  # fmt: skip
    if run.status in RUN_TERMINAL_STATES:
        agent_loops_close(run=run, reason=f"the run is {run.status}")
        return
    run_supervise_next(run=run, tick=tick + 1, countdown=config.supervise_seconds)


def harness_reviews_request(run: Run) -> list[ResearchNode]:
    """A Reviewer of ours for each finalized Worker of a Worker-only harness run.

    With ``--harness-main`` the harness's Main Agent asks for reviews (and our Reviewer loop plays
    them); without it no one would, so the supervisor asks for one per finalized Worker, as our
    own Main Agent does (unless the run has no Reviewers, or the harness plays them).
    """
    harness = (run.policy or {}).get("harness") or {}
    if (
        run.agent_mode != AgentMode.EXTERNAL
        or run.status != RunStatus.RUNNING
        or harness.get("plays_main")
        or harness.get("plays_reviewers")
        or (run.policy or {}).get("reviewers") is False
    ):
        return []
    reviewed = ResearchEdge.objects.filter(downstream__run=run, kind=EdgeKind.REVIEW_SCOPE).values("upstream_id")
    finalized = ResearchNode.objects.filter(run=run, kind=NodeKind.WORKER, status=NodeStatus.FINALIZED).exclude(
        pk__in=reviewed)  # fmt: skip
    added = []
    for worker in finalized.order_by("pk"):
        experiments = list(Experiment.objects.filter(owner=worker).order_by("pk").values_list("handle", flat=True))
        work = ", ".join(experiments) or "no experiments"
        question = (f"Review {worker.handle}'s work ({work}): do the results hold up? Check data provenance "
                    "and overlap with sealed items, and compare them.")  # fmt: skip
        added.append(reviewer_add(run=run, question=question, scope=[worker], actor="supervisor"))
    return added


def _integrity_reconcile(run: Run, *, settle_seconds: float = 30.0) -> None:
    """Make sure every ended experiment gets its post-checks and every finished Worker its reporting checks.

    The pipeline and Worker finalization are the primary callers of the integrity hooks; this is the
    orchestrator's reconciliation (like ``state_sync_results`` for jobs), asking once per experiment
    that has no findings a while after it ended, and once per finalized Worker. The checks are
    idempotent, so a duplicate request only repeats work.
    """
    settled = db_now() - timedelta(seconds=settle_seconds)
    asked = run_supervisor_state_get(run=run, key="integrity_checked")
    # "Unchecked": no finding of the first (non-reporting) check, whatever the reporting checks left.
    checked = IntegrityFinding.objects.filter(experiment=OuterRef("pk"), subcategory=Subcategory.WEIGHT_PROVENANCE)
    ended = (
        Experiment.objects.filter(run=run, status__in=EXPERIMENT_TERMINAL_STATES, updated_at__lt=settled,
                                  jobs__started_at__isnull=False)
        .exclude(Exists(checked))
        .exclude(handle__in=asked)
        .distinct()
    )  # fmt: skip
    handles = []
    for experiment in ended:
        with transaction.atomic():
            integrity_on_experiment_finished(experiment=experiment)
        handles.append(experiment.handle)
    if handles:
        run_supervisor_state_add(run=run, key="integrity_checked", values=handles)
    reported = run_supervisor_state_get(run=run, key="integrity_reported")
    finalized = ResearchNode.objects.filter(run=run, kind=NodeKind.WORKER, status=NodeStatus.FINALIZED).exclude(
        handle__in=reported)  # fmt: skip
    workers = []
    for node in finalized:
        with transaction.atomic():
            integrity_on_report(run=run, node=node)
        workers.append(node.handle)
    if workers:
        run_supervisor_state_add(run=run, key="integrity_reported", values=workers)
