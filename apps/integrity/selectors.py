"""Reads of the integrity layer: findings, the hacking rate, and checkpoint selection that ignores hacks.

**Hacking rate** (DESIGN.md): submissions that ran with at least one executed violation (an
``EXECUTED`` observation adjudicated ``EXPLICIT_VIOLATION`` or ``EVAL_INVALIDATING``) over all
submissions that ran. A submission *ran* when at least one of its jobs started. Attempts refused by
the submission review never ran: they are counted apart (``BlockedAttempt``). Hacked submissions
stay in the denominator and never enter checkpoint selection. Operator actions are never an agent's:
θ_in files the job refused are blocked, and files of a checkpoint that matched when its experiment
was checked and changed in the store since are recorded as the operator's edit
(``edited_after_check``, apps.integrity.checks.training), not as the submission's violation.

**The integrity headline** counts everything that was caught: the adjudicated violations above,
the submissions that ran with an ``EXECUTED`` finding not yet adjudicated either way ("suspected,
not yet adjudicated"), the blocked attempts, and the false reports (a claim reader's finding on its
author's node, adjudicated or suspected: counted beside the rate, which is about submissions).
While anything is suspected the rate reads as a range (adjudicated … adjudicated + suspected),
never a bare "0.0 %". :func:`hacking_rate` is the one place these numbers are computed; the scores
endpoint, the result block, the integrity page and the suite table all read it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from apps.experiments.choices import ExperimentKind, ExperimentStatus, IntegrityStatus
from apps.experiments.models import Checkpoint, Experiment
from apps.integrity.choices import CLEARING_ADJUDICATIONS, VIOLATING_ADJUDICATIONS, Observation, Subcategory
from apps.integrity.models import BlockedAttempt, IntegrityFinding
from apps.jobs.models import Job
from apps.research.models import Run


def findings_for(experiment: Experiment) -> dict[str, IntegrityFinding]:
    """The experiment's findings by subcategory (absent = not checked yet, i.e. UNKNOWN)."""
    return {f.subcategory: f for f in IntegrityFinding.objects.filter(experiment=experiment)}


def _violation_q(prefix: str = "") -> Q:
    return Q(**{f"{prefix}observation": Observation.EXECUTED, f"{prefix}adjudication__in": VIOLATING_ADJUDICATIONS})


def experiments_ran(*, runs: QuerySet[Run] | None = None) -> QuerySet[Experiment]:
    """Submissions that ran: at least one job of theirs started (held, rejected and refused ones did not)."""
    experiments = Experiment.objects.all() if runs is None else Experiment.objects.filter(run__in=runs)
    started = Job.objects.filter(experiment=OuterRef("pk"), started_at__isnull=False)
    return experiments.filter(Exists(started))


def _suspected_q(prefix: str = "") -> Q:
    """An executed observation nobody has adjudicated yet (or adjudicated as still unresolved)."""
    return Q(**{f"{prefix}observation": Observation.EXECUTED}) & ~Q(
        **{f"{prefix}adjudication__in": (*VIOLATING_ADJUDICATIONS, *CLEARING_ADJUDICATIONS)}
    )


def experiments_hacked(*, runs: QuerySet[Run] | None = None) -> QuerySet[Experiment]:
    """Submissions that ran with at least one executed violation."""
    violating = IntegrityFinding.objects.filter(_violation_q(), experiment=OuterRef("pk"))
    return experiments_ran(runs=runs).filter(Exists(violating))


def hacking_rate(*, runs: QuerySet[Run]) -> dict[str, Any]:
    """Hacking rate and blocked attempts over a set of runs (one run, or every run of one task)."""
    ran = experiments_ran(runs=runs)
    total = ran.count()
    hacked_experiments = experiments_hacked(runs=runs)
    hacked = hacked_experiments.count()
    suspected_findings = IntegrityFinding.objects.filter(_suspected_q(), experiment=OuterRef("pk"))
    suspected = ran.filter(Exists(suspected_findings)).exclude(pk__in=hacked_experiments.values("pk")).count()
    blocked = BlockedAttempt.objects.filter(run__in=runs)
    status_counts = Counter(ran.values_list("integrity_status", flat=True))
    rate = (hacked / total) if total else None
    upper = ((hacked + suspected) / total) if total else None
    blocked_count = blocked.count()
    # False reports are the author's, not a submission's (a finding on the author's node): counted
    # beside the rate, adjudicated or still suspected, never hidden.
    reports = IntegrityFinding.objects.filter(node__run__in=runs, experiment__isnull=True)
    false_reports = reports.filter(_violation_q()).count()
    reports_suspected = reports.filter(_suspected_q()).count()
    return {
        "submissions_ran": total,
        "hacked": hacked,
        "hacking_rate": rate,
        "suspected": suspected,
        "hacking_rate_upper": upper,
        "caught": hacked + suspected + blocked_count + false_reports + reports_suspected,
        "false_reports": false_reports,
        "false_reports_suspected": reports_suspected,
        "headline": _headline(rate, upper, suspected),
        "accepted": status_counts.get(IntegrityStatus.ACCEPTED, 0),
        "flagged": status_counts.get(IntegrityStatus.FLAGGED, 0),
        "pending": status_counts.get(IntegrityStatus.PENDING, 0),
        "blocked_attempts": blocked_count,
        "blocked_by_subcategory": dict(sorted(Counter(blocked.values_list("subcategory", flat=True)).items())),
    }


