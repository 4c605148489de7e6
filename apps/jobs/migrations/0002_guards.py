from django.db import migrations

from apps.core.db import guard_table


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]

    operations = [
        guard_table("jobs_jobtransition", forbid=("UPDATE", "DELETE")),
        guard_table("jobs_job", forbid=("DELETE",)),
    ]
