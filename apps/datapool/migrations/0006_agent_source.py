"""Datapool source ``agent``: data an agent (a harness, our LLM agent) made and sent in the call.

The source-kind constraint changes; as in 0005, SQLite rebuilds the table, so the guards are put
back there (PostgreSQL keeps them and the last three operations do nothing).
"""

from django.db import migrations, models

from apps.core.db import freeze_column, guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):

    dependencies = [
        ('datapool', '0005_chat_format_export_source'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='dataentry',
            name='data_source_valid',
        ),
        migrations.AlterField(
            model_name='dataentry',
            name='source_kind',
            field=models.CharField(choices=[('workspace', 'Workspace'), ('catalog', 'Catalog'), ('job', 'Job'), ('hub', 'Hub'), ('export', 'Export'), ('agent', 'Agent')], max_length=16),
        ),
        migrations.AddConstraint(
            model_name='dataentry',
            constraint=models.CheckConstraint(condition=models.Q(('source_kind__in', ['workspace', 'catalog', 'job', 'hub', 'export', 'agent'])), name='data_source_valid'),
        ),
        on_sqlite_after_rebuild(guard_table("datapool_dataentry", forbid=("DELETE",))),
        on_sqlite_after_rebuild(guard_table("datapool_dataentry", forbid=("UPDATE",))),
        on_sqlite_after_rebuild(freeze_column("datapool_dataentry", "sha256")),
    ]
