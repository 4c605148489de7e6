"""A job's accelerators (1-8, all on one host) and the device indices it holds (issue 37).

The constraint rebuilds jobs_job on SQLite, so its guard is installed again there afterwards.
"""

from django.db import migrations, models

from apps.core.db import guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0013_statement_refusals"),
        ("jobs", "0005_guards_after_table_rebuild"),
        ("research", "0011_decision_nominate"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="accelerators",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AddField(
            model_name="job",
            name="devices",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(("accelerators__gte", 1), ("accelerators__lte", 8)), name="job_accelerators_1_8"
            ),
        ),
        on_sqlite_after_rebuild(guard_table("jobs_job", forbid=("DELETE",))),
    ]
