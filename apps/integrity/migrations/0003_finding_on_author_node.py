"""A report's finding sits on its author's node (issue 33, item 4).

The new column rebuilds integrity_integrityfinding on SQLite, so its guard is installed again there.
"""

import django.db.models.deletion
from django.db import migrations, models

from apps.core.db import guard_table, on_sqlite_after_rebuild


class Migration(migrations.Migration):

    dependencies = [
        ('experiments', '0013_statement_refusals'),
        ('integrity', '0002_guards'),
        ('research', '0012_run_and_experiment_notes'),
    ]

    operations = [
        migrations.AddField(
            model_name='integrityfinding',
            name='node',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='report_findings', to='research.researchnode'),
        ),
        migrations.AlterField(
            model_name='integrityfinding',
            name='experiment',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='findings', to='experiments.experiment'),
        ),
        migrations.AddConstraint(
            model_name='integrityfinding',
            constraint=models.UniqueConstraint(condition=models.Q(('node__isnull', False)), fields=('node', 'subcategory'), name='finding_node_unique'),
        ),
        migrations.AddConstraint(
            model_name='integrityfinding',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('experiment__isnull', False), ('node__isnull', True)), models.Q(('experiment__isnull', True), ('node__isnull', False)), _connector='OR'), name='finding_experiment_or_author'),
        ),
        on_sqlite_after_rebuild(guard_table("integrity_integrityfinding", forbid=("DELETE",))),
    ]
