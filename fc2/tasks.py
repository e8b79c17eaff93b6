"""Celery tasks: thin wrappers over the pipeline's steps (services/pipeline.py) and the sweep (services/sweep.py).

Every step's task is a StepTask: its message carries the job's id, the job's lease as it was handed over (`lease`),
`resume` when the sweep sends a lost step again, and `attempt`. What every step repeats lives in the base class: a
database that cannot be reached is retried with backoff (the job is not at fault), and a step that failed
transiently (pipeline.TryAgain) is sent again with `self.retry(countdown=…)`, its lease handed to that message — no
worker sleeps meanwhile. Anything else a step raises fails its job, and whatever is lost (a message, a worker) is the
sweep's to find.
"""

from celery import Task, shared_task
from django.conf import settings
from django.db import OperationalError

from fc2.services import monitoring, pipeline
from fc2.services import sweep as sweeping


class StepTask(Task):
    """One step of the pipeline, run under the job's lease by pipeline.advance."""

    autoretry_for = (OperationalError,)
    retry_backoff = True
    max_retries = 5

    def advance(self, step: str, job_id: int, lease: str | None, resume: bool, attempt: int) -> None:
        try:
            pipeline.advance(step, job_id, lease, resume, attempt)
        except pipeline.TryAgain as again:
            kwargs = {"lease": again.lease.isoformat(), "resume": True, "attempt": attempt + 1}
            # Bounded by FC2_STEP_ATTEMPTS in the pipeline; Celery counts database retries too. A step waiting its
            # turn (no room on the machine yet) is not bounded: it waits, as a queued job does.
            limit = None if again.waits else self.max_retries + settings.FC2_STEP_ATTEMPTS
            raise self.retry(args=[job_id], kwargs=kwargs, countdown=again.delay_s, max_retries=limit) from again


@shared_task(name="fc2.tasks.recommend", base=StepTask, bind=True)
def recommend(self: StepTask, job_id: int, lease: str | None = None, resume: bool = False, attempt: int = 1) -> None:
    self.advance("recommend", job_id, lease, resume, attempt)


@shared_task(name="fc2.tasks.provision", base=StepTask, bind=True)
def provision(self: StepTask, job_id: int, lease: str | None = None, resume: bool = False, attempt: int = 1) -> None:
    self.advance("provision", job_id, lease, resume, attempt)


@shared_task(name="fc2.tasks.bootstrap", base=StepTask, bind=True)
def bootstrap(self: StepTask, job_id: int, lease: str | None = None, resume: bool = False, attempt: int = 1) -> None:
    self.advance("bootstrap", job_id, lease, resume, attempt)


@shared_task(name="fc2.tasks.collect", base=StepTask, bind=True)
def collect(self: StepTask, job_id: int, lease: str | None = None, resume: bool = False, attempt: int = 1) -> None:
    self.advance("collect", job_id, lease, resume, attempt)


@shared_task(name="fc2.tasks.release", autoretry_for=(OperationalError,), retry_backoff=True, max_retries=5)
def release(job_id: int) -> None:
    pipeline.release(job_id)


@shared_task(name="fc2.tasks.sweep")
def sweep() -> None:
    sweeping.sweep()


@shared_task(name="fc2.tasks.compact_samples")
def compact_samples() -> None:
    monitoring.compact_ended_jobs()
