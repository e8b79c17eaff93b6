"""Triggers that told a response cache ahead of Django (since removed) of every change to the tables its checks read:
the users, the sessions, the API tokens, the recommender's catalogues and performance records. Kept as history, and
written out here in full so that it needs no module of the platform; 0016 drops what it made."""

from django.conf import settings
from django.db import migrations

NAME = "fc2_answer_checks"  # PostgreSQL's channel, function and triggers; SQLite's one-row table
FUNCTION = f"{NAME}_changed"
WRITES = ("insert", "update", "delete")


def tables(apps) -> list[str]:
    models = (settings.AUTH_USER_MODEL, "sessions.Session", "fc2.ApiToken", "recommender.Catalog")
    return sorted(apps.get_model(m)._meta.db_table for m in (*models, "recommender.PerformanceRecord"))


def create(apps, schema_editor) -> None:
    connection = schema_editor.connection
    if connection.vendor not in ("sqlite", "postgresql"):
        return
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN PERFORM pg_notify('{NAME}', ''); RETURN NULL; END $$"
            )
            for table in tables(apps):
                cursor.execute(
                    f"CREATE TRIGGER {NAME} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {quote(table)} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
                )
            return
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {NAME} (version INTEGER NOT NULL)")
        cursor.execute(f"INSERT INTO {NAME} (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM {NAME})")
        for table in tables(apps):
            for write in WRITES:
                cursor.execute(
                    f"CREATE TRIGGER {quote(f'{NAME}_{write}_{table}')} AFTER {write.upper()} ON {quote(table)} "
                    f"BEGIN UPDATE {NAME} SET version = version + 1; END"
                )


def drop(apps, schema_editor) -> None:
    """Drop whatever of it is there (0016 calls this too)."""
    connection = schema_editor.connection
    if connection.vendor not in ("sqlite", "postgresql"):
        return
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        for table in tables(apps):
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {NAME} ON {quote(table)}")
            else:
                for write in WRITES:
                    cursor.execute(f"DROP TRIGGER IF EXISTS {quote(f'{NAME}_{write}_{table}')}")
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
        else:
            cursor.execute(f"DROP TABLE IF EXISTS {NAME}")


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0013_job_strategy_left_open"),
        ("recommender", "0003_alter_instancetype_hourly_price"),
        ("sessions", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(create, drop)]
