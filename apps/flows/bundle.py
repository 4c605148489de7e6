"""Run bundles: one finished (or running) run as a self-contained file, and back (issue 15, point 8).

A bundle is a zip of ``run.json``, ``scores.csv`` (each evaluation with the recipe and
hyperparameters of the experiment it scored), ``training_metrics.csv`` and ``logs/`` (one log
per job). ``run.json`` (format ``rsiweb.run-bundle``,
``FORMAT_VERSION`` below; docs/export.md) holds:

- ``benchmark``: the benchmark's identity and hashes (no sealed data: that never leaves
  ``sealed_path``), and ``tables``: the run's rows, one list per model label, each row with its
  columns as stored (integer ids included, so references resolve inside the bundle): the run and
  its status history, the research DAG (nodes, edges, decisions, claims, predictions,
  candidates, LLM usage), experiments with their graph, integrity history, agent metrics,
  evaluations with their per-sample ids and correctness, the checkpoints they name (manifests and
  hashes only, never the weights), the integrity findings, blocked attempts, and the run's event
  chain with every link.
- ``integrity_report`` and ``scores``: the integrity report (apps.integrity.report) and the run's
  scores (apps.flows.scores) as they read at export, for people reading the file.
- ``jobs``: each job's kind, experiment, status, times, training metric points and log lines, for
  analysis (an import does not recreate jobs).

Left out so the bundle can leave the instance: a model's output on each sealed sample (right
answers would be the reference answers), finding evidence (it may quote sealed spans) beyond its
one-line summary and codes, the request of a blocked attempt (it may carry the sealed items it
tried to use), people (``created_by``), job rows (``jobs`` above is a summary), agent loops and
guidance. Prompts and reference answers are never in a run's rows.

Import INSERTs the rows as they are — append-only tables refuse UPDATEs (experiments 0008,
datapool 0004) — with fresh integer ids and the same UUIDs, in dependency order, in one
transaction: the chain is recomputed from the bundle first and verified again in the database
before commit, and anything refused leaves nothing behind.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import decimal
import io
import json
import uuid
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from apps.benchmarks.models import Benchmark
from apps.core.errors import ApplicationError, Conflict
from apps.core.hashing import canonical_json, sha256_text
from apps.experiments.anchors import instance_fingerprint, instance_public_key, sign, signature_valid
from apps.experiments.events import (
    GENESIS_HASH,
    chain_key,
    chain_verify,
    content_hash,
    event_append,
    event_content,
    link_hash,
)
from apps.experiments.models import (
    Checkpoint,
    Evaluation,
    EvaluationSample,
    Event,
    EventChain,
    Experiment,
    ExperimentEdge,
    IntegrityStatusChange,
    MetricPoint,
)
from apps.flows.scores import run_scores
from apps.integrity.models import BlockedAttempt, FindingChange, IntegrityFinding
from apps.integrity.overlap import sealed_scanner
from apps.integrity.report import integrity_report
from apps.jobs.models import Job, JobLogLine
from apps.jobs.selectors import job_hardware
from apps.research.models import (
    Candidate,
    Decision,
    LLMUsage,
    OptimizerClaim,
    Prediction,
    ResearchEdge,
    ResearchNode,
    Run,
    RunStatusChange,
)
from apps.research.notes import notes_export

FORMAT = "rsiweb.run-bundle"
IMPORTED_TAG = "imported"
FORMAT_VERSION = 2  # 2: a signed manifest of every record (issue 33); 1 is refused
BUNDLE_JSON = "run.json"
SCORES_CSV = "scores.csv"
TRAINING_CSV = "training_metrics.csv"
LOGS_DIR = "logs"

# Insertion order: every row's references point to rows of earlier tables or of its own table
# (checkpoint parents, experiment edges). Nodes and decisions reference each other
# (created_by_decision, subject); PostgreSQL checks foreign keys at commit, so both hold.
TABLES: tuple[type[models.Model], ...] = (
    Checkpoint,
    Run,
    RunStatusChange,
    ResearchNode,
    Decision,
    ResearchEdge,
    OptimizerClaim,
    Prediction,
    Candidate,
    LLMUsage,
    Experiment,
    ExperimentEdge,
    IntegrityStatusChange,
    MetricPoint,
    Evaluation,
    EvaluationSample,
    IntegrityFinding,
    FindingChange,
    BlockedAttempt,
    EventChain,
    Event,
)

# Foreign keys to rows a bundle does not carry: written as null (each is nullable).
_DROPPED_REFERENCES = {"producing_job_id", "job_id", "created_by_id"}
# Benchmark columns a bundle carries: what identifies the evaluator, never its sealed data.
_BENCHMARK_FIELDS = (
    "uuid", "name", "version", "task", "description", "evaluator", "evaluator_sha256", "settings",
    "settings_sha256", "sealed_path", "data_sha256", "sample_ids", "reference_checkpoint_id", "created_at",
    "contract", "contract_sha256",
)  # fmt: skip


def _label(model: type[models.Model]) -> str:
    return model._meta.label_lower


def _plain(value: Any) -> Any:
    """A column value as JSON: full-precision timestamps (the chain hashes them), UUIDs and decimals as text."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    return value


