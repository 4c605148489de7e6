"""Write a run bundle: ``manage.py export_run <run-uuid> <path>`` (apps.flows.bundle, docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.core.errors import ApplicationError
from apps.flows.bundle import bundle_archive, export_run_bundle
from apps.research.models import Run


class Command(BaseCommand):
    help = "Export one run as a bundle (zip of run.json and scores.csv); no sealed data, no artifacts."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", help="the run's UUID")
        parser.add_argument("path", help="where to write the bundle (a .zip file)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = Run.objects.select_related("benchmark").get(uuid=options["run"])
        except (Run.DoesNotExist, ValidationError):
            raise CommandError(f"No run {options['run']!r}.") from None
        try:
            archive = bundle_archive(export_run_bundle(run))
        except ApplicationError as error:
            raise CommandError(error.message) from None
        path = Path(options["path"])
        path.write_bytes(archive)
        self.stdout.write(f"run {run.uuid} ({run.name!r}) exported to {path} ({len(archive)} bytes)")
