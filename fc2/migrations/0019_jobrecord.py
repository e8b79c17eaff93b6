"""The link from a performance record to the job that measured it, moved from the recommender
(`PerformanceRecord.job`) to fc2 (`JobRecord`): the app above knows the recommender, the recommender nothing of fc2.
The existing links are copied here, before the recommender's 0004 drops its column (`run_before`: the recommender's
migrations name nothing of fc2)."""

import django.db.models.deletion
from django.db import migrations, models


def copy_links(apps, schema_editor):
    PerformanceRecord = apps.get_model("recommender", "PerformanceRecord")
    JobRecord = apps.get_model("fc2", "JobRecord")
    links = PerformanceRecord.objects.filter(job__isnull=False).order_by("pk").values_list("job", "pk")
    JobRecord.objects.bulk_create(JobRecord(job_id=job, record_id=record) for job, record in links.iterator())


def copy_links_back(apps, schema_editor):
    PerformanceRecord = apps.get_model("recommender", "PerformanceRecord")
    JobRecord = apps.get_model("fc2", "JobRecord")
    for job, record in JobRecord.objects.values_list("job_id", "record_id").iterator():
        PerformanceRecord.objects.filter(pk=record).update(job=job)


class Migration(migrations.Migration):

    dependencies = [
        ("fc2", "0018_job_request_plan_budgets_recommending"),
        ("recommender", "0003_alter_instancetype_hourly_price"),
    ]
    run_before = [
        ("recommender", "0004_remove_performancerecord_job"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobRecord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="record_links", to="fc2.job"
                    ),
                ),
                (
                    "record",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="job_link",
                        to="recommender.performancerecord",
                    ),
                ),
            ],
        ),
        migrations.RunPython(copy_links, copy_links_back),
    ]
