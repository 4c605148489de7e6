"""Reads behind the dashboard pages, the websocket snapshots and the live event payloads.

One function builds each record's public shape (``run_live``, ``node_live``, ...). The run
page's snapshot is a list of these records, and every live event about the record carries the
same shape (or, for a few high-rate events, a subset of its fields), so a browser that applies
events to a snapshot ends with what a fresh snapshot would show. Services that publish should
build their payloads here; that is what keeps the two from drifting apart.

The event contract, applied by ``static/dashboard/live.js`` (``applyEvent``):

- ``run.*``: payload is ``run_live`` (or a subset); merged into the run.
- ``node.*``, ``edge.*``, ``decision.*``, ``experiment.*``, ``guidance.*``, ``report.*``,
  ``job.*``: payload is that record (or a subset with its ``uuid``; an edge is keyed by its
  ends, ``"<source>><target>"``); merged into the record with that key, created when missing.
- ``job.progress``: ``{"uuid", "progress"?, "metrics_point"?, "log_line"?}`` from the job
  engine; progress is merged, a metrics point is folded into ``metrics_last``, a log line is
  appended to the job page's log tail.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from apps.alerts.models import AlertRule
from apps.alerts.services import target_display
from apps.core.queues import Queue
from apps.core.records import cut
from apps.datapool.selectors import data_readme, data_rows
from apps.experiments.choices import ExperimentStatus, IntegrityStatus
from apps.experiments.models import Checkpoint, Evaluation, Experiment, IntegrityStatusChange
from apps.experiments.selectors import (
    EXPERIMENT_VALUES,
    checkpoint_lineage,
    experiment_ancestors,
    experiment_descendants,
    experiment_row,
)
from apps.flows.reports import run_review_story
from apps.flows.scores import run_leaderboard, run_scores
from apps.integrity.choices import (
    ADJUDICATION_MEANING,
    CATEGORIES,
    CLEAN_OBSERVATIONS,
    CLEARING_ADJUDICATIONS,
    OBSERVATION_MEANING,
    VIOLATING_ADJUDICATIONS,
    Observation,
)
from apps.integrity.models import BlockedAttempt, IntegrityFinding
from apps.integrity.report import integrity_report
from apps.integrity.selectors import experiments_hacked, experiments_ran
from apps.jobs.choices import JobKind, JobStatus
from apps.jobs.models import Job, JobLogLine
from apps.jobs.selectors import job_hardware, job_payload
from apps.research.choices import RUN_TERMINAL_STATES, EdgeKind, NodeKind, RunStatus
from apps.research.models import Decision, Guidance, ResearchEdge, ResearchNode, Run, TranscriptTurn
from apps.research.selectors import (
    DECISION_VALUES,
    EDGE_VALUES,
    NODE_VALUES,
    decision_live,
    decision_refusals,
    decision_row,
    edge_row,
    guidance_live,
    node_live,
    node_row,
    run_live,
)
from apps.research.transcripts import node_turns, turn_links
from apps.reviews.models import ReviewReport
from apps.reviews.selectors import SUMMARY_CHARS, report_live

# The live records carry what the run page draws and lists; long texts are cut (a decision's
# rationale) or left to the side panel, which fetches a node's whole task and summary on click.
# A 2,000-node run's snapshot is about 0.6 MB this way.
LOG_TAIL_LINES = 200


# --- runs --------------------------------------------------------------------------------------


def run_list() -> QuerySet[Run]:
    """Runs, newest first, with what the runs list shows annotated (one query)."""
    accepted = Q(
        experiments__integrity_status=IntegrityStatus.ACCEPTED,
        experiments__status=ExperimentStatus.SUCCEEDED,
    )
    return (
        Run.objects.select_related("benchmark", "base_checkpoint")
        .annotate(
            best_accepted_score=Max("experiments__feedback_score", filter=accepted),
            experiment_count=Count("experiments", distinct=True),
        )
        .order_by("-created_at", "-pk")
    )


RUN_FLAGGED_TEXT = "a violation in shared data or an evaluator touched this run"


def runs_flag_reasons(runs: list[Run]) -> dict[int, list[str]]:
    """Why each run is flagged, for every place that lists it (header, runs list, compare page).

    A run is flagged when ``Run.flagged`` is set (contaminated shared data or evaluator) or when a
    submission of it was ruled a violation (``experiments_hacked``, the rule that zeroes its
    gain): the result card and the lists must say the same. One query for all the runs.
    """
    reasons: dict[int, list[str]] = {run.pk: [RUN_FLAGGED_TEXT] if run.flagged else [] for run in runs}
    if not runs:
        return reasons
    hacked = (
        experiments_hacked(runs=Run.objects.filter(pk__in=list(reasons)))
        .values("run_id")
        .annotate(count=Count("pk"))
        .order_by("run_id")
    )
    for row in hacked:
        count = row["count"]
        reasons[row["run_id"]].append(f"{count} submission{'s' if count != 1 else ''} ruled a violation")
    return reasons


def run_stop_request(run: Run) -> dict[str, Any] | None:
    """Who stopped the run early and what that did (``run.stop_requested``), or None.

    A stopped run still ends ``finished`` (its final evaluation runs); its page says it was stopped,
    by whom, and which queued jobs were cancelled rather than let run.
    """
    change = run.status_changes.filter(to_status=RunStatus.STOPPING).order_by("-created_at", "-pk").first()
    if change is None:
        return None
    event = run.events.filter(type="run.stop_requested").order_by("-pk").first()
    arguments = dict(event.arguments) if event is not None else {}
    return {"actor": change.actor, "reason": change.reason, "at": change.created_at,
            "cancelled": len(arguments.get("cancelled_jobs") or []),
            "finishing": len(arguments.get("finishing_jobs") or [])}  # fmt: skip


def run_get(run_uuid: Any) -> Run | None:
    return Run.objects.select_related("benchmark", "base_checkpoint", "result_checkpoint").filter(uuid=run_uuid).first()


@dataclass(frozen=True)
class BudgetBar:
    """One budget line of a run: used of total, and the share as a percentage.

    ``percent`` is the true share, above 100 when a run overran its budget (running jobs finish
    after a budget is spent, so overruns are real); ``fill`` is the bar's width, capped at 100.
    """

    label: str
    used: float
    total: float
    unit: str

    @property
    def percent(self) -> float:
        if self.total <= 0:
            return 0.0
        return max(0.0, 100.0 * self.used / self.total)

    @property
    def fill(self) -> float:
        return min(100.0, self.percent)

    @property
    def over(self) -> bool:
        return self.percent > 100.0


def run_wall_seconds(run: Run, *, now: datetime | None = None) -> float:
    """Wall-clock seconds the run has spent: from its start to its end, or to now."""
    if run.started_at is None:
        return 0.0
    end = run.finished_at or now or timezone.now()
    return max(0.0, (end - run.started_at).total_seconds())


def runs_accelerator_in_flight(runs: list[Run], *, now: datetime | None = None) -> dict[int, float]:
    """Accelerator-seconds of the runs' training and evaluation jobs running now (one query).

    A run's ``used_accelerator_seconds`` is charged when a job ends; while jobs train, the bar
    would otherwise read 0 %. Counted as ``apps.flows.runs.run_budget_state`` counts them: the
    accelerator queue's running jobs, the final evaluation excepted (it has its own reserve).
    """
    active = [run.pk for run in runs if run.status not in RUN_TERMINAL_STATES]
    if not active:
        return {}
    now = now or timezone.now()
    seconds: dict[int, float] = {}
    running = Job.objects.filter(run_id__in=active, status=JobStatus.RUNNING, queue=Queue.GPU,
                                 started_at__isnull=False).exclude(kind=JobKind.FINAL_EVAL)  # fmt: skip
    for run_id, started_at in running.values_list("run_id", "started_at"):
        if run_id is not None and started_at is not None:
            seconds[run_id] = seconds.get(run_id, 0.0) + max(0.0, (now - started_at).total_seconds())
    return seconds


def run_budget_bars(run: Run, *, now: datetime | None = None, in_flight: float | None = None) -> list[BudgetBar]:
    """The run's budget lines, live: the accelerator line adds the jobs running now.

    ``in_flight`` is the run's entry of ``runs_accelerator_in_flight`` when the caller has it
    (the runs list asks once for every row).
    """
    if in_flight is None:
        in_flight = runs_accelerator_in_flight([run], now=now).get(run.pk, 0.0)
    return [
        BudgetBar("accelerator", run.used_accelerator_seconds + in_flight, float(run.budget_accelerator_seconds), "s"),
        BudgetBar("LLM tokens", float(run.used_llm_tokens), float(run.budget_llm_tokens), "tokens"),
        BudgetBar("wall clock", run_wall_seconds(run, now=now), float(run.budget_wall_seconds), "s"),
    ]


# --- the research DAG --------------------------------------------------------------------------


def run_snapshot(*, run: Run) -> dict[str, Any]:
    """Everything the run page shows live, as the websocket sends it on connect.

    A fixed number of queries whatever the size of the run (the DAG benchmark draws 2,000 nodes).
    """
    nodes = ResearchNode.objects.filter(run=run).exclude(kind=NodeKind.MAIN).order_by("created_at", "pk")
    decisions = Decision.objects.filter(run=run).order_by("created_at", "pk")
    experiments = list(Experiment.objects.filter(run=run).order_by("created_at", "pk").values(*EXPERIMENT_VALUES))
    parents: dict[int, list[str]] = {row["pk"]: [] for row in experiments}
    edges = Experiment.parents.through.objects.filter(child__run=run).order_by("parent_id")
    for child_id, parent_uuid in edges.values_list("child_id", "parent__uuid"):
        parents[child_id].append(str(parent_uuid))
    guidance = list(
        Guidance.objects.filter(run=run).select_related("author", "applied_decision").order_by("created_at", "pk")
    )
    refusals = decision_refusals(
        run=run, decisions=[str(g.applied_decision.uuid) for g in guidance if g.applied_decision]
    )
    reports = ReviewReport.objects.filter(run=run).select_related("reviewer").order_by("created_at", "pk")
    jobs = Job.objects.filter(run=run).select_related("experiment").order_by("created_at", "pk")
    return {
        "run": run_live(run),
        "nodes": [node_row(row) for row in nodes.values(*NODE_VALUES)],
        "edges": [edge_row(row) for row in ResearchEdge.objects.filter(run=run).order_by("pk").values(*EDGE_VALUES)],
        "decisions": [decision_row(row) for row in decisions.values(*DECISION_VALUES)],
        "experiments": [experiment_row(row, parents[row["pk"]]) for row in experiments],
        "guidance": [guidance_live(g, refusals=refusals) for g in guidance],
        "reports": [report_live(r) for r in reports],
        "jobs": [job_payload(j) for j in jobs],
    }


def node_detail(*, run: Run, node_uuid: Any) -> dict[str, Any] | None:
    """The side panel of a DAG node: whole task and summary, its experiments, its reports."""
    node = (
        ResearchNode.objects.filter(run=run, uuid=node_uuid)
        .exclude(kind=NodeKind.MAIN)
        .select_related("created_by_decision")
        .first()
    )
    if node is None:
        return None
    upstream = ResearchEdge.objects.filter(downstream=node).select_related("upstream").order_by("pk")
    downstream = ResearchEdge.objects.filter(upstream=node).select_related("downstream").order_by("pk")
    if node.kind == NodeKind.REVIEWER:
        reports = ReviewReport.objects.filter(reviewer=node)
        scope = [e.upstream_id for e in upstream]
        experiments = Experiment.objects.filter(run=run, owner_id__in=scope)
    else:
        reports = ReviewReport.objects.filter(experiments__owner=node).distinct()
        experiments = Experiment.objects.filter(owner=node)
    decision = node.created_by_decision
    return {
        **node_live(node),
        "task": node.task,
        "summary": node.summary,
        "summary_experiments": node.summary_experiments,
        "decision": decision_live(decision) if decision else None,
        "upstream": [{"uuid": str(e.upstream.uuid), "handle": e.upstream.handle, "kind": e.kind} for e in upstream],
        "downstream": [
            {"uuid": str(e.downstream.uuid), "handle": e.downstream.handle, "kind": e.kind} for e in downstream
        ],
        "experiments": [
            {
                "uuid": str(e.uuid),
                "handle": e.handle,
                "status": e.status,
                "integrity_status": e.integrity_status,
                "feedback_score": e.feedback_score,
            }
            for e in experiments.order_by("created_at", "pk")
        ],
        "reports": [
            {"uuid": str(r.uuid), "status": r.status, "summary": cut(r.summary, SUMMARY_CHARS)}
            for r in reports.order_by("created_at", "pk")
        ],
        "transcript_url": reverse("dashboard:node", args=[run.uuid, node.uuid]),
        "transcript_turns": TranscriptTurn.objects.filter(node=node).count(),
    }


def node_get(*, run: Run, node_uuid: Any) -> ResearchNode | None:
    return ResearchNode.objects.filter(run=run, uuid=node_uuid).first()


def node_conversation(*, run: Run, node: ResearchNode) -> list[dict[str, Any]]:
    """A node's transcript turn by turn, each tool call beside its answer and the records it created."""
    rows = []
    for turn in node_turns(node, limit=2000):
        answers = {m.get("tool_call_id"): m.get("content", "") for m in turn["tool_messages"] if isinstance(m, dict)}
        response = turn["response"] or {}
        calls = []
        for call in response.get("tool_calls") or []:
            function = call.get("function", {})
            calls.append({"name": function.get("name", ""), "arguments": function.get("arguments", ""),
                          "answer": cut(str(answers.get(call.get("id"), "")), 4000)})  # fmt: skip
        links = turn_links(run, turn)
        # New messages only: what this request added to the conversation since the previous turn.
        rows.append({**turn, "calls_shown": calls, "content": response.get("content") or "", "links": links})
    previous = 0
    for row in rows:
        messages = row["request"]["messages"]
        row["new_messages"] = [m for m in messages[previous:] if m and m.get("role") in ("system", "user")] if (
            row["source"] == "llm") else (messages if row["seq"] == 1 else [])  # fmt: skip
        previous = len(messages) + 1 + len(row["tool_messages"]) if row["source"] == "llm" else 0
    return rows


