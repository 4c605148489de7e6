"""Reads of runs and the research DAG, and the public shape of each record.

One function builds each record's public shape (``run_live``, ``node_live``, ...). The run
page's snapshot (apps/dashboard/selectors.py) is a list of these records, and every live event
that the research services publish carries the same shape, so a browser that applies events to
a snapshot ends with what a fresh snapshot would show.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max, Q

from apps.core.records import cut, iso, text_or_none
from apps.experiments.models import Event
from apps.jobs.choices import JobStatus
from apps.jobs.models import Job
from apps.research.agent_config import DEFAULT_PROFILE, DEFAULT_SEARCH_POLICY
from apps.research.choices import AgentMode, NodeKind, NodeStatus
from apps.research.models import Decision, Guidance, Prediction, ResearchEdge, ResearchNode, Run

# Long texts are cut (a decision's rationale) or left to the side panel, which fetches a node's
# whole task and summary on click. A 2,000-node run's snapshot is about 0.6 MB this way.
RATIONALE_CHARS = 240

# The research DAG can have thousands of records, so the snapshot reads rows (values()), not
# model instances; a live event reads its one row the same way, through the same row -> record
# function.
NODE_VALUES = ("uuid", "handle", "kind", "status", "created_by_decision__uuid", "created_at", "finalized_at")
EDGE_VALUES = ("upstream__uuid", "downstream__uuid", "kind")
# The ablation switches (policy key, arm label, value of the full system), as start_run names them.
ABLATION_SWITCHES = (("reviewers", "no-reviewer", True), ("serial_workers", "serial-workers", False))
DECISION_VALUES = ("uuid", "kind", "trigger", "rationale", "subject__uuid", "created_at")


def run_llm_profile(run: Run) -> str:
    """The LLM endpoint profile an LLM run's agents call (run policy ``llm_profile``)."""
    return str((run.policy or {}).get("llm_profile") or DEFAULT_PROFILE)


def run_ablation(run: Run) -> str:
    """The paper's ablation arm a run belongs to, from its policy switches."""
    policy = run.policy or {}
    off = [label for key, label, default in ABLATION_SWITCHES if bool(policy.get(key, default)) != default]
    arm = " + ".join(off) if off else "full"
    # Another search policy than the default is its own arm: full under uct is "full · uct" (issue 32).
    return arm if run.search_policy == DEFAULT_SEARCH_POLICY else f"{arm} · {run.search_policy}"


def run_live(run: Run) -> dict[str, Any]:
    """The run record of the run page's snapshot and of ``run.*`` events."""
    return {
        "uuid": str(run.uuid),
        "name": run.name,
        "status": run.status,
        "benchmark": str(run.benchmark),
        "target_capability": run.target_capability,
        "flagged": run.flagged,
        "max_parallel_workers": run.max_parallel_workers,
        "budget_accelerator_seconds": run.budget_accelerator_seconds,
        "budget_llm_tokens": run.budget_llm_tokens,
        "budget_wall_seconds": run.budget_wall_seconds,
        "reserved_final_seconds": run.reserved_final_seconds,
        "used_accelerator_seconds": run.used_accelerator_seconds,
        "used_llm_tokens": run.used_llm_tokens,
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "result_checkpoint": run.result_checkpoint.handle if run.result_checkpoint_id else None,
    }


def run_live_get(run: Run) -> dict[str, Any]:
    """``run_live`` of the run as committed now (a caller's instance may hold stale fields)."""
    return run_live(Run.objects.select_related("benchmark", "result_checkpoint").get(pk=run.pk))


def node_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "uuid": str(row["uuid"]),
        "handle": row["handle"],
        "kind": row["kind"],
        "status": row["status"],
        "decision": text_or_none(row["created_by_decision__uuid"]),
        "created_at": iso(row["created_at"]),
        "finalized_at": iso(row["finalized_at"]),
    }


def edge_row(row: dict[str, Any]) -> dict[str, Any]:
    # No id of its own: an edge is keyed by its two ends, "<source>><target>" (live.js edgeKey).
    return {"source": str(row["upstream__uuid"]), "target": str(row["downstream__uuid"]), "kind": row["kind"]}


def decision_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "uuid": str(row["uuid"]),
        "kind": row["kind"],
        "trigger": row["trigger"],
        "rationale": cut(row["rationale"], RATIONALE_CHARS),
        "subject": text_or_none(row["subject__uuid"]),
        "created_at": iso(row["created_at"]),
    }


