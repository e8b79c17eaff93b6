"""Celery tasks: one thin wrapper per pipeline step, taking the job id (see services/pipeline.py)."""

from celery import shared_task

from fc2.services import pipeline


@shared_task(name="fc2.tasks.profile")
def profile(job_id: int) -> None:
    pipeline.advance("profile", job_id)


@shared_task(name="fc2.tasks.provision")
def provision(job_id: int) -> None:
    pipeline.advance("provision", job_id)


@shared_task(name="fc2.tasks.bootstrap")
def bootstrap(job_id: int) -> None:
    pipeline.advance("bootstrap", job_id)


@shared_task(name="fc2.tasks.watch")
def watch(job_id: int) -> None:
    pipeline.advance("watch", job_id)


@shared_task(name="fc2.tasks.collect")
def collect(job_id: int) -> None:
    pipeline.advance("collect", job_id)


@shared_task(name="fc2.tasks.release")
def release(job_id: int) -> None:
    pipeline.advance("release", job_id)
