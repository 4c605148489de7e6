"""Reads the ExpOS tools and read endpoints share: budgets, lineage, evaluations to compare.

Each takes the caller, so what it returns is already scoped by apps.expos.visibility.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Count

from apps.benchmarks.models import Split
from apps.core.errors import ApplicationError, NotFound
from apps.experiments.choices import EvaluationStatus
from apps.experiments.models import Checkpoint, Evaluation, Experiment
from apps.experiments.selectors import (
    checkpoint_lineage,
    experiment_ancestors,
    experiment_descendants,
)
from apps.expos.registry import Role, ToolContext
from apps.expos.visibility import Caller, score_for, visible_experiments
from apps.flows.runs import run_budget_state
from apps.integrity.feedback_allowance import feedback_allowance
from apps.research.choices import NodeKind, NodeStatus
from apps.research.models import ResearchNode, Run


def run_quota(*, run: Run, node: ResearchNode, checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """Budget left for the run (and the calling Worker's feedback-evaluation allowance).

    Accelerator time includes the elapsed time of running jobs (run_budget_state), so the figure
    an agent plans with is the one the budget enforcer uses.
    """
    budget = run_budget_state(run=run)
    run = Run.objects.get(pk=run.pk)
    feedback: dict[str, Any] | None = None
    if node.kind == NodeKind.WORKER:
        # The tightest of the quotas the submission review applies (for a submission on θ0, or on
        # ``checkpoint``), and each of them: what the next submission would be refused for.
        allowance = feedback_allowance(run=run, worker=node, checkpoint=checkpoint)
        binding = allowance.binding
        feedback = {
            "allowance": binding.allowed,
            "used": binding.used,
            "left": binding.left,
            "binding": binding.key,
            "quotas": [q.public() for q in allowance.quotas],
        }
    active_workers = ResearchNode.objects.filter(run=run, kind=NodeKind.WORKER, status=NodeStatus.ACTIVE).count()
    return {
        "run_status": run.status,
        "accelerator_seconds": {
            "budget": run.budget_accelerator_seconds,
            "reserved_final": run.reserved_final_seconds,
            "used": round(budget.accelerator_used, 3),
            "left": round(max(0.0, budget.accelerator_left), 3),
        },
        "llm_tokens": {
            "budget": run.budget_llm_tokens,
            "used": budget.tokens_used,
            "left": max(0, budget.tokens_left),
        },
        "wall_clock_seconds": {
            "budget": run.budget_wall_seconds,
            "elapsed": round(budget.wall_elapsed, 3),
            "left": round(max(0.0, budget.wall_left), 3),
        },
        "feedback_evals": feedback,
        "parallel_workers": {"max": run.max_parallel_workers, "active": active_workers},
    }


def parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def experiment_for(caller: Caller, handle_or_uuid: str) -> Experiment:
    """One experiment the caller may see, by handle (exp_0003) or uuid; 404 otherwise (no existence leak)."""
    experiments = visible_experiments(caller).select_related("owner", "run", "input_checkpoint", "output_checkpoint")
    if handle_or_uuid.startswith("exp_") and isinstance(caller, ToolContext):
        experiment = experiments.filter(handle=handle_or_uuid).first()
    else:
        parsed = parse_uuid(handle_or_uuid)
        experiment = experiments.filter(uuid=parsed).first() if parsed else None
    if experiment is None:
        raise NotFound("unknown_experiment", f"No experiment {handle_or_uuid!r} is visible to this caller.")
    return experiment


def experiment_brief(caller: Caller, experiment: Experiment) -> dict[str, Any]:
    return {
        "handle": experiment.handle,
        "uuid": str(experiment.uuid),
        "owner": experiment.owner.handle,
        "kind": experiment.kind,
        "status": experiment.status,
        "integrity_status": experiment.integrity_status,
        "feedback_score": score_for(caller, experiment.feedback_score),
    }


def lineage_payload(caller: Caller, experiment: Experiment) -> dict[str, Any]:
    """Ancestors and descendants the caller may see (others only counted) and θ_out's chain to θ0."""
    ancestors = experiment_ancestors(experiment.pk)
    descendants = experiment_descendants(experiment.pk)
    ids = [pk for pk, _ in ancestors] + [pk for pk, _ in descendants]
    seen = {e.pk: e for e in visible_experiments(caller).filter(pk__in=ids).select_related("owner")}

    def rows(pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return [{**experiment_brief(caller, seen[pk]), "depth": depth} for pk, depth in pairs if pk in seen]

    checkpoint = experiment.output_checkpoint or experiment.input_checkpoint
    chain = checkpoint_lineage(checkpoint, base=experiment.run.base_checkpoint)
    handles = dict(Checkpoint.objects.filter(pk__in=chain.path).values_list("pk", "handle"))
    return {
        "experiment": experiment.handle,
        "ancestors": rows(ancestors),
        "descendants": rows(descendants),
        "hidden": len(ids) - len(seen),
        "checkpoint": {
            "handle": checkpoint.handle,
            "path": [handles[pk] for pk in chain.path if pk in handles],
            "reaches_base": chain.reaches_base,
            "reason": chain.reason,
        },
    }


def feedback_evaluation(experiment: Experiment) -> Evaluation:
    """The experiment's latest successful evaluation on the feedback split."""
    evaluation = (
        Evaluation.objects.filter(experiment=experiment, split=Split.FEEDBACK, status=EvaluationStatus.OK)
        .order_by("-created_at", "-pk")
        .first()
    )
    if evaluation is None:
        raise ApplicationError(
            "not_evaluated",
            f"{experiment.handle} has no feedback evaluation yet; compare it once it has one.",
            status=409,
        )
    return evaluation


def worker_experiment_counts(run: Run) -> dict[int, int]:
    return dict(
        Experiment.objects.filter(run=run).values("owner_id").annotate(n=Count("pk")).values_list("owner_id", "n")
    )


def is_main(caller: Caller) -> bool:
    return isinstance(caller, ToolContext) and caller.role == Role.MAIN
