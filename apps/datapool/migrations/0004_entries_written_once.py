"""No unaudited edits (issue 13, point 8): a datapool entry stays as it was registered.

An entry is written in one INSERT (with its parent links) and never updated by any code path:
its bytes' hash, uri, row count, schema, source and declared teacher are what the submission
review and the integrity checks judged, so the database refuses every UPDATE of the row, not a
chosen list of columns, and every UPDATE or DELETE of its lineage links. Notes about an entry
go to its append-only readme.
"""

from django.db import migrations

from apps.core.db import guard_table


class Migration(migrations.Migration):
    dependencies = [("datapool", "0003_guards")]

    operations = [
        guard_table("datapool_dataentry", forbid=("UPDATE",)),
        guard_table("datapool_dataentry_parents", forbid=("UPDATE", "DELETE")),
    ]
