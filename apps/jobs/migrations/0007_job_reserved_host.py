"""A queued multi-device job's reservation of a host, one per host (issue 37: no starvation).

The new column rebuilds jobs_job on SQLite, so its guard is installed again there afterwards.
"""

from django.db import migrations, models

from apps.core.db import guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):
    dependencies = [("jobs", "0006_job_accelerators_and_devices")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="reserved_host",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("status", "queued"), models.Q(("reserved_host", ""), _negated=True)),
                fields=("reserved_host",),
                name="job_one_reservation_per_host",
            ),
        ),
        on_sqlite_after_rebuild(guard_table("jobs_job", forbid=("DELETE",))),
    ]
