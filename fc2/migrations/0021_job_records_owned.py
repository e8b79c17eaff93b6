"""Each performance record a job measured (its run's or its profiling run's, linked by JobRecord) becomes the record
of the job's owner: until now every user's answers read every job's records, so one user's code could steer
another's cluster (issue 41). The shipped grids and imported files stay the platform's. An admin promotes a record
back to the platform's (the admin's action, `manage.py promote_records`). Undone by making them the platform's again.
It lives here, beside JobRecord, as the recommender's migrations name nothing of fc2."""

from django.db import migrations


def own(apps, schema_editor):
    JobRecord = apps.get_model("fc2", "JobRecord")
    PerformanceRecord = apps.get_model("recommender", "PerformanceRecord")
    links = JobRecord.objects.filter(record__owner__isnull=True).values_list("record_id", "job__owner_id")
    for record, owner in links.order_by("record_id").iterator():
        PerformanceRecord.objects.filter(pk=record).update(owner_id=owner)


def disown(apps, schema_editor):
    JobRecord = apps.get_model("fc2", "JobRecord")
    PerformanceRecord = apps.get_model("recommender", "PerformanceRecord")
    linked = JobRecord.objects.values_list("record_id", flat=True)
    PerformanceRecord.objects.filter(pk__in=linked).update(owner=None)


class Migration(migrations.Migration):

    dependencies = [
        ("fc2", "0020_workload_name_help"),
        ("recommender", "0005_owner_trust_unusable"),
    ]

    operations = [
        migrations.RunPython(own, disown),
    ]
