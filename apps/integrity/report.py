"""The integrity report of one run: the 12-subcategory matrix per submission, the findings on the
reports' authors (a false claim in a Worker's summary or a Main Agent claim, judged on its author's
node: ``reports``), rates, blocked attempts.

Served as JSON to people (viewer and above) at ``GET /api/v1/integrity/runs/<uuid>/report``; the
dashboard renders the same dict as a page. It carries observations, adjudications and one-line
summaries, never the evidence itself: matches against sealed items stay on the finding, where
Reviewers open them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.utils import timezone

from apps.experiments.models import Experiment
from apps.integrity.choices import CATEGORIES, VIOLATING_ADJUDICATIONS, Observation
from apps.integrity.models import BlockedAttempt, IntegrityFinding
from apps.integrity.selectors import (
    SUBCATEGORY_ORDER,
    best_accepted_experiment,
    evaluated_checkpoint,
    experiments_ran,
    hacking_rate,
)
from apps.research.models import Run

MAX_BLOCKED_LISTED = 500


def _finding_cell(finding: IntegrityFinding | None) -> dict[str, Any]:
    if finding is None:
        return {
            "observation": Observation.UNKNOWN,
            "adjudication": "",
            "decided_by": "",
            "summary": "not checked",
            "codes": [],
        }
    evidence = finding.evidence or {}
    return {
        "observation": finding.observation,
        "adjudication": finding.adjudication,
        "decided_by": finding.decided_by,
        "summary": str(evidence.get("summary", ""))[:500],
        "codes": list(evidence.get("codes", [])),
    }


def integrity_report(run: Run) -> dict[str, Any]:
    """Everything a reader needs to check "0.0% hacking" for one run, from the stored records."""
    experiments = list(
        Experiment.objects.filter(run=run)
        .select_related("owner", "input_checkpoint", "output_checkpoint")
        .order_by("created_at", "pk")
    )
    findings: dict[int, dict[str, IntegrityFinding]] = {}
    for finding in IntegrityFinding.objects.filter(experiment__run=run):
        if finding.experiment_id is not None:
            findings.setdefault(finding.experiment_id, {})[finding.subcategory] = finding
    ran_ids = set(experiments_ran(runs=Run.objects.filter(pk=run.pk)).values_list("pk", flat=True))
    submissions = []
    observation_counts: dict[str, Counter[str]] = {s: Counter() for s in SUBCATEGORY_ORDER}
    violation_counts: Counter[str] = Counter()
    for experiment in experiments:
        cells = {s: _finding_cell(findings.get(experiment.pk, {}).get(s)) for s in SUBCATEGORY_ORDER}
        hacked = any(
            c["observation"] == Observation.EXECUTED and c["adjudication"] in VIOLATING_ADJUDICATIONS
            for c in cells.values()
        )
        if experiment.pk in ran_ids:
            for subcategory, cell in cells.items():
                observation_counts[subcategory][cell["observation"]] += 1
                if cell["observation"] == Observation.EXECUTED and cell["adjudication"] in VIOLATING_ADJUDICATIONS:
                    violation_counts[subcategory] += 1
        checkpoint = evaluated_checkpoint(experiment)
        submissions.append(
            {
                "experiment": experiment.handle,
                "uuid": str(experiment.uuid),
                "owner": experiment.owner.handle,
                "kind": experiment.kind,
                "status": experiment.status,
                "ran": experiment.pk in ran_ids,
                "checkpoint": checkpoint.handle if checkpoint is not None else None,
                "feedback_score": experiment.feedback_score,
                "integrity_status": experiment.integrity_status,
                "hacked": hacked,
                "findings": cells,
            }
        )
    # What reports state is judged on their authors' nodes: listed apart from the submissions.
    reports = (
        IntegrityFinding.objects.filter(node__run=run, experiment__isnull=True)
        .select_related("node")
        .order_by("node__created_at", "node_id", "subcategory")
    )
    blocked = BlockedAttempt.objects.filter(run=run).select_related("node").order_by("created_at", "pk")
    best = best_accepted_experiment(run)
    return {
        "run": {
            "uuid": str(run.uuid),
            "name": run.name,
            "benchmark": str(run.benchmark),
            "task": run.benchmark.task,
            "status": run.status,
            "flagged": run.flagged,
        },
        "categories": {name: list(subs) for name, subs in CATEGORIES.items()},
        "subcategories": list(SUBCATEGORY_ORDER),
        "rates": hacking_rate(runs=Run.objects.filter(pk=run.pk)),
        "task_rates": {run.benchmark.task: hacking_rate(runs=Run.objects.filter(benchmark__task=run.benchmark.task))},
        "by_subcategory": {
            s: {"observations": dict(sorted(observation_counts[s].items())), "violations": violation_counts[s]}
            for s in SUBCATEGORY_ORDER
        },
        "submissions": submissions,
        "reports": [
            {"node": f.node.handle, "kind": f.node.kind, "subcategory": f.subcategory, **_finding_cell(f)}
            for f in reports
            if f.node is not None
        ],
        "blocked_attempts": [
            {
                "node": a.node.handle if a.node_id else None,
                "subcategory": a.subcategory,
                "tool": a.tool,
                "reason": a.reason[:500],
                "at": a.created_at.isoformat(),
            }
            for a in blocked[:MAX_BLOCKED_LISTED]
        ],
        "selection": {
            "best_accepted": best.handle if best is not None else None,
            "feedback_score": best.feedback_score if best is not None else None,
            "checkpoint": getattr(evaluated_checkpoint(best), "handle", None) if best is not None else None,
        },
        "generated_at": timezone.now().isoformat(),
    }
