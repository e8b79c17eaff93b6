"""Samples get the time the agent took them (`measured_at`: the stored ones were taken when received), the whole
machine's CPU and the GPUs' memory."""

import django.utils.timezone
from django.db import migrations, models
from django.db.models import F


def measured_when_received(apps, schema_editor):
    apps.get_model("monitor", "NodeSample").objects.update(measured_at=F("at"))


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0002_loss_points"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodesample",
            name="gpu_memory_mb",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="nodesample",
            name="measured_at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(measured_when_received, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="nodesample",
            name="measured_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name="nodesample",
            name="node_cpu_percent",
            field=models.FloatField(blank=True, help_text="The whole machine's, where it is the node's", null=True),
        ),
        migrations.AlterModelOptions(name="nodesample", options={"ordering": ["node", "measured_at"]}),
        migrations.AddIndex(
            model_name="nodesample",
            index=models.Index(fields=["node", "measured_at"], name="monitor_sample_measured_idx"),
        ),
    ]
