"""Which checkpoint a run returns: the documented rule, and the Main Agent's nomination.

The rule is one text (:data:`RESULT_RULE`), shown to agents in the tool descriptions and in the
``run_result_policy`` answer, and applied by :func:`result_select` when the final evaluation
starts (``run_final_eval_start``). Reads only; the nomination is written by
apps.flows.nominations.
"""

from __future__ import annotations

from typing import Any

from apps.experiments.models import Event, Experiment
from apps.integrity.selectors import best_accepted_experiment, selectable_experiments
from apps.research.models import Run

NOMINATED_EVENT = "run.result_nominated"
RESULT_RULE = (
    "The run returns one checkpoint, fixed when the final evaluation starts (after stop_loop, or when the budget "
    "ends): the checkpoint of the experiment the Main Agent nominated before stop_loop (main_nominate_result; "
    "the latest nomination counts) if it is still accepted then; otherwise the checkpoint of the accepted "
    "experiment (succeeded, integrity accepted, no violation found) with the best feedback score, the earliest on "
    "ties. With no accepted experiment the run returns no checkpoint (θ0 stays the result). Final-split scores "
    "never select: they are measured after the choice, for people."
)


def result_nomination(run: Run) -> Event | None:
    """The run's latest nomination event, or None."""
    return Event.objects.filter(run=run, type=NOMINATED_EVENT).order_by("-seq").first()


def result_select(run: Run) -> tuple[Experiment | None, dict[str, Any]]:
    """The experiment whose checkpoint the run returns, and how it was chosen (for the event)."""
    nomination = result_nomination(run)
    if nomination is not None:
        handle = nomination.arguments.get("experiment")
        chosen = selectable_experiments(run).filter(handle=handle).first()
        if chosen is not None:
            return chosen, {"by": "nomination", "experiment": handle, "decision": nomination.arguments.get("decision")}
        fallback = best_accepted_experiment(run)
        return fallback, {
            "by": "rule",
            "nomination_set_aside": handle,
            "why": f"{handle} is no longer accepted (its integrity status changed after the nomination)",
        }
    return best_accepted_experiment(run), {"by": "rule"}
