"""No unaudited edits (issue 13, point 8): records written once stay as written.

- Evaluations and checkpoints are written in one INSERT and never updated by any code path, so
  the database refuses every UPDATE (score, split, checkpoint, benchmark, counts, hashes; a
  checkpoint's manifest, uri and lineage), not a chosen list of columns.
- An experiment's recipe and input are frozen; its θ_out and feedback score are filled in once
  by the pipeline and frozen from then on.
- Its integrity status, which later evidence may change, changes only with the
  IntegrityStatusChange row (actor, reason) that describes the change, in the same transaction.
"""

from django.db import migrations, models

from apps.core.db import freeze_column, guard_table, status_needs_history

# 0003's append-only triggers on the history table; SQLite drops them whenever it rebuilds the table.
REINSTALL_HISTORY_GUARDS = guard_table("experiments_integritystatuschange", forbid=("UPDATE", "DELETE")).code


class Migration(migrations.Migration):
    dependencies = [("experiments", "0007_metric_point")]

    operations = [
        # Backwards this runs last, after RemoveConstraint rebuilt the table.
        migrations.RunPython(migrations.RunPython.noop, REINSTALL_HISTORY_GUARDS),
        migrations.AddConstraint(
            model_name="integritystatuschange",
            constraint=models.CheckConstraint(
                condition=models.Q(("actor", ""), _negated=True), name="integrity_change_has_actor"
            ),
        ),
        migrations.AddConstraint(
            model_name="integritystatuschange",
            constraint=models.CheckConstraint(
                condition=models.Q(("reason", ""), _negated=True), name="integrity_change_has_reason"
            ),
        ),
        # AddConstraint rebuilt the table on SQLite (a no-op on PostgreSQL).
        migrations.RunPython(REINSTALL_HISTORY_GUARDS, migrations.RunPython.noop),
        guard_table("experiments_evaluation", forbid=("UPDATE",)),
        guard_table("experiments_checkpoint", forbid=("UPDATE",)),
        freeze_column("experiments_experiment", "run_id"),
        freeze_column("experiments_experiment", "kind"),
        freeze_column("experiments_experiment", "input_checkpoint_id"),
        freeze_column("experiments_experiment", "action"),
        freeze_column("experiments_experiment", "output_checkpoint_id", once_set=True),
        freeze_column("experiments_experiment", "feedback_score", once_set=True),
        status_needs_history(
            "experiments_experiment",
            "integrity_status",
            history="experiments_integritystatuschange",
            fk="experiment_id",
            initial="pending",
        ),
    ]
