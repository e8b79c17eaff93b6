"""Celery tasks: thin wrappers over the pipeline's steps (services/pipeline.py) and the sweep (services/sweep.py).

A step's message carries the job's lease as it was handed over (`lease`), and `resume` when the sweep sends a lost
step again. Only a database that cannot be reached is retried here, with backoff: anything else a step raises fails
its job, and whatever is lost (a message, a worker) is the sweep's to find.
"""

from celery import shared_task
from django.db import OperationalError

from fc2.services import pipeline
from fc2.services import sweep as sweeping

RETRY = {"autoretry_for": (OperationalError,), "retry_backoff": True, "max_retries": 5}


@shared_task(name="fc2.tasks.recommend", **RETRY)
def recommend(job_id: int, lease: str | None = None, resume: bool = False) -> None:
    pipeline.advance("recommend", job_id, lease, resume)


@shared_task(name="fc2.tasks.provision", **RETRY)
def provision(job_id: int, lease: str | None = None, resume: bool = False) -> None:
    pipeline.advance("provision", job_id, lease, resume)


@shared_task(name="fc2.tasks.bootstrap", **RETRY)
def bootstrap(job_id: int, lease: str | None = None, resume: bool = False) -> None:
    pipeline.advance("bootstrap", job_id, lease, resume)


@shared_task(name="fc2.tasks.finish", **RETRY)
def finish(job_id: int, lease: str | None = None, resume: bool = False) -> None:
    pipeline.advance("finish", job_id, lease, resume)


@shared_task(name="fc2.tasks.release", **RETRY)
def release(job_id: int) -> None:
    pipeline.release(job_id)


@shared_task(name="fc2.tasks.sweep")
def sweep() -> None:
    sweeping.sweep()
