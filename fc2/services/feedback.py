"""A finished job becomes a performance record: what the recommender's lookup and model learn from (FC² §4.4: the
monitor feeds the empirical data back).

The epoch time (monitor.figures.epoch_time_s, the job page's figure too) is the training code's own figure when it
reports one (`epoch_time_s` in its metrics: the example bundle's is the steady state's, its start-up — tracing and
compiling the step — reported apart as `startup_s`, examples/README.md), else its training time over its epochs
(`duration_s / epochs`, start-up included) — never the job's wall time, which counts the bootstrap. Start-up does not
shrink with more workers, so only the steady state can rank worker counts where the steps are short. A job that
failed is recorded too, with no time: a configuration that did not run is information (Anwar's empty rows), counted
and never used as a time. The pipeline records every job that ends (pipeline.ended), so the lookup and the model
learn from it at once (FC² §4.2).
"""

from __future__ import annotations

from django.db import transaction

import provisioner
from fc2.models import Job, JobRecord, batch_size_parameter
from fc2.services.pricing import ps_node_type
from monitor.figures import epoch_time_s
from recommender.models import PerformanceRecord


def batch_size_of(job: Job) -> int | None:
    """The batch size the job trained with: its metrics' (what the code used), else its `batch_size` parameter."""
    if isinstance(value := (job.metrics or {}).get("batch_size"), int) and value > 0:
        return value
    return batch_size_parameter(job.parameters or {})


def record_job(job: Job) -> PerformanceRecord | None:
    """The job's measurement as a record of its workload (source: measured), with its workers' mean bandwidth and CPU
    use from its run figures (monitor/figures.py); None for a job that has not ended or was cancelled, or whose
    nodes were not machines of its instance types (the local provider's processes: what they measure is not the
    type's). Recording a job twice updates its one record."""
    if job.state not in (Job.State.SUCCEEDED, Job.State.FAILED) or not provisioner.get(job.provider).typed_nodes:
        return None
    if not job.planned:  # ended before its cluster was chosen: nothing of it ran
        return None
    ran_on = dict(job.nodes.values_list("role", "instance_type").distinct())  # what its nodes were (a type each)
    worker_type = ran_on.get("worker") or ran_on.get("chief") or job.worker_type
    if not worker_type:
        return None
    metrics = job.metrics or {}
    figures = job.figures or {}
    succeeded = job.state == Job.State.SUCCEEDED
    idleness = figures.get("worker_idleness")
    with transaction.atomic():
        record, created = PerformanceRecord.objects.update_or_create(
            job_link__job=job,  # its one measured record, linked by fc2.JobRecord: a new one is linked below
            source=PerformanceRecord.Source.MEASURED,
            defaults={
                "workload": job.workload,
                "instance_type": worker_type,
                "ps_type": ran_on.get("ps") or ps_node_type(job),
                "workers": job.workers,
                "batch_size": batch_size_of(job),
                "latency_ms": job.latency_ms,
                "strategy": job.strategy,
                "epoch_time_s": epoch_time_s(metrics) if succeeded else None,
                "loss": metrics.get("final_train_loss") if succeeded else None,
                "bandwidth_mbps": figures.get("worker_bandwidth_mbps"),
                "cpu_util": None if idleness is None else round(100 * (1 - idleness), 1),
                "origin": f"job {job.pk} on {job.provider}",
            },
        )
        if created:
            JobRecord.objects.create(job=job, record=record)
    return record
