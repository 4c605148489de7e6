"""The researcher's workbench reads (issue 36, items 1-3): runs as a table of parameters and
outcomes, a run's experiments by recipe, overlaid training curves, and exports of all of it.

A run's *row* is one flat mapping, column -> plain value (a number, text, a bool or None):

- what the runs list showed before (benchmark, status, policy, best accepted, experiments);
- its outcome as the run page reports it (apps.flows.scores): ``final`` with ``final_low`` and
  ``final_high`` (the bootstrap CI), ``theta0``, ``reference``, ``gain``, ``hacking`` (the
  headline, never a bare 0 %) and ``hacking_rate``;
- every setting it was started with (apps.flows.compare.run_config: ``budget.*``, ``policy.*``...);
- the recipe of the experiment it returned (``recipe``, ``hp.<name>`` for each hyperparameter)
  and that experiment's last training metrics (``train.<key>``) and agent metrics (``metric.<key>``).

The same rows feed the table, its sort, the query (apps.dashboard.runquery) and the CSV and
Parquet exports, so what a researcher filters on is what they download.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from django.conf import settings
from django.db.models import Q
from plotly.utils import PlotlyJSONEncoder

from apps.benchmarks.models import Split
from apps.core.errors import ApplicationError
from apps.dashboard.runquery import Query, QueryError, parse_query
from apps.datapool.models import DataEntry
from apps.datapool.storage import artifact_store
from apps.experiments.choices import EvaluationStatus
from apps.experiments.models import Checkpoint, Evaluation, EvaluationSample, Experiment, MetricPoint
from apps.flows.compare import run_config
from apps.flows.scores import bootstrap_ci, lite_gain
from apps.integrity.selectors import hacking_by_run
from apps.jobs.choices import JobKind
from apps.jobs.models import Job
from apps.research.models import Run

# --- the runs table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    help: str = ""


BUILTIN_COLUMNS: tuple[Column, ...] = (
    Column("benchmark", "Benchmark"),
    Column("status", "Status"),
    Column("policy", "Policy"),
    Column("final", "Final score", "the returned checkpoint on the final split, with its 95 % bootstrap CI"),
    Column("theta0", "θ0 (final)", "θ0 on the final split"),
    Column("gain", "Gain over θ0", "clamp((final − θ0) / (reference − θ0), 0, 1); 0 for a hacked run"),
    Column("hacking", "Hacking", "submissions with an adjudicated violation; a range while any is suspected"),
    Column("best", "Best accepted", "best feedback score among accepted experiments"),
    Column("experiments", "Experiments"),
    Column("budget", "Budget used"),
    Column("created", "Created"),
)
DEFAULT_COLUMNS = ("benchmark", "status", "policy", "final", "gain", "hacking", "best", "experiments", "budget")
# What sorting a column means when its shown value is not the one to order by.
SORT_KEYS = {"hacking": "hacking_rate", "budget": "budget.accelerator_used_fraction"}
ALIASES = {"lr": "hp.learning_rate", "steps": "hp.max_steps", "score": "final", "hacking": "hacking_rate"}
QUERY_PREFIXES = ("hp.", "policy.", "train.", "metric.", "budget.", "prompt.")
MAX_CHOSEN_COLUMNS = 24


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(f"{prefix}.{key}", value[key], into)
    else:
        into[prefix] = _plain(value)


def _plain(value: Any) -> Any:
    """A cell value: numbers, text and bools as they are; lists and objects as compact JSON."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def experiment_recipe(experiment: Experiment) -> dict[str, Any]:
    """An experiment's recipe as columns: ``recipe``, ``data``, ``evaluate`` and ``hp.<name>``."""
    action = experiment.action if isinstance(experiment.action, dict) else {}
    row: dict[str, Any] = {}
    for key, value in action.items():
        if key == "hyperparameters" and isinstance(value, dict):
            _flatten("hp", value, row)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            row[key] = ", ".join(value)
        else:
            _flatten(key, value, row)
    return row


