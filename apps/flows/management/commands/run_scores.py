"""Print a run's scores: ``manage.py run_scores <run-uuid> [--split final] [--json]`` (apps.flows.scores).

The same numbers as the run page's result block and ``GET /api/v1/runs/<uuid>/scores``: raw score
with its bootstrap CI, θ0, reference, the Lite-normalised gain, integrity counts, and the cell as
PostTrainBench's leaderboard computes it under both readings, with its published weight.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from apps.benchmarks.models import Split
from apps.flows.scores import ScoreCI, run_leaderboard, run_scores
from apps.research.models import Run


def _line(label: str, entry: ScoreCI | None) -> str:
    if entry is None:
        return f"{label:<12} not evaluated"
    ci = f"  CI {entry.low:.3f}–{entry.high:.3f}" if entry.low is not None and entry.high is not None else ""
    return f"{label:<12} {entry.score:.3f}  n={entry.n}{ci}  ({entry.checkpoint})"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


class Command(BaseCommand):
    help = "Print a run's scores (raw, θ0, reference with CIs; Lite gain; PostTrainBench cell and weight)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run", help="the run's UUID")
        parser.add_argument("--split", default=Split.FINAL, choices=[s.value for s in Split], help="default: final")
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = Run.objects.select_related("benchmark").get(uuid=options["run"])
        except (Run.DoesNotExist, ValidationError):
            raise CommandError(f"No run {options['run']!r}.") from None
        scores = run_scores(run=run, split=options["split"])
        board = run_leaderboard(run=run, split=options["split"], scores=scores)
        if options["json"]:
            self.stdout.write(json.dumps({"scores": scores.as_dict(), "leaderboard": board}, indent=2))
            return
        cells = board["cell"]
        weight = (
            f"weight {board['weight']:.4f} ({board['weight_source']})"
            if board["weight"] is not None
            else "unweighted (no published PostTrainBench weight)"
        )
        lines = [
            f"run {run.uuid} ({run.name!r}) on {run.benchmark.name}, {scores.split} split",
            f"returned     {scores.returned_checkpoint or 'none'}",
            _line("score", scores.raw),
            _line("θ0", scores.theta0),
            _line("reference", scores.reference),
            f"Lite gain    {_number(scores.gain)}  {scores.gain_note}".rstrip(),
            f"PTB cell     {_number(cells['substitute']['value'])} (θ0 substituted when flagged or missing)"
            f"  ·  {_number(cells['max']['value'])} (max(s, θ0))  ·  {weight}",
            f"integrity    {scores.hacked} of {scores.submissions_ran} submissions hacked, "
            f"{scores.suspected} suspected (not yet adjudicated), {scores.blocked_attempts} blocked attempts"
            f"  ·  hacking rate {scores.hacking_headline}",
        ]
        if scores.small_split:
            lines.append(f"warning      {scores.small_split}")
        self.stdout.write("\n".join(lines))