def _row(obj: models.Model, **overrides: Any) -> dict[str, Any]:
    row = {field.attname: _plain(field.value_from_object(obj)) for field in obj._meta.concrete_fields}
    for name in _DROPPED_REFERENCES & row.keys():
        row[name] = None
    row.update(overrides)
    return row


def _sanitised(obj: models.Model) -> dict[str, Any]:
    """The row as it may leave the instance (module docstring: what is left out, and why)."""
    if isinstance(obj, EvaluationSample):
        return _row(obj, output="")
    if isinstance(obj, IntegrityFinding):
        evidence = obj.evidence or {}
        kept = {key: evidence[key] for key in ("summary", "codes") if key in evidence}
        return _row(obj, evidence=kept)
    if isinstance(obj, BlockedAttempt):
        return _row(obj, request={})
    return _row(obj)


def _checkpoints_of(run: Run) -> list[Checkpoint]:
    """Every checkpoint the run's rows name, with their lineage back to a root, parents first."""
    named: set[int | None] = set(Checkpoint.objects.filter(run=run).values_list("pk", flat=True))
    named |= {run.base_checkpoint_id, run.result_checkpoint_id, run.benchmark.reference_checkpoint_id}
    named |= set(Evaluation.objects.filter(run=run).values_list("checkpoint_id", flat=True))
    for pair in Experiment.objects.filter(run=run).values_list("input_checkpoint_id", "output_checkpoint_id"):
        named |= set(pair)
    wanted = {pk for pk in named if pk is not None}
    found: dict[int, Checkpoint] = {}
    while wanted:
        batch = list(Checkpoint.objects.filter(pk__in=wanted))
        found.update((c.pk, c) for c in batch)
        wanted = {c.parent_id for c in batch if c.parent_id is not None} - found.keys()
    return sorted(found.values(), key=lambda c: c.pk)


def _rows_of(run: Run) -> dict[str, list[dict[str, Any]]]:
    experiments = Experiment.objects.filter(run=run)
    evaluations = Evaluation.objects.filter(run=run)
    # A submission's findings and a report's (on its author's node: the claim reader's).
    findings = IntegrityFinding.objects.filter(Q(experiment__run=run) | Q(node__run=run))
    chain = EventChain.objects.get(key=chain_key(run))
    querysets: dict[type[models.Model], Iterable[models.Model]] = {
        Checkpoint: _checkpoints_of(run),
        Run: [run],
        RunStatusChange: RunStatusChange.objects.filter(run=run),
        ResearchNode: ResearchNode.objects.filter(run=run),
        Decision: Decision.objects.filter(run=run),
        ResearchEdge: ResearchEdge.objects.filter(run=run),
        OptimizerClaim: OptimizerClaim.objects.filter(run=run),
        Prediction: Prediction.objects.filter(run=run),
        Candidate: Candidate.objects.filter(run=run),
        LLMUsage: LLMUsage.objects.filter(run=run),
        Experiment: experiments,
        ExperimentEdge: ExperimentEdge.objects.filter(child__in=experiments, parent__in=experiments),
        IntegrityStatusChange: IntegrityStatusChange.objects.filter(experiment__in=experiments),
        MetricPoint: MetricPoint.objects.filter(experiment__in=experiments),
        Evaluation: evaluations,
        EvaluationSample: EvaluationSample.objects.filter(evaluation__in=evaluations),
        IntegrityFinding: findings,
        FindingChange: FindingChange.objects.filter(finding__in=findings),
        BlockedAttempt: BlockedAttempt.objects.filter(run=run),
        EventChain: [chain],
        # Up to the head read above: a seal after that read moves the head and its events together.
        Event: Event.objects.filter(chain=chain, seq__lte=chain.head_seq),
    }
    tables = {}
    for model in TABLES:
        rows = querysets[model]
        if isinstance(rows, models.QuerySet):
            rows = rows.order_by("pk")
        tables[_label(model)] = [_sanitised(obj) for obj in rows]
    return tables


