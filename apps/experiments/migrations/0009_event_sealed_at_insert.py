# An event is sealed as it is inserted when its writer gets the chain's lock, and says so, so the
# writer can skip the after-commit re-check; a writer that did not get it re-checks after its
# commit, waiting for the holder (apps.experiments.events).

from importlib import import_module

from django.db import migrations

OLD_APPEND_FUNCTION = import_module("apps.experiments.migrations.0006_event_append_function").APPEND_FUNCTION

APPEND_FUNCTION = """
CREATE FUNCTION rsiweb_event_append(
    p_key text, p_run bigint, p_created timestamptz, p_type text, p_actor text, p_role text, p_tool text,
    p_arguments jsonb, p_result_ref text, p_content_sha256 text
) RETURNS TABLE(event_id bigint, event_chain_id bigint, event_sealed boolean) AS $$
DECLARE
    c bigint;
    e bigint;
    h_seq bigint;
    h_hash text;
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
    IF rsiweb_seal_chain(c) < 0 THEN
        -- Another writer is sealing this chain: insert unsealed; the caller re-checks after commit.
        INSERT INTO experiments_event (chain_id, run_id, created_at, type, actor, role, tool, arguments, result_ref,
                                       content_sha256, prev_hash, hash)
             VALUES (c, p_run, p_created, p_type, p_actor, p_role, p_tool, p_arguments, p_result_ref,
                     p_content_sha256, '', '')
        RETURNING id INTO e;
        RETURN QUERY SELECT e, c, false;
        RETURN;
    END IF;
    -- We hold the chain (until our transaction ends) and everything visible is sealed: link this
    -- event as it is inserted, the same link rsiweb_seal_chain() would compute.
    SELECT head_seq + 1, head_hash INTO h_seq, h_hash FROM experiments_eventchain WHERE id = c;
    INSERT INTO experiments_event (chain_id, run_id, created_at, type, actor, role, tool, arguments, result_ref,
                                   content_sha256, seq, prev_hash, hash)
         VALUES (c, p_run, p_created, p_type, p_actor, p_role, p_tool, p_arguments, p_result_ref,
                 p_content_sha256, h_seq, h_hash,
                 encode(sha256(convert_to(h_hash || ':' || h_seq::text || ':' || p_content_sha256, 'UTF8')), 'hex'))
    RETURNING id, hash INTO e, h_hash;
    UPDATE experiments_eventchain SET head_seq = h_seq, head_hash = h_hash, updated_at = now() WHERE id = c;
    RETURN QUERY SELECT e, c, true;
END;
$$ LANGUAGE plpgsql;
"""

# The re-check of a writer that found the chain taken: it waits for the holder's transaction to
# end, then seals what is pending. Only this re-check ever waits for the lock, and it holds
# nothing else, so the wait cannot deadlock.
SEAL_WAIT_FUNCTION = """
CREATE OR REPLACE FUNCTION rsiweb_seal_chain_wait(p_chain bigint) RETURNS integer AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('rsiweb-chain'), p_chain::integer);
    RETURN rsiweb_seal_chain(p_chain);
END;
$$ LANGUAGE plpgsql;
"""

_DROP_APPEND = (
    "DROP FUNCTION IF EXISTS rsiweb_event_append(text, bigint, timestamptz, text, text, text, text, jsonb, text, text);"
)


def _create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_DROP_APPEND)
        schema_editor.execute(APPEND_FUNCTION)
        schema_editor.execute(SEAL_WAIT_FUNCTION)


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS rsiweb_seal_chain_wait(bigint);")
        schema_editor.execute(_DROP_APPEND)
        schema_editor.execute(OLD_APPEND_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0008_append_only_records")]

    operations = [migrations.RunPython(_create, _drop)]
