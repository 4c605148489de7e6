"""Build the minibench (once per seed and profile) and install it: θ0, references, sealed benchmarks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.benchmarks.build_progress import BuildProgress, build_progress_finish, minibench_build
from apps.benchmarks.services import minibench_install
from apps.core.errors import ApplicationError


class Command(BaseCommand):
    help = "Build the tiny benchmark offline from a seed (skipped when already built) and register it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--seed", type=int, default=0, help="data, tokenizer and weights seed (default: 0)")
        parser.add_argument(
            "--profile",
            choices=("full", "ci", "demo"),
            default="full",
            help="ci: one task (arithmetic), minutes on a CPU; full: every task; demo: the ci task with a "
            "reference trained in a few minutes, registered as minibench-demo/... (manage.py demo's) "
            "(default: full)",
        )
        parser.add_argument("--out", type=Path, default=None, help="build folder (default: RSI_MINIBENCH_ROOT)")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"] or settings.MINIBENCH_ROOT)
        seed, profile = options["seed"], options["profile"]
        manifest_path = out / "manifest.json"
        progress: BuildProgress | None = None
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if (manifest.get("seed"), manifest.get("profile")) != (seed, profile):
                raise CommandError(
                    f"{out} holds a minibench built with seed {manifest.get('seed')} profile "
                    f"{manifest.get('profile')}; pass another --out for seed {seed} profile {profile}."
                )
            self.stdout.write(f"minibench already built in {out} (seed {seed}, profile {profile})")
        else:
            if out.exists() and any(out.iterdir()):
                raise CommandError(
                    f"{out} is not empty but has no manifest.json (an interrupted build?); "
                    "remove it or pass another --out."
                )
            log_path = Path(settings.DATA_DIR) / "logs" / "minibench-build.log"
            self.stdout.write(f"building the minibench in {out} (seed {seed}, profile {profile}; log {log_path})")
            try:
                progress = minibench_build(out, seed=seed, profile=profile, log_path=log_path, on_update=self._show)
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
            finally:
                self._end_line()
        try:
            result = minibench_install(root=out)
        except ApplicationError as exc:
            if progress is not None:
                build_progress_finish(progress, out=out, error=f"{exc.code}: {exc.message}")
            raise CommandError(f"{exc.code}: {exc.message}") from None
        if progress is not None:
            build_progress_finish(progress, out=out)
        self.stdout.write(f"θ0: {result['theta0']} ({'registered' if result['theta0_created'] else 'already there'})")
        for task in result["tasks"]:
            state = "registered" if task["benchmark_created"] else "already there"
            self.stdout.write(f"benchmark {task['benchmark']} ({state}); reference {task['reference']}")

    # A terminal gets one line redrawn in place; a log file (no tty) a line per stage and per 10%.
    _on_line = False
    _last: tuple[str, int] = ("", -1)

    def _show(self, progress: BuildProgress) -> None:
        if self.stdout.isatty():
            self.stdout.write("\r\033[K" + progress.line(), ending="")
            self.stdout.flush()
            self._on_line = True
            return
        key = (progress.stage, int(progress.fraction * 10))
        if key != self._last:
            self._last = key
            self.stdout.write(progress.line())
            self.stdout.flush()

    def _end_line(self) -> None:
        if self._on_line:
            self.stdout.write("")
            self._on_line = False
