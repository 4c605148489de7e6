"""The event log's and the metric points' parents without FOREIGN KEY constraints (issue 14, point 11).

Each insert of an event or a metric point had the database check its parents at commit: a
``SELECT ... FOR KEY SHARE`` of the run, the chain and the experiment rows, each a row lock
written to the WAL. Every append of a run locked the same run and chain rows, so concurrent
agents of one run made multixacts of them. The checks cost about 0.1 ms of a single append's
2.3 ms (docs/benchmarks.md). What they guarded still holds:

- no parent is ever deleted: runs, experiments (research 0002, experiments 0003) and now event
  chains refuse DELETE at the database;
- every insert takes its parent's id from the database: rsiweb_event_append finds or makes the
  chain in the same statement, the append of metric points finds its experiment by run, handle
  and owner in the same statement, and a run id comes from a run row.

SQLite rebuilds both tables to alter them, and a rebuilt table has none of its triggers: they are
installed again here (PostgreSQL's ALTER keeps them).
"""

import django.db.models.deletion
from django.db import migrations, models

from apps.core.db import guard_table, on_sqlite_after_rebuild, seal_once

EVENT_CONTENT = (
    "chain_id", "run_id", "created_at", "type", "actor", "role", "tool", "arguments", "result_ref", "content_sha256",
)  # fmt: skip


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0011_guards_after_table_rebuilds"),
        ("research", "0009_transcripts"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="chain",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="experiments.eventchain",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="run",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="events",
                to="research.run",
            ),
        ),
        migrations.AlterField(
            model_name="metricpoint",
            name="experiment",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="metric_points",
                to="experiments.experiment",
            ),
        ),
        guard_table("experiments_eventchain", forbid=("DELETE",)),
        on_sqlite_after_rebuild(guard_table("experiments_event", forbid=("DELETE",))),
        on_sqlite_after_rebuild(
            seal_once("experiments_event", seal_columns=("seq", "prev_hash", "hash"), content_columns=EVENT_CONTENT)
        ),
        on_sqlite_after_rebuild(guard_table("experiments_metricpoint", forbid=("UPDATE", "DELETE"))),
    ]