def _final_evaluations(runs: list[Run]) -> dict[tuple[int, int], Evaluation]:
    """For each (run, checkpoint) the runs table needs, the final-split evaluation apps.flows.scores
    reports (checkpoint_evaluation's order: the run's final_eval job, then a system evaluation, then
    the newest), read in one query for all runs."""
    wanted = {(run.pk, pk) for run in runs for pk in _scored_checkpoints(run) if pk is not None}
    candidates = (
        Evaluation.objects.filter(
            checkpoint_id__in={pk for _run, pk in wanted}, benchmark_id__in={run.benchmark_id for run in runs},
            split=Split.FINAL, status=EvaluationStatus.OK,
        )
        .select_related("job")
        .order_by("-created_at", "-pk")
    )  # fmt: skip
    benchmarks = {run.pk: run.benchmark_id for run in runs}
    chosen: dict[tuple[int, int], tuple[int, Evaluation]] = {}
    for evaluation in candidates:
        for run_id, benchmark_id in benchmarks.items():
            key = (run_id, evaluation.checkpoint_id)
            if key not in wanted or evaluation.benchmark_id != benchmark_id:
                continue
            if evaluation.run_id == run_id and evaluation.job is not None and evaluation.job.kind == JobKind.FINAL_EVAL:
                rank = 0
            else:
                rank = 1 if evaluation.experiment_id is None else 2
            if key not in chosen or rank < chosen[key][0]:  # newest first: the first of a rank wins
                chosen[key] = (rank, evaluation)
    return {key: evaluation for key, (_rank, evaluation) in chosen.items()}


def _scored_checkpoints(run: Run) -> tuple[int | None, int | None, int | None]:
    return run.result_checkpoint_id, run.base_checkpoint_id, run.benchmark.reference_checkpoint_id


def _score_cis(evaluations: Iterable[Evaluation]) -> dict[int, tuple[float, float | None, float | None, int]]:
    """score, CI low, CI high and n of each evaluation, from its per-sample rows (as run_scores)."""
    evaluations = list(evaluations)
    correct: dict[int, list[bool]] = {e.pk: [] for e in evaluations}
    samples = EvaluationSample.objects.filter(evaluation__in=evaluations).order_by("evaluation_id", "sample_id")
    for evaluation_id, right in samples.values_list("evaluation_id", "correct"):
        correct[evaluation_id].append(right)
    out = {}
    for evaluation in evaluations:
        values = np.array(correct[evaluation.pk], dtype=np.float64)
        low = high = None
        if values.size:
            low, high = bootstrap_ci(values)
        out[evaluation.pk] = (float(evaluation.score or 0.0), low, high, int(values.size or evaluation.sample_count))
    return out


def _returned_experiments(runs: list[Run]) -> dict[int, Experiment]:
    """The experiment each run returned: the one whose output is the run's result checkpoint."""
    results = {run.result_checkpoint_id: run.pk for run in runs if run.result_checkpoint_id is not None}
    found = Experiment.objects.filter(run__in=[run.pk for run in runs], output_checkpoint_id__in=results)
    return {
        e.run_id: e
        for e in found.order_by("pk")
        if e.output_checkpoint_id is not None and results.get(e.output_checkpoint_id) == e.run_id
    }


def _train_metrics_last(experiments: Iterable[Experiment]) -> dict[int, dict[str, Any]]:
    jobs = Job.objects.filter(experiment__in=list(experiments), kind=JobKind.TRAIN).order_by("attempt", "pk")
    last: dict[int, dict[str, Any]] = {}
    for experiment_id, metrics in jobs.values_list("experiment_id", "metrics"):
        values = (metrics or {}).get("last") or {}  # the newest attempt comes last and wins
        last[experiment_id] = {
            f"train.{k}": v for k, v in values.items() if k not in ("step", "elapsed_s") and isinstance(v, int | float)
        }
    return last


def _agent_metrics_last(experiments: Iterable[Experiment]) -> dict[int, dict[str, Any]]:
    last: dict[int, dict[str, Any]] = {}
    points = MetricPoint.objects.filter(experiment__in=list(experiments)).order_by("experiment_id", "key", "step")
    for experiment_id, key, value in points.values_list("experiment_id", "key", "value"):
        last.setdefault(experiment_id, {})[f"metric.{key}"] = value  # ordered by step: the last one stays
    return last


