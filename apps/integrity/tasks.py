"""The integrity task (queue ``default``): run the post-submission checks of one experiment.

Registered by ``IntegrityConfig.ready`` so every worker and web process knows it; named
``workers.data.*`` so the Celery routes put it on the default queue with the other data work.
"""

from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(
    name="workers.data.integrity_check_task",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=1800,
    time_limit=1860,
)
def integrity_check_task(*, experiment_id: int, reporting_only: bool = False) -> int:
    """Run the checks of one experiment (all twelve, or the reporting three); returns the findings stored.

    Safe to deliver twice: the checks are deterministic and an unchanged finding writes nothing.
    """
    from apps.integrity.services import integrity_check_experiment

    return len(integrity_check_experiment(experiment_id=experiment_id, reporting_only=reporting_only))
