from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPING = "stopping"  # no new work; running jobs finish, then the final evaluation
    FINAL_EVAL = "final_eval"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


RUN_ACTIVE_STATES = (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.STOPPING, RunStatus.FINAL_EVAL)
RUN_TERMINAL_STATES = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED)


class AgentMode(models.TextChoices):
    HEURISTIC = "heuristic"
    LLM = "llm"
    EXTERNAL = "external"  # agents are outside harnesses holding tokens


class NodeKind(models.TextChoices):
    MAIN = "main"
    WORKER = "worker"
    REVIEWER = "reviewer"


class NodeStatus(models.TextChoices):
    ACTIVE = "active"
    FINALIZED = "finalized"
    CANCELLED = "cancelled"


class EdgeKind(models.TextChoices):
    CONTEXT = "context"  # Worker -> Worker: the downstream sees the upstream's experiments
    REVIEW_SCOPE = "review_scope"  # Worker -> Reviewer: the reviewer judges the upstream


class DecisionKind(models.TextChoices):
    CONTINUE = "continue"
    VERIFY = "verify"
    BRANCH = "branch"
    REVISE = "revise"
    STOP = "stop"
    NOMINATE = "nominate"  # the checkpoint the run returns (apps.flows.nominations)


class Trigger(models.TextChoices):
    RUN_START = "run_start"
    WORKER_FINALIZE = "worker_finalize"
    REVIEW_REPORT = "review_report"
    TRAINING_GATE = "training_gate"
    GUIDANCE = "guidance"
    JOBS_FAILING = "jobs_failing"  # most of the run's recent jobs failed (run_health_on_job_ended)


class PredictionVerdict(models.TextChoices):
    OPEN = "open"
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"


class CandidateStatus(models.TextChoices):
    OPEN = "open"
    ADOPTED = "adopted"
    DROPPED = "dropped"


class AgentLoopStatus(models.TextChoices):
    """Where one agent's step loop stands (apps/research/agent_loops.py owns its transitions)."""

    SCHEDULED = "scheduled"  # a step message is (or is about to be) on the agents queue
    RUNNING = "running"  # a worker claimed the step and is executing it
    WAITING = "waiting"  # idle until a trigger wakes it (the Main Agent between planning steps)
    DONE = "done"  # the agent finished (finalized, stopped, or its run ended)
    FAILED = "failed"  # the step kept failing; last_error says why


AGENT_LOOP_ACTIVE_STATES = (AgentLoopStatus.SCHEDULED, AgentLoopStatus.RUNNING, AgentLoopStatus.WAITING)
