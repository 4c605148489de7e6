"""plotly figures of a run, built on the server and drawn by plotly.js in the page.

Each builder reads through the ORM and returns a ``plotly.graph_objects.Figure``;
``run_charts`` returns them all as JSON-ready dicts for ``/runs/<uuid>/charts.json``. The page
re-fetches that document when a live event says the run changed (never on a timer).

Figures use the empty "none" template plus a few layout settings of ours: the default plotly
template adds about 6 KB of JSON to every figure and a look that clashes with the page.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from django.db.models import F
from django.utils import timezone
from plotly.utils import PlotlyJSONEncoder

from apps.core.queues import Queue
from apps.dashboard.selectors import run_reference_scores
from apps.experiments.choices import IntegrityStatus
from apps.experiments.models import Evaluation, Event, Experiment
from apps.expos.registry import load_all
from apps.jobs.models import Job
from apps.research.choices import DecisionKind, Trigger
from apps.research.models import Decision, LLMUsage, Run

INTERVALS = 5
ACCELERATOR_QUEUE = Queue.GPU
# One colour per category / kind, readable on white and by most colour-blind readers (Okabe-Ito).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
INTEGRITY_SYMBOL = {
    IntegrityStatus.ACCEPTED: "circle",
    IntegrityStatus.PENDING: "circle-open",
    IntegrityStatus.FLAGGED: "x",
}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "template": "none",
        "title": {"text": title, "x": 0.01, "font": {"size": 14}},
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#1f2933"},
        "margin": {"l": 56, "r": 16, "t": 40, "b": 40},
        "height": 300,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "legend": {"orientation": "h", "y": -0.22, "x": 0, "yanchor": "top"},
        "xaxis": {"gridcolor": "#e4e7eb", "zeroline": False, "automargin": True},
        "yaxis": {"gridcolor": "#e4e7eb", "zeroline": False, "automargin": True},
        "hovermode": "closest",
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _empty(figure: go.Figure, message: str) -> go.Figure:
    figure.add_annotation(
        text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"color": "#7b8794"}
    )
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False)
    return figure


def _run_span(run: Run, *, now: datetime) -> tuple[datetime, datetime]:
    start = run.started_at or run.created_at
    end = run.finished_at or now
    return start, max(end, start + timedelta(seconds=1))


def _scored_experiments(run: Run) -> list[tuple[Experiment, datetime]]:
    """Experiments with a feedback score, each with the moment the score became known.

    That moment is the feedback evaluation's creation; an experiment scored without an
    evaluation row (imported, or a test) falls back to its last change.
    """
    experiments = list(
        Experiment.objects.filter(run=run, feedback_score__isnull=False)
        .select_related("owner", "output_checkpoint")
        .order_by("created_at", "pk")
    )
    scored_at = dict(
        Evaluation.objects.filter(experiment__in=experiments, split="feedback", status="ok")
        .order_by("experiment_id", "created_at")
        .values_list("experiment_id", "created_at")
    )
    rows = [(e, scored_at.get(e.pk, e.updated_at)) for e in experiments]
    rows.sort(key=lambda row: (row[1], row[0].pk))
    return rows


def best_so_far_figure(run: Run) -> go.Figure:
    """Best accepted feedback score over time, final-split scores where known, θ0 and reference lines."""
    figure = go.Figure(
        layout=_layout("Best accepted score so far", yaxis={"title": {"text": "score"}}, xaxis=_time_axis(run))
    )
    rows = [(e, t) for e, t in _scored_experiments(run) if e.integrity_status == IntegrityStatus.ACCEPTED]
    references = run_reference_scores(run)
    xs: list[datetime] = []
    ys: list[float] = []
    texts: list[str] = []
    best = None
    for experiment, at in rows:
        if best is None or experiment.feedback_score > best[0]:
            best = (experiment.feedback_score, experiment.handle)
        xs.append(at)
        ys.append(best[0])
        texts.append(best[1])
    if xs:
        end = run.finished_at or timezone.now()
        # Extend the step to now (or the end): the best stays best until something beats it.
        figure.add_trace(
            go.Scatter(
                x=[*xs, max(end, xs[-1])],
                y=[*ys, ys[-1]],
                text=[*texts, texts[-1]],
                mode="lines+markers",
                line={"shape": "hv", "color": PALETTE[0], "width": 2},
                name="best accepted (feedback)",
                hovertemplate="%{text}<br>%{y:.3f}<extra></extra>",
            )
        )
        checkpoints = {e.output_checkpoint_id: (e, at) for e, at in rows if e.output_checkpoint_id}
        finals = (
            Evaluation.objects.filter(checkpoint_id__in=checkpoints, split="final", status="ok")
            .order_by("created_at")
            .values_list("checkpoint_id", "score")
        )
        final_points = {cid: score for cid, score in finals}
        if final_points:
            figure.add_trace(
                go.Scatter(
                    x=[checkpoints[cid][1] for cid in final_points],
                    y=list(final_points.values()),
                    text=[checkpoints[cid][0].handle for cid in final_points],
                    mode="markers",
                    marker={"symbol": "diamond", "size": 10, "color": PALETTE[5]},
                    name="final split",
                    hovertemplate="%{text} (final)<br>%{y:.3f}<extra></extra>",
                )
            )
    _baseline_lines(figure, references, splits=("feedback", "final"))
    if not xs and all(v is None for v in references.values()):
        return _empty(figure, "No accepted experiment has a score yet.")
    return figure


BASELINES = {
    "theta0": ("θ0", "#7b8794"),
    "reference": ("reference", PALETTE[2]),
}
SPLIT_DASH = {"feedback": "dot", "final": "dash"}


def _baseline_lines(figure: go.Figure, references: dict[str, float | None], *, splits: tuple[str, ...]) -> None:
    """θ0's and the reference's scores as labelled horizontal lines: every score chart has them,
    so a score is always read against where the run started and where it could get to."""
    for role, (label, colour) in BASELINES.items():
        for split in splits:
            value = references[f"{role}_{split}"]
            if value is not None:
                figure.add_hline(
                    y=value,
                    line={"color": colour, "dash": SPLIT_DASH[split], "width": 1.5},
                    annotation={"text": f"{label} ({split}) {value:.3f}", "font": {"size": 10, "color": colour}},
                    annotation_position="top left",
                )


# A time axis spans at least this much, so a chart of one or two points shows minutes, not
# sub-millisecond ticks around a single instant.
MIN_TIME_SPAN = timedelta(minutes=2)


def _time_axis(run: Run, *, now: datetime | None = None) -> dict[str, Any]:
    start, end = _run_span(run, now=now or timezone.now())
    return {"type": "date", "range": [start, max(end, start + MIN_TIME_SPAN)], "title": {"text": "time"}}


def experiment_scores_figure(run: Run) -> go.Figure:
    """Every experiment's feedback score over time, one colour per Worker, symbol per integrity status."""
    figure = go.Figure(
        layout=_layout("Every experiment's score", yaxis={"title": {"text": "feedback score"}}, xaxis=_time_axis(run))
    )
    by_worker: dict[str, list[tuple[Experiment, datetime]]] = defaultdict(list)
    for experiment, at in _scored_experiments(run):
        by_worker[experiment.owner.handle].append((experiment, at))
    references = run_reference_scores(run)
    _baseline_lines(figure, references, splits=("feedback",))
    if not by_worker:
        if all(references[key] is None for key in ("theta0_feedback", "reference_feedback")):
            return _empty(figure, "No experiment has a score yet.")
        return figure
    for index, (handle, rows) in enumerate(sorted(by_worker.items())):
        figure.add_trace(
            go.Scatter(
                x=[at for _, at in rows],
                y=[e.feedback_score for e, _ in rows],
                text=[f"{e.handle} · {handle} · {e.integrity_status}" for e, _ in rows],
                mode="markers",
                marker={
                    "color": PALETTE[index % len(PALETTE)],
                    "size": 9,
                    "symbol": [INTEGRITY_SYMBOL.get(e.integrity_status, "circle") for e, _ in rows],
                    "line": {"width": 1.5, "color": PALETTE[index % len(PALETTE)]},
                },
                name=handle,
                meta="smoothable",  # charts.js draws a per-Worker trend when the reader smooths
                hovertemplate="%{text}<br>%{y:.3f}<extra></extra>",
            )
        )
    return figure


