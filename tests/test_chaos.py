"""Managed jobs' nodes lost at moments the resume's own tests (tests/test_resume.py) do not choose: a peer's failure
that a lost node caused, a second loss once the restarts are spent, the platform's worker lost while a restart starts
its nodes. Each ends in a clear state — resumed, or failed naming the nodes and the restarts — with nothing left.

The light cases drive the pipeline's functions on the database; the lab case runs a job for real, driven inline (the
steps in a thread here, the report API served by it), its code a trainer that fails, as TensorFlow's collectives do,
once a peer it trained with stops answering.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from django.utils import timezone

from fc2.models import Job
from fc2.services import pipeline
from tests.test_resume import running

State = Job.State


@pytest.mark.django_db
def test_restarts_spent_fail_the_job_naming_every_restart_and_its_nodes(job):
    job = running(job, max_restarts=2)
    assert pipeline.node_lost(job, ["worker-1"], "worker-1 is lost")
    restarted = {"resumed_at": timezone.now().isoformat()}
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, restarts=[{**job.restarts[0], **restarted}])
    assert pipeline.node_lost(job, ["worker-0", "worker-1"], "worker-0 is lost")
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING)
    assert not pipeline.node_lost(job, ["worker-1"], "worker-1 is lost: its host is gone")
    job.refresh_from_db()
    first, second = (datetime.fromisoformat(r["at"]).strftime("%H:%M:%S") for r in job.restarts)
    assert job.state == State.FAILED
    assert job.failure_reason == (
        f"worker-1 is lost: its host is gone; restarts made: 2 of 2 (1: worker-1 at {first}; 2: worker-0, worker-1 "
        f"at {second})"
    )
