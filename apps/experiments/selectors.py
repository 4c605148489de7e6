"""Reads of the experiment graph shared by views, consumers, tools and workers.

Lineage is answered by one recursive SQL query each way (WITH RECURSIVE runs on PostgreSQL and
SQLite alike). ``UNION`` (not ``UNION ALL``) over (id, depth) keeps merges from multiplying rows;
the outer ``MIN(depth)`` gives each ancestor its shortest distance.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Min, QuerySet

from apps.core.records import iso
from apps.experiments.choices import ExperimentStatus
from apps.experiments.models import Checkpoint, Evaluation, Experiment, ExperimentEdge, MetricPoint

# Guards a corrupt (cyclic) graph from looping forever; real runs are far shallower.
MAX_DEPTH = 10_000

_ANCESTORS_SQL = """
WITH RECURSIVE walk(id, depth) AS (
    SELECT e.parent_id, 1 FROM experiments_experimentedge e WHERE e.child_id = %s
    UNION
    SELECT e.parent_id, walk.depth + 1 FROM experiments_experimentedge e
    JOIN walk ON e.child_id = walk.id WHERE walk.depth < %s
)
SELECT id, MIN(depth) FROM walk GROUP BY id ORDER BY MIN(depth), id
"""

_DESCENDANTS_SQL = """
WITH RECURSIVE walk(id, depth) AS (
    SELECT e.child_id, 1 FROM experiments_experimentedge e WHERE e.parent_id = %s
    UNION
    SELECT e.child_id, walk.depth + 1 FROM experiments_experimentedge e
    JOIN walk ON e.parent_id = walk.id WHERE walk.depth < %s
)
SELECT id, MIN(depth) FROM walk GROUP BY id ORDER BY MIN(depth), id
"""

_CHECKPOINT_CHAIN_SQL = """
WITH RECURSIVE walk(id, parent_id, is_base, producing_job_id, depth) AS (
    SELECT id, parent_id, is_base, producing_job_id, 0 FROM experiments_checkpoint WHERE id = %s
    UNION ALL
    SELECT c.id, c.parent_id, c.is_base, c.producing_job_id, walk.depth + 1
    FROM experiments_checkpoint c JOIN walk ON c.id = walk.parent_id WHERE walk.depth < %s
)
SELECT id, parent_id, is_base, producing_job_id FROM walk ORDER BY depth
"""

_CHECKPOINT_DESCENDANTS_SQL = """
WITH RECURSIVE walk(id, depth) AS (
    SELECT id, 1 FROM experiments_checkpoint WHERE parent_id = %s
    UNION
    SELECT c.id, walk.depth + 1 FROM experiments_checkpoint c JOIN walk ON c.parent_id = walk.id
    WHERE walk.depth < %s
)
SELECT id, MIN(depth) FROM walk GROUP BY id ORDER BY MIN(depth), id
"""


# One array parameter, not an IN list: psycopg re-parses a query of 1,000 placeholders on every
# call (~5 ms for a page of the experiment list), while ``= ANY(%s)`` is one short cached query.
_PARENT_HANDLES_SQL = """
SELECT e.child_id, p.handle FROM experiments_experimentedge e
JOIN experiments_experiment p ON p.id = e.parent_id
WHERE e.child_id = ANY(string_to_array(%s, ',')::bigint[])
"""


def _fetch(sql: str, *params: object) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def experiment_ancestors(experiment_id: int) -> list[tuple[int, int]]:
    """(experiment id, shortest distance) of every experiment this one continues, transitively."""
    return [(row[0], row[1]) for row in _fetch(_ANCESTORS_SQL, experiment_id, MAX_DEPTH)]


def experiment_descendants(experiment_id: int) -> list[tuple[int, int]]:
    """(experiment id, shortest distance) of every experiment that continues this one."""
    return [(row[0], row[1]) for row in _fetch(_DESCENDANTS_SQL, experiment_id, MAX_DEPTH)]


def experiment_parent_handles(experiment_ids: Iterable[int]) -> dict[int, list[str]]:
    """The handles of each experiment's parents (in no order), for many experiments in one query."""
    parents: dict[int, list[str]] = {pk: [] for pk in experiment_ids}
    if not parents:
        return parents
    if connection.vendor == "postgresql":
        # The ids as one text: psycopg quotes a list of a thousand ints element by element, in Python.
        rows: Iterable[tuple[int, str]] = _fetch(_PARENT_HANDLES_SQL, ",".join(map(str, parents)))
    else:
        rows = ExperimentEdge.objects.filter(child_id__in=parents).values_list("child_id", "parent__handle")
    for child_id, handle in rows:
        parents[child_id].append(handle)
    return parents


