"""Build the minibench (once per seed and profile) and install it: θ0, references, sealed benchmarks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.benchmarks.services import minibench_install
from apps.core.errors import ApplicationError


class Command(BaseCommand):
    help = "Build the tiny benchmark offline from a seed (skipped when already built) and register it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--profile", choices=("full", "ci"), default="full")
        parser.add_argument("--out", type=Path, default=None, help="build folder (default: RSI_MINIBENCH_ROOT)")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"] or settings.MINIBENCH_ROOT)
        seed, profile = options["seed"], options["profile"]
        manifest_path = out / "manifest.json"
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
            # The builder pulls in torch, which the install step does not need.
            from apps.benchmarks.minibench import build_minibench  # noqa: PLC0415 - heavy (torch), build only

            self.stdout.write(f"building the minibench in {out} (seed {seed}, profile {profile}) ...")
            build_minibench(out, seed=seed, profile=profile)
        try:
            result = minibench_install(root=out)
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(f"θ0: {result['theta0']} ({'registered' if result['theta0_created'] else 'already there'})")
        for task in result["tasks"]:
            state = "registered" if task["benchmark_created"] else "already there"
            self.stdout.write(f"benchmark {task['benchmark']} ({state}); reference {task['reference']}")
