"""On PostgreSQL, every change to a table that fc2/answer_cache.py's checks read (the users, the sessions, the API
tokens, the recommender's catalogues and performance records) notifies the channel `fc2_answer_checks` at its commit,
so that a process may trust checks it has made until it is told that one of those tables changed. Nothing is made on
other databases (SQLite says it changed by itself: PRAGMA data_version)."""

from django.conf import settings
from django.db import migrations

CHANNEL = "fc2_answer_checks"
TRIGGER = "fc2_answer_checks"  # on each watched table
FUNCTION = "fc2_answer_checks_changed"
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
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    # A statement-level trigger: one notification per statement, and PostgreSQL folds the same notification sent
    # several times in one transaction into one, delivered at its commit (none for a transaction rolled back).
    schema_editor.execute(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$"
    )
    for table in _tables(apps):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {quote(table)}")
        schema_editor.execute(
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {quote(table)} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
        )


def drop(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in _tables(apps):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {schema_editor.quote_name(table)}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0013_job_strategy_left_open"),
        ("recommender", "0003_alter_instancetype_hourly_price"),
        ("sessions", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(create, drop)]
