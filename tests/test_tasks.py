"""The Celery step tasks are made from the pipeline's table (fc2/tasks.py): every step has its task under the name
the pipeline sends it by, which is the name the hand-written tasks had — so a message that an older installation left
in the queue still runs."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.utils import timezone

from fc2 import tasks
from fc2.celery import app as celery_app
from fc2.models import Job
from fc2.services import pipeline

# The names the tasks had when they were written by hand, one by one: messages already queued carry them.
OLD_NAMES = {
    "recommend": "fc2.tasks.recommend",
    "provision": "fc2.tasks.provision",
    "bootstrap": "fc2.tasks.bootstrap",
    "collect": "fc2.tasks.collect",
    "release": "fc2.tasks.release",
}


def test_every_step_of_the_table_has_its_task_under_its_name():
    assert set(tasks.STEP_TASKS) == set(pipeline.STEPS)
    for step in [*pipeline.STEPS, "release"]:
        task = celery_app.tasks[pipeline.task_name(step)]
        assert task.name == OLD_NAMES[step]
        if step != "release":
            assert isinstance(task, tasks.StepTask) and task.step == step and task is tasks.STEP_TASKS[step]
    assert set(OLD_NAMES) == {*pipeline.STEPS, "release"}  # a step added to the table: add its name here


def test_a_message_sent_by_the_old_name_runs(job, settings, django_capture_on_commit_callbacks):
    """The recommend step's message as an older installation sent it goes through the broker and is taken off the
    queue as a worker takes it (the task found by the message's name): the job is planned and its next step sent,
    under its old name too. Nothing of the pipeline is replaced: the broker is the test settings' own."""
    settings.CELERY_TASK_DEFAULT_QUEUE = queue = f"fc2-test-{uuid.uuid4().hex[:8]}"
    lease = timezone.now() + timedelta(seconds=60)
    Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY, state=Job.State.QUEUED, lease_until=lease)
    celery_app.send_task("fc2.tasks.recommend", args=[job.pk], kwargs={"lease": lease.isoformat()}, queue=queue)

    with celery_app.connection_for_read() as connection, connection.SimpleQueue(queue) as messages:
        message = messages.get(timeout=10)
        args, kwargs, _ = message.decode()
        with django_capture_on_commit_callbacks(execute=True):
            celery_app.tasks[message.headers["task"]].apply(args=args, kwargs=kwargs)
        message.ack()
        sent = messages.get(timeout=10)
        sent.ack()

    job.refresh_from_db()
    assert job.state == Job.State.RECOMMENDING and job.workers == 2  # planned: the provision step comes next
    assert sent.headers["task"] == "fc2.tasks.provision" and sent.decode()[0] == [job.pk]