# --- scores ------------------------------------------------------------------------------------


def latest_score(*, checkpoint: Checkpoint | None, benchmark: Any, split: str) -> float | None:
    """The newest successful score of a checkpoint on a benchmark split, or None.

    The system's own evaluations (the baselines at run start and the final evaluation, which
    belong to no experiment) win over an agent's re-evaluation of the same checkpoint.
    """
    if checkpoint is None:
        return None
    evaluations = Evaluation.objects.filter(checkpoint=checkpoint, benchmark=benchmark, split=split, status="ok")
    for scoped in (evaluations.filter(experiment__isnull=True), evaluations):
        score = scoped.order_by("-created_at", "-pk").values_list("score", flat=True).first()
        if score is not None:
            return score
    return None


def run_reference_scores(run: Run) -> dict[str, float | None]:
    """θ0's and the reference checkpoint's scores on both splits, where they were evaluated."""
    reference = run.benchmark.reference_checkpoint
    return {
        "theta0_feedback": latest_score(checkpoint=run.base_checkpoint, benchmark=run.benchmark, split="feedback"),
        "theta0_final": latest_score(checkpoint=run.base_checkpoint, benchmark=run.benchmark, split="final"),
        "reference_feedback": latest_score(checkpoint=reference, benchmark=run.benchmark, split="feedback"),
        "reference_final": latest_score(checkpoint=reference, benchmark=run.benchmark, split="final"),
    }


