"""Every change to a table that fc2/answer_cache.py's checks read (the users, the sessions, the API tokens, the
recommender's catalogues and performance records) is told, so that a process may trust checks it has made until one
of those tables changes:

- PostgreSQL: a statement trigger on each notifies the channel `fc2_answer_checks` at the commit (PostgreSQL folds the
  same notification sent several times in one transaction into one, and sends none for a transaction rolled back);
- SQLite: a trigger for each write on each adds one to the version in the table `fc2_answer_checks` (one row; not a
  model's table, so that no flush empties it), in the same transaction as the change.

Nothing is made on other databases."""

from django.conf import settings
from django.db import migrations

NAME = "fc2_answer_checks"  # PostgreSQL's channel and triggers; SQLite's table and its triggers' prefix
FUNCTION = "fc2_answer_checks_changed"
OPERATIONS = ("INSERT", "UPDATE", "DELETE")
# The tables the checks read, as (app label, model name).
WATCHED = (
    tuple(settings.AUTH_USER_MODEL.split(".")),
    ("sessions", "Session"),
    ("fc2", "ApiToken"),
    ("recommender", "Catalog"),
    ("recommender", "PerformanceRecord"),
)


def _tables(apps) -> list[str]:
    return [apps.get_model(label, name)._meta.db_table for label, name in WATCHED]


def create(apps, schema_editor) -> None:
    vendor, quote = schema_editor.connection.vendor, schema_editor.quote_name
    if vendor == "postgresql":
        schema_editor.execute(
            f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_notify('{NAME}', ''); RETURN NULL; END $$"
        )
        for table in _tables(apps):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {NAME} ON {quote(table)}")
            schema_editor.execute(
                f"CREATE TRIGGER {NAME} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {quote(table)} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
            )
    elif vendor == "sqlite":
        schema_editor.execute(f"CREATE TABLE IF NOT EXISTS {NAME} (version INTEGER NOT NULL)")
        schema_editor.execute(f"INSERT INTO {NAME} (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM {NAME})")
        for table in _tables(apps):
            for operation in OPERATIONS:
                trigger = quote(f"{NAME}_{operation.lower()}_{table}")
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger}")
                schema_editor.execute(
                    f"CREATE TRIGGER {trigger} AFTER {operation} ON {quote(table)} "
                    f"BEGIN UPDATE {NAME} SET version = version + 1; END"
                )


def drop(apps, schema_editor) -> None:
    vendor, quote = schema_editor.connection.vendor, schema_editor.quote_name
    if vendor == "postgresql":
        for table in _tables(apps):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {NAME} ON {quote(table)}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    elif vendor == "sqlite":
        for table in _tables(apps):
            for operation in OPERATIONS:
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {quote(f'{NAME}_{operation.lower()}_{table}')}")
        schema_editor.execute(f"DROP TABLE IF EXISTS {NAME}")


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0013_job_strategy_left_open"),
        ("recommender", "0003_alter_instancetype_hourly_price"),
        ("sessions", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(create, drop)]
