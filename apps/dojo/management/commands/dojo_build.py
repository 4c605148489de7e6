"""Build RSI-Dojo task environments from a task source (queued on the gpu queue, or inline)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.dojo.choices import BUILD_TERMINAL_STATES
from apps.dojo.models import EnvironmentBuild
from apps.dojo.services import environment_build_create, environment_build_execute


class Command(BaseCommand):
    help = (
        "Apply RSI-Craft's filters (subset split, size, reliability, mutation, discriminability) to a "
        "task source and record every decision. Offline: --minibench ROOT uses its θ0 as the base "
        "and the task's reference as the strong model."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--source", default="minibench-variants:arithmetic",
                            help="minibench-variants:<task>[,<task>] or folder:<path>")  # fmt: skip
        parser.add_argument("--minibench", type=Path, help="a built minibench: base = theta0, strong = reference")
        parser.add_argument("--strong-task", default="arithmetic", help="whose minibench reference is the strong model")
        parser.add_argument("--base", type=Path, help="base model checkpoint folder (overrides --minibench)")
        parser.add_argument("--strong", type=Path, help="strong model checkpoint folder (overrides --minibench)")
        parser.add_argument("--config", default="{}", help='filter thresholds as JSON, e.g. {"repeats": 3}')
        parser.add_argument("--inline", action="store_true", help="run here instead of on a gpu worker")
        parser.add_argument("--wait", type=float, default=0, help="seconds to wait for a queued build to end")

    def handle(self, *args: Any, **options: Any) -> None:
        root: Path | None = options["minibench"]
        base = options["base"] or (root / "theta0" if root else None)
        strong = options["strong"] or (root / "references" / options["strong_task"] if root else None)
        if base is None or strong is None:
            raise CommandError("name the models: --minibench ROOT, or --base and --strong")
        try:
            config = json.loads(options["config"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--config is not JSON: {exc}") from exc
        try:
            build = environment_build_create(
                source=options["source"], base_dir=base, strong_dir=strong, config=config,
                enqueue=not options["inline"],
            )  # fmt: skip
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        if options["inline"]:
            environment_build_execute(build=build, log=lambda text: self.stdout.write(text))
        else:
            deadline = time.monotonic() + options["wait"]
            while build.status not in BUILD_TERMINAL_STATES and time.monotonic() < deadline:
                time.sleep(1)
                build.refresh_from_db()
        self._report(build)

    def _report(self, build: EnvironmentBuild) -> None:
        build.refresh_from_db()
        self.stdout.write(f"build {build.uuid}: {build.status}")
        for env in build.environments.order_by("name"):
            reason = f" {env.reason} at {env.rejected_at}" if env.reason else ""
            self.stdout.write(f"  {env.name}: {env.status}{reason} ({env.seconds:.1f}s)")
        if build.summary:
            self.stdout.write(json.dumps(build.summary, sort_keys=True))
