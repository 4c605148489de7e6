# An event append in one round trip on PostgreSQL: chain look-up, insert and sealing attempt.

from django.db import migrations

APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION rsiweb_event_append(
    p_key text, p_run bigint, p_created timestamptz, p_type text, p_actor text, p_role text, p_tool text,
    p_arguments jsonb, p_result_ref text, p_content_sha256 text
) RETURNS TABLE(event_id bigint, event_chain_id bigint) AS $$
DECLARE
    c bigint;
    e bigint;
BEGIN
    SELECT id INTO c FROM experiments_eventchain WHERE key = p_key;
    IF c IS NULL THEN
        INSERT INTO experiments_eventchain (key, head_seq, head_hash, created_at, updated_at)
             VALUES (p_key, 0, repeat('0', 64), now(), now())
        ON CONFLICT (key) DO NOTHING
        RETURNING id INTO c;
        IF c IS NULL THEN  -- a concurrent writer created it first
            SELECT id INTO c FROM experiments_eventchain WHERE key = p_key;
        END IF;
    END IF;
    INSERT INTO experiments_event (chain_id, run_id, created_at, type, actor, role, tool, arguments, result_ref,
                                   content_sha256, prev_hash, hash)
         VALUES (c, p_run, p_created, p_type, p_actor, p_role, p_tool, p_arguments, p_result_ref,
                 p_content_sha256, '', '')
    RETURNING id INTO e;
    -- Seal now when no one else is sealing this chain (the caller re-checks after its commit).
    PERFORM rsiweb_seal_chain(c);
    RETURN QUERY SELECT e, c;
END;
$$ LANGUAGE plpgsql;
"""


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND_FUNCTION)


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS rsiweb_event_append(text, bigint, timestamptz, text, text, text, text, jsonb, "
            "text, text);"
        )


class Migration(migrations.Migration):
    dependencies = [("experiments", "0005_event_sealing")]

    operations = [migrations.RunPython(_create, _drop)]
