from django.db import migrations

from apps.core.db import guard_table


class Migration(migrations.Migration):
    dependencies = [("integrity", "0001_initial")]

    operations = [
        guard_table("integrity_findingchange", forbid=("UPDATE", "DELETE")),
        guard_table("integrity_blockedattempt", forbid=("UPDATE", "DELETE")),
        guard_table("integrity_integrityfinding", forbid=("DELETE",)),
    ]
