"""The people's writes from the dashboard: guidance, run control, integrity adjudication.

Each one goes through the owning app's service, which holds the rule and records what was
done, names the person as the actor, and tells the run page's browsers after commit.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.core.errors import ApplicationError
from apps.experiments.selectors import experiment_live
from apps.research.selectors import guidance_live, run_live
from apps.live.events import publish_on_commit
from apps.live.groups import run_group
from apps.research import services as research_services
from apps.research.models import Guidance, Run

GUIDANCE_MAX_CHARS = 4000
RUN_ACTIONS = ("pause", "resume", "stop")


def _actor(user: Any) -> str:
    return f"user:{user.get_username()}"


def guidance_post(*, run: Run, author: Any, text: str) -> Guidance:
    """An operator's guidance for the Main Agent, shown live on the run page as pending.

    apps.research.services.guidance_post owns the rule (refused on a finished run, recorded,
    wakes the Main Agent with trigger ``guidance``); this adds the length limit of the form and
    the ``guidance.created`` event for the browsers.
    """
    text = text.strip()
    if len(text) > GUIDANCE_MAX_CHARS:
        raise ApplicationError("text_too_long", f"Keep guidance under {GUIDANCE_MAX_CHARS} characters.")
    with transaction.atomic():
        guidance = research_services.guidance_post(run=run, author=author, text=text)
        publish_on_commit(run_group(run.uuid), "guidance.created", guidance_live(guidance))
    return guidance


def run_control(*, run: Run, action: str, user: Any, reason: str = "") -> Run:
    """Pause, resume or stop a run for a person; the run page updates live.

    apps.research.services ``run_pause`` / ``run_resume`` / ``run_stop`` own the rules (what a
    pause does to running jobs; a stop lets running jobs finish, then the final evaluation
    runs); this names the person as actor and publishes the run's new state.
    """
    actor = _actor(user)
    reason = reason.strip() or f"{action} from the dashboard"
    with transaction.atomic():
        if action == "pause":
            research_services.run_pause(run=run, actor=actor, reason=reason)
        elif action == "resume":
            research_services.run_resume(run=run, actor=actor)
        elif action == "stop":
            research_services.run_stop(run=run, actor=actor, reason=reason)
        else:
            raise ApplicationError("invalid_action", f"A run can be paused, resumed or stopped, not {action!r}.")
        changed = Run.objects.select_related("benchmark", "result_checkpoint").get(pk=run.pk)
        publish_on_commit(run_group(changed.uuid), "run.updated", run_live(changed))
    return changed


def finding_adjudicate_for_person(
    *, finding: Any, adjudication: str, user: Any, rationale: str, observation: str | None = None
) -> Any:
    """An admin's adjudication of one integrity finding, with the reason the audit trail keeps.

    apps.integrity.services.finding_adjudicate owns the rule (history row, event, the
    experiment's new integrity status under the acceptance rule); this names the person as the
    actor and tells the run page that the experiment may have changed colour.
    """
    from apps.experiments.models import Experiment
    from apps.integrity.services import finding_adjudicate

    with transaction.atomic():
        result = finding_adjudicate(
            finding=finding, adjudication=adjudication, actor=_actor(user), rationale=rationale, observation=observation
        )
        experiment = Experiment.objects.select_related("owner", "output_checkpoint", "run").get(
            pk=finding.experiment_id
        )
        publish_on_commit(run_group(experiment.run.uuid), "experiment.updated", experiment_live(experiment))
    return result
