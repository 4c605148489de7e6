"""The one Celery app: three queues, explicit routes (STYLE.md 17)."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue as KombuQueue

from apps.core.queues import TASK_ROUTES, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings.base")

app = Celery("rsiweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = tuple(KombuQueue(name.value) for name in Queue)
app.conf.task_default_queue = Queue.DEFAULT.value
app.conf.task_routes = TASK_ROUTES
# workers/ is not a Django app, so its task modules are named explicitly.
app.autodiscover_tasks(packages=["workers.gpu", "workers.agents", "workers.data"], related_name="tasks")
