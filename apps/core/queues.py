"""Celery queue and task names, declared once for the services that send and the workers that run.

Django-free (rsiweb/celery.py reads it before settings load). Services send tasks by name
(``app.send_task``), so apps/ never imports workers/; the worker modules register their tasks
under these same names.
"""

from __future__ import annotations

from enum import StrEnum


class Queue(StrEnum):
    GPU = "gpu"  # training and evaluation: one process per accelerator
    AGENTS = "agents"  # LLM / heuristic agent loops, I/O bound
    DEFAULT = "default"  # data jobs, integrity scans, the reaper


class TaskName(StrEnum):
    TRAIN_JOB = "workers.gpu.train_job_task"
    EVALUATE_JOB = "workers.gpu.evaluate_job_task"
    DOJO_BUILD_JOB = "workers.gpu.dojo_build_job_task"
    AGENT_SFT_JOB = "workers.gpu.agent_sft_job_task"
    DATA_JOB = "workers.data.data_job_task"
    INTEGRITY_CHECK = "workers.data.integrity_check_task"
    INTEGRITY_REPORTS = "workers.data.integrity_reports_task"
    REAP_JOBS = "workers.data.reap_jobs_task"
    ALERT_DELIVER = "workers.data.alert_deliver_task"
    AGENT_STEP = "workers.agents.agent_step_task"
    RUN_SUPERVISE = "workers.agents.run_supervise_task"
    SUITE_ADVANCE = "workers.agents.suite_advance_task"


# Where each task family runs (rsiweb/celery.py's task_routes).
TASK_ROUTES = {
    "workers.gpu.*": {"queue": Queue.GPU.value},
    "workers.agents.*": {"queue": Queue.AGENTS.value},
    "workers.data.*": {"queue": Queue.DEFAULT.value},
}