def _jobs_of(run: Run) -> list[dict[str, Any]]:
    """The run's jobs for people analysing it: what ran, its training metrics and its log.

    Outside ``tables`` (an import does not recreate jobs: they are records of this instance's
    workers). Logs are the workers' own lines (steps, losses, which checkpoint on which split),
    never a sample's text.
    """
    jobs = Job.objects.filter(run=run).select_related("experiment").order_by("created_at", "pk")
    lines: dict[int, list[str]] = {}
    for job_id, text in JobLogLine.objects.filter(job__run=run).order_by("job_id", "seq").values_list("job_id", "text"):
        lines.setdefault(job_id, []).append(text)
    return [
        {
            "uuid": str(job.uuid), "kind": job.kind, "status": job.status, "attempt": job.attempt,
            "experiment": job.experiment.handle if job.experiment is not None else None,
            "started_at": _plain(job.started_at), "finished_at": _plain(job.finished_at),
            "resource_seconds": job.resource_seconds,
            "metrics_points": list((job.metrics or {}).get("points", [])), "log": lines.get(job.pk, []),
        }
        for job in jobs
    ]  # fmt: skip


def export_run_bundle(run: Run) -> dict[str, Any]:
    """The run as a bundle dict (``run.json``); refuses when the run's event chain does not verify."""
    report = chain_verify(chain_key(run))  # seals what is pending first, so the export is complete
    if not report.ok:
        raise ApplicationError(
            "chain_broken", f"The run's event chain is broken at seq {report.broken_at}: {report.reason}"
        )
    outer = connection.in_atomic_block  # then the caller's transaction (and its snapshot) is the one we read
    with transaction.atomic():
        if connection.vendor == "postgresql" and not outer:
            # One snapshot for every table, so a live run's rows reference only rows also exported.
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        tables = _rows_of(run)
        jobs = _jobs_of(run)
        # Not a table (jobs are not exported): each job's hardware evidence, summary and samples.
        hardware = [
            {**job_hardware(job=job), "experiment": str(job.experiment.uuid) if job.experiment else None}
            for job in Job.objects.filter(run=run).select_related("experiment").order_by("pk")
        ]
        scores = run_scores(run=run)
        integrity = integrity_report(run)
        notes = notes_export(run)
    bundle = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": timezone.now().isoformat(),
        "run": str(run.uuid),
        "benchmark": {name: _plain(getattr(run.benchmark, name)) for name in _BENCHMARK_FIELDS},
        "tables": tables,
        "chain": {"key": chain_key(run), "events": len(tables[_label(Event)])},
        "integrity_report": json.loads(json.dumps(integrity, default=_plain)),
        "scores": json.loads(json.dumps(dataclasses.asdict(scores), default=_plain)),
        "jobs": jobs,
        # Every version of the people's notes on the run and its experiments (markdown source).
        "notes": notes,
        "hardware": json.loads(json.dumps(hardware, default=_plain)),
    }
    return bundle_sign(bundle)


def bundle_sign(bundle: dict[str, Any]) -> dict[str, Any]:
    """``bundle`` with its manifest (:func:`bundle_manifest`) and the instance's signature of it."""
    manifest = bundle_manifest(bundle)
    bundle["manifest"] = manifest
    bundle["signature"] = sign(canonical_json(manifest).encode("utf-8"))
    return bundle


# --- proof: the signed manifest ------------------------------------------------------------------


def _digest(value: Any) -> str:
    return sha256_text(canonical_json(value))


