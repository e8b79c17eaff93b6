"""The triggers that tell of every change to a table fc2/answer_cache.py's checks read — the users, the sessions, the
API tokens, the recommender's catalogues and performance records (`watched_tables`) — so that a process may trust
checks it has made until one of those tables changes:

- PostgreSQL: a statement trigger on each notifies the channel `NAME` at the commit (PostgreSQL folds the same
  notification sent several times in one transaction into one, and sends none for a transaction rolled back);
- SQLite: a trigger for each write on each adds one to the version in the one-row table `NAME` (not a model's table,
  so that no flush empties it), in the same transaction as the change.

Made by migration fc2/0014 and, should a later migration have lost any (SQLite rebuilds a table to alter it, and its
triggers go with it), again after every `migrate` (`ensure`, from fc2.apps). Nothing is made on other databases."""

from __future__ import annotations

NAME = "fc2_answer_checks"  # PostgreSQL's channel and triggers; SQLite's table
OFF = "off"  # the payload PostgreSQL's listeners are sent when the triggers are dropped: trust nothing from here
FUNCTION = f"{NAME}_changed"
VENDORS = ("sqlite", "postgresql")
_WRITES = ("insert", "update", "delete")


def watched_tables() -> tuple[str, ...]:
    """The tables the checks read, sorted: the users', the sessions', the API tokens', and what the recommender's stamps
    read (its catalogues and performance records). tests/test_answer_cache_unchanged_database.py checks it against the
    queries the checks make."""
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.models import Session

    from fc2.models import ApiToken
    from recommender.models import Catalog, PerformanceRecord

    return tuple(sorted(m._meta.db_table for m in (get_user_model(), Session, ApiToken, Catalog, PerformanceRecord)))


def expected(vendor: str) -> set[tuple[str, str]]:
    """(trigger, table) of every trigger there should be."""
    if vendor == "postgresql":
        return {(NAME, table) for table in watched_tables()}
    return {(_sqlite_trigger(write, table), table) for table in watched_tables() for write in _WRITES}


def _sqlite_trigger(write: str, table: str) -> str:
    return f"{NAME}_{write}_{table}"


def found(cursor, vendor: str) -> set[tuple[str, str]]:
    """(trigger, table) of those of `expected` that are there (on PostgreSQL: and fire, as neither disabled nor
    replica-only); `cursor` a DB-API or Django cursor on the database."""
    if vendor == "postgresql":
        cursor.execute(
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = %s AND NOT t.tgisinternal AND t.tgenabled IN ('O', 'A') AND pg_table_is_visible(c.oid)",
            [NAME],
        )
    else:
        cursor.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'")
    return set(map(tuple, cursor.fetchall())) & expected(vendor)


def applicable(connection) -> bool:
    """Whether `connection`'s database is one they are made on: SQLite or PostgreSQL, holding every watched table (a
    router may keep some elsewhere)."""
    return connection.vendor in VENDORS and set(watched_tables()) <= set(connection.introspection.table_names())


def ensure(connection) -> None:
    """Make what is missing on `connection`'s database (a Django connection) — triggers, and on SQLite the version's
    table or its row — and nothing else."""
    if not applicable(connection):
        return
    with connection.cursor() as cursor:
        missing = expected(connection.vendor) - found(cursor, connection.vendor)
        if connection.vendor == "sqlite":
            _version_table(cursor)
    if missing:
        create(connection, {table for _, table in missing})


def _version_table(cursor) -> None:
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {NAME} (version INTEGER NOT NULL)")
    cursor.execute(f"INSERT INTO {NAME} (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM {NAME})")


def create(connection, tables=None) -> None:
    """Make the triggers on `tables` (default: every watched one), anew."""
    if not applicable(connection):
        return
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN PERFORM pg_notify('{NAME}', ''); RETURN NULL; END $$"
            )
        else:
            _version_table(cursor)
        for table in watched_tables():
            if tables is not None and table not in tables:
                continue
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {NAME} ON {quote(table)}")
                cursor.execute(
                    f"CREATE TRIGGER {NAME} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {quote(table)} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
                )
                continue
            for write in _WRITES:
                trigger = quote(_sqlite_trigger(write, table))
                cursor.execute(f"DROP TRIGGER IF EXISTS {trigger}")
                cursor.execute(
                    f"CREATE TRIGGER {trigger} AFTER {write.upper()} ON {quote(table)} "
                    f"BEGIN UPDATE {NAME} SET version = version + 1; END"
                )


def drop(connection) -> None:
    """Drop the triggers; PostgreSQL's listeners are told (`OFF`), SQLite's see its schema change."""
    if connection.vendor not in VENDORS:
        return
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for trigger, table in sorted(expected(connection.vendor)):
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {quote(table)}")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {quote(trigger)}")
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
            cursor.execute("SELECT pg_notify(%s, %s)", [NAME, OFF])
        else:
            cursor.execute(f"DROP TABLE IF EXISTS {NAME}")
