"""What the run returns, told to its agents: the selection rule, the nomination, the run's state.

``run_result_policy`` answers every role, also after ``stop_loop`` while the final evaluation runs
(its status and whether it finished, never a final-split score); ``main_nominate_result`` lets
the Main Agent choose the returned checkpoint among the accepted ones before ``stop_loop``.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import NotFound
from apps.expos.registry import Category, Role, ToolContext, tool
from apps.expos.schemas import EXPERIMENT, UUID, array, boolean, closed, enum, integer, nullable, string, text
from apps.expos.visibility import visible_experiments
from apps.flows.nominations import MAX_EVIDENCE, result_nominate
from apps.flows.result_selection import RESULT_RULE, result_nomination
from apps.jobs.choices import JOB_TERMINAL_STATES, JobKind
from apps.jobs.models import Job
from apps.research.choices import RunStatus, Trigger
from apps.research.models import Run

_RUN_STATUS = enum(*RunStatus.values)


@tool(
    "run_result_policy",
    category=Category.EXECUTION,
    roles=Role.ALL_AGENTS,
    description="Which checkpoint this run returns, and where the run stands. The rule: " + RESULT_RULE + " The "
    "answer also gives the current nomination, the run's settings (parallel Workers, seed, training gate, "
    "Reviewers), the run status and whether the final evaluation started and finished (never its score). It "
    "answers after stop_loop until the run has finished; after that every token answers 401 saying so.",
    input_schema=closed({}),
    output_schema=closed(
        {
            "rule": string(2000),
            "run_status": _RUN_STATUS,
            "nomination": nullable(
                closed(
                    {"experiment": string(32), "checkpoint": string(64), "decision": UUID, "at": string(40)},
                )
            ),
            "final_evaluation": closed(
                {"started": boolean(), "finished": boolean(), "jobs": integer(), "jobs_ended": integer()}
            ),
            "settings": closed(
                {
                    "parallel_workers": integer(),
                    "seed": integer(0, 2**63 - 1),
                    "training_gate": boolean(),
                    "reviewers": boolean(),
                }
            ),
        }
    ),
)
def run_result_policy(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    # The run as it is now: the token's resolved copy may be seconds old (apps.expos.auth).
    run = Run.objects.get(pk=ctx.run.pk)
    policy = run.policy or {}
    nomination = result_nomination(run)
    jobs = Job.objects.filter(run=run, kind=JobKind.FINAL_EVAL)
    total, ended = jobs.count(), jobs.filter(status__in=JOB_TERMINAL_STATES).count()
    started = run.status in (RunStatus.FINAL_EVAL, RunStatus.FINISHED) or total > 0
    return {
        "rule": RESULT_RULE,
        "run_status": run.status,
        "nomination": None
        if nomination is None
        else {
            "experiment": nomination.arguments["experiment"],
            "checkpoint": nomination.arguments["checkpoint"],
            "decision": nomination.arguments["decision"],
            "at": nomination.created_at.isoformat(),
        },
        "final_evaluation": {
            "started": started,
            "finished": run.status == RunStatus.FINISHED or (started and total > 0 and ended == total),
            "jobs": total,
            "jobs_ended": ended,
        },
        "settings": {
            "parallel_workers": run.max_parallel_workers,
            "seed": int(policy.get("seed", 0) or 0),
            "training_gate": bool(policy.get("training_gate")),
            "reviewers": policy.get("reviewers") is not False,
        },
    }


@tool(
    "main_nominate_result",
    category=Category.EXECUTION,
    roles={Role.MAIN},
    description="Nominate the checkpoint the run returns: an accepted experiment (succeeded, integrity "
    "accepted, scored on feedback), before stop_loop. Recorded as a decision (kind nominate) with your rationale "
    "and the experiments whose feedback scores you cite (evidence, including the nominee). The latest "
    "nomination counts; if it is no longer accepted when the final evaluation starts, the rule applies. "
    "Refused for an experiment that is not accepted (not_accepted) and after stop_loop (nomination_closed).",
    input_schema=closed(
        {
            "experiment": EXPERIMENT,
            "rationale": text(4000),
            "evidence": array(EXPERIMENT, min_items=1, max_items=MAX_EVIDENCE, unique=True),
            "trigger": {**enum(*Trigger.values), "default": Trigger.WORKER_FINALIZE},
        },
        optional=("trigger",),
    ),
    output_schema=closed({"decision": UUID, "experiment": string(32), "checkpoint": string(64), "rule": string(2000)}),
    idempotent_create=True,
    errors=("unknown_experiment", "not_accepted", "nomination_closed", "evidence_required", "evidence_unscored"),
)
def main_nominate_result(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    handles = {args["experiment"], *args["evidence"]}
    found = {e.handle: e for e in visible_experiments(ctx).filter(handle__in=handles).select_related("owner")}
    missing = sorted(handles - set(found))
    if missing:
        raise NotFound("unknown_experiment", f"No experiment {', '.join(missing)} in this run.")
    experiment = found[args["experiment"]]
    decision = result_nominate(
        run=ctx.run,
        experiment=experiment,
        rationale=args["rationale"],
        evidence=[found[h] for h in args["evidence"]],
        trigger=args.get("trigger", Trigger.WORKER_FINALIZE),
        actor=ctx.actor,
    )
    ctx.result_ref = f"decision:{decision.uuid}"
    checkpoint = experiment.output_checkpoint or experiment.input_checkpoint
    return {"decision": str(decision.uuid), "experiment": experiment.handle, "checkpoint": checkpoint.handle,
            "rule": RESULT_RULE}  # fmt: skip
