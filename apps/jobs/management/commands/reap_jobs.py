"""Reap jobs whose heartbeat went stale: once (cron, an operator) or in a loop.

Workers already run the reaper in a thread (workers.runtime); this command is for a host with no
worker up, or to reap at once after a crash instead of waiting for the next sweep.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand

from apps.jobs.services import engine_config, jobs_reap_stale


class Command(BaseCommand):
    help = "Mark running jobs with a stale heartbeat lost and queue their next attempt."

    def add_arguments(self, parser: Any) -> None:
        config = engine_config()
        parser.add_argument(
            "--stale-after", type=float, default=config.stale_after_seconds,
            help=f"seconds without a heartbeat before a job counts as lost (default {config.stale_after_seconds:g})",
        )  # fmt: skip
        parser.add_argument("--loop", action="store_true", help="keep sweeping until interrupted")
        parser.add_argument(
            "--interval", type=float, default=config.reaper_interval_seconds, help="seconds between sweeps"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        while True:
            for job in jobs_reap_stale(stale_after_seconds=options["stale_after"]):
                successor = getattr(job, "next_attempt", None)
                follow = f"; attempt {successor.attempt} queued as {successor.uuid}" if successor else ""
                self.stdout.write(f"job {job.uuid} attempt {job.attempt}: {job.status}{follow}")
            if not options["loop"]:
                return
            time.sleep(options["interval"])