def run_rows(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """Rows of runs (annotated by apps.dashboard.selectors.run_list, or plain), read in a fixed
    number of queries whatever the number of runs. The numbers are run_scores' (apps.flows.scores)."""
    runs = list(runs)
    if not runs:
        return []
    evaluations = _final_evaluations(runs)
    cis = _score_cis(evaluations.values())
    hacking = hacking_by_run(runs=Run.objects.filter(pk__in=[run.pk for run in runs]))
    returned = _returned_experiments(runs)
    train = _train_metrics_last(returned.values())
    agent = _agent_metrics_last(returned.values())
    rows = []
    for run in runs:
        raw, theta0, reference = (
            cis.get(evaluations[(run.pk, pk)].pk) if pk is not None and (run.pk, pk) in evaluations else None
            for pk in _scored_checkpoints(run)
        )
        gain, note = lite_gain(raw[0] if raw else None, theta0[0] if theta0 else None,
                               reference[0] if reference else None)  # fmt: skip
        integrity = hacking[run.pk]
        if run.result_checkpoint_id is None:
            gain, note = None, "undefined: the run has not returned a checkpoint"
        elif integrity["violation"]:
            gain, note = 0.0, "0: the run has a submission with an adjudicated violation"
        experiment = returned.get(run.pk)
        budget = run.budget_accelerator_seconds
        used = run.used_accelerator_seconds / budget if budget else None
        row: dict[str, Any] = {
            "uuid": str(run.uuid), "name": run.name, "benchmark": run.benchmark.name, "status": run.status,
            "policy": run.agent_mode, "search_policy": run.search_policy, "created": run.created_at.isoformat(),
            "flagged": run.flagged or integrity["violation"], "tags": ", ".join(run.tags or []),
            "best": getattr(run, "best_accepted_score", None), "experiments": getattr(run, "experiment_count", None),
            "final": raw[0] if raw else None, "final_low": raw[1] if raw else None,
            "final_high": raw[2] if raw else None, "final_n": raw[3] if raw else None,
            "theta0": theta0[0] if theta0 else None, "reference": reference[0] if reference else None,
            "gain": gain, "gain_note": note, "hacking": integrity["headline"],
            "hacking_rate": integrity["hacking_rate"],
            "returned_experiment": experiment.handle if experiment is not None else None,
            "budget.accelerator_used_fraction": used,
            "budget.accelerator_used_seconds": run.used_accelerator_seconds,
            "budget.llm_tokens_used": run.used_llm_tokens,
        }  # fmt: skip
        for key, value in run_config(run).items():
            row.setdefault(key, _plain(value))
        if experiment is not None:
            row.update(experiment_recipe(experiment))
            row.update(train.get(experiment.pk, {}))
            row.update(agent.get(experiment.pk, {}))
        rows.append(row)
    return rows


def row_columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every column some row has, built-ins first then parameters and metrics by name."""
    keys = {key for row in rows for key in row}
    builtin = [c.key for c in BUILTIN_COLUMNS if c.key in keys]
    return builtin + sorted(keys - set(builtin))


def table_query(text: str, rows: list[dict[str, Any]]) -> Query | None:
    """The runs list's ``query``, checked against the columns of ``rows`` (raises QueryError)."""
    return parse_query(text, columns=row_columns(rows), aliases=ALIASES, prefixes=QUERY_PREFIXES)


def sort_rows(rows: list[dict[str, Any]], key: str, *, descending: bool) -> list[dict[str, Any]]:
    """Rows ordered by one column; a missing value always comes last, ties keep the given order.

    Numbers sort as numbers, everything else as text, so a column that mixes them stays readable.
    """
    field = SORT_KEYS.get(key, key)

    def present(row: Mapping[str, Any]) -> bool:
        return row.get(field) is not None

    def value(row: Mapping[str, Any]) -> tuple[int, Any]:
        found = row[field]
        if isinstance(found, int | float):
            return (0, float(found))
        return (1, str(found).lower())

    having = [row for row in rows if present(row)]
    missing = [row for row in rows if not present(row)]
    return sorted(having, key=value, reverse=descending) + missing


def parse_sort(text: str, known: Iterable[str]) -> tuple[str, bool] | None:
    """``final`` or ``-final`` (descending); None when the column is unknown."""
    text = text.strip()
    descending = text.startswith("-")
    key = text.lstrip("-")
    key = ALIASES.get(key, key) if key not in set(known) else key
    if not key or key not in set(known) | set(SORT_KEYS):
        return None
    return key, descending


QUERY_HELP = (
    "e.g. final > 0.5 and lr < 1e-3 · columns: final, gain, theta0, hacking_rate, best, status, hp.<name>, "
    "policy.<key>, budget.<key>, train.<key>; and, or, not, ( ); < <= > >= = !="
)


@dataclass
class RunTable:
    """What the runs list shows: the runs kept by the query, in order, each with its row."""

    runs: list[Run]
    rows: list[dict[str, Any]]
    columns: list[Column]  # chosen, in order
    available: list[Column]  # every column a listed run has
    sort: str  # the column key, "" for newest first
    descending: bool
    query: str

    @classmethod
    def empty(cls) -> RunTable:
        return cls(runs=[], rows=[], columns=[], available=[], sort="", descending=True, query="")

    def sort_link(self, key: str) -> str:
        """The ``sort`` value a column header links to: descending first, then ascending."""
        return key if self.sort == key and self.descending else f"-{key}"


def _column(key: str) -> Column:
    for column in BUILTIN_COLUMNS:
        if column.key == key:
            return column
    return Column(key, key)


def run_table(runs: list[Run], *, query: str = "", sort: str = "", columns: list[str] | None = None) -> RunTable:
    """Rows for ``runs`` (newest first), kept by ``query``, ordered by ``sort``, with ``columns`` shown.

    Raises ApplicationError (400) for a bad query, an unknown sort column or an unknown column.
    """
    rows = run_rows(runs)
    known = row_columns(rows) + [c.key for c in BUILTIN_COLUMNS]
    try:
        parsed = table_query(query, rows)
    except QueryError as error:
        raise ApplicationError("invalid_query", f"query: {error.message}") from None
    pairs = list(zip(runs, rows, strict=True))
    if parsed is not None:
        pairs = [(run, row) for run, row in pairs if parsed.matches(row)]
    order = ("", True)
    if sort.strip():
        found = parse_sort(sort, known)
        if found is None:
            raise ApplicationError("invalid_sort", f"sort: no column {sort.strip().lstrip('-')!r} to sort by.")
        order = found
        index = {id(row): run for run, row in pairs}
        ordered = sort_rows([row for _run, row in pairs], order[0], descending=order[1])
        pairs = [(index[id(row)], row) for row in ordered]
    chosen = [c.strip() for c in (columns or []) if c.strip()] or list(DEFAULT_COLUMNS)
    if len(chosen) > MAX_CHOSEN_COLUMNS:
        raise ApplicationError("invalid_columns", f"col: at most {MAX_CHOSEN_COLUMNS} columns.")
    unknown = [c for c in chosen if c not in known]
    if unknown and runs:
        raise ApplicationError("invalid_columns", f"col: no column {unknown[0]!r} in these runs.")
    return RunTable(
        runs=[run for run, _row in pairs],
        rows=[row for _run, row in pairs],
        columns=[_column(c) for c in chosen],
        available=[_column(c) for c in dict.fromkeys(known)],
        sort=order[0],
        descending=order[1],
        query=query.strip(),
    )


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}".replace(",", "\u202f")  # a thin space: never broken mid-number
    return f"{value:.3f}" if 1e-3 <= abs(value) < 1e6 or value == 0 else f"{value:.3g}"