def _interval_of(at: datetime, start: datetime, end: datetime) -> int:
    share = (at - start).total_seconds() / max(1e-9, (end - start).total_seconds())
    return min(INTERVALS - 1, max(0, int(share * INTERVALS)))


def tool_use_figure(run: Run, *, now: datetime | None = None) -> go.Figure:
    """Tool calls by category across five equal progress intervals of the run (the paper's figure 4b).

    Stars mark intervals where a Reviewer's report changed the next action: a decision the Main
    Agent took on a review report that did anything but continue.
    """

    now = now or timezone.now()
    start, end = _run_span(run, now=now)
    labels = [f"{i * 100 // INTERVALS}–{(i + 1) * 100 // INTERVALS}%" for i in range(INTERVALS)]
    figure = go.Figure(
        layout=_layout(
            "Tool use by category across the run",
            barmode="stack",
            # Seven categories and the review marker: a legend on the right stays off the axis title.
            legend={"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left"},
            xaxis={"title": {"text": "progress of the run"}, "type": "category"},
            yaxis={"title": {"text": "tool calls"}},
        )
    )
    category_of = {name: tool.category for name, tool in load_all().items()}
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * INTERVALS)
    for tool, at in Event.objects.sealed().filter(run=run, type="tool.called").values_list("tool", "created_at"):
        counts[category_of.get(tool, "other")][_interval_of(at, start, end)] += 1
    totals = [0] * INTERVALS
    for index, (category, values) in enumerate(sorted(counts.items())):
        figure.add_trace(
            go.Bar(x=labels, y=values, name=category.replace("_", " "), marker={"color": PALETTE[index % len(PALETTE)]})
        )
        totals = [a + b for a, b in zip(totals, values, strict=True)]
    changes: dict[int, list[str]] = defaultdict(list)
    decisions = Decision.objects.filter(run=run, trigger=Trigger.REVIEW_REPORT).exclude(kind=DecisionKind.CONTINUE)
    for kind, at, subject in decisions.values_list("kind", "created_at", "subject__handle"):
        changes[_interval_of(at, start, end)].append(f"{kind}" + (f" ({subject})" if subject else ""))
    if changes:
        top = max(totals) if any(totals) else 1
        slots = sorted(changes)
        figure.add_trace(
            go.Scatter(
                x=[labels[i] for i in slots],
                y=[totals[i] + 0.06 * top + 0.5 for i in slots],
                text=["<br>".join(changes[i]) for i in slots],
                mode="markers",
                marker={"symbol": "star", "size": 14, "color": "#D55E00", "line": {"width": 1, "color": "#000"}},
                name="review changed the next action",
                hovertemplate="%{text}<extra>review → decision</extra>",
            )
        )
    if not counts and not changes:
        return _empty(figure, "No tool calls recorded yet.")
    return figure