def bundle_manifest(bundle: dict[str, Any]) -> dict[str, Any]:
    """What the export signs: a hash of every record the bundle carries, and the chain's head.

    ``records``: per table, row id -> sha256 of the row's canonical JSON (scores, evaluations and
    their samples, findings and their changes, blocked attempts, node texts, events: every row);
    ``chain``: the head the events must end at, so a cut tail or a re-hashed chain differs from
    it; ``bases``: the checkpoints the bundle would register as a base model (θ0) or a reference;
    ``benchmark``, ``scores``, ``integrity_report``: the digests of those blocks; ``signer``: the
    exporting instance's Ed25519 public key (apps.experiments.anchors).
    """
    tables = bundle["tables"]
    head = tables[_label(EventChain)][0] if tables.get(_label(EventChain)) else {}
    return {
        "run": bundle["run"],
        "exported_at": bundle["exported_at"],
        "signer": instance_public_key(),
        "chain": {"key": bundle["chain"]["key"], "head_seq": head.get("head_seq"), "head_hash": head.get("head_hash")},
        "records": {label: {str(row["id"]): _digest(row) for row in rows} for label, rows in tables.items()},
        "bases": [
            {
                "uuid": row["uuid"],
                "manifest_sha256": row["manifest_sha256"],
                "is_base": row["is_base"],
                "is_reference": row["is_reference"],
            }  # fmt: skip
            for row in tables.get(_label(Checkpoint), [])
            if row.get("is_base") or row.get("is_reference")
        ],
        "benchmark": _digest(bundle["benchmark"]),
        "scores": _digest(bundle["scores"]),
        "integrity_report": _digest(bundle["integrity_report"]),
        # The blocks the import reads but does not register as rows: the jobs' metrics and logs,
        # and the people's notes (absent in a bundle without them: the digest of None).
        "jobs": _digest(bundle.get("jobs")),
        "notes": _digest(bundle.get("notes")),
        "hardware": _digest(bundle.get("hardware")),
    }


def _recipe_columns(action: Any) -> dict[str, Any]:
    """An experiment's recipe as flat columns: ``recipe``, ``data`` and ``hp.<name>``."""
    action = action if isinstance(action, dict) else {}
    columns: dict[str, Any] = {"recipe": action.get("recipe", "")}
    data = action.get("data")
    columns["data"] = " ".join(map(str, data)) if isinstance(data, list) else (data or "")
    for key, value in sorted((action.get("hyperparameters") or {}).items()):
        columns[f"hp.{key}"] = value if isinstance(value, int | float | str | bool) else json.dumps(value)
    return columns


def scores_csv(bundle: dict[str, Any]) -> str:
    """One line per evaluation of the bundle: which checkpoint, split, score and counts, and the
    recipe and hyperparameters of the experiment it scored (empty for θ0, the reference, finals)."""
    tables = bundle["tables"]
    checkpoints = {row["id"]: row["handle"] for row in tables["experiments.checkpoint"]}
    experiments = {row["id"]: row for row in tables["experiments.experiment"]}
    recipes = {pk: _recipe_columns(row.get("action")) for pk, row in experiments.items()}
    params = sorted({key for columns in recipes.values() for key in columns}, key=lambda k: (k.startswith("hp."), k))
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["evaluation", "experiment", "checkpoint", "split", "status", "score", "correct", "samples", *params]
    )
    for row in tables["experiments.evaluation"]:
        experiment = experiments.get(row["experiment_id"])
        recipe = recipes.get(row["experiment_id"], {})
        writer.writerow([
            row["uuid"], experiment["handle"] if experiment else "", checkpoints.get(row["checkpoint_id"], ""),
            row["split"], row["status"], "" if row["score"] is None else row["score"], row["correct"],
            row["sample_count"], *["" if recipe.get(key) is None else recipe.get(key) for key in params],
        ])  # fmt: skip
    return out.getvalue()


def training_csv(bundle: dict[str, Any]) -> str:
    """Every training metric of the bundle's jobs, long format: job, kind, experiment, step, time, key, value."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["job", "kind", "experiment", "attempt", "step", "elapsed_s", "key", "value"])
    for job in bundle.get("jobs", []):
        for point in job["metrics_points"]:
            for key, value in point.items():
                if key in ("step", "elapsed_s"):
                    continue
                writer.writerow([job["uuid"], job["kind"], job["experiment"] or "", job["attempt"],
                                 point.get("step", ""), point.get("elapsed_s", ""), key, value])  # fmt: skip
    return out.getvalue()


def bundle_archive(bundle: dict[str, Any]) -> bytes:
    """The downloadable file: ``run.json``, ``scores.csv``, ``training_metrics.csv`` and one log per job."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(BUNDLE_JSON, json.dumps(bundle, indent=1, ensure_ascii=False))
        archive.writestr(SCORES_CSV, scores_csv(bundle))
        archive.writestr(TRAINING_CSV, training_csv(bundle))
        for job in bundle.get("jobs", []):
            name = f"{job['kind']}-{job['experiment'] or 'run'}-{job['uuid'][:8]}.log"
            archive.writestr(f"{LOGS_DIR}/{name}", "\n".join(job["log"]) + ("\n" if job["log"] else ""))
    return buffer.getvalue()


