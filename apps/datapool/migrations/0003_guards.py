"""Readme entries are append-only; datapool entries and usages are never deleted."""

from django.db import migrations

from apps.core.db import freeze_column, guard_table


class Migration(migrations.Migration):
    dependencies = [("datapool", "0002_initial")]

    operations = [
        guard_table("datapool_datareadmeentry", forbid=("UPDATE", "DELETE")),
        guard_table("datapool_dataentry", forbid=("DELETE",)),
        guard_table("datapool_datausage", forbid=("UPDATE", "DELETE")),
        freeze_column("datapool_dataentry", "sha256"),
    ]
