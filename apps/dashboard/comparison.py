"""What the comparison and ablation pages show, from apps.flows.compare's reads.

The curves are plotly figures as JSON-ready dicts, drawn by ``static/dashboard/compare.js``
with the vendored plotly.js (no CDN).
"""

from __future__ import annotations

from itertools import combinations
from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from django.utils import timezone

from apps.flows.compare import ablation_groups, best_so_far, config_diff, run_final_score, runs_paired
from apps.research.models import Run

COMPARE_MAX_RUNS = 8
# Okabe-Ito: one colour per run, readable by most colour-blind readers (as charts.py).
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]


def runs_by_uuid(uuids: list[str]) -> list[Run]:
    """The runs named, oldest first (the baseline usually came first), each once; unknown ids skipped."""
    valid = [u for u in uuids if is_uuid(u)]
    return list(
        Run.objects.select_related("benchmark", "base_checkpoint", "result_checkpoint")
        .filter(uuid__in=valid)
        .order_by("created_at", "pk")
    )


def is_uuid(value: str) -> bool:
    try:
        UUID(value)
    except ValueError:
        return False
    return True


def run_comparison(runs: list[Run]) -> dict[str, Any]:
    """The comparison page: config diff, best-so-far curves, final scores, paired bootstraps."""
    finals = [run_final_score(run) for run in runs]
    columns = [
        {"run": run, "colour": COLOURS[i % len(COLOURS)], "final": final}
        for i, (run, final) in enumerate(zip(runs, finals, strict=True))
    ]
    pairs = []
    for (i, first), (j, second) in combinations(enumerate(runs), 2):
        pairs.append(
            {"a": first, "b": second, "a_index": i + 1, "b_index": j + 1, "paired": runs_paired(first, second)}
        )
    rows = config_diff(runs)
    return {
        "columns": columns,
        "config_rows": rows,
        "differing": sum(1 for row in rows if row["differs"]),
        "pairs": pairs,
        "curves": best_so_far_figure(runs),
    }


def best_so_far_figure(runs: list[Run]) -> dict[str, Any]:
    """Each run's best accepted feedback score over minutes since its start, on one time axis."""
    traces = []
    for i, run in enumerate(runs):
        points = best_so_far(run)
        if not points:
            continue
        x = [round(p["seconds"] / 60, 3) for p in points]
        y = [p["best"] for p in points]
        text = [p["experiment"] for p in points]
        # Hold the last best to the run's end, so a run that stopped improving still reads as a line.
        end = run.finished_at or timezone.now()
        origin = run.started_at or run.created_at
        end_minutes = round(max(0.0, (end - origin).total_seconds()) / 60, 3)
        if end_minutes > x[-1]:
            x, y, text = [*x, end_minutes], [*y, y[-1]], [*text, "end of run" if run.finished_at else "now"]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{i + 1}. {run.name}",
                "x": x,
                "y": y,
                "text": text,
                "line": {"shape": "hv", "color": COLOURS[i % len(COLOURS)]},
                "hovertemplate": "%{text}<br>%{x:.1f} min: %{y:.3f}<extra>%{fullData.name}</extra>",
            }
        )
    return {
        "data": traces,
        "layout": {
            "template": "none",
            "title": {"text": "Best accepted feedback score so far", "x": 0.01, "font": {"size": 14}},
            "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1f2933"},
            "margin": {"l": 56, "r": 16, "t": 40, "b": 40},
            "height": 340,
            "xaxis": {
                "title": {"text": "minutes since the run started"},
                "rangemode": "tozero",
                "gridcolor": "#e4e7eb",
            },
            "yaxis": {"title": {"text": "feedback score"}, "gridcolor": "#e4e7eb", "tickformat": ".2f"},
            "legend": {"orientation": "h", "y": -0.25, "x": 0, "yanchor": "top"},
            "hovermode": "closest",
        },
    }


def run_ablation_view(runs: QuerySet[Run]) -> list[dict[str, Any]]:
    """The ablation page's groups (per benchmark and budget, one column per arm)."""
    return ablation_groups(list(runs.select_related("benchmark", "result_checkpoint")))