def node_live(node: ResearchNode) -> dict[str, Any]:
    """A Worker or Reviewer of the research DAG (``node.*`` events), as committed so far."""
    return node_row(ResearchNode.objects.filter(pk=node.pk).values(*NODE_VALUES).get())


def edge_live(edge: ResearchEdge) -> dict[str, Any]:
    """An edge of the research DAG (``edge.*`` events); keyed by its two ends."""
    return edge_row(ResearchEdge.objects.filter(pk=edge.pk).values(*EDGE_VALUES).get())


def decision_live(decision: Decision) -> dict[str, Any]:
    """A Main Agent decision (``decision.*`` events)."""
    return decision_row(Decision.objects.filter(pk=decision.pk).values(*DECISION_VALUES).get())


def decision_refusals(*, run: Run, decisions: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The tool calls made on behalf of each decision that were refused, counted by (tool, status, error).

    A decision names what it meant to do; whether it happened is in the tool calls that carried
    its uuid (``state_add_new_worker`` with ``decision``). A guidance whose decision's every spawn
    was answered 409 ``worker_limit`` was read, not carried out, and the run page says so.
    One query for any number of decisions (the snapshot reads all of a run's guidance at once).
    """
    if not decisions:
        return {}
    counts: dict[str, dict[tuple[str, int, str], int]] = {}
    calls = Event.objects.filter(
        run=run, type="tool.called", arguments__status__gte=400, arguments__args__decision__in=decisions
    ).values_list("tool", "arguments")
    for tool, arguments in calls:
        key = (tool, int(arguments.get("status", 0)), str(arguments.get("error", "")))
        per = counts.setdefault(str(arguments["args"]["decision"]), {})
        per[key] = per.get(key, 0) + 1
    return {
        decision: [{"tool": t, "status": st, "error": e, "count": n} for (t, st, e), n in sorted(per.items())]
        for decision, per in counts.items()
    }


def guidance_live(guidance: Guidance, *, refusals: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Human guidance (``guidance.*`` events): pending until a planning step applies it.

    ``refused`` lists what the applying decision tried and was refused (decision_refusals); what
    it did (the Workers and Reviewers it spawned) is on the nodes, which name their decision.
    ``refusals`` is the run's, read once by a caller that builds many records.
    """
    decision = str(guidance.applied_decision.uuid) if guidance.applied_decision_id else None
    if decision is not None and refusals is None:
        refusals = decision_refusals(run=guidance.run, decisions=[decision])
    return {
        "uuid": str(guidance.uuid),
        "text": guidance.text,
        "author": guidance.author.get_username(),
        "created_at": iso(guidance.created_at),
        "applied_at": iso(guidance.applied_at),
        "applied_decision": decision,
        "applied_note": guidance.applied_note,
        "refused": (refusals or {}).get(decision, []) if decision else [],
    }


def guidance_live_get(guidance: Guidance) -> dict[str, Any]:
    """``guidance_live`` of the guidance as committed now."""
    return guidance_live(Guidance.objects.select_related("author", "applied_decision", "run").get(pk=guidance.pk))


def prediction_live(prediction: Prediction) -> dict[str, Any]:
    """A prediction (``prediction.*`` events): open until reconciled against what was observed."""
    return {
        "uuid": str(prediction.uuid),
        "text": prediction.text,
        "metric": prediction.metric,
        "expected_value": prediction.expected_value,
        "worker": str(prediction.worker.uuid) if prediction.worker_id else None,
        "verdict": prediction.verdict,
        "observed_value": prediction.observed_value,
        "created_at": iso(prediction.created_at),
        "reconciled_at": iso(prediction.reconciled_at),
    }


def prediction_live_get(prediction: Prediction) -> dict[str, Any]:
    """``prediction_live`` of the prediction as committed now."""
    return prediction_live(Prediction.objects.select_related("worker").get(pk=prediction.pk))


# --- run-level health: are most of the run's recent jobs failing? --------------------------------

# The policy keys (docs/run-policy.md) and their defaults: "3 of the last 4 jobs failed".
JOB_FAILURE_WINDOW, JOB_FAILURE_THRESHOLD = 4, 3


@dataclass(frozen=True)
class JobHealth:
    """The run's last ``window`` ended jobs (succeeded or failed), and whether too many failed."""

    window: int
    threshold: int
    ended: int
    failed: int
    failures: list[dict[str, Any]]  # the failed ones, newest first: job, kind, experiment, error

    @property
    def failing(self) -> bool:
        return self.failed >= self.threshold

    def summary(self) -> str:
        errors = "; ".join(f"{f['kind']} {f['experiment'] or f['job'][:8]}: {f['error']}" for f in self.failures)
        return f"{self.failed} of the run's last {self.ended} jobs failed ({errors})"[:2000]

    def as_json(self) -> dict[str, Any]:
        return {"window": self.window, "threshold": self.threshold, "ended": self.ended, "failed": self.failed,
                "failures": self.failures, "summary": self.summary()}  # fmt: skip


def run_job_failure_policy(run: Run) -> tuple[int, int]:
    """(window, threshold) of the run's policy: ``job_failure_window``, ``job_failure_threshold``."""
    policy = run.policy or {}
    window = max(1, int(policy.get("job_failure_window", JOB_FAILURE_WINDOW)))
    return window, max(1, min(window, int(policy.get("job_failure_threshold", JOB_FAILURE_THRESHOLD))))


def run_job_health(*, run: Run, without_job_id: int | None = None) -> JobHealth:
    """The health of the run's recent jobs; ``without_job_id`` reads it as it was before that job ended.

    Lost attempts (retried as a new row) and cancelled jobs (someone's choice) are not outcomes
    of the work, so only succeeded and failed jobs count.
    """
    window, threshold = run_job_failure_policy(run)
    ended = Job.objects.filter(run=run, status__in=(JobStatus.SUCCEEDED, JobStatus.FAILED))
    if without_job_id is not None:
        ended = ended.exclude(pk=without_job_id)
    rows = list(
        ended.order_by("-finished_at", "-pk").values("uuid", "kind", "status", "error", "experiment__handle")[:window]
    )
    failures = [
        {"job": str(row["uuid"]), "kind": row["kind"], "experiment": row["experiment__handle"],
         "error": _last_line(row["error"])}
        for row in rows if row["status"] == JobStatus.FAILED
    ]  # fmt: skip
    return JobHealth(window=window, threshold=threshold, ended=len(rows), failed=len(failures), failures=failures)


def _last_line(error: str) -> str:
    # A traceback's last line names the exception ("OSError: [Errno 28] No space left on device").
    return cut((error or "").strip().splitlines()[-1] if (error or "").strip() else "failed", 300)


def harness_plays(run: Run, node: ResearchNode) -> bool:
    """Whether the harness of external ``run`` may play ``node``: its Workers, its Main Agent (with a
    token only under ``--harness-main``), and its Reviewers only when started with
    ``--harness-reviewers`` (by default our own Reviewer loop reviews the harness's Workers, so the
    run needs no second harness)."""
    if run.agent_mode != AgentMode.EXTERNAL:
        return False
    if node.kind == NodeKind.REVIEWER:
        return bool(((run.policy or {}).get("harness") or {}).get("plays_reviewers"))
    return True


def run_held_nodes_last_seen(run: Run) -> dict[str, datetime]:
    """The active nodes of ``run`` that an outside harness holds, each with its last sign of life.

    Held: an active Worker or Reviewer that none of our agent loops drives (every one of an
    external-mode run), and in external mode the Main node once a token was issued for it (a
    harness plans there and creates the Workers). A sign of life is the node's creation, a token
    issued for it, or the last call with one of its tokens (``AgentToken.last_used_at``, to the minute).
    """
    # The Main of an external run has a loop row too, which only numbers the supervisor's ticks.
    nodes = ResearchNode.objects.filter(Q(agent_loop__isnull=True) | Q(kind=NodeKind.MAIN), run=run,
                                        status=NodeStatus.ACTIVE)  # fmt: skip
    rows = nodes.annotate(issued=Max("tokens__created_at"), used=Max("tokens__last_used_at")).values_list(
        "handle", "kind", "created_at", "issued", "used"
    )
    held = {}
    for handle, kind, created, issued, used in rows:
        if kind == NodeKind.MAIN and (run.agent_mode != AgentMode.EXTERNAL or issued is None):
            continue
        held[handle] = max(t for t in (created, issued, used) if t is not None)
    return held