def _busy_seconds(intervals: list[tuple[datetime, datetime]]) -> float:
    """Length of the union of intervals: two lanes busy at once count once."""
    total = 0.0
    current: tuple[datetime, datetime] | None = None
    for begin, finish in sorted(intervals):
        if current is None or begin > current[1]:
            if current is not None:
                total += (current[1] - current[0]).total_seconds()
            current = (begin, finish)
        else:
            current = (current[0], max(current[1], finish))
    if current is not None:
        total += (current[1] - current[0]).total_seconds()
    return total


def accelerator_timeline_figure(run: Run, *, now: datetime | None = None) -> go.Figure:
    """Accelerator jobs as bars on their worker's lane; the gaps between bars are idle time."""
    now = now or timezone.now()
    start, end = _run_span(run, now=now)
    jobs = list(
        Job.objects.filter(run=run, queue=ACCELERATOR_QUEUE, started_at__isnull=False)
        .select_related("experiment")
        .order_by("started_at", "pk")
    )
    spans = [(job, job.started_at, job.finished_at or now) for job in jobs]
    busy = _busy_seconds([(s, f) for _, s, f in spans])
    span_seconds = max(1.0, (end - start).total_seconds())
    title = f"Accelerator busy / idle — busy {100 * busy / span_seconds:.0f}% of the run"
    figure = go.Figure(
        layout=_layout(title, barmode="overlay", xaxis=_time_axis(run, now=now), yaxis={"type": "category"})
    )
    if not spans:
        return _empty(figure, "No accelerator job has started yet.")
    kinds = sorted({job.kind for job, _, _ in spans})
    for index, kind in enumerate(kinds):
        rows = [(job, s, f) for job, s, f in spans if job.kind == kind]
        figure.add_trace(
            go.Bar(
                orientation="h",
                base=[s for _, s, _ in rows],
                x=[max(1.0, (f - s).total_seconds() * 1000) for _, s, f in rows],
                y=[job.worker or "unassigned" for job, _, _ in rows],
                text=[
                    f"{job.kind} · {job.status}" + (f" · {job.experiment.handle}" if job.experiment_id else "")
                    for job, _, _ in rows
                ],
                marker={"color": PALETTE[index % len(PALETTE)]},
                name=kind,
                hovertemplate="%{text}<extra></extra>",
                textposition="none",
            )
        )
    return figure


