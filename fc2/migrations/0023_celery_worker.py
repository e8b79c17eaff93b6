"""Celery workers' heartbeats (fc2/celery.py's WorkerBeat step): whether any worker is taking jobs."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0022_clean_job_metrics"),
    ]

    operations = [
        migrations.CreateModel(
            name="CeleryWorker",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "hostname",
                    models.CharField(help_text="Celery's node name, e.g. celery@host", max_length=255, unique=True),
                ),
                ("queues", models.JSONField(default=list, help_text="The queues it consumes from")),
                ("beat_at", models.DateTimeField(help_text="When it last said it was up and consuming")),
                (
                    "task_started_at",
                    models.DateTimeField(blank=True, help_text="When it last started a task", null=True),
                ),
                (
                    "stopped_at",
                    models.DateTimeField(
                        blank=True, help_text="When it last shut down (until its next beat)", null=True
                    ),
                ),
            ],
            options={
                "ordering": ["hostname"],
            },
        ),
    ]
