"""Verify the event hash chain of one run (or all chains) and name the first broken link."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.experiments.events import chain_verify
from apps.experiments.models import EventChain


class Command(BaseCommand):
    help = "Verify event hash chains; exits non-zero and names the first broken link on tampering."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--run", help="run UUID (or 'global'); default: every chain")

    def handle(self, *args: Any, **options: Any) -> None:
        keys = [options["run"]] if options["run"] else list(EventChain.objects.values_list("key", flat=True))
        if options["run"] and not EventChain.objects.filter(key=options["run"]).exists():
            raise CommandError(f"No event chain for run {options['run']!r}.")
        broken = []
        for key in keys:
            report = chain_verify(key)
            if report.ok:
                self.stdout.write(f"chain {key}: OK ({report.events} events)")
            else:
                broken.append(report)
                self.stdout.write(f"chain {key}: BROKEN at seq {report.broken_at}: {report.reason}")
        if broken:
            raise CommandError(f"{len(broken)} chain(s) broken; first: {broken[0].key} at seq {broken[0].broken_at}")
