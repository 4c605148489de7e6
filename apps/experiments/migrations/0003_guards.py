"""Database guards: the event log and histories are append-only; records are never deleted."""

from django.db import migrations

from apps.core.db import freeze_column, guard_table

APPEND_ONLY = ("UPDATE", "DELETE")
NO_DELETE = ("DELETE",)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0002_initial")]

    operations = [
        guard_table("experiments_event", forbid=APPEND_ONLY),
        guard_table("experiments_integritystatuschange", forbid=APPEND_ONLY),
        guard_table("experiments_evaluationsample", forbid=APPEND_ONLY),
        guard_table("experiments_experiment", forbid=NO_DELETE),
        guard_table("experiments_experimentedge", forbid=APPEND_ONLY),
        guard_table("experiments_checkpoint", forbid=NO_DELETE),
        guard_table("experiments_evaluation", forbid=NO_DELETE),
        freeze_column("experiments_experiment", "owner_id"),
        freeze_column("experiments_checkpoint", "manifest_sha256"),
    ]