# The Workers whose feedback spend one Worker shares: itself, its predecessors (context in-edges,
# transitively) and its successors (context out-edges, transitively). A successor continues its
# predecessors' line of work, so it inherits what they spent instead of a fresh allowance; siblings
# share what their common predecessors spent, not each other's. Both walks in one query.
_LINEAGE_NODES_SQL = """
WITH RECURSIVE up(id) AS (
    SELECT CAST(%s AS BIGINT)
    UNION
    SELECT e.upstream_id FROM research_researchedge e JOIN up ON e.downstream_id = up.id WHERE e.kind = %s
), down(id) AS (
    SELECT CAST(%s AS BIGINT)
    UNION
    SELECT e.downstream_id FROM research_researchedge e JOIN down ON e.upstream_id = down.id WHERE e.kind = %s
)
SELECT id FROM up UNION SELECT id FROM down
"""
# research.EdgeKind.CONTEXT, spelled here: the experiment graph's reads do not import the research app.
_CONTEXT_EDGE = "context"


def _feedback_submissions() -> QuerySet[Experiment]:
    """Submissions that evaluate (or will) on the feedback split: all but rejected ones.

    Failed and cancelled ones count: the allowance bounds what was asked of the sealed split,
    and counting only successes would let a Worker retry its way around it.
    """
    return Experiment.objects.exclude(status=ExperimentStatus.REJECTED)


def worker_lineage_ids(*, node: Any) -> set[int]:
    """Node ids of ``node``'s lineage: itself, its predecessors and its successors (context edges)."""
    rows = _fetch(_LINEAGE_NODES_SQL, node.pk, _CONTEXT_EDGE, node.pk, _CONTEXT_EDGE)
    return {row[0] for row in rows} | {node.pk}


def feedback_evals_used(*, node: Any) -> int:
    """Feedback evaluations spent by this Worker's lineage (:func:`worker_lineage_ids`).

    The submission review and the quota tool both count with this (and with
    :func:`feedback_evals_used_in_run` / :func:`feedback_evals_used_on_checkpoint`).
    """
    return _feedback_submissions().filter(owner_id__in=worker_lineage_ids(node=node)).count()


def feedback_evals_used_in_run(*, run: Any) -> int:
    """Feedback evaluations spent in the whole run, by every Worker."""
    return _feedback_submissions().filter(run=run).count()


def feedback_evals_used_on_checkpoint(*, run: Any, checkpoint: Any) -> int:
    """Feedback evaluations of the run's submissions that start from (train_eval) or evaluate
    (eval_only) ``checkpoint``, by every Worker: each one probes the feedback split around it."""
    return _feedback_submissions().filter(run=run, input_checkpoint=checkpoint).count()


def checkpoint_descendants(checkpoint_id: int) -> list[tuple[int, int]]:
    return [(row[0], row[1]) for row in _fetch(_CHECKPOINT_DESCENDANTS_SQL, checkpoint_id, MAX_DEPTH)]


