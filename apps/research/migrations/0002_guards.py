from django.db import migrations

from apps.core.db import guard_table


class Migration(migrations.Migration):
    dependencies = [("research", "0001_initial")]

    operations = [
        guard_table("research_decision", forbid=("UPDATE", "DELETE")),
        guard_table("research_optimizerclaim", forbid=("UPDATE", "DELETE")),
        guard_table("research_runstatuschange", forbid=("UPDATE", "DELETE")),
        guard_table("research_researchedge", forbid=("UPDATE", "DELETE")),
        guard_table("research_run", forbid=("DELETE",)),
        guard_table("research_researchnode", forbid=("DELETE",)),
    ]
