"""The people's writes from the dashboard: new runs, labels, guidance, run control, adjudication.

Each one goes through the owning app's service, which holds the rule, records what was done and
tells the run page's browsers after commit (STYLE.md 25: only the domain's services publish).
What is added here is the person's side only: the form's limits and the person named as actor.
"""

from __future__ import annotations

from typing import Any

from apps.alerts.models import AlertRule
from apps.alerts.services import alert_rule_create, alert_rule_delete
from apps.core.errors import ApplicationError
from apps.flows import runs
from apps.integrity.models import IntegrityFinding
from apps.integrity.services import finding_adjudicate
from apps.research import services as research_services
from apps.research.models import Guidance, Note, Run
from apps.research.notes import note_add

GUIDANCE_MAX_CHARS = 4000
RUN_ACTIONS = ("pause", "resume", "stop")


def _actor(user: Any) -> str:
    return f"user:{user.get_username()}"


def guidance_post(*, run: Run, author: Any, text: str) -> Guidance:
    """An operator's guidance for the Main Agent, shown live on the run page as pending.

    apps.research.services.guidance_post owns the rule (refused on a finished run, recorded,
    wakes the Main Agent with trigger ``guidance``, publishes ``guidance.created``); this adds
    the length limit of the form.
    """
    text = text.strip()
    if len(text) > GUIDANCE_MAX_CHARS:
        raise ApplicationError("text_too_long", f"Keep guidance under {GUIDANCE_MAX_CHARS} characters.")
    return research_services.guidance_post(run=run, author=author, text=text)


def run_control(*, run: Run, action: str, user: Any, reason: str = "") -> Run:
    """Pause, resume or stop a run for a person; returns the run as it is now.

    apps.flows.runs ``run_pause`` / ``run_resume`` / ``run_stop`` own the rules (what a pause does
    to running jobs; a person's stop cancels queued trainings, lets running jobs finish, then the
    final evaluation runs) and publish ``run.updated``; this names the person as actor.
    """
    actor = _actor(user)
    reason = reason.strip() or f"{action} from the dashboard"
    if action == "pause":
        runs.run_pause(run=run, actor=actor, reason=reason)
    elif action == "resume":
        runs.run_resume(run=run, actor=actor)
    elif action == "stop":
        # The Stop button promises "no new work": queued trainings are cancelled (RUN_CONTROL_HELP).
        runs.run_stop(run=run, actor=actor, reason=reason, cancel_queued=True)
    else:
        raise ApplicationError("invalid_action", f"A run can be paused, resumed or stopped, not {action!r}.")
    # Re-read with what the page's answer shows (run_live): the services return the locked row.
    return Run.objects.select_related("benchmark", "result_checkpoint").get(pk=run.pk)


def run_start_for_person(*, user: Any, **arguments: Any) -> Run:
    """An operator's new run from the form: the service ``manage.py start_run`` calls.

    apps.flows.runs.run_launch owns the rules (the LLM profile's configuration is
    checked, the final evaluation reserved, the run started); this names the person.
    """
    return runs.run_launch(actor=_actor(user), created_by=user, **arguments)


def run_label_for_person(*, run: Run, user: Any, **labels: Any) -> Run:
    """Rename, tag or star a run for a person (apps.research.services.run_label owns the rules)."""
    return research_services.run_label(run=run, actor=_actor(user), **labels)


def finding_adjudicate_for_person(
    *, finding: IntegrityFinding, adjudication: str, user: Any, rationale: str, observation: str | None = None
) -> IntegrityFinding:
    """An admin's adjudication of one integrity finding, with the reason the audit trail keeps.

    apps.integrity.services.finding_adjudicate owns the rule (history row, event, the
    experiment's new integrity status under the acceptance rule, whose service publishes
    ``experiment.updated``); this names the person as the actor.
    """
    return finding_adjudicate(
        finding=finding, adjudication=adjudication, actor=_actor(user), rationale=rationale, observation=observation
    )


def alert_rule_create_for_person(
    *, user: Any, channel: str, target: str, triggers: list[str], run: Run | None = None
) -> AlertRule:
    """A person's alert rule (apps.alerts.services.alert_rule_create owns the checks)."""
    return alert_rule_create(owner=user, run=run, channel=channel, target=target, triggers=triggers)


def alert_rule_delete_for_person(*, user: Any, rule: AlertRule) -> None:
    """Remove one of the person's own rules; another person's is not theirs to remove."""
    if rule.owner_id != user.pk:
        raise ApplicationError("not_yours", "That alert belongs to someone else.")
    alert_rule_delete(rule=rule)


def note_add_for_person(*, run: Run, user: Any, text: str, experiment: Any = None) -> Note:
    """A person's new note version (apps.research.notes.note_add owns the rules)."""
    return note_add(run=run, author=user, text=text, experiment=experiment)
