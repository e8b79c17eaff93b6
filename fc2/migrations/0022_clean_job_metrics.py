"""Job.metrics stored before reports were cleaned at the door (fc2/jsonbounds.py): an integer no float holds (10**400
raised OverflowError on every page showing the job), NaN (SQLite took it), NUL, strings of any length — cleaned as
the door cleans a new metrics.json, with a line on the job's timeline."""

from django.db import migrations

from fc2 import jsonbounds

MAX_METRIC_STRING = 1000  # as fc2.services.noderecords keeps a metrics.json's strings


def clean_metrics(apps, schema_editor):
    Job = apps.get_model("fc2", "Job")
    JobEvent = apps.get_model("fc2", "JobEvent")
    for pk, state, metrics in Job.objects.exclude(metrics={}).values_list("pk", "state", "metrics").iterator():
        try:
            cleaned, changes = jsonbounds.clean(metrics, max_string=MAX_METRIC_STRING)
        except ValueError:  # nested deeper than the door takes
            cleaned, changes = {"error": "metrics.json is not valid JSON"}, ["nested too deep: not kept"]
        if changes:
            Job.objects.filter(pk=pk).update(metrics=cleaned)
            JobEvent.objects.bulk_create(
                [JobEvent(job_id=pk, state=state, message=f"metrics.json (as kept): {change}") for change in changes]
            )


class Migration(migrations.Migration):
    dependencies = [("fc2", "0021_job_records_owned")]

    operations = [migrations.RunPython(clean_metrics, migrations.RunPython.noop)]