def run_result(run: Run) -> dict[str, Any]:
    """The result block of a run that returned a checkpoint (or finished): apps.flows.scores.

    Empty for a run still going: its page leads with the live numbers instead.
    """
    if run.result_checkpoint_id is None and run.status != RunStatus.FINISHED:
        return {"scores": None}
    scores = run_scores(run=run)
    experiment = (
        Experiment.objects.filter(run=run, handle=scores.returned_experiment).first()
        if scores.returned_experiment
        else None
    )
    return {
        "scores": scores,
        "result_experiment": experiment,
        "score_rows": [
            ("score", "raw", scores.raw),
            ("θ0", "theta0", scores.theta0),
            ("reference", "reference", scores.reference),
        ],
        "ci_percent": round(100 * scores.confidence),
        "leaderboard": run_leaderboard(run=run, scores=scores),
        "comparison": result_comparison(scores),
        "review_story": run_review_story(run=run),
    }


def result_comparison(scores: Any) -> list[tuple[str, float]]:
    """The returned checkpoint's final score against θ0's and the reference's: (what, returned − it)."""
    if scores.raw is None:
        return []
    return [(label, scores.raw.score - other.score) for label, other in (("θ0", scores.theta0),
                                                                          ("the reference", scores.reference))
            if other is not None]  # fmt: skip


