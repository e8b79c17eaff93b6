"""Celery tasks: thin wrappers over the pipeline's steps (services/pipeline.py) and the sweep (services/sweep.py).

The step tasks are made from the pipeline's one table (pipeline.STEPS): a StepTask for each step, registered under
`pipeline.task_name(step)` — the name `pipeline.enqueue` sends by, and the one the hand-written tasks had
(`fc2.tasks.provision`), so a message an older installation queued still runs. A step added to the table has its task
without a line here.

Every step's message carries the job's id, the job's lease as it was handed over (`lease`), `resume` when the sweep
sends a lost step again, and `attempt`. What every step repeats lives in the base class: a database that cannot be
reached is retried with backoff (the job is not at fault), and a step that failed transiently (pipeline.TryAgain) is
sent again with `self.retry(countdown=…)`, its lease handed to that message — no worker sleeps meanwhile. Anything
else a step raises fails its job, and whatever is lost (a message, a worker) is the sweep's to find.
"""

from celery import Task, shared_task
from django.conf import settings
from django.db import OperationalError

from fc2.celery import app
from fc2.services import monitoring, pipeline
from fc2.services import sweep as sweeping


class StepTask(Task):
    """One step of the pipeline (`step`, a key of pipeline.STEPS), run under the job's lease by pipeline.advance."""

    step: str
    autoretry_for = (OperationalError,)
    retry_backoff = True
    max_retries = 5

    def run(self, job_id: int, lease: str | None = None, resume: bool = False, attempt: int = 1) -> None:
        try:
            pipeline.advance(self.step, job_id, lease, resume, attempt)
        except pipeline.TryAgain as again:
            assert again.lease is not None  # advance raises it only once the lease is handed over
            kwargs = {"lease": again.lease.isoformat(), "resume": True, "attempt": attempt + 1}
            # Bounded by FC2_STEP_ATTEMPTS in the pipeline; Celery counts database retries too. A step waiting its
            # turn (no room on the machine yet) is not bounded: it waits, as a queued job does.
            limit = None if again.waits else self.max_retries + settings.FC2_STEP_ATTEMPTS
            raise self.retry(args=(job_id,), kwargs=kwargs, countdown=again.delay_s, max_retries=limit) from again


def _step_task(step: str) -> StepTask:
    """The task of `step`: a class of its own, as Celery makes one for every task, registered under its name."""
    task = type(f"{step.capitalize()}Task", (StepTask,), {"name": pipeline.task_name(step), "step": step})
    return app.register_task(task())


STEP_TASKS = {step: _step_task(step) for step in pipeline.STEPS}


@shared_task(name=pipeline.task_name("release"), autoretry_for=(OperationalError,), retry_backoff=True, max_retries=5)
def release(job_id: int) -> None:
    pipeline.release(job_id)


@shared_task(name="fc2.tasks.sweep")
def sweep() -> None:
    sweeping.sweep()


@shared_task(name="fc2.tasks.compact_samples")
def compact_samples() -> None:
    monitoring.compact_ended_jobs()
