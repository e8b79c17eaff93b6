"""A job's request kept apart from its plan (`Job.request`, written once; the plan columns empty until the recommend
step writes them), its budgets named by their units (`budget` $/h, `total_budget` $ for the whole job), and each
state named for its step (`profiling` → `recommending`; step `finish` → `collect`)."""

from django.db import migrations, models

ONE_WORKER_TYPE = ("manual", "scala-opt-m")


def _amount(value) -> str | None:
    return None if value is None else str(value)


def split_request(apps, schema_editor):
    """Each job's request, as well as it can be told from its row. A queued job's columns are still its request, as
    it came; they are moved out of the plan, which its recommend step writes. A planned job's request is what a
    re-run asked for before: a left-open strategy where the model chose one (its recommendation says so), the worker
    type only where the algorithm takes one, the PS type and worker count it ran with."""
    Job = apps.get_model("fc2", "Job")
    JobEvent = apps.get_model("fc2", "JobEvent")
    Job.objects.filter(state="profiling").update(state="recommending")
    JobEvent.objects.filter(state="profiling").update(state="recommending")
    for job in Job.objects.iterator():
        queued = job.state == "queued"
        left_open = bool(((job.recommendation or {}).get("extra") or {}).get("strategy"))
        job.request = {
            "parameters": {str(k): str(v) for k, v in (job.parameters or {}).items()},
            "provider": job.provider,
            "strategy": "auto" if left_open else job.strategy,
            "workers": job.workers,
            "algorithm": job.algorithm,
            "ps_type": job.ps_type,
            "worker_type": job.worker_type if queued or job.algorithm in ONE_WORKER_TYPE else "",
            "region": job.region,
            "latency_ms": job.latency_ms,
            "budget": _amount(job.budget),
            "total_budget": _amount(job.total_budget),
            "catalog": job.catalog,
            "worker_types": list(job.worker_types or []),
            "workload_name": job.workload_name,
        }
        if queued:
            job.strategy, job.ps_type, job.worker_type, job.workers = "", "", "", None
        job.resends = {("collect" if step == "finish" else step): n for step, n in (job.resends or {}).items()}
        job.save(update_fields=["request", "strategy", "ps_type", "worker_type", "workers", "resends"])


def join_request(apps, schema_editor):
    """Back: a job not planned yet holds its request in its columns again."""
    Job = apps.get_model("fc2", "Job")
    JobEvent = apps.get_model("fc2", "JobEvent")
    for job in Job.objects.filter(workers__isnull=True):
        asked = job.request or {}
        job.strategy = asked.get("strategy") or "ps"
        job.ps_type = asked.get("ps_type", "")
        job.worker_type = asked.get("worker_type", "")
        job.workers = asked.get("workers") or 2
        job.save(update_fields=["strategy", "ps_type", "worker_type", "workers"])
    for job in Job.objects.exclude(resends={}):
        job.resends = {("finish" if step == "collect" else step): n for step, n in job.resends.items()}
        job.save(update_fields=["resends"])
    Job.objects.filter(state="recommending").update(state="profiling")
    JobEvent.objects.filter(state="recommending").update(state="profiling")


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0017_job_resends"),
    ]

    operations = [
        migrations.RenameField(model_name="job", old_name="budget", new_name="total_budget"),
        migrations.RenameField(model_name="job", old_name="hourly_budget", new_name="budget"),
        migrations.AlterField(
            model_name="job",
            name="budget",
            field=models.DecimalField(
                blank=True, decimal_places=4, help_text="$/h: the recommender's budget C", max_digits=10, null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="request",
            field=models.JSONField(default=dict, editable=False, help_text="What the user asked, as it came"),
        ),
        migrations.AlterField(
            model_name="job",
            name="strategy",
            field=models.CharField(
                blank=True,
                choices=[
                    ("ps", "Parameter server"),
                    ("mirrored", "All-Reduce (mirrored)"),
                    ("auto", "Left open (the model chooses)"),
                ],
                max_length=10,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="workers",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("recommending", "Recommending"),
                    ("provisioning", "Provisioning"),
                    ("bootstrapping", "Bootstrapping"),
                    ("running", "Running"),
                    ("collecting", "Collecting"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                ],
                db_index=True,
                default="queued",
                max_length=15,
            ),
        ),
        migrations.RunPython(split_request, join_request),
    ]