@dataclass(frozen=True)
class CheckpointLineage:
    """The parent chain of a checkpoint: does it reach θ0 through recorded jobs only?"""

    path: list[int] = field(default_factory=list)  # checkpoint ids, newest first
    reaches_base: bool = False
    broken_at: int | None = None  # checkpoint id where the chain breaks
    reason: str = ""


def checkpoint_lineage(checkpoint: Checkpoint, *, base: Checkpoint | None = None) -> CheckpointLineage:
    """Walk parents back to a base checkpoint (``base`` when given: it must be that θ0).

    A link is broken when a non-base checkpoint has no parent (foreign weights) or was not made
    by a recorded job (a swap or merge outside the Experiment OS).
    """
    rows = _fetch(_CHECKPOINT_CHAIN_SQL, checkpoint.pk, MAX_DEPTH)
    path = [row[0] for row in rows]
    for ckpt_id, parent_id, is_base, producing_job_id in rows:
        if is_base:
            if base is not None and ckpt_id != base.pk:
                return CheckpointLineage(path, False, ckpt_id, f"reaches base checkpoint {ckpt_id}, not θ0 {base.pk}")
            return CheckpointLineage(path, True)
        if producing_job_id is None:
            return CheckpointLineage(path, False, ckpt_id, "checkpoint was not produced by a recorded job")
        if parent_id is None:
            return CheckpointLineage(path, False, ckpt_id, "checkpoint has no parent and is not a base")
    return CheckpointLineage(path, False, path[-1] if path else None, "lineage deeper than the walk limit")


def checkpoint_registered_profile(checkpoint: Checkpoint) -> dict[str, Any]:
    """The model profile (family, chat template, EOS ids) of the registered model a checkpoint descends
    from: its own when it was registered (a base or a reference), else its lineage's base's.

    Empty when the chain reaches no base or the base was registered without one (the minibench's
    θ0). Read from the operator's registration, never from files a training run wrote.
    """
    if checkpoint.model_profile:
        return dict(checkpoint.model_profile)
    lineage = checkpoint_lineage(checkpoint)
    if not lineage.reaches_base or not lineage.path:
        return {}
    base = Checkpoint.objects.filter(pk=lineage.path[-1]).values_list("model_profile", flat=True).first()
    return dict(base or {})


def metric_history(
    *,
    experiment_id: int,
    key: str,
    after_step: int | None = None,
    limit: int = 25_000,
    to_step: int | None = None,
    sample: int | None = None,
) -> tuple[list[tuple[int, float, int]], bool]:
    """Up to ``limit`` (step, value, logged_ms) of one key in step order, after ``after_step`` and up
    to ``to_step``; and whether more follow. One range scan of the (experiment, key, step) unique index.

    ``sample`` (>= 2): instead of a page, at most that many points of the whole range, evenly spaced
    by rank (the first and the last always among them), chosen by the database; nothing follows.

    The time comes back as Unix milliseconds computed by the database: parsing and re-formatting
    10,000 timestamps in Python took longer than the rest of the read.
    """
    if connection.vendor == "postgresql":
        logged_ms = "CAST(EXTRACT(EPOCH FROM created_at) * 1000 AS BIGINT)"
    else:  # SQLite keeps "YYYY-MM-DD HH:MM:SS.ffffff" (UTC)
        logged_ms = "CAST(ROUND((julianday(created_at) - 2440587.5) * 86400000) AS INTEGER)"
    bounds: list[Any] = [
        experiment_id,
        key,
        -1 if after_step is None else after_step,
        2**62 if to_step is None else to_step,
    ]
    where = "WHERE experiment_id = %s AND key = %s AND step > %s AND step <= %s"
    if sample is not None:
        # Row j of n is kept when it is the first of its bucket floor(j * (m - 1) / (n - 1)): exactly
        # m rows of a longer range, the first (bucket 0) and the last (bucket m - 1) among them.
        sql = (
            f"SELECT step, value, ms FROM (SELECT step, value, {logged_ms} AS ms, "
            "ROW_NUMBER() OVER (ORDER BY step) - 1 AS j, COUNT(*) OVER () AS n "
            f"FROM experiments_metricpoint {where}) AS ranked "
            "WHERE n <= %s OR j = 0 OR (j * (%s - 1)) / (n - 1) > ((j - 1) * (%s - 1)) / (n - 1) ORDER BY step"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*bounds, sample, sample, sample])
            return cursor.fetchall(), False
    sql = f"SELECT step, value, {logged_ms} FROM experiments_metricpoint {where} ORDER BY step LIMIT %s"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*bounds, limit + 1])
        points = cursor.fetchall()
    return points[:limit], len(points) > limit


