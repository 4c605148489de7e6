"""Re-install the guards of tables that 0005 and 0006 rebuilt on SQLite.

SQLite alters a table (a new column with a default, a changed check constraint) by copying it
into a new one, and the copy has no triggers: after 0005 (Run.tags, Run.starred) and 0006 (the
decision trigger constraint) research_run no longer refused DELETE and research_decision no longer
refused UPDATE or DELETE there. The statements are idempotent (CREATE OR REPLACE on PostgreSQL,
IF NOT EXISTS on SQLite), so on PostgreSQL, where ALTER keeps triggers, this changes nothing.
"""

from django.db import migrations

from apps.core.db import guard_table


def _keep(operation: migrations.RunPython) -> migrations.RunPython:
    # Going back leaves the guards of 0002 in place: they are 0002's to remove.
    return migrations.RunPython(operation.code, migrations.RunPython.noop)


class Migration(migrations.Migration):
    dependencies = [("research", "0007_agent_loop_heartbeat")]

    operations = [
        _keep(guard_table("research_decision", forbid=("UPDATE", "DELETE"))),
        _keep(guard_table("research_run", forbid=("DELETE",))),
    ]
