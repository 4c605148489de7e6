"""Database-level guards installed by migrations, on PostgreSQL and SQLite alike.

Append-only tables refuse UPDATE and DELETE; protected tables refuse DELETE. Enforcing this in
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


def _column_sql(vendor: str, table: str, column: str) -> tuple[list[str], list[str]]:
    name = f"{table}_{column}_immutable"
    message = f"{table}.{column} cannot change once set"
    if vendor == "postgresql":
        return (
            [
                f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'restrict_violation'; END; $$ LANGUAGE plpgsql;",
                f"CREATE TRIGGER {name} BEFORE UPDATE OF {column} ON {table} FOR EACH ROW "
                f"WHEN (OLD.{column} IS DISTINCT FROM NEW.{column}) EXECUTE FUNCTION {name}();",
            ],
            [f"DROP TRIGGER IF EXISTS {name} ON {table};", f"DROP FUNCTION IF EXISTS {name}();"],
        )
    return (
        [
            f"CREATE TRIGGER {name} BEFORE UPDATE OF {column} ON {table} "
            f"WHEN OLD.{column} IS NOT NEW.{column} BEGIN SELECT RAISE(ABORT, '{message}'); END;"
        ],
        [f"DROP TRIGGER IF EXISTS {name};"],
    )


def freeze_column(table: str, column: str) -> migrations.RunPython:
    """A migration operation that makes ``column`` of ``table`` immutable (e.g. an owner)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        for sql in _column_sql(schema_editor.connection.vendor, table, column)[0]:
            schema_editor.execute(sql)

    def backward(apps: Any, schema_editor: Any) -> None:
        for sql in _column_sql(schema_editor.connection.vendor, table, column)[1]:
            schema_editor.execute(sql)

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