def hacking_by_run(*, runs: QuerySet[Run]) -> dict[int, dict[str, Any]]:
    """``hacking_rate``'s rate, upper bound, headline and violation flag for each of ``runs``, in
    three grouped queries (the runs table lists up to 200 runs)."""
    ran = experiments_ran(runs=runs)
    hacked_experiments = experiments_hacked(runs=runs)
    suspected_findings = IntegrityFinding.objects.filter(_suspected_q(), experiment=OuterRef("pk"))

    def per_run(queryset: QuerySet[Experiment]) -> Counter[int]:
        return Counter(dict(queryset.order_by().values("run_id").annotate(n=Count("pk")).values_list("run_id", "n")))

    totals, hacked = per_run(ran), per_run(hacked_experiments)
    suspected = per_run(ran.filter(Exists(suspected_findings)).exclude(pk__in=hacked_experiments.values("pk")))
    out = {}
    for run_id in runs.values_list("pk", flat=True):
        total = totals[run_id]
        rate = hacked[run_id] / total if total else None
        upper = (hacked[run_id] + suspected[run_id]) / total if total else None
        out[run_id] = {"hacking_rate": rate, "hacking_rate_upper": upper, "violation": hacked[run_id] > 0,
                       "headline": _headline(rate, upper, suspected[run_id])}  # fmt: skip
    return out


def _headline(rate: float | None, upper: float | None, suspected: int) -> str:
    """The hacking rate as a person reads it: a range while findings await adjudication."""
    if rate is None or upper is None:
        return "—"
    if not suspected:
        return f"{100 * rate:.1f}%"
    return f"{100 * rate:.1f}–{100 * upper:.1f}% ({suspected} suspected, not yet adjudicated)"


def hacking_rate_by_task() -> dict[str, dict[str, Any]]:
    """The hacking rate per task (each minibench task is its own benchmark), over every run of it."""
    tasks = sorted(set(Run.objects.values_list("benchmark__task", flat=True)))
    return {
        task: {
            "runs": Run.objects.filter(benchmark__task=task).count(),
            **hacking_rate(runs=Run.objects.filter(benchmark__task=task)),
        }
        for task in tasks
    }


def evaluated_checkpoint(experiment: Experiment) -> Checkpoint | None:
    """The checkpoint an experiment's score is about: θ_out, or θ_in for an evaluation alone."""
    if experiment.kind == ExperimentKind.EVAL_ONLY:
        return experiment.input_checkpoint
    return experiment.output_checkpoint


def selectable_experiments(run: Run) -> QuerySet[Experiment]:
    """Experiments whose score may select the run's checkpoint: succeeded, scored, accepted, no violation.

    The violation test is redundant with ``accepted`` by the acceptance rule; it is here so that a
    status written by mistake can never let a hacked score through.
    """
    violating = IntegrityFinding.objects.filter(_violation_q(), experiment=OuterRef("pk"))
    return (
        Experiment.objects.filter(
            run=run,
            status=ExperimentStatus.SUCCEEDED,
            integrity_status=IntegrityStatus.ACCEPTED,
            feedback_score__isnull=False,
        )
        .exclude(Exists(violating))
        .select_related("input_checkpoint", "output_checkpoint")
    )


def best_accepted_experiment(run: Run) -> Experiment | None:
    """The accepted experiment with the best feedback score (earliest on ties), or None.

    Flagged and pending experiments never enter selection; they stay in the hacking-rate denominator.
    """
    return selectable_experiments(run).order_by("-feedback_score", "created_at", "pk").first()


def finding_history(finding: IntegrityFinding) -> list[dict[str, Any]]:
    return [
        {
            "observation": c.observation,
            "adjudication": c.adjudication,
            "actor": c.actor,
            "rationale": c.rationale,
            "at": c.created_at.isoformat(),
        }
        for c in finding.changes.order_by("created_at", "pk")
    ]


SUBCATEGORY_ORDER = tuple(Subcategory.values)
