from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0004_job_dashboard_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="cluster_name",
            field=models.CharField(blank=True, max_length=40),
        ),
        migrations.AddField(
            model_name="job",
            name="lease_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