def metric_keys(*, experiment_id: int) -> list[str]:
    """The keys logged on an experiment, sorted."""
    keys = MetricPoint.objects.filter(experiment_id=experiment_id).order_by("key").values_list("key", flat=True)
    return list(keys.distinct())


def metric_summary(*, experiment_id: int) -> list[dict[str, Any]]:
    """Per logged key: how many points and the step range (one grouped query)."""
    rows = (
        MetricPoint.objects.filter(experiment_id=experiment_id)
        .values("key")
        .annotate(points=Count("pk"), first_step=Min("step"), last_step=Max("step"))
        .order_by("key")
    )
    return [dict(row) for row in rows]


# --- public records (snapshots and live events) ------------------------------------------------

# The experiment graph can have thousands of experiments: the run snapshot reads rows, and a
# live event reads its one row the same way, through the same row -> record function.
EXPERIMENT_VALUES = (
    "pk",
    "uuid",
    "handle",
    "owner__uuid",
    "kind",
    "status",
    "integrity_status",
    "feedback_score",
    "output_checkpoint__handle",
    "created_at",
)


def experiment_row(row: dict[str, Any], parents: list[str]) -> dict[str, Any]:
    return {
        "uuid": str(row["uuid"]),
        "handle": row["handle"],
        "owner": str(row["owner__uuid"]),
        "kind": row["kind"],
        "status": row["status"],
        "integrity_status": row["integrity_status"],
        "feedback_score": row["feedback_score"],
        "output_checkpoint": row["output_checkpoint__handle"],
        "parents": parents,
        "created_at": iso(row["created_at"]),
    }


def experiment_live(experiment: Experiment) -> dict[str, Any]:
    """An experiment of the experiment graph (``experiment.*`` events), as committed so far."""
    row = Experiment.objects.filter(pk=experiment.pk).values(*EXPERIMENT_VALUES).get()
    parents = [
        str(u)
        for u in Experiment.objects.filter(child_edges__child=experiment.pk)
        .order_by("pk")
        .values_list("uuid", flat=True)
    ]
    return experiment_row(row, parents)


def evaluation_live(evaluation: Evaluation) -> dict[str, Any]:
    """An evaluation (``evaluation.created``): the aggregate only; per-sample rows stay sealed."""
    row = (
        Evaluation.objects.filter(pk=evaluation.pk)
        .values(
            "uuid",
            "experiment__uuid",
            "checkpoint__handle",
            "job__uuid",
            "split",
            "status",
            "refusal_reason",
            "score",
            "correct",
            "sample_count",
            "backend",
            "created_at",
        )
        .get()
    )
    return {
        "uuid": str(row["uuid"]),
        "experiment": str(row["experiment__uuid"]) if row["experiment__uuid"] is not None else None,
        "checkpoint": row["checkpoint__handle"],
        "job": str(row["job__uuid"]) if row["job__uuid"] is not None else None,
        "split": row["split"],
        "status": row["status"],
        "refusal_reason": row["refusal_reason"],
        "score": row["score"],
        "correct": row["correct"],
        "sample_count": row["sample_count"],
        "backend": row["backend"],
        "created_at": iso(row["created_at"]),
    }
