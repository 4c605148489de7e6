"""The run lifecycle: start, launch, pause, resume, stop, budgets, the final evaluation, finish, result.

A run's life crosses apps: starting it gives the Main Agent its loop (research), spending its
budget cancels queued training (jobs), stopping it waits for experiments (experiments) and their
integrity post-checks (integrity), and its final evaluation enqueues one job per checkpoint and
reads the accepted candidates. So it is a flow (apps.flows), above those apps; the run's own
state machine (``run_set_status``) and its records stay in apps.research.

The agent loops and the run supervisor (apps.flows.supervisor) call these; operators reach them
through the dashboard and `manage.py start_run`. A run's state is the database: every function
here is safe to call again after a restart.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import THETA0_HANDLE, benchmark_resolve
from apps.core.clock import db_now
from apps.core.errors import ApplicationError, Conflict
from apps.core.queues import Queue
from apps.experiments.choices import EXPERIMENT_ACTIVE_STATES, ExperimentStatus, IntegrityStatus
from apps.experiments.events import chain_key, chain_verify, event_append
from apps.experiments.models import Checkpoint, Event, Experiment
from apps.flows.pipeline import evaluation_spec, experiment_on_job_transition
from apps.flows.result_selection import result_select
from apps.integrity.selectors import selectable_experiments
from apps.integrity.services import integrity_recheck_run_reports
from apps.jobs.choices import JOB_ACTIVE_STATES, JobKind, JobStatus
from apps.jobs.models import Job
from apps.jobs.services import ACCELERATOR_QUEUE, engine_config, job_enqueue, job_request_cancel, jobs_reap_stale
from apps.ml.hparams import LR_SCHEDULERS
from apps.research.agent_config import (
    DEFAULT_PROFILE,
    DEFAULT_SEARCH_POLICY,
    ROLES,
    SEARCH_POLICIES,
    LLMNotConfigured,
    llm_config,
    prompt_hashes,
)
from apps.research.agent_loops import agent_loop_ensure, agent_loops_close, agent_loops_resend, run_supervise_start
from apps.research.choices import (
    AGENT_LOOP_ACTIVE_STATES,
    RUN_TERMINAL_STATES,
    AgentLoopStatus,
    AgentMode,
    NodeKind,
    RunStatus,
    Trigger,
)
from apps.research.models import AgentLoop, ResearchNode, Run
from apps.research.selectors import run_held_nodes_last_seen, run_job_health
from apps.research.services import SYSTEM, main_trigger, run_create, run_set_status, run_updated


def run_charge_job(*, job: Job) -> None:
    """Charge a finished job's accelerator time to its run's budget (apps.jobs.hooks ``on_finished``).

    Only jobs of the accelerator queue count. Called inside the job's transition, after the job
    row and its run's row are locked (the documented order); the run page's budget bar moves.
    """
    if job.run_id is None or job.queue != ACCELERATOR_QUEUE or job.resource_seconds <= 0:
        return
    # F(): several jobs of one run finish concurrently; each adds, none overwrites.
    Run.objects.filter(pk=job.run_id).update(
        used_accelerator_seconds=F("used_accelerator_seconds") + job.resource_seconds
    )
    # Read back: other jobs add too.
    run_updated(Run.objects.get(pk=job.run_id))


def run_health_on_job_ended(*, job: Job) -> None:
    """After a job of a run succeeded or failed: did the run's recent jobs start, or stop, mostly failing?

    When this job's failure makes ``job_failure_threshold`` of the last ``job_failure_window`` jobs
    failures (3 of 4 by default: a full disk, an OOM, a broken dataset), the run records a
    ``run.jobs_failing`` event with the failure summary and wakes the Main Agent with it
    (trigger ``jobs_failing``). ``run.jobs_recovered`` follows only when the condition that failed
    them is shown gone: the run is back under the threshold *and* this job, which succeeded, is of
    a kind that was failing. A full artifact disk fails the trainings that store checkpoints while
    evaluations (which store nothing) still succeed; their successes dilute the window but say
    nothing of the disk, so they do not end the episode (issue 35: recovered while still full).
    Only the crossings are recorded, not every failure after one. Called inside the job's
    transition (apps.jobs.services); the run row is locked (after the job and its experiment, the
    documented order), so two jobs ending together are counted one after the other.
    """
    if job.run_id is None:
        return
    run = Run.objects.select_for_update().get(pk=job.run_id)
    if run.status in RUN_TERMINAL_STATES:
        return
    health = run_job_health(run=run)
    episode = Event.objects.filter(run=run, type__in=("run.jobs_failing", "run.jobs_recovered")).order_by("-pk").first()
    failing_now = episode is not None and episode.type == "run.jobs_failing"
    if health.failing and not failing_now:
        kind = "run.jobs_failing"
    elif failing_now and not health.failing and job.status == JobStatus.SUCCEEDED:
        assert episode is not None
        failed_kinds = {failure["kind"] for failure in episode.arguments.get("failures", [])}
        if failed_kinds and job.kind not in failed_kinds:
            return  # a success of another kind: the failing kind has not been seen to work again
        kind = "run.jobs_recovered"
    else:
        return
    event_append(run=run, type=kind, actor=SYSTEM, role=SYSTEM, arguments={"job": str(job.uuid), **health.as_json()},
                 result_ref=f"run:{run.uuid}")  # fmt: skip
    if health.failing:
        main_trigger(run=run, trigger=Trigger.JOBS_FAILING, detail={"summary": health.summary()})
    run_updated(run)


def run_stop_request(*, run: Run, reason: str, actor: str = "main") -> Run:
    """Ask the run to end: no new work, running jobs finish, then the final evaluation.

    Guards: a run already stopping (or later) is left as it is (idempotent); a run whose final
    evaluation is pending or that has ended is refused; a paused run must be resumed by a person first.
    """
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current == RunStatus.STOPPING:
        return Run.objects.get(pk=run.pk)
    if current == RunStatus.FINAL_EVAL:
        raise Conflict("final_eval_pending", "The final evaluation is running; the run ends when it does.")
    if current in RUN_TERMINAL_STATES:
        raise Conflict("run_finished", f"Run {run.uuid} is already {current}.")
    if current == RunStatus.PAUSED:
        raise Conflict("run_paused", "A person paused this run; it can be stopped once resumed.")
    # The same path as an operator's stop with a final evaluation (run_stop, below).
    return run_stop(run=run, actor=actor, reason=reason or "stop requested", final_eval=True)


def run_results_sync(*, run: Run, actor: str = SYSTEM) -> list[tuple[Any, str, str]]:
    """Reconcile finished jobs with the experiment records of ``run``; idempotent.

    Ends stale jobs (the reaper's pass), then hands every still-active experiment whose jobs have
    all ended to the pipeline, which records the missed transition. Returns (experiment, from, to)
    for each experiment whose status changed.
    """
    jobs_reap_stale(stale_after_seconds=engine_config().stale_after_seconds)
    changed: list[tuple[Any, str, str]] = []
    active = Experiment.objects.filter(run=run, status__in=EXPERIMENT_ACTIVE_STATES).exclude(
        status=ExperimentStatus.HELD
    )
    for experiment in active:
        with transaction.atomic():
            locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
            jobs = list(Job.objects.filter(experiment=locked).order_by("created_at", "pk"))
            if not jobs or any(job.status in JOB_ACTIVE_STATES for job in jobs):
                continue  # nothing ran yet, or something still runs: nothing was missed
            last = jobs[-1]
            if (
                last.kind == JobKind.TRAIN
                and last.status == JobStatus.SUCCEEDED
                and any(job.kind == JobKind.EVALUATE for job in jobs)
            ):
                continue
            before = locked.status
            experiment_on_job_transition(job=last)
            after = Experiment.objects.values_list("status", flat=True).get(pk=locked.pk)
            if after != before:
                changed.append((locked, before, after))
    if changed:
        event_append(
            run=run,
            type="results.synced",
            actor=actor,
            role=SYSTEM,
            arguments={"changed": [[e.handle, a, b] for e, a, b in changed]},
        )
    return changed


def run_start(*, run: Run, actor: str = SYSTEM) -> Run:
    """Start a created run: record the prompt versions, give the Main Agent its loop, and wake it.

    Idempotent: starting a running run changes nothing. The run supervisor starts ticking on commit.
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status == RunStatus.RUNNING:
            return locked
        if locked.status != RunStatus.CREATED:
            raise Conflict("run_not_created", f"Run {locked.uuid} is {locked.status}; only a created run starts.")
        locked.started_at = timezone.now()
        locked.prompt_hashes = {"policy": locked.agent_mode, **prompt_hashes()}
        locked.save(update_fields=["started_at", "prompt_hashes", "updated_at"])
        locked = run_set_status(run=locked, status=RunStatus.RUNNING, actor=actor, reason="started")
        main = ResearchNode.objects.get(run=locked, kind=NodeKind.MAIN)
        # An external run's Main loop is created done: its harnesses drive the agents.
        agent_loop_ensure(node=main, policy=locked.agent_mode)
        main_trigger(run=locked, trigger=Trigger.RUN_START, actor=actor)
        run_supervise_start(run=locked)
    return locked


# Accelerator-seconds one final-split evaluation is budgeted at when reserving for the end.
FINAL_EVAL_SECONDS = 30


# The LLM token budget of an LLM run that names none.
DEFAULT_LLM_TOKENS = 2_000_000


def run_launch(
    *,
    benchmark: Benchmark | str,
    policy: str = AgentMode.HEURISTIC,
    llm_profile: str = DEFAULT_PROFILE,
    base_checkpoint: Checkpoint | None = None,
    name: str = "",
    wall_seconds: int = 3600,
    accelerator_seconds: int = 3600,
    llm_tokens: int = 0,
    parallel: int = 2,
    gate: bool = False,
    reviewer: bool = True,
    serial_workers: bool = False,
    max_workers: int = 4,
    screen_steps: int = 60,
    train_steps: int = 200,
    learning_rate: float = 2e-3,
    batch_size: int = 64,
    seed: int = 0,
    lr_scheduler_type: str = "cosine",
    actor: str = SYSTEM,
    created_by: Any = None,
    heuristic: dict[str, Any] | None = None,
    start: bool = True,
    search_policy: str = DEFAULT_SEARCH_POLICY,
) -> Run:
    """Create and start a run as a person asks for it (``manage.py start_run``, the dashboard's form).

    ``heuristic`` adds keys to the policy's ``heuristic`` block (the agent suites' weakening
    switches, apps/dojo/agents.py); ``start=False`` leaves the run ``created`` for a later
    ``run_start`` (a suite's queued cells).

    The final evaluation's cost is reserved from the accelerator budget. An LLM run names an
    endpoint profile (agent_config ``llm_profiles``); its configuration is checked now, with the
    variable to set, rather than inside a worker. The ablation switches are the paper's:
    ``reviewer=False`` (the Main Agent decides from Worker summaries alone) and
    ``serial_workers`` (one Worker at a time).
    """
    if policy not in (AgentMode.HEURISTIC, AgentMode.LLM):
        raise ApplicationError("invalid_policy", "policy is heuristic or llm.")
    if search_policy not in SEARCH_POLICIES:
        raise ApplicationError(
            "invalid_search_policy", f"search_policy is one of {', '.join(SEARCH_POLICIES)}, not {search_policy!r}."
        )
    if lr_scheduler_type not in LR_SCHEDULERS:
        raise ApplicationError(
            "invalid_lr_scheduler",
            f"lr_scheduler_type is one of {', '.join(LR_SCHEDULERS)}, not {lr_scheduler_type!r}.",
        )
    if policy == AgentMode.LLM:
        try:
            for role in ROLES:
                llm_config(role, llm_profile)
        except LLMNotConfigured as exc:
            raise ApplicationError("llm_not_configured", str(exc)) from None
        llm_tokens = llm_tokens or DEFAULT_LLM_TOKENS
    bench = benchmark if isinstance(benchmark, Benchmark) else benchmark_resolve(benchmark)
    base = base_checkpoint or base_checkpoint_default()
    if not base.is_base:
        raise ApplicationError("not_a_base_checkpoint", f"{base.handle} is not a registered θ0 checkpoint.")
    parallel = 1 if serial_workers else max(1, parallel)
    # θ0, the reference and up to max_workers accepted candidates are evaluated at the end.
    reserve = min(FINAL_EVAL_SECONDS * (2 + max_workers), accelerator_seconds // 4)
    label = policy if policy == AgentMode.HEURISTIC else f"llm:{llm_profile}"
    run = run_create(
        name=name or f"{bench.name} {label}",
        benchmark=bench,
        base_checkpoint=base,
        target_capability=bench.description or bench.task,
        budget_wall_seconds=wall_seconds,
        budget_accelerator_seconds=accelerator_seconds,
        budget_llm_tokens=llm_tokens,
        max_parallel_workers=parallel,
        reserved_final_seconds=reserve,
        agent_mode=policy,
        search_policy=search_policy,
        created_by=created_by,
        policy={
            "training_gate": gate,
            "reviewers": reviewer,
            "serial_workers": serial_workers,
            "seed": seed,
            **({"llm_profile": llm_profile} if policy == AgentMode.LLM else {}),
            "heuristic": {
                "max_workers": max_workers,
                "screen_steps": screen_steps,
                "train_steps": train_steps,
                "learning_rate": learning_rate,
                "batch_size": batch_size,
                "lr_scheduler_type": lr_scheduler_type,
                **(heuristic or {}),
            },
        },  # fmt: skip
    )
    return run_start(run=run, actor=actor) if start else run


def base_checkpoint_default() -> Checkpoint:
    """The θ0 a run starts from when none is named: the minibench's, else the first registered base."""
    base = Checkpoint.objects.filter(handle=THETA0_HANDLE).first() or Checkpoint.objects.filter(is_base=True).first()
    if base is None:
        raise ApplicationError("no_base_checkpoint", "No θ0 is installed: run `manage.py build_minibench` first.")
    return base


def run_pause(*, run: Run, actor: str, reason: str = "") -> Run:
    """An operator pauses a running run: no agent step and no new submission until resumed.

    Jobs already running finish (their results are recorded); the wall clock keeps counting.
    """
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current == RunStatus.PAUSED:
        return Run.objects.get(pk=run.pk)
    if current != RunStatus.RUNNING:
        raise Conflict("run_not_running", f"Run {run.uuid} is {current}; only a running run can be paused.")
    return run_set_status(run=run, status=RunStatus.PAUSED, actor=actor, reason=reason or "paused")


def run_resume(*, run: Run, actor: str) -> Run:
    """Resume a paused run; every scheduled agent step is re-sent on commit."""
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current == RunStatus.RUNNING:
        return Run.objects.get(pk=run.pk)
    if current != RunStatus.PAUSED:
        raise Conflict("run_not_paused", f"Run {run.uuid} is {current}; only a paused run can be resumed.")
    with transaction.atomic():
        resumed = run_set_status(run=run, status=RunStatus.RUNNING, actor=actor, reason="resumed")
        transaction.on_commit(lambda: agent_loops_resend(run=resumed))
        run_supervise_start(run=resumed)
    return resumed


def run_stop(*, run: Run, actor: str, reason: str = "", final_eval: bool = True, cancel_queued: bool = False) -> Run:
    """An operator stops a run.

    ``final_eval=True``: like the Main Agent's stop_loop — no new work, running jobs finish, then the
    final evaluation (also from a paused run); the run then ends ``finished``, its status history
    naming the stop. ``cancel_queued`` (a person's Stop): queued trainings and data jobs are
    cancelled too, and only running jobs and queued evaluations of finished trainings finish; the
    Main Agent's stop_loop leaves its queued work to run, as its prompt says.
    ``final_eval=False``: abort — active jobs are
    cancelled, agent loops end, and the run is ``stopped`` with no result.
    """
    current = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    if current in RUN_TERMINAL_STATES:
        raise Conflict("run_finished", f"Run {run.uuid} is already {current}.")
    if final_eval:
        if current in (RunStatus.STOPPING, RunStatus.FINAL_EVAL):
            return Run.objects.get(pk=run.pk)
        with transaction.atomic():
            stopped = run_set_status(run=run, status=RunStatus.STOPPING, actor=actor, reason=reason or "stopped")
            # A person's "no new work" includes what is queued: a training not yet started never starts.
            cancelled = run_queued_work_cancel(run=stopped, actor=actor) if cancel_queued else []
            event_append(run=stopped, type="run.stop_requested", actor=actor, role=SYSTEM,
                         arguments={"reason": reason or "stopped", "cancelled_jobs": cancelled,
                                    "finishing_jobs": run_finishing_jobs(run=stopped)})  # fmt: skip
            if current == RunStatus.PAUSED:
                # Paused steps were never sent: let the agents wrap up (summaries, reports).
                transaction.on_commit(lambda: agent_loops_resend(run=stopped))
        return stopped
    with transaction.atomic():
        stopped = run_set_status(run=run, status=RunStatus.STOPPED, actor=actor, reason=reason or "aborted")
        for job in Job.objects.filter(run=stopped, status__in=JOB_ACTIVE_STATES):
            with contextlib.suppress(Conflict):  # it ended meanwhile
                job_request_cancel(job=job, actor=actor)
        agent_loops_close(run=stopped, reason=f"run stopped by {actor}")
    return stopped


# What a stopping run cancels while queued: work that would start something new. A queued
# evaluation is the second half of a training that ran; it finishes so its experiment ends.
STOP_CANCELS_KINDS = (JobKind.TRAIN, JobKind.DATA)


def run_queued_work_cancel(*, run: Run, actor: str) -> list[str]:
    """Cancel the run's queued trainings and data jobs (a stop, a spent budget); their uuids.

    Called with the run ``stopping``, so no new submission is accepted meanwhile.
    """
    cancelled = []
    for job in Job.objects.filter(run=run, status=JobStatus.QUEUED, kind__in=STOP_CANCELS_KINDS).order_by("pk"):
        try:
            job_request_cancel(job=job, actor=actor)
            cancelled.append(str(job.uuid))
        except Conflict:
            pass  # claimed meanwhile: it runs to its end
    return cancelled


def run_finishing_jobs(*, run: Run) -> list[dict[str, str]]:
    """The jobs a stopping run lets finish: those running, and queued evaluations of finished trainings."""
    jobs = Job.objects.filter(run=run, status__in=JOB_ACTIVE_STATES).exclude(kind=JobKind.FINAL_EVAL).order_by("pk")
    return [{"job": str(job.uuid), "kind": job.kind, "status": job.status} for job in jobs]


@dataclass(frozen=True)
class BudgetState:
    """What is left of a run's budgets; ``exhausted`` names the spent ones."""

    wall_elapsed: float
    wall_left: float
    accelerator_used: float
    accelerator_left: float  # after the final-evaluation reserve
    tokens_used: int
    tokens_left: int
    exhausted: tuple[str, ...]


def run_budget_state(*, run: Run) -> BudgetState:
    """Budgets now. Accelerator time counts finished jobs and the elapsed time of running ones."""
    run = Run.objects.get(pk=run.pk)
    now = db_now()
    running = Job.objects.filter(run=run, status=JobStatus.RUNNING, queue=Queue.GPU, started_at__isnull=False).exclude(
        kind=JobKind.FINAL_EVAL
    )
    in_flight = sum(max(0.0, (now - job.started_at).total_seconds()) * job.accelerators for job in running)
    accelerator_used = run.used_accelerator_seconds + in_flight
    accelerator_left = run.budget_accelerator_seconds - run.reserved_final_seconds - accelerator_used
    elapsed = (now - run.started_at).total_seconds() if run.started_at else 0.0
    tokens_left = run.budget_llm_tokens - run.used_llm_tokens
    exhausted = []
    if run.started_at and elapsed >= run.budget_wall_seconds:
        exhausted.append("wall_clock")
    if accelerator_left <= 0:
        exhausted.append("accelerator_seconds")
    if run.agent_mode == AgentMode.LLM and tokens_left <= 0:
        exhausted.append("llm_tokens")
    return BudgetState(
        wall_elapsed=elapsed,
        wall_left=run.budget_wall_seconds - elapsed,
        accelerator_used=accelerator_used,
        accelerator_left=accelerator_left,
        tokens_used=run.used_llm_tokens,
        tokens_left=tokens_left,
        exhausted=tuple(exhausted),
    )


def run_budget_enforce(*, run: Run, actor: str = SYSTEM) -> Run:
    """When a budget is spent, the run stops taking work: ``stopping``, and queued training is cancelled.

    Running jobs finish (the evaluation of a finished training still runs, so its experiment ends);
    what has not started does not start. The final evaluation has its own reserve.
    """
    current = Run.objects.get(pk=run.pk)
    if current.status != RunStatus.RUNNING:
        return current
    budget = run_budget_state(run=current)
    if not budget.exhausted:
        return current
    with transaction.atomic():
        stopped = run_set_status(run=current, status=RunStatus.STOPPING, actor=actor,
                                 reason=f"budget spent: {', '.join(budget.exhausted)}")  # fmt: skip
        if stopped.status != RunStatus.STOPPING:
            return stopped
        cancelled = run_queued_work_cancel(run=stopped, actor=f"{actor}: budget spent")
        event_append(run=stopped, type="run.budget_exhausted", actor=actor, role=SYSTEM,
                     arguments={"exhausted": list(budget.exhausted), "cancelled_jobs": cancelled,
                                "accelerator_used": round(budget.accelerator_used, 3),
                                "wall_elapsed": round(budget.wall_elapsed, 3),
                                "tokens_used": budget.tokens_used})  # fmt: skip
    return stopped


def run_advance(
    *, run: Run, grace_seconds: float, quiet_seconds: float, silent_seconds: float = 1800.0, actor: str = SYSTEM
) -> Run:
    """Move a run along its end: stop a stuck or leaderless run, start the final evaluation, finish.

    Called by the run supervisor on every tick. A ``running`` run with nothing left to do (no
    active loop, experiment or trigger) is stopped after ``quiet_seconds`` — unless an outside
    harness holds an active node: then only once every such node has been silent (no call with
    its tokens) for ``silent_seconds``, since a harness may think for minutes between calls.
    ``stopping`` waits until no experiment is queued or running, then (up to ``grace_seconds``)
    for the agents' summaries and the integrity post-checks; ``final_eval`` waits for its
    evaluation jobs.
    """
    run = Run.objects.get(pk=run.pk)
    now = db_now()
    loops = AgentLoop.objects.filter(run=run)
    main_loop = loops.filter(node__kind=NodeKind.MAIN).first()
    active_experiments = Experiment.objects.filter(run=run, status__in=(ExperimentStatus.QUEUED,
                                                                        ExperimentStatus.RUNNING))  # fmt: skip
    if run.status == RunStatus.RUNNING:
        if main_loop is not None and main_loop.status == AgentLoopStatus.FAILED:
            return run_stop_request(run=run, reason=f"the Main Agent failed: {main_loop.last_error[:300]}", actor=actor)
        idle = (
            main_loop is not None and main_loop.status in (AgentLoopStatus.WAITING, AgentLoopStatus.DONE)
            and not main_loop.inbox
            and not loops.exclude(node__kind=NodeKind.MAIN).filter(status__in=AGENT_LOOP_ACTIVE_STATES).exists()
            and not active_experiments.exists()
            and not Experiment.objects.filter(run=run, status=ExperimentStatus.HELD).exists()
        )  # fmt: skip
        if not idle:
            return run
        held = run_held_nodes_last_seen(run)
        if held:
            silent = (now - max(held.values())).total_seconds()
            if silent > silent_seconds:
                return run_stop_request(run=run, actor=actor, reason=f"the agents holding {', '.join(sorted(held))} "
                                        f"have been silent for {silent:.0f}s")  # fmt: skip
            return run
        last = max([main_loop.updated_at, *[e.updated_at for e in Experiment.objects.filter(run=run)]])
        if (now - last).total_seconds() > quiet_seconds:
            return run_stop_request(run=run, reason="nothing left to do: no active branch, job or trigger",
                                    actor=actor)  # fmt: skip
        return run
    if run.status == RunStatus.STOPPING:
        if active_experiments.exists() or Job.objects.filter(run=run, status__in=JOB_ACTIVE_STATES).exists():
            return run
        change = run.status_changes.filter(to_status=RunStatus.STOPPING).order_by("-created_at").first()
        since = change.created_at if change else now
        ended = Experiment.objects.filter(run=run).order_by("-updated_at").values_list("updated_at", flat=True).first()
        waited = (now - max(since, ended or since)).total_seconds()
        busy_agents = loops.exclude(node__kind=NodeKind.MAIN).filter(status__in=AGENT_LOOP_ACTIVE_STATES).exists()
        unchecked = Experiment.objects.filter(run=run, status=ExperimentStatus.SUCCEEDED,
                                              integrity_status=IntegrityStatus.PENDING).exists()  # fmt: skip
        if (busy_agents or unchecked) and waited < grace_seconds:
            return run
        return run_final_eval_start(run=run, actor=actor)
    if run.status == RunStatus.FINAL_EVAL:
        if Job.objects.filter(run=run, kind=JobKind.FINAL_EVAL, status__in=JOB_ACTIVE_STATES).exists():
            return run
        return run_finish(run=run, actor=actor)
    return run


def run_final_eval_start(*, run: Run, actor: str = SYSTEM) -> Run:
    """Evaluate θ0, the reference and the accepted candidates on the final split (paid from the reserve).

    The returned checkpoint is fixed now (apps.flows.result_selection): the Main Agent's
    nomination if still accepted, else the accepted experiment with the best *feedback* score.
    The other accepted candidates are evaluated too, to be shown, never to select.
    """
    with transaction.atomic():
        locked = Run.objects.select_for_update().select_related("benchmark", "base_checkpoint").get(pk=run.pk)
        if locked.status != RunStatus.STOPPING:
            return locked
        # Every report judged again before the result is taken: a claim revised or a summary written
        # after its last check cannot change which experiments are accepted unseen.
        integrity_recheck_run_reports(run=locked)
        best, chosen_by = result_select(locked)
        # One evaluation per checkpoint, with every role it plays (the best may be θ0 itself).
        targets: dict[int, dict[str, Any]] = {}

        def add(role: str, checkpoint: Any, experiment: Any) -> None:
            target = targets.setdefault(checkpoint.pk, {"checkpoint": checkpoint, "roles": [], "experiment": None})
            if role == "candidate" and target["roles"]:
                return  # already evaluated in another role; a candidate is only shown once
            target["roles"].append(role)
            if experiment is not None and target["experiment"] is None:
                target["experiment"] = experiment.handle

        add("theta0", locked.base_checkpoint, None)
        if locked.benchmark.reference_checkpoint is not None:
            add("reference", locked.benchmark.reference_checkpoint, None)
        # The others accepted are shown next to it, best first; they never select.
        candidates = selectable_experiments(locked).order_by("-feedback_score", "created_at", "pk")
        for experiment in [best, *candidates]:
            if experiment is not None:
                add("best" if experiment == best else "candidate",
                    experiment.output_checkpoint or experiment.input_checkpoint, experiment)  # fmt: skip
        jobs = []
        for target in targets.values():
            checkpoint = target["checkpoint"]
            spec = {**evaluation_spec(checkpoint=checkpoint, benchmark=locked.benchmark, split="final"),
                    "roles": target["roles"], "experiment": target["experiment"]}  # fmt: skip
            job = job_enqueue(kind=JobKind.FINAL_EVAL, spec=spec, run=locked)
            jobs.append({"roles": target["roles"], "checkpoint": checkpoint.handle, "job": str(job.uuid),
                         "experiment": target["experiment"]})  # fmt: skip
        event_append(run=locked, type="run.final_eval_started", actor=actor, role=SYSTEM,
                     arguments={"best": best.handle if best is not None else None, "chosen_by": chosen_by,
                                "jobs": jobs})  # fmt: skip
        return run_set_status(run=locked, status=RunStatus.FINAL_EVAL, actor=actor,
                              reason=f"final evaluation of {len(jobs)} checkpoints")  # fmt: skip


def run_finish(*, run: Run, actor: str = SYSTEM) -> Run:
    """Record the final result (best accepted checkpoint next to θ0 and the reference) and finish."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status != RunStatus.FINAL_EVAL:
            return locked
        rows: dict[str, Any] = {"theta0": None, "reference": None, "best": None, "candidates": []}
        for job in Job.objects.filter(run=locked, kind=JobKind.FINAL_EVAL).select_related("evaluation").order_by("pk"):
            evaluation = getattr(job, "evaluation", None) if job.status == JobStatus.SUCCEEDED else None
            row = {"checkpoint": job.spec.get("checkpoint"), "experiment": job.spec.get("experiment"),
                   "job": str(job.uuid), "status": job.status,
                   "final_score": evaluation.score if evaluation is not None else None}  # fmt: skip
            row["checkpoint_handle"] = Checkpoint.objects.filter(uuid=row["checkpoint"]).values_list(
                "handle", flat=True).first()  # fmt: skip
            for role in job.spec.get("roles") or [job.spec.get("role", "candidate")]:
                if role == "candidate":
                    rows["candidates"].append(row)
                else:
                    rows[role] = {**row, "experiment": row["experiment"] if role == "best" else None}
        best, theta0 = rows["best"], rows["theta0"]
        if best is not None and best["experiment"]:
            experiment = Experiment.objects.select_related("output_checkpoint", "input_checkpoint").get(
                run=locked, handle=best["experiment"])  # fmt: skip
            best["feedback_score"] = experiment.feedback_score
            locked.result_checkpoint = experiment.output_checkpoint or experiment.input_checkpoint
        rows["beats_theta0"] = bool(
            best and theta0 and best["final_score"] is not None and theta0["final_score"] is not None
            and best["final_score"] > theta0["final_score"]
        )  # fmt: skip
        locked.finished_at = timezone.now()
        locked.save(update_fields=["result_checkpoint", "finished_at", "updated_at"])
        event_append(
            run=locked,
            type="run.final_result",
            actor=actor,
            role=SYSTEM,
            arguments=rows,
            result_ref=f"checkpoint:{locked.result_checkpoint.uuid}" if locked.result_checkpoint else "",
        )
        reason = "final evaluation done" if best else "final evaluation done; no accepted checkpoint"
        finished = run_set_status(run=locked, status=RunStatus.FINISHED, actor=actor, reason=reason)
        agent_loops_close(run=finished, reason="the run finished")
    # The finished chain verified once more, and its head anchored (apps.experiments.anchors).
    key = chain_key(finished)
    transaction.on_commit(lambda: chain_verify(key))
    return finished


def run_final_result(*, run: Run) -> dict[str, Any] | None:
    """The recorded final result of a finished run (as ``run_finish`` wrote it), or None."""
    event = Event.objects.filter(run=run, type="run.final_result").order_by("-id").first()
    return dict(event.arguments) if event is not None else None
