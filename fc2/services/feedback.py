"""A finished job becomes a performance record: what the recommender's lookup and model learn from (FC² §4.4: the
monitor feeds the empirical data back).

The epoch time is the training code's own figure when it reports one (`epoch_time_s` in its metrics), else its
training time over its epochs (`duration_s / epochs`, which the platform's example bundles report) — never the job's
wall time, which counts the bootstrap. A job that failed is recorded too, with no time: a configuration that did not
run is information (Anwar's empty rows), counted and never used as a time.
"""

from __future__ import annotations

from fc2.models import Job
from fc2.services.pricing import ps_node_type
from recommender.models import PerformanceRecord


def epoch_time_s(metrics: dict) -> float | None:
    """The run's epoch time from its metrics, or None when they do not say.

    >>> epoch_time_s({"epoch_time_s": 2.5})
    2.5
    >>> epoch_time_s({"duration_s": 6.0, "epochs": 3})
    2.0
    >>> epoch_time_s({"duration_s": 6.0}) is None
    True
    """
    if isinstance(value := metrics.get("epoch_time_s"), int | float) and value > 0:
        return float(value)
    duration, epochs = metrics.get("duration_s"), metrics.get("epochs")
    if isinstance(duration, int | float) and isinstance(epochs, int) and duration > 0 and epochs > 0:
        return duration / epochs
    return None


def record_job(job: Job, batch_size: int | None = None) -> PerformanceRecord | None:
    """The job's measurement as a record of its workload (source: measured); None for a job that has not ended or was
    cancelled. Recording a job twice updates its one record."""
    if job.state not in (Job.State.SUCCEEDED, Job.State.FAILED):
        return None
    metrics = job.metrics or {}
    if batch_size is None and isinstance(metrics.get("batch_size"), int):
        batch_size = metrics["batch_size"]
    time = epoch_time_s(metrics) if job.state == Job.State.SUCCEEDED else None
    record, _ = PerformanceRecord.objects.update_or_create(
        job=job,
        source=PerformanceRecord.Source.MEASURED,
        defaults={
            "workload": job.workload,
            "instance_type": job.worker_type,
            "ps_type": ps_node_type(job),
            "workers": job.workers,
            "batch_size": batch_size,
            "latency_ms": job.latency_ms,
            "strategy": job.strategy,
            "epoch_time_s": time,
            "loss": metrics.get("final_train_loss") if job.state == Job.State.SUCCEEDED else None,
            "origin": f"job {job.pk} on {job.provider}",
        },
    )
    return record