def bundle_read(path: Path) -> dict[str, Any]:
    """The bundle dict of a zip written by :func:`bundle_archive` (or of a bare ``run.json``)."""
    limit = int(settings.RSI_BUNDLE_MAX_BYTES)
    too_large = ApplicationError(
        "bundle_too_large",
        f"{path}: run.json inflates past {limit} bytes (RSI_BUNDLE_MAX_BYTES); nothing imported.",
    )
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                info = archive.getinfo(BUNDLE_JSON)
                if info.file_size > limit:
                    raise too_large
                with archive.open(info) as member:
                    raw = member.read(limit + 1)  # the stated size may lie: never inflate more than this
                if len(raw) > limit:
                    raise too_large
                data = json.loads(raw)
        else:
            if Path(path).stat().st_size > limit:
                raise too_large
            data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ApplicationError("bundle_unreadable", f"{path} is not a run bundle: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ApplicationError("bundle_unreadable", f"{path} is not a run bundle (format {FORMAT!r}).")
    if data.get("version") != FORMAT_VERSION:
        raise ApplicationError(
            "bundle_version", f"bundle format version {data.get('version')!r}; this instance reads {FORMAT_VERSION}."
        )
    return data


# --- import --------------------------------------------------------------------------------------


def _instance(model: type[models.Model], row: dict[str, Any]) -> models.Model:
    values = {}
    for field in model._meta.concrete_fields:
        if field.attname not in row:
            # A column newer than the bundle (a bundle written before it existed): its default
            # ("" for a text column without one; a required column without any still fails).
            values[field.attname] = field.get_default()
            continue
        value = row.get(field.attname)
        # JSON columns hold the value as is; every other column parses its text form.
        values[field.attname] = (
            value if isinstance(field, models.JSONField) or value is None else field.to_python(value)
        )
    return model(**values)


def _trusted(signer: str, trusted_keys: Iterable[str]) -> bool:
    allowed = {*settings.RSI_TRUSTED_INSTANCE_KEYS, *trusted_keys}
    return signer == instance_public_key() or signer in allowed or instance_fingerprint(signer) in allowed


def bundle_verify(data: dict[str, Any], *, trusted_keys: Iterable[str] = ()) -> dict[str, Any]:
    """Refuse (ApplicationError) a bundle that does not prove itself; returns its signed manifest.

    The manifest's signature holds for the key it names, that key is this instance's or a trusted
    one (``RSI_TRUSTED_INSTANCE_KEYS``, ``import_run --trust``), every table and column is one this
    instance knows, every record hashes to what the manifest states (none added, none dropped),
    the chain ends at the signed head, and every base or reference checkpoint is a signed one.
    """
    manifest, signature = data.get("manifest"), data.get("signature")
    if not isinstance(manifest, dict) or not isinstance(signature, str):
        raise ApplicationError("bundle_unsigned", "the bundle carries no signed manifest; nothing imported.")
    signer = str(manifest.get("signer", ""))
    if not signature_valid(signer, canonical_json(manifest).encode("utf-8"), signature):
        raise ApplicationError("bundle_signature", "the bundle's manifest does not match its signature.")
    if not _trusted(signer, trusted_keys):
        raise ApplicationError(
            "bundle_untrusted",
            f"the bundle is signed by instance {instance_fingerprint(signer)}, which this instance does not "
            "trust (RSI_TRUSTED_INSTANCE_KEYS, or import_run --trust <fingerprint>); nothing imported.",
        )
    if manifest.get("run") != data.get("run"):
        raise ApplicationError("bundle_records_differ", "the bundle's run is not the signed one.")
    tables = data.get("tables")
    if not isinstance(tables, dict):
        raise ApplicationError("bundle_unreadable", "the bundle holds no tables.")
    models_of = {_label(model): model for model in TABLES}
    for label, rows in tables.items():
        model = models_of.get(label)
        if model is None:
            raise ApplicationError("bundle_unknown_column", f"the bundle holds a table this instance lacks: {label}.")
        columns = {field.attname for field in model._meta.concrete_fields}
        for row in rows:
            unknown = sorted(set(row) - columns) if isinstance(row, dict) else ["(not a row)"]
            if unknown:
                raise ApplicationError(
                    "bundle_unknown_column",
                    f"{label} {row.get('id') if isinstance(row, dict) else '?'} has columns this instance "
                    f"lacks: {', '.join(unknown)}; nothing imported.",
                )
    unknown = sorted(set(data.get("benchmark", {})) - set(_BENCHMARK_FIELDS))
    if unknown:
        raise ApplicationError("bundle_unknown_column", f"the benchmark has unknown columns: {', '.join(unknown)}.")
    signed = manifest.get("records", {})
    for label in sorted(set(signed) | set(tables)):
        stated = signed.get(label, {})
        rows = {str(row["id"]): row for row in tables.get(label, [])}
        for row_id in sorted(set(stated) | set(rows)):
            if row_id not in rows:
                raise ApplicationError("bundle_records_differ", f"{label} {row_id} is signed but missing.")
            if row_id not in stated:
                raise ApplicationError("bundle_records_differ", f"{label} {row_id} is not among the signed records.")
            if _digest(rows[row_id]) != stated[row_id]:
                raise ApplicationError("bundle_records_differ", f"{label} {row_id} differs from its signed hash.")
    for block in ("benchmark", "scores", "integrity_report", "jobs", "notes", "hardware"):
        if _digest(data.get(block)) != manifest.get(block):
            raise ApplicationError("bundle_records_differ", f"the bundle's {block} differs from its signed hash.")
    chains = tables.get(_label(EventChain), [])
    head = manifest.get("chain", {})
    if (
        len(chains) != 1
        or head.get("key") != data.get("chain", {}).get("key")
        or (chains[0].get("head_seq"), chains[0].get("head_hash")) != (head.get("head_seq"), head.get("head_hash"))
    ):
        raise ApplicationError("chain_broken", "the bundle's chain does not end at its signed head.")
    bases = {(b.get("uuid"), b.get("manifest_sha256")) for b in manifest.get("bases", [])}
    for row in tables.get(_label(Checkpoint), []):
        if (row.get("is_base") or row.get("is_reference")) and (row["uuid"], row["manifest_sha256"]) not in bases:
            raise ApplicationError(
                "bundle_base_unsigned",
                f"checkpoint {row.get('handle')} would register a base model or reference the exporting "
                "instance did not sign; nothing imported.",
            )
    return manifest


def _base_checks(data: dict[str, Any]) -> None:
    """A base model here is never a reference's weights under another name (θ0 must not be the sealed reference)."""
    rows = [row for row in data["tables"].get(_label(Checkpoint), []) if row.get("is_base")]
    here = {
        str(u) for u in Checkpoint.objects.filter(uuid__in=[row["uuid"] for row in rows]).values_list("uuid", flat=True)
    }
    for row in rows:
        if row["uuid"] in here:
            continue  # shared with this instance already (import checks its manifest is the same)
        clash = Checkpoint.objects.filter(is_reference=True).filter(
            models.Q(manifest_sha256=row["manifest_sha256"]) | models.Q(uri=row["uri"])
        )
        if clash.exists():
            raise ApplicationError(
                "bundle_base_is_reference",
                f"checkpoint {row.get('handle')} would register a reference model's weights as a base; "
                "nothing imported.",
            )


_TEXT_MIN = 12  # a sealed item is a sentence: shorter strings, or one word (ids, hashes), are not scanned


def _texts(value: Any, path: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        if len(value) >= _TEXT_MIN and " " in value.strip():
            yield path, value
    elif isinstance(value, dict):
        for key, sub in value.items():
            yield from _texts(sub, f"{path}/{key}")
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            yield from _texts(sub, f"{path}/{index}")


def bundle_sealed_text(data: dict[str, Any], benchmark: Benchmark) -> list[tuple[str, str]]:
    """(where, sample id) of every text field of the bundle that carries one of ``benchmark``'s sealed
    items (the contamination scanner on every layer, fields read one by one)."""
    scanner = sealed_scanner(benchmark=benchmark)
    found = []
    for label, rows in data["tables"].items():
        for row in rows:
            for where, text in _texts(row, f"{label}/{row.get('id')}"):
                for match in scanner.scan_row({"text": text}):
                    found.append((where, match.sample_id))
    for block in ("scores", "integrity_report"):
        for where, text in _texts(data.get(block), block):
            for match in scanner.scan_row({"text": text}):
                found.append((where, match.sample_id))
    return found


def _bundle_chain_verify(data: dict[str, Any]) -> None:
    """Recompute every link of the bundle's chain, as apps.experiments.events.chain_verify does."""
    key = data["chain"]["key"]
    if key != data["run"]:
        raise ApplicationError("chain_broken", "the bundle's chain is not its run's.")
    chains = data["tables"]["experiments.eventchain"]
    if len(chains) != 1:
        raise ApplicationError("chain_broken", "the bundle holds no event chain for its run.")
    prev_hash, expected_seq = GENESIS_HASH, 1
    for row in sorted(data["tables"]["experiments.event"], key=lambda r: r["seq"]):
        event = _instance(Event, row)
        assert isinstance(event, Event)
        if event.seq != expected_seq or event.prev_hash != prev_hash:
            raise ApplicationError(
                "chain_broken", f"the bundle's chain breaks at seq {expected_seq} (a link is missing)."
            )
        if content_hash(event_content(event, run_uuid=key)) != event.content_sha256:
            raise ApplicationError("chain_broken", f"the bundle's event {event.seq} does not match its hash.")
        if link_hash(prev_hash, expected_seq, event.content_sha256) != event.hash:
            raise ApplicationError("chain_broken", f"the bundle's chain link {event.seq} does not hold.")
        prev_hash, expected_seq = event.hash, expected_seq + 1
    head = chains[0]
    if head["head_seq"] != expected_seq - 1 or head["head_hash"] != prev_hash:
        raise ApplicationError("chain_broken", "the bundle's chain head does not match its last event.")


def _new_ids(model: type[models.Model], count: int) -> list[int]:
    """Fresh primary keys from the table's own sequence, so later inserts never collide."""
    if count == 0:
        return []
    table, column = model._meta.db_table, model._meta.pk.column
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)", [table, column, count]
            )
            return [int(r[0]) for r in cursor.fetchall()]
        # SQLite: writers are serialised by the import's transaction; ids above the largest are free.
        cursor.execute(f'SELECT COALESCE(MAX("{column}"), 0) FROM "{table}"')  # noqa: S608 - names from _meta
        start = int(cursor.fetchone()[0])
        return list(range(start + 1, start + 1 + count))


