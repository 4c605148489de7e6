"""State changes of the experiment graph: checkpoints, experiments, evaluations, integrity status.

Each change of an experiment or an evaluation is announced to the run's watchers after commit
(``apps.live``), with the record its selector builds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psycopg
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.backends.postgresql.base import CursorDebugWrapper, ServerBindingCursor
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from apps.core.errors import ApplicationError, Conflict
from apps.core.handles import lock_global_handles, next_handle
from apps.core.hashing import canonical_json, sha256_text, sha256_tree
from apps.core.models import clean_new_row
from apps.experiments.choices import EvaluationStatus, IntegrityStatus
from apps.experiments.events import EVENT_APPEND_CALL, PendingEvent, event_append, pending_event_write
from apps.experiments.models import (
    Checkpoint,
    Evaluation,
    EvaluationSample,
    Experiment,
    ExperimentEdge,
    IntegrityStatusChange,
    MetricPoint,
)
from apps.experiments.selectors import evaluation_live, experiment_live
from apps.live.events import LiveEvent, publish_on_commit
from apps.live.groups import run_group
from apps.research.choices import NodeKind
from apps.research.models import ResearchNode, Run

if TYPE_CHECKING:
    from apps.benchmarks.models import Benchmark
    from apps.jobs.models import Job


def manifest_digest(manifest: dict[str, str]) -> str:
    return sha256_text(canonical_json(manifest))


def checkpoint_register(
    *,
    handle: str | None = None,
    uri: str,
    directory: Path | None = None,
    manifest: dict[str, str] | None = None,
    parent: Checkpoint | None = None,
    producing_job: Any = None,
    run: Run | None = None,
    is_base: bool = False,
    is_reference: bool = False,
    model_profile: dict[str, Any] | None = None,
) -> Checkpoint:
    """Record a checkpoint with the sha256 manifest of every file in ``directory`` (or given).

    ``model_profile`` is a registered base or reference model's family, chat template and EOS
    handling (`apps.ml.base_models`); a trained checkpoint inherits its parent's tokenizer.
    """
    if manifest is None:
        if directory is None:
            raise ApplicationError("no_manifest", "Give the checkpoint directory or its manifest.")
        manifest = sha256_tree(directory)
    if not manifest:
        raise ApplicationError("empty_checkpoint", f"Checkpoint at {uri} has no files.")
    with transaction.atomic():
        if handle is None:
            # Checkpoint handles are global: a run's lock would not keep two runs from numbering
            # the same handle at once (seen with concurrent ablation runs), so the lock is global.
            lock_global_handles("ckpt")
            handle = next_handle(Checkpoint.objects.all(), "ckpt")
        checkpoint = Checkpoint(
            handle=handle,
            uri=uri,
            manifest=manifest,
            manifest_sha256=manifest_digest(manifest),
            parent=parent,
            producing_job=producing_job,
            run=run,
            is_base=is_base,
            is_reference=is_reference,
            model_profile=model_profile or {},
        )
        checkpoint.full_clean()
        checkpoint.save()
        event_append(
            run=run,
            type="checkpoint.registered",
            actor="system",
            role="system",
            arguments={"handle": handle, "uri": uri, "manifest_sha256": checkpoint.manifest_sha256},
            result_ref=f"checkpoint:{checkpoint.uuid}",
        )
    return checkpoint


def checkpoint_register_once(
    *, handle: str, directory: Path, store: Callable[[str], str], remedy: str, **flags: Any
) -> tuple[Checkpoint, bool]:
    """Register the files of ``directory`` as checkpoint ``handle`` once; ``(checkpoint, created)``.

    A checkpoint already under ``handle`` with the same manifest is returned as it is; one with
    another manifest is refused (``checkpoint_differs``, the message ending with ``remedy``).
    Otherwise ``store(manifest digest)`` puts the files where they will live and returns their
    URI, and the checkpoint is registered with ``flags`` (``checkpoint_register``'s); a
    concurrent registration of the same handle wins, and its row is returned.
    """
    manifest = sha256_tree(directory)
    digest = manifest_digest(manifest)
    existing = Checkpoint.objects.filter(handle=handle).first()
    if existing is not None:
        if existing.manifest_sha256 != digest:
            raise Conflict(
                "checkpoint_differs",
                f"{handle} is registered with other files (manifest {existing.manifest_sha256[:12]}…, "
                f"these {digest[:12]}…); {remedy}",
            )
        return existing, False
    uri = store(digest)
    try:
        return checkpoint_register(handle=handle, uri=uri, manifest=manifest, **flags), True
    except IntegrityError:
        return Checkpoint.objects.get(handle=handle), False


def experiment_create(
    *,
    run: Run,
    owner: ResearchNode,
    kind: str,
    input_checkpoint: Checkpoint,
    action: dict[str, Any],
    parents: list[Experiment] | None = None,
    claim: str = "",
    idempotency_key: str | None = None,
    status: str = "queued",
) -> Experiment:
    """Create one experiment owned by one Worker, linked to the experiments it continues."""
    if owner.kind != NodeKind.WORKER or owner.run_id != run.pk:
        raise ApplicationError("invalid_owner", "An experiment is owned by exactly one Worker of its run.")
    parents = parents or []
    if any(p.run_id != run.pk for p in parents):
        raise ApplicationError("foreign_parent", "Parent experiments must belong to the same run.")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        experiment = Experiment(
            run=locked,
            handle=next_handle(Experiment.objects.filter(run=locked), "exp"),
            owner=owner,
            kind=kind,
            status=status,
            input_checkpoint=input_checkpoint,
            action=action,
            claim=claim,
            idempotency_key=idempotency_key,
        )
        # The run row is locked above; the owner and checkpoint are rows the caller just read.
        clean_new_row(experiment, held=("run", "owner", "input_checkpoint"))
        experiment.save()
        # Parents exist before the child is created and edges are append-only, so the
        # experiment graph is acyclic by construction.
        ExperimentEdge.objects.bulk_create([ExperimentEdge(parent=p, child=experiment) for p in parents])
        IntegrityStatusChange.objects.create(
            experiment=experiment, to_status=IntegrityStatus.PENDING, actor="system", reason="submitted"
        )
        event_append(
            run=locked,
            type="experiment.created",
            actor=owner.handle,
            role="worker",
            arguments={"kind": kind, "action": action, "parents": [p.handle for p in parents]},
            result_ref=f"experiment:{experiment.uuid}",
        )
        publish_on_commit(run_group(locked.uuid), LiveEvent.EXPERIMENT_CREATED, experiment_live(experiment))
    return experiment


def experiment_set_integrity(*, experiment: Experiment, status: str, actor: str, reason: str) -> Experiment:
    """Change an experiment's integrity status; the change and its reason join the history."""
    if status not in IntegrityStatus.values:
        raise ApplicationError("invalid_status", f"Integrity status must be one of {IntegrityStatus.values}.")
    if not reason.strip():
        raise ApplicationError("reason_required", "An integrity status change needs a reason.")
    with transaction.atomic():
        locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
        if locked.integrity_status == status:
            return locked
        IntegrityStatusChange.objects.create(
            experiment=locked, from_status=locked.integrity_status, to_status=status, actor=actor, reason=reason
        )
        locked.integrity_status = status
        locked.save(update_fields=["integrity_status", "updated_at"])
        event_append(
            run=locked.run,
            type="experiment.integrity_changed",
            actor=actor,
            role="system",
            arguments={"status": status, "reason": reason},
            result_ref=f"experiment:{locked.uuid}",
        )
        experiment_publish(locked)
    return locked


def experiment_publish(experiment: Experiment) -> None:
    """Tell the run's watchers that the experiment changed (status, score, θ_out, integrity), after commit.

    For the services that change an experiment row; the payload is read now, inside their
    transaction, so it is the row as it will be committed.
    """
    publish_on_commit(run_group(experiment.run.uuid), LiveEvent.EXPERIMENT_UPDATED, experiment_live(experiment))


def evaluation_record(
    *,
    job: Job,
    checkpoint: Checkpoint,
    benchmark: Benchmark,
    split: str,
    rows: list[dict[str, Any]] | None = None,
    seal: dict[str, Any] | None = None,
    backend: str = "hf",
    refusal_reason: str = "",
    inference: dict[str, Any] | None = None,
) -> Evaluation:
    """Record the evaluation a job ran (``rows`` and the ``seal`` it verified) or refused (``refusal_reason``).

    A run evaluation is the aggregate plus its sealed per-sample rows, with the hashes that
    benchmark_load_sealed verified just before it ran and the id of every sample scored
    (sample-inclusion accounting). A refused one records that nothing was run, and why. The
    caller holds the job's lock; the experiment's score is the pipeline's to set from this row.
    ``inference`` records the engine and weight provenance and, for a final evaluation over several
    seeds, their aggregate (``apps.experiments.final_eval``): the score is then the mean over the
    seeds that succeeded, and ``rows`` are the first succeeded seed's.
    """
    if (rows is None) == (not refusal_reason):
        raise ApplicationError("invalid_evaluation", "An evaluation has result rows or a refusal reason, not both.")
    evaluation = Evaluation(
        run=job.run,
        experiment=job.experiment,
        checkpoint=checkpoint,
        benchmark=benchmark,
        job=job,
        split=split,
        backend=backend,
        inference=inference or {},
    )
    if rows is None:
        evaluation.status = EvaluationStatus.REFUSED
        evaluation.refusal_reason = refusal_reason
    else:
        if seal is None:
            raise ApplicationError("invalid_evaluation", "A run evaluation records the seal it verified.")
        evaluation.correct = sum(1 for row in rows if row["correct"])
        evaluation.sample_count = len(rows)
        evaluation.score = evaluation.correct / len(rows) if rows else 0.0
        seeds = (inference or {}).get("seeds") or {}
        if len(seeds.get("succeeded", [])) > 1:
            evaluation.score = float(seeds["mean"])
        evaluation.evaluator_sha256 = seal["evaluator_sha256"]
        evaluation.settings_sha256 = seal["settings_sha256"]
        evaluation.data_sha256 = seal["data_sha256"]
    with transaction.atomic():
        evaluation.full_clean()
        evaluation.save(force_insert=True)
        EvaluationSample.objects.bulk_create(
            EvaluationSample(
                evaluation=evaluation, sample_id=str(r["id"]), output=str(r["output"]), correct=bool(r["correct"])
            )
            for r in rows or []
        )
        if job.run is not None:
            publish_on_commit(run_group(job.run.uuid), LiveEvent.EVALUATION_CREATED, evaluation_live(evaluation))
    return evaluation


# Points per call (MLflow's log_batch allows 1,000 metrics); on SQLite it also keeps the
# statement's parameters (3 per point) under SQLite's limit of 32,766.
MAX_METRIC_POINTS = 10_000


def _metric_points_check(points: list[tuple[str, int, float]]) -> None:
    if len(points) > MAX_METRIC_POINTS:
        raise ApplicationError("too_many_points", f"At most {MAX_METRIC_POINTS} points per call; split the batch.")
    seen: set[tuple[str, int]] = set()
    for index, (key, step, _) in enumerate(points):
        if (key, step) in seen:
            raise ApplicationError(
                "duplicate_point", f"/points/{index}: {key} at step {step} appears twice in this call."
            )
        seen.add((key, step))


# The points on PostgreSQL, from _metric_points_source's four parameters.
_PG_POINTS = (
    "SELECT (%s::text[])[u.k] AS column1, u.column2, u.column3 FROM unnest("
    "string_to_array(%s, ',')::int[], string_to_array(%s, ',')::bigint[], string_to_array(%s, ',')::float8[]"
    ") AS u(k, column2, column3)"
)


def _metric_points_source(points: list[tuple[str, int, float]]) -> tuple[str, list[Any]]:
    """The points as a row source with columns column1..3, and its parameters."""
    keys, steps, values = (list(column) for column in zip(*points, strict=True))
    if connection.vendor == "postgresql":
        # Four parameters, whatever the batch size: the distinct keys as a text array, and each
        # point's key number, step and value as comma-separated text that PostgreSQL splits and
        # parses. Quoting 3,000 array elements in Python (psycopg's client-side binding) was a
        # quarter of a 1,000-point call's CPU; joining them is a C loop. repr() of a float is its
        # shortest exact text, which float8 input reads back as the same double (NaN and
        # infinities included).
        numbers: dict[str, int] = {}
        key_numbers = [numbers.setdefault(key, len(numbers) + 1) for key in keys]
        return f"({_PG_POINTS}) AS v", [
            list(numbers),
            ",".join(map(str, key_numbers)),
            ",".join(map(str, map(int, steps))),
            ",".join(map(repr, map(float, values))),
        ]
    # SQLite: a VALUES list (its columns are column1.. too)
    return f"(VALUES {', '.join(['(%s, %s, %s)'] * len(points))}) AS v", [x for point in points for x in point]


_METRIC_INSERT = (
    "INSERT INTO experiments_metricpoint (experiment_id, key, step, value, created_at) "
    "SELECT {experiment}, column1, CAST(column2 AS BIGINT), CAST(column3 AS DOUBLE PRECISION), %s "
    "FROM {source} ON CONFLICT (experiment_id, key, step) DO NOTHING RETURNING key, step"
)


def metric_points_log(*, experiment: Experiment, points: list[tuple[str, int, float]]) -> tuple[int, int]:
    """Append (key, step, value) points to ``experiment``; returns (logged, already_there).

    One INSERT for the whole batch. A point identical to one already logged is a no-op, so a
    retried call is harmless; a different value for a logged (key, step) refuses the whole call
    (409 ``metric_conflict``) — a logged value is never replaced. Call inside a transaction.
    """
    if not points:
        return 0, 0
    _metric_points_check(points)
    source, params = _metric_points_source(points)
    # The pk is ours, an int.
    with connection.cursor() as cursor:
        cursor.execute(_METRIC_INSERT.format(experiment=int(experiment.pk), source=source), [timezone.now(), *params])
        inserted = {(key, step) for key, step in cursor.fetchall()}
    return _metric_points_settle(experiment, points, inserted)


def metric_points_log_owned(
    *,
    run: Run,
    owner: ResearchNode,
    handle: str,
    points: list[tuple[str, int, float]],
    event: PendingEvent | None = None,
) -> tuple[Experiment, int, int] | None:
    """``metric_points_log`` on the experiment ``handle`` of ``run`` if ``owner`` owns it, else None.

    On PostgreSQL the ownership check is part of the INSERT (one statement: the experiment is
    found by run, handle and owner, and the points are inserted for it), because this is what
    agents call most. None says only "not yours or not there"; the caller tells which.

    ``event`` (the call's record) is written by the same statement when the experiment is the
    owner's, so the change and its event cost one round trip; the caller's transaction rolls
    both back if the points are then refused. The statement is bound server-side, so each
    connection prepares it once.
    """
    if connection.vendor != "postgresql" or not points:
        experiment = Experiment.objects.filter(run=run, handle=handle, owner=owner).only("pk", "uuid", "handle").first()
        if experiment is None:
            return None
        logged = metric_points_log(experiment=experiment, points=points)
        if event is not None:
            pending_event_write(event)
        return experiment, *logged
    _metric_points_check(points)
    source, params = _metric_points_source(points)
    insert = _METRIC_INSERT.format(experiment="e.id", source=f"e, {source}")
    params = [run.pk, handle, owner.pk, timezone.now(), *params]
    if event is None:
        sql = f"{_OWNED} ins AS ({insert}) SELECT e.id, e.uuid, ins.key, ins.step FROM e LEFT JOIN ins ON true"
    else:
        # A function in a CTE's select list runs once per row of ``e``: once when the experiment
        # is the owner's, not at all when it is not.
        sql = (
            f"{_OWNED} ins AS ({insert}), ev AS (SELECT {EVENT_APPEND_CALL} AS r FROM e) "
            "SELECT e.id, e.uuid, ins.key, ins.step, (ev.r).event_id, (ev.r).event_chain_id, (ev.r).event_sealed "
            "FROM e LEFT JOIN ins ON true LEFT JOIN ev ON true"
        )
        params += event.params
    with _server_bound_cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return None
    if event is not None:
        event.appended(*rows[0][4:7])
    experiment = Experiment(pk=rows[0][0], uuid=rows[0][1], handle=handle, run_id=run.pk, owner_id=owner.pk)
    inserted = {(row[2], row[3]) for row in rows if row[2] is not None}
    return experiment, *_metric_points_settle(experiment, points, inserted)


# The common append as its own transaction: the points of an experiment found by run, handle, owner
# and the uuid the caller's event names; the event; and, for the points not inserted, the check that
# each is logged with the same value (a conflict, or a point a concurrent call inserted after this
# statement's snapshot, refuses the statement: rsiweb_refuse_unless, migration 0013).
_AT_ONCE = (
    "WITH e AS (SELECT id FROM experiments_experiment WHERE run_id = %s AND handle = %s AND owner_id = %s "
    "AND uuid = %s), "
    f"v AS MATERIALIZED ({_PG_POINTS}), "
    "ins AS (INSERT INTO experiments_metricpoint (experiment_id, key, step, value, created_at) "
    "SELECT e.id, v.column1, v.column2, v.column3, %s FROM e, v "
    "ON CONFLICT (experiment_id, key, step) DO NOTHING RETURNING key, step), "
    f"ev AS (SELECT {EVENT_APPEND_CALL} AS r FROM e), "
    "kept AS (SELECT count(*) AS n, coalesce(bool_and(coalesce(m.value = v.column3, false)), true) AS same "
    "FROM e CROSS JOIN v LEFT JOIN ins ON ins.key = v.column1 AND ins.step = v.column2 "
    "LEFT JOIN experiments_metricpoint m ON m.experiment_id = e.id AND m.key = v.column1 AND m.step = v.column2 "
    "WHERE ins.key IS NULL) "
    "SELECT (ev.r).event_id, (ev.r).event_chain_id, (ev.r).event_sealed, kept.n, "
    "rsiweb_refuse_unless(kept.same, 'metric_conflict') FROM ev, kept"
)
REFUSED_SQLSTATE = "RS409"  # rsiweb_refuse_unless


def metric_points_log_at_once(
    *, run: Run, owner: ResearchNode, handle: str, uuid: str, points: list[tuple[str, int, float]], event: PendingEvent
) -> tuple[int, int] | None:
    """An agent's common append as one statement that is its own transaction: (logged, already_there).

    PostgreSQL, outside any transaction: the points go in with ``event`` (the call's record) when
    ``owner`` owns the experiment ``handle`` of ``run`` and its uuid is ``uuid`` (the one the event
    names), and every point not inserted is already logged with the same value; the statement
    commits itself, so the call costs one round trip where BEGIN, statement, COMMIT cost three.
    None, with nothing written, in every other case (not owned, another uuid, a conflicting or
    concurrently inserted point): the caller takes ``metric_points_log_owned`` in a transaction,
    which tells which.
    """
    if connection.in_atomic_block or connection.vendor != "postgresql":
        raise RuntimeError("metric_points_log_at_once runs on PostgreSQL outside any transaction")
    _metric_points_check(points)
    _, source_params = _metric_points_source(points)  # _PG_POINTS's four
    params = [run.pk, handle, owner.pk, uuid, *source_params, timezone.now(), *event.params]
    try:
        with _server_bound_cursor() as cursor:
            cursor.execute(_AT_ONCE, params)
            row = cursor.fetchone()
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == REFUSED_SQLSTATE:
            return None  # rolled back with its statement
        raise
    if row is None:
        return None
    event.appended(*row[:3])  # committed: a re-check it needs runs now (on_commit outside a transaction)
    unchanged = int(row[3])
    return len(points) - unchanged, unchanged


_OWNED = "WITH e AS (SELECT id, uuid FROM experiments_experiment WHERE run_id = %s AND handle = %s AND owner_id = %s),"


def _server_bound_cursor() -> Any:
    """A Django cursor whose parameters PostgreSQL binds, so psycopg prepares a statement it runs
    often (Django's own cursors interpolate them client-side and never prepare)."""
    connection.ensure_connection()
    # Prepared on first use rather than psycopg's fifth: only these statements are bound
    # server-side (Django's cursors never prepare), and they run on every connection of the pool.
    connection.connection.prepare_threshold = 0
    connection.validate_thread_sharing()
    raw = cast(Any, ServerBindingCursor)(connection.connection)
    # Wrapped as Django wraps its own cursors (execute wrappers, error translation, the query log).
    return _LoggedServerBound(raw, connection) if connection.queries_logged else connection.make_cursor(raw)


class _LoggedServerBound(CursorDebugWrapper):
    """The query log's entry of a prepared statement: Django looks for the SQL where psycopg only
    keeps it for statements it interpolates, and would log None; this logs it with its values."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        try:
            logged = cast(Any, connection.ops).compose_sql(sql, params)
        except psycopg.DataError:  # a value it cannot write in: the statement as sent
            logged = sql
        with self.debug_sql(logged, params):
            return CursorWrapper.execute(self, sql, params)


def _metric_points_settle(
    experiment: Experiment, points: list[tuple[str, int, float]], inserted: set[tuple[str, int]]
) -> tuple[int, int]:
    if len(inserted) == len(points):
        return len(points), 0
    # Some were there already: identical values are a retry, anything else a conflict.
    wanted = {(key, step): value for key, step, value in points if (key, step) not in inserted}
    seen_steps = [step for _, step in wanted]
    existing = {
        (key, step): value
        for key, step, value in MetricPoint.objects.filter(
            experiment_id=experiment.pk,
            key__in={key for key, _ in wanted},
            step__gte=min(seen_steps),
            step__lte=max(seen_steps),
        ).values_list("key", "step", "value")
    }
    changed = [f"{key}@{step}" for (key, step), value in wanted.items() if existing.get((key, step)) != value]
    if changed:
        raise Conflict(
            "metric_conflict",
            f"{experiment.handle} already has other values for {', '.join(changed[:5])}"
            f"{' ...' if len(changed) > 5 else ''}; a logged value is never replaced — log under a new step or key.",
            points=changed[:50],
        )
    return len(inserted), len(wanted)
