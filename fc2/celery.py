"""The Celery application: configured from Django settings (CELERY_*), tasks found in every installed app; and each
worker's heartbeat (WorkerBeat), which tells pages, the API and the CLI whether any worker is taking jobs.

Django's settings and models are imported where they are used: this module is imported (fc2/__init__.py) before
Django is set up."""

import logging
import os
from collections.abc import Callable
from typing import Any

from celery import Celery, Task, bootsteps, signals
from celery.worker.consumer import Consumer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fc2.settings")

logger = logging.getLogger(__name__)

app = Celery("fc2")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class WorkerBeat(bootsteps.StartStopStep):
    """A step of the worker's consumer: writes the worker's heartbeat (fc2/services/workers.py) when the consumer
    starts consuming and every third of FC2_WORKER_SILENCE_S after, on the worker's timer. It starts after the task
    consumer (Tasks) and, like it, is stopped when the consumer loses the broker and started again once it is back:
    a worker that cannot take jobs — dead, stopped, or without its broker — does not beat."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Consumer, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.timer_entry = None
        # Before the pool starts its processes, which run the tasks and so send task_prerun.
        signals.task_prerun.connect(_task_started, weak=False, dispatch_uid="fc2.celery.task_started")

    def start(self, consumer: Consumer) -> None:
        from django.conf import settings

        from fc2.services import workers

        self.beat(consumer)
        interval = settings.FC2_WORKER_SILENCE_S / workers.BEATS_PER_SILENCE
        self.timer_entry = consumer.timer.call_repeatedly(interval, self.beat, (consumer,))

    def stop(self, consumer: Consumer) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    def shutdown(self, consumer: Consumer) -> None:
        """The worker is stopping: it says so, rather than look alive until its beats go stale."""
        from fc2.services import workers

        self.stop(consumer)
        _unless_database_down("its shutdown", workers.stopped, consumer.hostname)

    def beat(self, consumer: Consumer) -> None:
        from fc2.services import workers

        # task_consumer: set by the Tasks step this one requires; celery-types does not declare it.
        queues = sorted(queue.name for queue in consumer.task_consumer.queues)  # type: ignore[attr-defined]
        _unless_database_down("a heartbeat", workers.beat, consumer.hostname, queues)


def _task_started(task: Task, **kwargs: object) -> None:
    from fc2.services import workers

    _unless_database_down("a task's start", workers.task_started, task.request.hostname)


def _unless_database_down(what: str, write: Callable[..., object], *args: object) -> None:
    """A write of the worker's status; with the database down, a warning: the worker goes on, the next beat will
    tell, and the status must never stop a worker or a task. The beats run outside any task or request, so nothing
    else drops a connection that a database restart broke: done here first (as Django does around a request), or
    every beat after a restart would fail and the worker look dead while it works."""
    from django.db import DatabaseError, close_old_connections

    close_old_connections()
    try:
        write(*args)
    except DatabaseError as error:
        logger.warning("the worker's status could not be written (%s): %s", what, error)


app.steps["consumer"].add(WorkerBeat)