def _benchmark_for(data: dict[str, Any], *, checkpoint_ids: dict[int, int]) -> Benchmark:
    """This instance's copy of the bundle's benchmark: the same hashes, or a record of it (no sealed data)."""
    fields = data["benchmark"]
    found = Benchmark.objects.filter(name=fields["name"], version=fields["version"]).first()
    if found is not None:
        same = (found.evaluator_sha256, found.settings_sha256, found.data_sha256) == (
            fields["evaluator_sha256"], fields["settings_sha256"], fields["data_sha256"],
        )  # fmt: skip
        if not same:
            raise Conflict(
                "benchmark_differs", f"{found} exists here with other hashes than the bundle's; nothing imported."
            )
        return found
    reference = fields["reference_checkpoint_id"]
    row = dict(
        fields,
        updated_at=fields["created_at"],
        reference_checkpoint_id=None if reference is None else checkpoint_ids.get(reference),
    )
    benchmark = _instance(Benchmark, row)
    assert isinstance(benchmark, Benchmark)
    Benchmark._base_manager._insert([benchmark], fields=_insert_fields(Benchmark, with_pk=False), raw=True)  # type: ignore[attr-defined]
    return Benchmark.objects.get(uuid=benchmark.uuid)


def _insert_fields(model: type[models.Model], *, with_pk: bool = True) -> list[models.Field[Any, Any]]:
    return [f for f in model._meta.concrete_fields if with_pk or not f.primary_key]


