"""A bundle's own name (the distribution until its owner renames it) and a URL dataset's last download failure."""

from django.db import migrations, models
from django.db.models import F


def name_after_distribution(apps, schema_editor):
    apps.get_model("fc2", "CodeBundle").objects.update(name=F("distribution"))


class Migration(migrations.Migration):
    dependencies = [("fc2", "0006_job_workload_name")]

    operations = [
        migrations.AddField(
            model_name="codebundle",
            name="name",
            field=models.CharField(
                default="", help_text="The owner's name for it; the distribution unless renamed", max_length=200
            ),
            preserve_default=False,
        ),
        migrations.RunPython(name_after_distribution, migrations.RunPython.noop),
        migrations.AddField(
            model_name="dataset",
            name="last_error",
            field=models.CharField(blank=True, max_length=500),
        ),
    ]