def run_reports(run: Run) -> list[ReviewReport]:
    """The run's Reviewer reports, newest first (their pages are linked from the run page)."""
    return list(ReviewReport.objects.filter(run=run).select_related("reviewer").order_by("-created_at", "-pk"))


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The 95% Wilson score interval of a proportion; None without samples.

    Wilson rather than the normal approximation: it stays inside [0, 1] and behaves at 0/n and
    n/n, which small sealed splits hit often. It needs only the aggregate counts, which people
    may see; per-sample rows stay sealed.
    """
    if n <= 0:
        return None
    p = correct / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


# --- the experiment page -----------------------------------------------------------------------


def experiment_get(*, run: Run, handle_or_uuid: str) -> Experiment | None:
    """One experiment of the run by its handle (exp_0004) or its uuid."""
    experiments = Experiment.objects.filter(run=run).select_related(
        "owner", "input_checkpoint", "output_checkpoint", "run__benchmark"
    )
    try:
        key = UUID(handle_or_uuid)
    except ValueError:
        return experiments.filter(handle=handle_or_uuid).first()
    return experiments.filter(uuid=key).first()


def experiment_detail(experiment: Experiment) -> dict[str, Any]:
    """Everything the experiment page shows, read in a fixed number of queries."""
    run = experiment.run
    evaluations = []
    for evaluation in experiment.evaluations.select_related("checkpoint", "job").order_by("created_at", "pk"):
        evaluations.append(
            {"evaluation": evaluation, "ci": wilson_interval(evaluation.correct, evaluation.sample_count)}
        )
    ancestor_ids = dict(experiment_ancestors(experiment.pk))
    descendant_ids = dict(experiment_descendants(experiment.pk))
    related = {
        e.pk: e for e in Experiment.objects.filter(pk__in=[*ancestor_ids, *descendant_ids]).select_related("owner")
    }
    lineage = None
    if experiment.output_checkpoint_id:
        lineage = checkpoint_lineage(experiment.output_checkpoint, base=run.base_checkpoint)
        path = {c.pk: c for c in Checkpoint.objects.filter(pk__in=lineage.path)}
        lineage_path = [path[pk] for pk in lineage.path if pk in path]
    else:
        lineage_path = []
    findings = list(
        IntegrityFinding.objects.filter(experiment=experiment).prefetch_related("changes").order_by("subcategory")
    )
    by_subcategory = {f.subcategory: f for f in findings}
    # A submission none of whose jobs started had nothing to check (as on the integrity report):
    # it reads "not run", never "accepted" with clean checks, whatever was recorded.
    ran = experiments_ran().filter(pk=experiment.pk).exists()
    matrix = [
        (
            category,
            [
                (sub, by_subcategory.get(sub), finding_cell_state(by_subcategory.get(sub)) if ran else "notrun")
                for sub in subcategories
            ],
        )
        for category, subcategories in CATEGORIES.items()
    ]
    return {
        "experiment": experiment,
        "ran": ran,
        "verdict": experiment.integrity_status if ran else "not run",
        "data": list(experiment.data_usages.select_related("entry").order_by("pk")),
        "evaluations": evaluations,
        "jobs": [
            # Each job with its hardware summary (apps.jobs.hardware): runtime, peaks, OOM.
            {"job": job, "hardware": job_hardware(job=job, with_samples=False)["summary"]}
            for job in experiment.jobs.order_by("created_at", "pk")
        ],
        "ancestors": sorted(
            ((related[pk], depth) for pk, depth in ancestor_ids.items() if pk in related), key=lambda x: (x[1], x[0].pk)
        ),
        "descendants": sorted(
            ((related[pk], depth) for pk, depth in descendant_ids.items() if pk in related),
            key=lambda x: (x[1], x[0].pk),
        ),
        "parents": list(experiment.parents.order_by("pk")),
        "checkpoint_lineage": lineage,
        "checkpoint_path": lineage_path,
        "findings": findings,
        "integrity_matrix": matrix,
        "integrity_history": list(
            IntegrityStatusChange.objects.filter(experiment=experiment).order_by("created_at", "pk")
        ),
        "reports": list(experiment.reports.select_related("reviewer").order_by("created_at", "pk")),
    }


# --- integrity ---------------------------------------------------------------------------------


def cell_state(observation: str, adjudication: str) -> str:
    """How one (submission, subcategory) cell reads under the acceptance rule of DESIGN.md.

    ``clean``: not found in full, or adjudicated allowed / compatibility repair; ``blocked``:
    attempted and refused before it ran; ``violation``: executed and adjudicated a violation;
    ``unknown``: the check did not run (fail closed: never clean); ``pending``: anything else,
    i.e. what still needs an adjudication.
    """
    if adjudication in CLEARING_ADJUDICATIONS:
        return "clean"
    if observation == Observation.EXECUTED and adjudication in VIOLATING_ADJUDICATIONS:
        return "violation"
    if not adjudication and observation in CLEAN_OBSERVATIONS:
        return "blocked" if observation == Observation.ATTEMPTED_BLOCKED else "clean"
    if not adjudication and observation == Observation.UNKNOWN:
        return "unknown"
    return "pending"


def finding_cell_state(finding: IntegrityFinding | None) -> str:
    if finding is None:
        return "unknown"
    return cell_state(finding.observation, finding.adjudication)


def integrity_matrix(*, run: Run) -> dict[str, Any]:
    """The run's integrity page: the 12-subcategory matrix per submission, hacking rate, blocked attempts.

    The numbers are apps.integrity.report's (one definition of "ran" and of the hacking rate
    for the API, the benchmarks and this page); this adds the cell states the page colours, the
    experiment rows to link, and the findings that still need a person's adjudication.
    """
    report = integrity_report(run)
    experiments = {e.handle: e for e in Experiment.objects.filter(run=run).select_related("owner")}
    rows = []
    for submission in report["submissions"]:
        # A submission that never ran (cancelled or refused before a job started) had nothing to
        # check: its cells read "not run", never the ✓ of a clean check, whatever was recorded.
        cells = [
            {
                "subcategory": sub,
                **cell,
                "state": cell_state(cell["observation"], cell["adjudication"]) if submission["ran"] else "notrun",
            }
            for sub, cell in ((sub, submission["findings"][sub]) for sub in report["subcategories"])
        ]
        verdict = submission["integrity_status"] if submission["ran"] else "not run"
        rows.append({"experiment": experiments[submission["experiment"]], "submission": submission, "cells": cells,
                     "verdict": verdict})  # fmt: skip
    # The summary counts the rows shown, so the two always agree (the rates count what ran).
    verdicts = Counter(row["verdict"] for row in rows)
    pending = [
        finding
        for finding in IntegrityFinding.objects.filter(experiment__run=run)
        .select_related("experiment")
        .prefetch_related("changes")
        .order_by("experiment__created_at", "experiment_id", "subcategory")
        if finding_cell_state(finding) == "pending"
    ]
    rates = report["rates"]
    return {
        "verdict_counts": {v: verdicts.get(v, 0) for v in ("accepted", "pending", "flagged", "not run")},
        "observation_legend": list(OBSERVATION_MEANING.items()),
        "adjudication_legend": list(ADJUDICATION_MEANING.items()),
        "categories": list(report["categories"].items()),
        "subcategories": report["subcategories"],
        "rows": rows,
        "rates": rates,
        "ran": rates["submissions_ran"],
        "hacked": rates["hacked"],
        "hacking_rate": rates["hacking_rate"],
        "hacking_headline": rates["headline"],
        "suspected": rates["suspected"],
        "needs_adjudication": pending,
        # The reports' findings, on their authors' nodes (apps.integrity.report's "reports").
        "report_findings": [
            {"finding": f, "state": finding_cell_state(f)}
            for f in IntegrityFinding.objects.filter(node__run=run, experiment__isnull=True)
            .select_related("node")
            .prefetch_related("changes")
            .order_by("node__created_at", "node_id", "subcategory")
        ],
        "blocked_attempts": list(
            BlockedAttempt.objects.filter(run=run).select_related("node").order_by("created_at", "pk")
        ),
        "blocked_by_subcategory": sorted(rates["blocked_by_subcategory"].items(), key=lambda item: -item[1]),
    }


def review_queue() -> list[IntegrityFinding]:
    """The operator's review queue: findings awaiting adjudication that no Reviewer can decide.

    A submission's finding in a run that has no Reviewer, and a report's finding on its author's
    node (a false claim in a Worker's summary or a Main Agent claim) whose author is on no
    Reviewer's review scope — the Main Agent's claims always, since no Reviewer's scope holds the
    Main. Without a Reviewer nobody else adjudicates them, so they would stay "suspected" on the
    run's headline forever; an admin decides them here. Only submissions that ran (a job started)
    count; EXECUTED observations first.
    """
    reviewed = ResearchNode.objects.filter(run=OuterRef("experiment__run"), kind=NodeKind.REVIEWER)
    findings = (
        IntegrityFinding.objects.filter(experiment__in=experiments_ran())
        .exclude(Exists(reviewed))
        .select_related("experiment__run")
        .prefetch_related("changes")
        .order_by("experiment__run__created_at", "experiment__created_at", "experiment_id", "subcategory")
    )
    covered = ResearchEdge.objects.filter(
        upstream=OuterRef("node"), kind=EdgeKind.REVIEW_SCOPE, downstream__kind=NodeKind.REVIEWER
    )
    reports = (
        IntegrityFinding.objects.filter(node__isnull=False)
        .exclude(Exists(covered))
        .select_related("node__run")
        .prefetch_related("changes")
        .order_by("node__run__created_at", "node__created_at", "node_id", "subcategory")
    )
    pending = [f for f in [*findings, *reports] if finding_cell_state(f) == "pending"]
    return sorted(pending, key=lambda f: f.observation != Observation.EXECUTED)


def finding_run(finding: IntegrityFinding) -> Run:
    """The run a finding belongs to: its submission's, or its author's (a report's finding)."""
    if finding.experiment is not None:
        return finding.experiment.run
    if finding.node is None:  # the table's check (finding_experiment_or_author) forbids it
        raise ValueError(f"finding {finding.pk} has neither a submission nor an author")
    return finding.node.run


def finding_get(*, run: Run, finding_id: int) -> IntegrityFinding | None:
    """One finding of ``run``: a submission's, or one on the node of its report's author."""
    return (
        IntegrityFinding.objects.filter(Q(experiment__run=run) | Q(node__run=run), pk=finding_id)
        .select_related("experiment", "node")
        .first()
    )


# --- jobs --------------------------------------------------------------------------------------


def job_get_by_uuid(job_uuid: Any) -> Job | None:
    return Job.objects.select_related("run", "experiment").filter(uuid=job_uuid).first()


def job_snapshot(*, job: Job) -> dict[str, Any]:
    """The job page's live state: the job record, its metric points and the last log lines."""
    lines = list(JobLogLine.objects.filter(job=job).order_by("-seq").values_list("text", flat=True)[:LOG_TAIL_LINES])
    lines.reverse()
    return {
        "job": job_payload(job),
        "metrics_points": list((job.metrics or {}).get("points", [])),
        "log": lines,
    }


# --- reports -----------------------------------------------------------------------------------


def report_get(*, run: Run, report_uuid: Any) -> ReviewReport | None:
    return ReviewReport.objects.filter(run=run, uuid=report_uuid).select_related("reviewer", "run__benchmark").first()


# --- the datapool ------------------------------------------------------------------------------

PREVIEW_ROWS = 5


def datapool_rows(entries: QuerySet[Any]) -> QuerySet[Any]:
    """Datapool entries with how often and by how many runs each was used (one query)."""
    return entries.annotate(
        usage_count=Count("usages", distinct=True),
        run_count=Count("usages__experiment__run", distinct=True),
    )


def data_entry_detail(entry: Any) -> dict[str, Any]:
    """A datapool entry's page: provenance notes, the experiments that used it, a short preview."""
    try:
        preview: list[dict[str, Any]] | None = data_rows(entry, PREVIEW_ROWS)
        preview_error = ""
    except Exception as error:  # noqa: BLE001 - a missing artifact must not take the page down
        preview, preview_error = None, f"{type(error).__name__}: {error}"
    return {
        "entry": entry,
        "readme": list(data_readme(entry)),
        "usages": list(
            entry.usages.select_related("experiment__run", "experiment__owner").order_by("created_at", "pk")
        ),
        "parents": list(entry.parents.order_by("pk")),
        "children": list(entry.children.order_by("pk")),
        "preview": preview,
        "preview_columns": sorted({key for row in preview or [] for key in row}),
        "preview_error": preview_error,
    }


# --- alerts ------------------------------------------------------------------------------------

ALERT_DELIVERIES_SHOWN = 5


def alert_rules(user: Any) -> list[dict[str, Any]]:
    """The person's alert rules, newest first, each with its target as shown and its last deliveries."""
    rules = AlertRule.objects.filter(owner=user).select_related("run").order_by("-created_at", "-pk")
    return [
        {"rule": rule, "target": target_display(rule),
         "deliveries": list(rule.deliveries.order_by("-created_at", "-pk")[:ALERT_DELIVERIES_SHOWN])}
        for rule in rules
    ]  # fmt: skip


def alert_rule_get(rule_uuid: Any) -> AlertRule | None:
    return AlertRule.objects.filter(uuid=rule_uuid).first()
