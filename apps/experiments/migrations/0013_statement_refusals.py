"""``rsiweb_refuse_unless(ok, code)``: a statement refuses itself (issue 14, point 11).

An agent's common metric append runs as one statement outside any transaction, which is then its
own transaction (apps.experiments.services.metric_points_log_at_once): it inserts the points and
the call's event, and checks in the same statement that every point it did not insert is
already logged with the same value. When one is not, this function raises SQLSTATE RS409 and
PostgreSQL rolls the whole statement back, points and event together; the caller then takes the
transactional path, which says which points conflict. PostgreSQL only: SQLite never takes that path.
"""

from django.db import migrations

from apps.core.db import on_postgresql

REFUSE_FUNCTION = """
CREATE OR REPLACE FUNCTION rsiweb_refuse_unless(ok boolean, code text) RETURNS boolean AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'RS409', MESSAGE = 'refused: ' || code;
    END IF;
    RETURN true;
END;
$$ LANGUAGE plpgsql VOLATILE;
"""


class Migration(migrations.Migration):
    dependencies = [("experiments", "0012_parents_without_fk_constraints")]

    operations = [on_postgresql(REFUSE_FUNCTION, "DROP FUNCTION IF EXISTS rsiweb_refuse_unless(boolean, text);")]
