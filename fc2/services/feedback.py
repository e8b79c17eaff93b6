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

What a job measures is its owner's record (`PerformanceRecord.owner`): only the owner's answers read it, never
another user's, until an admin promotes it to the platform's. And it is hostile input, like an upload: the job's own
code writes the metrics its figures come from. Each figure is checked at this door against its physical bound
(recommender/bounds.py); one outside it is not stored, and the job's timeline says so. A succeeded job whose epoch
time is out of bounds becomes no record at all: a record without a time would read as a failed run.
"""

from __future__ import annotations

import math

from django.db import transaction

import provisioner
from fc2.models import Job, JobRecord, batch_size_parameter
from fc2.services.pricing import ps_node_type
from monitor.figures import epoch_time_s
from recommender.bounds import BOUNDS, out_of_bounds
from recommender.models import PerformanceRecord


def batch_size_of(job: Job) -> int | None:
    """The batch size the job trained with: its metrics' (what the code used, where it is a batch size a record can
    hold), else its `batch_size` parameter."""
    value = (job.metrics or {}).get("batch_size")
    if isinstance(value, int) and not isinstance(value, bool) and BOUNDS["batch_size"].holds(value):
        return value
    return batch_size_parameter(job.parameters or {})


def _number(value: object) -> float | None:
    """A figure of the job's own JSON as a float, or None where it is no number (a string, a list, an integer too
    large for a float); a float out of its bound stays one, for the bounds to refuse by name."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


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
    measured = _measured(job)
    if measured is None:
        return None
    with transaction.atomic():
        record, created = PerformanceRecord.objects.update_or_create(
            job_link__job=job,  # its one measured record, linked by fc2.JobRecord: a new one is linked below
            source=PerformanceRecord.Source.MEASURED,
            defaults={
                "workload": job.workload,
                "instance_type": worker_type,
                "ps_type": ran_on.get("ps") or ps_node_type(job),
                "strategy": job.strategy,
                **measured,
                "origin": f"job {job.pk} on {job.provider}",
                "owner_id": job.owner_id,  # the owner's answers read it, no one else's (until an admin promotes it)
            },
        )
        if created:
            JobRecord.objects.create(job=job, record=record)
    return record


def _measured(job: Job) -> dict | None:
    """The job's figures that a record keeps, each within its bound (an out-of-bounds one left out, and said on the
    job's timeline); None when the job succeeded with an epoch time out of bounds (no record: see the module)."""
    metrics = job.metrics if isinstance(job.metrics, dict) else {}
    figures = job.figures if isinstance(job.figures, dict) else {}
    succeeded = job.state == Job.State.SUCCEEDED
    idleness = _number(figures.get("worker_idleness"))
    try:
        epoch = epoch_time_s(metrics) if succeeded else None
    except (ArithmeticError, TypeError, ValueError):  # (an integer too large for a float, from the job's own JSON)
        epoch = math.inf
    measured = {
        "workers": job.workers,
        "batch_size": batch_size_of(job),
        "latency_ms": job.latency_ms,
        "epoch_time_s": epoch,
        "loss": _number(metrics.get("final_train_loss")) if succeeded else None,
        "bandwidth_mbps": _number(figures.get("worker_bandwidth_mbps")),
        "cpu_util": None if idleness is None else round(100 * (1 - idleness), 1),
    }
    problems = out_of_bounds(measured)
    if not problems:
        return measured
    if not BOUNDS["epoch_time_s"].holds(epoch):
        job.log(f"no performance record of this run: its {'; '.join(problems)}")
        return None
    job.log(f"its performance record leaves out what is out of bounds: {'; '.join(problems)}")
    return {name: value if BOUNDS[name].holds(value) else None for name, value in measured.items()}