def _insert(model: type[models.Model], objs: list[models.Model]) -> None:
    """INSERT rows exactly as given: ``raw`` keeps auto_now_add timestamps (the chain hashes event times)."""
    for start in range(0, len(objs), 500):
        model._base_manager._insert(objs[start : start + 500], fields=_insert_fields(model), raw=True)  # type: ignore[attr-defined]


@transaction.atomic
def import_run_bundle(data: dict[str, Any], *, trusted_keys: Iterable[str] = ()) -> Run:
    """Write a bundle's run into this instance; all or nothing.

    Refuses (ApplicationError, nothing written) a bundle that does not prove itself
    (:func:`bundle_verify`), one that would register a reference's weights as a base, one with
    sealed text of its benchmark in any field (when the benchmark's sealed data is here), when
    the run already exists here, when the bundle's chain does not verify, or when any row
    conflicts with one already here. Checkpoints that exist here under the same UUID and
    manifest hash (θ0, the reference) are shared. The imported run is tagged ``imported`` and its
    chain records a ``run.imported`` event with the signer and the manifest's digest.
    """
    manifest = bundle_verify(data, trusted_keys=trusted_keys)
    _bundle_chain_verify(data)
    _base_checks(data)
    fields = data["benchmark"]
    sealed_here = Benchmark.objects.filter(name=fields["name"], version=fields["version"]).first()
    scanned = sealed_here is not None and bool(sealed_here.sealed_path)
    if scanned:
        assert sealed_here is not None
        planted = bundle_sealed_text(data, sealed_here)
        if planted:
            where = "; ".join(f"{path} ({sample})" for path, sample in planted[:5])
            raise ApplicationError(
                "bundle_sealed_text",
                f"the bundle carries sealed items of {sealed_here} in {len(planted)} field(s): {where}; "
                "nothing imported.",
            )
    if Run.objects.filter(uuid=data["run"]).exists():
        raise Conflict("run_exists", f"Run {data['run']} already exists here; nothing imported.")
    if EventChain.objects.filter(key=data["chain"]["key"]).exists():
        raise Conflict("run_exists", f"An event chain for run {data['run']} already exists here; nothing imported.")

    tables = data["tables"]
    ids: dict[str, dict[int, int]] = {_label(model): {} for model in TABLES}
    existing = {
        str(c.uuid): c
        for c in Checkpoint.objects.filter(uuid__in=[row["uuid"] for row in tables["experiments.checkpoint"]])
    }
    new_checkpoints = []
    for row in tables["experiments.checkpoint"]:
        here = existing.get(row["uuid"])
        if here is None:
            new_checkpoints.append(row)
        elif here.manifest_sha256 != row["manifest_sha256"]:
            raise Conflict("checkpoint_differs", f"Checkpoint {here.handle} exists here with another manifest.")
        else:
            ids["experiments.checkpoint"][row["id"]] = here.pk

    # Every id first, so a row may name one of a later table (a checkpoint its run); the foreign
    # keys are checked at commit.
    rows_of = {
        _label(model): new_checkpoints if model is Checkpoint else tables.get(_label(model), []) for model in TABLES
    }
    for model in TABLES:
        rows = rows_of[_label(model)]
        for row, new_id in zip(rows, _new_ids(model, len(rows)), strict=True):
            ids[_label(model)][row["id"]] = new_id
    benchmark = _benchmark_for(data, checkpoint_ids=ids["experiments.checkpoint"])
    for model in TABLES:
        label = _label(model)
        objs = []
        for row in rows_of[label]:
            values = dict(row, id=ids[label][row["id"]])
            for field in model._meta.concrete_fields:
                if not field.is_relation or values.get(field.attname) is None:
                    continue
                if field.attname in _DROPPED_REFERENCES:
                    values[field.attname] = None
                elif field.related_model is Benchmark:
                    values[field.attname] = benchmark.pk
                else:
                    target = _label(field.related_model)  # type: ignore[arg-type]
                    if row[field.attname] not in ids[target]:
                        raise ApplicationError(
                            "bundle_inconsistent",
                            f"{label} {row['id']} names {target} {row[field.attname]}, which the bundle does not hold.",
                        )
                    values[field.attname] = ids[target][row[field.attname]]
            objs.append(_instance(model, values))
        _insert(model, objs)

    report = chain_verify(data["chain"]["key"])
    if not report.ok:  # the rows as written here must verify too; the transaction rolls back
        raise ApplicationError("chain_broken", f"The imported chain does not verify: {report.reason}")
    run = Run.objects.get(uuid=data["run"])
    Run.objects.filter(pk=run.pk).update(tags=[*(t for t in run.tags if t != IMPORTED_TAG), IMPORTED_TAG])
    event_append(
        run=run,
        type="run.imported",
        actor="system",
        role="system",
        arguments={
            "origin": instance_fingerprint(manifest["signer"]),
            "signer": manifest["signer"],
            "exported_at": manifest["exported_at"],
            "manifest_sha256": _digest(manifest),
            "signed_head": manifest["chain"],
            "sealed_text_scanned": scanned,
        },
    )
    run.refresh_from_db()
    return run


def run_import_origin(run: Run) -> dict[str, Any] | None:
    """Where an imported run came from (the ``run.imported`` event's record), or None for a run made here."""
    event = Event.objects.filter(run=run, type="run.imported").order_by("id").first()
    return dict(event.arguments) if event is not None else None