def budget_burn_figure(run: Run, *, now: datetime | None = None) -> go.Figure:
    """Share of each budget spent over time: accelerator-seconds, LLM tokens and wall clock."""
    now = now or timezone.now()
    start, end = _run_span(run, now=now)
    figure = go.Figure(
        layout=_layout(
            "Budget burn",
            yaxis={"title": {"text": "% of budget"}, "rangemode": "tozero"},
            xaxis=_time_axis(run, now=now),
        )
    )
    series: list[tuple[str, list[datetime], list[float]]] = []
    if run.budget_accelerator_seconds:
        finished = Job.objects.filter(run=run, queue=ACCELERATOR_QUEUE, finished_at__isnull=False).order_by(
            "finished_at"
        )
        xs, ys, used = [start], [0.0], 0.0
        for at, seconds in finished.values_list("finished_at", "resource_seconds"):
            used += seconds
            xs.append(at)
            ys.append(100 * used / run.budget_accelerator_seconds)
        series.append(("accelerator", xs, ys))
    if run.budget_llm_tokens:
        usage = (
            LLMUsage.objects.filter(run=run)
            .order_by("created_at")
            .annotate(tokens=F("prompt_tokens") + F("completion_tokens"))
        )
        xs, ys, used_tokens = [start], [0.0], 0
        for at, tokens in usage.values_list("created_at", "tokens"):
            used_tokens += tokens
            xs.append(at)
            ys.append(100 * used_tokens / run.budget_llm_tokens)
        series.append(("LLM tokens", xs, ys))
    if run.budget_wall_seconds and run.started_at:
        elapsed = (end - start).total_seconds()
        series.append(("wall clock", [start, end], [0.0, 100 * elapsed / run.budget_wall_seconds]))
    for index, (label, xs, ys) in enumerate(series):
        # Each series runs on to now at its last level, so lines end where the run is.
        if xs[-1] < end and label != "wall clock":
            xs, ys = [*xs, end], [*ys, ys[-1]]
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"shape": "hv" if label != "wall clock" else "linear", "color": PALETTE[index], "width": 2},
                name=label,
                hovertemplate="%{y:.1f}%<extra>" + label + "</extra>",
            )
        )
    figure.add_hline(y=100, line={"color": "#D55E00", "dash": "dash", "width": 1})
    if run.budget_accelerator_seconds and run.reserved_final_seconds:
        usable = 100 * (run.budget_accelerator_seconds - run.reserved_final_seconds) / run.budget_accelerator_seconds
        figure.add_hline(
            y=usable,
            line={"color": PALETTE[0], "dash": "dot", "width": 1},
            annotation={"text": "accelerator reserve for the final evaluation", "font": {"size": 10}},
            annotation_position="bottom left",
        )
    return figure


CHARTS = {
    "best_so_far": best_so_far_figure,
    "experiment_scores": experiment_scores_figure,
    "tool_use": tool_use_figure,
    "accelerator": accelerator_timeline_figure,
    "budget": budget_burn_figure,
}


def run_charts(run: Run) -> dict[str, Any]:
    """Every chart of the run page as plotly JSON (``{"name": {"data": [...], "layout": {...}}}``)."""
    figures = {name: build(run).to_plotly_json() for name, build in CHARTS.items()}
    # PlotlyJSONEncoder turns datetimes and numpy values into what plotly.js reads.
    return json.loads(json.dumps(figures, cls=PlotlyJSONEncoder))


def hardware_figure(job: Job) -> dict[str, Any]:
    """The job page's hardware chart (apps.jobs.hardware samples): CPU and GPU utilisation in percent
    on the left axis, the job's RAM and each GPU's memory in MiB on the right; plotly JSON."""
    samples = list((job.metrics or {}).get("hardware", []))
    figure = go.Figure(
        layout=_layout(
            "Hardware",
            xaxis={"title": {"text": "seconds since the job started"}},
            yaxis={"title": {"text": "%"}, "rangemode": "tozero"},
            yaxis2={"title": {"text": "MiB"}, "overlaying": "y", "side": "right", "rangemode": "tozero"},
        )
    )
    if not samples:
        return dict(json.loads(json.dumps(_empty(figure, "No samples yet.").to_plotly_json(), cls=PlotlyJSONEncoder)))
    t = [s.get("t") for s in samples]
    figure.add_scatter(x=t, y=[s.get("cpu_percent") for s in samples], name="CPU %", mode="lines")
    figure.add_scatter(x=t, y=[s.get("ram_mib") for s in samples], name="RAM MiB", mode="lines", yaxis="y2")
    indices = sorted({g["index"] for s in samples for g in s.get("gpus", [])})
    for index in indices:
        per: list[dict[str, Any]] = [next((g for g in s.get("gpus", []) if g["index"] == index), {}) for s in samples]
        figure.add_scatter(x=t, y=[g.get("util_percent") for g in per], name=f"GPU {index} util %", mode="lines")
        figure.add_scatter(x=t, y=[g.get("memory_mib") for g in per], name=f"GPU {index} MiB", mode="lines", yaxis="y2")
        figure.add_scatter(
            x=t, y=[g.get("temperature_c") for g in per], name=f"GPU {index} °C", mode="lines", visible="legendonly"
        )
    return dict(json.loads(json.dumps(figure.to_plotly_json(), cls=PlotlyJSONEncoder)))
