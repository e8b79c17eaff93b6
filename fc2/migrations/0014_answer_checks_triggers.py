"""The triggers that tell fc2/answer_cache.py of every change to a table its checks read (fc2/answer_triggers.py)."""

from django.conf import settings
from django.db import migrations

from fc2 import answer_triggers


def create(apps, schema_editor) -> None:
    answer_triggers.create(schema_editor.connection)


def drop(apps, schema_editor) -> None:
    answer_triggers.drop(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0013_job_strategy_left_open"),
        ("recommender", "0003_alter_instancetype_hourly_price"),
        ("sessions", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(create, drop)]
