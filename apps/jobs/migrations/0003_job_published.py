from django.db import migrations, models

from apps.core.db import guard_table


class Migration(migrations.Migration):
    dependencies = [("jobs", "0002_guards")]

    operations = [
        migrations.AddField(model_name="job", name="published_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="job", name="publishes", field=models.PositiveSmallIntegerField(default=0)),
        # SQLite rebuilds the table to add a column with a default, and the rebuild drops its triggers.
        # Reversing it must not drop the trigger 0002 installed.
        migrations.RunPython(guard_table("jobs_job", forbid=("DELETE",)).code, migrations.RunPython.noop),
    ]
