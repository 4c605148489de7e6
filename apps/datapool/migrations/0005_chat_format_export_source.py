"""Datapool format ``chat`` (exported agent trajectories) and source ``export`` (apps.dojo.export).

The two choice constraints change; SQLite does that by rebuilding datapool_dataentry, and the copy
has none of the triggers of 0003 and 0004 (no DELETE, no UPDATE, sha256 frozen), so they are
installed again there. PostgreSQL keeps them; there the last three operations do nothing.
"""

from django.db import migrations, models

from apps.core.db import freeze_column, guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):

    dependencies = [
        ('datapool', '0004_entries_written_once'),
        ('research', '0009_transcripts'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='dataentry',
            name='data_format_valid',
        ),
        migrations.RemoveConstraint(
            model_name='dataentry',
            name='data_source_valid',
        ),
        migrations.AlterField(
            model_name='dataentry',
            name='format',
            field=models.CharField(choices=[('sft', 'Sft'), ('dpo', 'Dpo'), ('chat', 'Chat')], max_length=8),
        ),
        migrations.AlterField(
            model_name='dataentry',
            name='source_kind',
            field=models.CharField(choices=[('workspace', 'Workspace'), ('catalog', 'Catalog'), ('job', 'Job'), ('hub', 'Hub'), ('export', 'Export')], max_length=16),
        ),
        migrations.AddConstraint(
            model_name='dataentry',
            constraint=models.CheckConstraint(condition=models.Q(('format__in', ['sft', 'dpo', 'chat'])), name='data_format_valid'),
        ),
        migrations.AddConstraint(
            model_name='dataentry',
            constraint=models.CheckConstraint(condition=models.Q(('source_kind__in', ['workspace', 'catalog', 'job', 'hub', 'export'])), name='data_source_valid'),
        ),
        on_sqlite_after_rebuild(guard_table("datapool_dataentry", forbid=("DELETE",))),
        on_sqlite_after_rebuild(guard_table("datapool_dataentry", forbid=("UPDATE",))),
        on_sqlite_after_rebuild(freeze_column("datapool_dataentry", "sha256")),
    ]