def cell(key: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """One table cell of a row: its text, a tooltip, and whether it is a number (right-aligned)."""
    value = row.get(key)
    if key == "final" and value is not None:
        low, high = row.get("final_low"), row.get("final_high")
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        return {"key": key, "text": f"{value:.3f}", "ci": ci.strip(), "num": True,
                "title": f"n = {row.get('final_n')}; 95 % bootstrap CI{ci or ': no per-sample rows'}"}  # fmt: skip
    if key == "gain":
        text = "—" if value is None else f"{value:.3f}"
        return {"key": key, "text": text, "num": True, "title": row.get("gain_note") or ""}
    if value is None:
        return {"key": key, "text": "—", "num": False, "title": "", "missing": True}
    return {"key": key, "text": _number(value), "num": isinstance(value, int | float) and not isinstance(value, bool),
            "title": ""}  # fmt: skip


# --- exports -------------------------------------------------------------------------------------

EXPORT_FIRST = ("uuid", "name")


def export_columns(rows: list[dict[str, Any]]) -> list[str]:
    return list(EXPORT_FIRST) + [c for c in row_columns(rows) if c not in EXPORT_FIRST and c != "budget"]


def rows_csv(rows: list[dict[str, Any]]) -> str:
    """runs × parameters × metrics as CSV: one line per run, one column per key any run has."""
    columns = export_columns(rows)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return out.getvalue()


def rows_parquet(rows: list[dict[str, Any]]) -> bytes:
    """The same table as Parquet, each column typed: numbers, bools, or text where values mix."""
    import pyarrow as pa  # noqa: PLC0415 - only an export needs it
    import pyarrow.parquet as pq  # noqa: PLC0415

    columns = export_columns(rows)
    arrays = []
    for column in columns:
        values = [row.get(column) for row in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            arrays.append(pa.array(values, type=pa.bool_()))
        elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            arrays.append(pa.array(values, type=pa.int64()))
        elif present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
            arrays.append(pa.array([None if v is None else float(v) for v in values], type=pa.float64()))
        else:
            arrays.append(pa.array([None if v is None else str(v) for v in values], type=pa.string()))
    table = pa.table(arrays, names=columns)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


# --- a run's experiments -----------------------------------------------------------------------

EXPERIMENT_FIXED = ("handle", "kind", "status", "recipe", "feedback", "integrity")


def run_experiment_rows(run: Run) -> list[dict[str, Any]]:
    """The run's experiments as rows: recipe, hyperparameters, feedback score, integrity status."""
    rows = []
    experiments = Experiment.objects.filter(run=run).select_related("owner", "output_checkpoint").order_by("pk")
    for experiment in experiments:
        row: dict[str, Any] = {
            "uuid": str(experiment.uuid),
            "handle": experiment.handle,
            "kind": experiment.kind,
            "status": experiment.status,
            "worker": experiment.owner.handle,
            "feedback": experiment.feedback_score,
            "integrity": experiment.integrity_status,
            "checkpoint": experiment.output_checkpoint.handle if experiment.output_checkpoint else None,
        }
        row.update(experiment_recipe(experiment))
        rows.append(row)
    return rows


def experiment_columns(rows: list[dict[str, Any]]) -> list[str]:
    keys = {key for row in rows for key in row} - {"uuid"}
    fixed = [k for k in EXPERIMENT_FIXED if k in keys or k in ("recipe",)]
    hps = sorted(k for k in keys if k.startswith("hp."))
    rest = sorted(keys - set(fixed) - set(hps) - {"worker", "checkpoint"})
    return fixed + hps + rest + ["worker", "checkpoint"]


def parallel_coordinates(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """plotly parallel coordinates of the experiments: numeric hyperparameters, the recipe, and the
    feedback score (the colour); None when fewer than two experiments have a score."""
    scored = [row for row in rows if isinstance(row.get("feedback"), int | float)]
    if len(scored) < 2:
        return None
    dimensions: list[dict[str, Any]] = []
    recipes = sorted({str(row.get("recipe") or row.get("kind")) for row in scored})
    if len(recipes) > 1:
        dimensions.append({
            "label": "recipe", "values": [recipes.index(str(r.get("recipe") or r.get("kind"))) for r in scored],
            "tickvals": list(range(len(recipes))), "ticktext": recipes,
        })  # fmt: skip
    for key in sorted({k for row in scored for k in row if k.startswith("hp.")}):
        values = [row.get(key) for row in scored]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values) and len(set(values)) > 1:
            dimensions.append({"label": key[3:], "values": values})
    dimensions.append({"label": "feedback score", "values": [row["feedback"] for row in scored]})
    figure = go.Figure(
        go.Parcoords(
            line={"color": [row["feedback"] for row in scored], "colorscale": "Viridis", "showscale": True},
            dimensions=dimensions,
            customdata=[row["handle"] for row in scored],
        ),
        layout={"template": "none", "height": 360, "margin": {"l": 64, "r": 64, "t": 48, "b": 24}},
    )
    drawn: dict[str, Any] = json.loads(json.dumps(figure.to_plotly_json(), cls=PlotlyJSONEncoder))
    return drawn


# --- training curves ---------------------------------------------------------------------------

MAX_CURVE_SERIES = 24


def curve_series(experiments: Iterable[Experiment]) -> list[dict[str, Any]]:
    """The training metrics of each experiment's train job (its newest attempt), one series each.

    A point is ``{"step": n, "elapsed_s": seconds since the training started (newer points), key: value}``.
    """
    series = []
    for experiment in experiments:
        job = (
            Job.objects.filter(experiment=experiment, kind=JobKind.TRAIN)
            .exclude(metrics={})
            .order_by("-attempt", "-pk")
            .first()
        )
        points = list((job.metrics or {}).get("points", [])) if job is not None else []
        series.append({
            "label": f"{experiment.run.name} · {experiment.handle}", "run": str(experiment.run.uuid),
            "experiment": experiment.handle, "job": str(job.uuid) if job else None, "points": points,
        })  # fmt: skip
    return series


def curve_experiments(*, runs: list[Run], experiment_uuids: list[str]) -> list[Experiment]:
    """The experiments to overlay: those named, else every trained experiment of ``runs``."""
    found = Experiment.objects.select_related("run").order_by("run__created_at", "run_id", "pk")
    if experiment_uuids:
        chosen = found.filter(uuid__in=experiment_uuids)
    else:
        chosen = found.filter(run__in=runs, jobs__kind=JobKind.TRAIN).distinct()
    return list(chosen[:MAX_CURVE_SERIES])


# --- artifacts -----------------------------------------------------------------------------------


def _inside(path: Path, root: str | Path) -> bool:
    try:
        path.resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


def _sealed_roots() -> list[str]:
    from apps.benchmarks.models import Benchmark  # noqa: PLC0415 - read only for this check

    roots = [str(settings.SEALED_ROOT)]
    roots += [p for p in Benchmark.objects.values_list("sealed_path", flat=True) if p]
    return roots


def _downloadable(uri: str) -> bool:
    """Is ``uri`` in the artifact store (the only place downloads come from), outside every sealed root?"""
    store = artifact_store()
    try:
        key = store.key(uri)
    except ApplicationError:
        return False
    if store.is_local:
        return not any(_inside(Path(store.root) / key, root) for root in _sealed_roots())
    return True


def checkpoint_files(checkpoint: Checkpoint) -> list[dict[str, Any]]:
    downloadable = _downloadable(checkpoint.uri)
    return [
        {"name": name, "sha256": sha, "downloadable": downloadable} for name, sha in sorted(checkpoint.manifest.items())
    ]


def run_artifacts(run: Run) -> dict[str, Any]:
    """The checkpoints a run made or started from and the datapool entries its experiments used or
    it registered. The sealed reference checkpoint is never listed."""
    checkpoints = (
        Checkpoint.objects.filter(Q(run=run) | Q(pk=run.base_checkpoint_id))
        .filter(is_reference=False)
        .order_by("created_at", "pk")
    )
    entries = (
        DataEntry.objects.filter(Q(run=run) | Q(usages__experiment__run=run)).distinct().order_by("created_at", "pk")
    )
    return {
        "checkpoints": [{"checkpoint": c, "files": checkpoint_files(c)} for c in checkpoints],
        "entries": [{"entry": e, "downloadable": _downloadable(e.uri)} for e in entries],
    }


def artifact_file(uri: str, name: str | None = None) -> Path:
    """The local path of a stored file (a checkpoint's ``name``, or a data file) for a download.

    Refuses (404) anything outside the artifact store and anything that resolves under a sealed
    root: sealed benchmark data never leaves through a download, whatever a row's URI says.
    """
    if not _downloadable(uri):
        raise ApplicationError("not_downloadable", "This artifact is not downloadable.", status=404)
    target = f"{uri.rstrip('/')}/{name}" if name else uri
    path = artifact_store().local_path(target)
    if any(_inside(path, root) for root in _sealed_roots()):
        raise ApplicationError("sealed", "Sealed data is never downloadable.", status=404)
    if not path.is_file():
        raise ApplicationError("not_a_file", "No such file.", status=404)
    return path
