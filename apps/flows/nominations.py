"""The Main Agent's nomination of the checkpoint its run returns (apps.flows.result_selection).

A nomination is a decision of the Main Agent (kind ``nominate``) with its rationale and the
feedback evidence it cites, and a ``run.result_nominated`` event the selection reads. It is taken
only before ``stop_loop`` and only for an accepted experiment; the selection checks it again when
the final evaluation starts.
"""

from __future__ import annotations

from django.db import transaction

from apps.core.errors import ApplicationError, Conflict
from apps.experiments.events import event_append
from apps.experiments.models import Experiment
from apps.flows.result_selection import NOMINATED_EVENT
from apps.integrity.selectors import selectable_experiments
from apps.research.choices import DecisionKind, RunStatus
from apps.research.models import Decision, Run
from apps.research.services import decision_record

MAX_EVIDENCE = 20


def result_nominate(
    *, run: Run, experiment: Experiment, rationale: str, evidence: list[Experiment], trigger: str, actor: str = "main"
) -> Decision:
    """Nominate ``experiment``'s checkpoint as the run's result; refuses what the rule could not return.

    ``evidence``: experiments of the run whose feedback scores the rationale cites (at least the
    nominee's). Locks the run row, so a nomination and ``stop_loop`` are ordered.
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
            raise Conflict(
                "nomination_closed",
                f"Run {locked.uuid} is {locked.status}: a nomination is taken before stop_loop only; the "
                "documented rule (run_result_policy) chooses now.",
            )
        if experiment.run_id != locked.pk:
            raise ApplicationError("unknown_experiment", f"{experiment.handle} is not an experiment of this run.")
        if not selectable_experiments(locked).filter(pk=experiment.pk).exists():
            raise Conflict(
                "not_accepted",
                f"{experiment.handle} cannot be the run's result: it is {experiment.status} with integrity status "
                f"{experiment.integrity_status}"
                + ("" if experiment.feedback_score is not None else " and no feedback score")
                + ". Only an accepted experiment (succeeded, integrity accepted, scored on feedback) can be "
                "nominated.",
                experiment=experiment.handle,
                experiment_status=experiment.status,
                integrity_status=experiment.integrity_status,
            )
        if experiment not in evidence:
            raise ApplicationError(
                "evidence_required",
                f"Cite the feedback evidence for {experiment.handle}: evidence must include it (and may add the "
                "experiments it was compared with).",
            )
        unscored = [e.handle for e in evidence if e.feedback_score is None]
        if unscored:
            raise ApplicationError(
                "evidence_unscored", f"{', '.join(unscored)} have no feedback score to cite.", experiments=unscored
            )
        decision = decision_record(
            run=locked,
            kind=DecisionKind.NOMINATE,
            trigger=trigger,
            rationale=rationale,
            subject=experiment.owner,
            actor=actor,
        )
        checkpoint = experiment.output_checkpoint or experiment.input_checkpoint
        event_append(
            run=locked,
            type=NOMINATED_EVENT,
            actor=actor,
            role="main",
            arguments={
                "experiment": experiment.handle,
                "checkpoint": checkpoint.handle,
                "decision": str(decision.uuid),
                "evidence": [{"experiment": e.handle, "feedback_score": e.feedback_score} for e in evidence],
            },
            result_ref=f"decision:{decision.uuid}",
        )
    return decision
