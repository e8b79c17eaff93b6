"""Drops what 0014 made (its triggers, and SQLite's version table or PostgreSQL's function): the response cache that
read them is gone, and nothing else does. Going back makes nothing again, for the same reason."""

from importlib import import_module

from django.db import migrations

made = import_module("fc2.migrations.0014_answer_checks_triggers")


class Migration(migrations.Migration):
    dependencies = [("fc2", "0015_job_faults_artifact_names_idempotency")]

    operations = [migrations.RunPython(made.drop, migrations.RunPython.noop)]
