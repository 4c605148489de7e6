"""Re-install on SQLite the guards of the tables that 0010 rebuilt there.

0010 added a column with a default to experiments_checkpoint and experiments_evaluation; SQLite
does that by copying the table, and the copy had none of the triggers of 0003 and 0008, so on
the embedded default both tables accepted UPDATE and DELETE (an evaluation's score could be
rewritten). PostgreSQL kept them; there this migration does nothing.
"""

from django.db import migrations

from apps.core.db import freeze_column, guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):
    dependencies = [("experiments", "0010_evaluation_inference_model_profile")]

    operations = [
        on_sqlite_after_rebuild(guard_table("experiments_checkpoint", forbid=("UPDATE", "DELETE"))),
        on_sqlite_after_rebuild(guard_table("experiments_evaluation", forbid=("UPDATE", "DELETE"))),
        on_sqlite_after_rebuild(freeze_column("experiments_checkpoint", "manifest_sha256")),
    ]
