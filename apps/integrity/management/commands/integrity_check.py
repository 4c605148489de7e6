"""Re-run the post-submission integrity checks: ``manage.py integrity_check --run <uuid>`` (every ended
experiment of a run) or ``--experiment <uuid>``; ``--reporting`` limits them to the reporting three.

For operators: after a check was fixed or a file restored, or when an experiment ended while the
workers were down. Prints one line per experiment with its integrity status.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.choices import EXPERIMENT_TERMINAL_STATES
from apps.experiments.models import Experiment
from apps.integrity.checks import REPORTING
from apps.integrity.services import integrity_run_checks


class Command(BaseCommand):
    help = "Re-run the integrity checks of one experiment or of every ended experiment of a run."

    def add_arguments(self, parser: Any) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--run", help="run uuid")
        target.add_argument("--experiment", help="experiment uuid")
        parser.add_argument("--reporting", action="store_true", help="only the reporting subcategories")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["experiment"]:
            experiments = Experiment.objects.filter(uuid=options["experiment"])
        else:
            experiments = Experiment.objects.filter(run__uuid=options["run"], status__in=EXPERIMENT_TERMINAL_STATES)
        experiments = experiments.order_by("pk")
        if not experiments.exists():
            raise CommandError("No matching ended experiment.")
        for experiment in experiments:
            findings = integrity_run_checks(
                experiment=experiment, subcategories=REPORTING if options["reporting"] else None
            )
            experiment.refresh_from_db()
            open_items = [f"{f.subcategory}={f.observation}" for f in findings if f.observation != "NOT_FOUND_FULL"]
            self.stdout.write(f"{experiment.handle} {experiment.integrity_status} {' '.join(open_items)}".rstrip())
