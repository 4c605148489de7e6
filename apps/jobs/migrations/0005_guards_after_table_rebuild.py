"""Re-install on SQLite the guard of jobs_job, which 0004 rebuilt there (a changed kind choice).

SQLite's copy of the table had no triggers, so jobs could be deleted on the embedded default.
PostgreSQL kept the trigger; there this migration does nothing.
"""

from django.db import migrations

from apps.core.db import guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):
    dependencies = [("jobs", "0004_job_kind_dojo")]

    operations = [on_sqlite_after_rebuild(guard_table("jobs_job", forbid=("DELETE",)))]
