"""The one Celery app: three queues, explicit routes (STYLE.md 17)."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings.base")

QUEUE_GPU = "gpu"  # training and evaluation: one process per accelerator
QUEUE_AGENTS = "agents"  # LLM / heuristic agent loops, I/O bound
QUEUE_DEFAULT = "default"  # data jobs, integrity scans, the reaper
QUEUES = (QUEUE_GPU, QUEUE_AGENTS, QUEUE_DEFAULT)

app = Celery("rsiweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = tuple(Queue(name) for name in QUEUES)
app.conf.task_default_queue = QUEUE_DEFAULT
app.conf.task_routes = {
    "workers.gpu.*": {"queue": QUEUE_GPU},
    "workers.agents.*": {"queue": QUEUE_AGENTS},
    "workers.data.*": {"queue": QUEUE_DEFAULT},
}
# workers/ is not a Django app, so its task modules are named explicitly.
app.autodiscover_tasks(packages=["workers.gpu", "workers.agents", "workers.data"], related_name="tasks")
