"""Database-level guards installed by migrations, on PostgreSQL and SQLite alike.

Append-only tables refuse UPDATE and DELETE; protected tables refuse DELETE; frozen columns
refuse any change (or, ``once_set``, any change after the first value); a status with a history
table changes only as its newest history row says (``status_needs_history``). Enforcing this in
the database (not in ``save()``) means no code path — ORM, raw SQL, admin, a bug — can rewrite
the record. Clean-up in tests may TRUNCATE on PostgreSQL, which these row triggers do not see;
production grants the application role no TRUNCATE on these tables (docs/deployment.md).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _trigger_sql(vendor: str, table: str, operations: tuple[str, ...]) -> tuple[list[str], list[str]]:
    forward: list[str] = []
    backward: list[str] = []
    for op in operations:
        name = f"{table}_no_{op.lower()}"
        message = f"{table} is append-only: {op} is not allowed"
        if vendor == "postgresql":
            forward.append(
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'restrict_violation'; END; $$ "
                "LANGUAGE plpgsql;"
            )
            forward.append(
                f"CREATE OR REPLACE TRIGGER {name} BEFORE {op} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}();"
            )
            backward.append(f"DROP TRIGGER IF EXISTS {name} ON {table};")
            backward.append(f"DROP FUNCTION IF EXISTS {name}();")
        elif vendor == "sqlite":
            forward.append(
                f"CREATE TRIGGER IF NOT EXISTS {name} BEFORE {op} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END;"
            )
            backward.append(f"DROP TRIGGER IF EXISTS {name};")
        else:  # pragma: no cover - only the two supported backends
            raise RuntimeError(f"append-only triggers are not written for {vendor}")
    return forward, backward


def guard_table(table: str, *, forbid: tuple[str, ...]) -> migrations.RunPython:
    """A migration operation that installs triggers refusing ``forbid`` (UPDATE/DELETE) on table."""

    def forward(apps: Any, schema_editor: Any) -> None:
        statements, _ = _trigger_sql(schema_editor.connection.vendor, table, forbid)
        for sql in statements:
            schema_editor.execute(sql)

    def backward(apps: Any, schema_editor: Any) -> None:
        _, statements = _trigger_sql(schema_editor.connection.vendor, table, forbid)
        for sql in statements:
            schema_editor.execute(sql)

    return migrations.RunPython(forward, backward)


def _column_sql(vendor: str, table: str, column: str, *, once_set: bool) -> tuple[list[str], list[str]]:
    name = f"{table}_{column}_immutable"
    message = f"{table}.{column} cannot change once set"
    # once_set: a NULL may be filled in (a score that arrives later), a value never changes.
    if vendor == "postgresql":
        when = f"OLD.{column} IS DISTINCT FROM NEW.{column}"
        if once_set:
            when = f"OLD.{column} IS NOT NULL AND {when}"
        return (
            [
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'restrict_violation'; END; $$ LANGUAGE plpgsql;",
                f"CREATE TRIGGER {name} BEFORE UPDATE OF {column} ON {table} FOR EACH ROW "
                f"WHEN ({when}) EXECUTE FUNCTION {name}();",
            ],
            [f"DROP TRIGGER IF EXISTS {name} ON {table};", f"DROP FUNCTION IF EXISTS {name}();"],
        )
    when = f"OLD.{column} IS NOT NEW.{column}"
    if once_set:
        when = f"OLD.{column} IS NOT NULL AND {when}"
    return (
        [
            f"CREATE TRIGGER IF NOT EXISTS {name} BEFORE UPDATE OF {column} ON {table} "
            f"WHEN {when} BEGIN SELECT RAISE(ABORT, '{message}'); END;"
        ],
        [f"DROP TRIGGER IF EXISTS {name};"],
    )


def freeze_column(table: str, column: str, *, once_set: bool = False) -> migrations.RunPython:
    """A migration operation that makes ``column`` of ``table`` immutable (e.g. an owner).

    With ``once_set`` the column may go from NULL to a value once (a score recorded when the
    evaluation finishes), and never changes after that.
    """

    def forward(apps: Any, schema_editor: Any) -> None:
        for sql in _column_sql(schema_editor.connection.vendor, table, column, once_set=once_set)[0]:
            schema_editor.execute(sql)

    def backward(apps: Any, schema_editor: Any) -> None:
        for sql in _column_sql(schema_editor.connection.vendor, table, column, once_set=once_set)[1]:
            schema_editor.execute(sql)

    return migrations.RunPython(forward, backward)


def on_sqlite_after_rebuild(operation: migrations.RunPython) -> migrations.RunPython:
    """Run a guard's installer again on SQLite only, after a migration rebuilt its table there.

    SQLite alters a table (a new column with a default, a changed choice constraint) by copying
    it into a new one, and the copy has no triggers; PostgreSQL's ALTER keeps them, so there this
    does nothing. Going back leaves the guard in place: it belongs to the migration that made it.
    """

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            operation.code(apps, schema_editor)

    return migrations.RunPython(forward, migrations.RunPython.noop)


def on_postgresql(sql: str, reverse_sql: str) -> migrations.RunPython:
    """Run ``sql`` on PostgreSQL only (a server-side function SQLite has no use for), ``reverse_sql`` going back."""

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    def backward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(reverse_sql)

    return migrations.RunPython(forward, backward)


def _seal_once_sql(
    vendor: str, table: str, seal_columns: tuple[str, ...], content_columns: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """UPDATE may only fill the seal columns of an unsealed row (``hash`` empty), once."""
    name = f"{table}_seal_once"
    message = f"{table} is append-only: only sealing an unsealed row is allowed"
    if vendor == "postgresql":
        changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in content_columns)
        return (
            [
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"IF OLD.hash <> '' OR NEW.hash = '' OR {changed} THEN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'restrict_violation'; END IF; "
                "RETURN NEW; END; $$ LANGUAGE plpgsql;",
                f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {name}();",
            ],
            [f"DROP TRIGGER IF EXISTS {name} ON {table};", f"DROP FUNCTION IF EXISTS {name}();"],
        )
    changed = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in content_columns)
    return (
        [
            f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} "
            f"WHEN OLD.hash <> '' OR NEW.hash = '' OR {changed} "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END;"
        ],
        [f"DROP TRIGGER IF EXISTS {name};"],
    )


def seal_once(table: str, *, seal_columns: tuple[str, ...], content_columns: tuple[str, ...]) -> migrations.RunPython:
    """A migration operation: rows of ``table`` are immutable except for one sealing UPDATE."""

    def forward(apps: Any, schema_editor: Any) -> None:
        for sql in _seal_once_sql(schema_editor.connection.vendor, table, seal_columns, content_columns)[0]:
            schema_editor.execute(sql)

    def backward(apps: Any, schema_editor: Any) -> None:
        for sql in _seal_once_sql(schema_editor.connection.vendor, table, seal_columns, content_columns)[1]:
            schema_editor.execute(sql)

    return migrations.RunPython(forward, backward)


def _status_history_sql(
    vendor: str, table: str, column: str, *, history: str, fk: str, initial: str
) -> tuple[list[str], list[str]]:
    """SQL for :func:`status_needs_history`; ``history`` has ``from_status`` and ``to_status`` columns."""
    name = f"{table}_{column}_audited"
    message = f"{table}.{column} changes only with a {history} row (from, to, actor, reason) in the same transaction"
    newest = f"SELECT from_status, to_status FROM {history} WHERE {fk} = NEW.id ORDER BY id DESC LIMIT 1"
    if vendor == "postgresql":
        return (
            [
                # At the statement: the change must be the one the newest history row describes.
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ DECLARE last RECORD; BEGIN "
                f"{newest} INTO last; "
                f"IF NOT FOUND OR last.from_status IS DISTINCT FROM OLD.{column} "
                f"OR last.to_status IS DISTINCT FROM NEW.{column} THEN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'restrict_violation'; END IF; "
                "RETURN NEW; END; $$ LANGUAGE plpgsql;",
                f"CREATE TRIGGER {name} BEFORE UPDATE OF {column} ON {table} FOR EACH ROW "
                f"WHEN (OLD.{column} IS DISTINCT FROM NEW.{column}) EXECUTE FUNCTION {name}();",
                # At commit: the status equals the newest history row's to_status (``initial`` while
                # there is none). A history row written in one transaction cannot be spent in a later
                # one, and a row inserted with another status is refused too.
                f"CREATE OR REPLACE FUNCTION {name}_at_commit() RETURNS trigger AS $$ DECLARE target bigint; BEGIN "
                f"IF TG_TABLE_NAME = '{history}' THEN target := NEW.{fk}; ELSE target := NEW.id; END IF; "
                f"IF EXISTS (SELECT 1 FROM {table} t WHERE t.id = target AND t.{column} IS DISTINCT FROM "
                f"COALESCE((SELECT h.to_status FROM {history} h WHERE h.{fk} = target ORDER BY h.id DESC LIMIT 1), "
                f"'{initial}')) THEN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'restrict_violation'; END IF; "
                "RETURN NULL; END; $$ LANGUAGE plpgsql;",
                f"CREATE CONSTRAINT TRIGGER {name}_at_commit AFTER INSERT OR UPDATE OF {column} ON {table} "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {name}_at_commit();",
                f"CREATE CONSTRAINT TRIGGER {name}_at_commit AFTER INSERT ON {history} "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {name}_at_commit();",
            ],
            [
                f"DROP TRIGGER IF EXISTS {name}_at_commit ON {history};",
                f"DROP TRIGGER IF EXISTS {name}_at_commit ON {table};",
                f"DROP TRIGGER IF EXISTS {name} ON {table};",
                f"DROP FUNCTION IF EXISTS {name}_at_commit();",
                f"DROP FUNCTION IF EXISTS {name}();",
            ],
        )
    # SQLite has no deferred triggers: the statement check only (see status_needs_history); the
    # PostgreSQL-only triggers are the ones named *_at_commit.
    return (
        [
            f"CREATE TRIGGER IF NOT EXISTS {name} BEFORE UPDATE OF {column} ON {table} "
            f"WHEN OLD.{column} IS NOT NEW.{column} AND NOT EXISTS (SELECT 1 FROM ({newest}) AS last "
            f"WHERE last.from_status = OLD.{column} AND last.to_status = NEW.{column}) "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END;"
        ],
        [f"DROP TRIGGER IF EXISTS {name};"],
    )


def status_needs_history(table: str, column: str, *, history: str, fk: str, initial: str) -> migrations.RunPython:
    """A migration operation: ``column`` of ``table`` changes only as its history table says.

    A status that later evidence may change (an experiment's integrity status) is not frozen;
    instead every change must be written first as a row of ``history`` (``fk`` -> ``table``,
    ``from_status``, ``to_status``, actor, reason — append-only), and the UPDATE must be exactly
    the change the newest such row describes. On PostgreSQL a deferred check at commit also
    requires the status to equal the newest row's ``to_status``, so the row and the change land
    in one transaction (an unused row, or a row spent in a later transaction, fails the commit).
    SQLite has no deferred triggers: there the UPDATE check holds, but a history row written in
    one transaction could be applied in a later one (it is still the audit record of the change).
    """

    def forward(apps: Any, schema_editor: Any) -> None:
        sql = _status_history_sql(
            schema_editor.connection.vendor, table, column, history=history, fk=fk, initial=initial
        )
        for statement in sql[0]:
            schema_editor.execute(statement)

    def backward(apps: Any, schema_editor: Any) -> None:
        sql = _status_history_sql(
            schema_editor.connection.vendor, table, column, history=history, fk=fk, initial=initial
        )
        for statement in sql[1]:
            schema_editor.execute(statement)

    return migrations.RunPython(forward, backward)
