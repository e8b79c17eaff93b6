"""The broker unreachable at submission (issue 27 §3): every door answers without a 500, the job is accepted once and
says it waits for a worker, and the sweep sends it once the broker is back. A real broker connection is refused
here: the Celery app is pointed at a Redis port on which nothing listens."""

from __future__ import annotations

import io
import json
import socket
from datetime import timedelta

import pytest
from celery import Celery
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from fc2.models import Job
from fc2.services import sweep
from tests.helpers import Api

pytestmark = pytest.mark.django_db(transaction=True)
WAITING = "waiting for a worker: the task queue cannot be reached"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def broker_down(monkeypatch):
    """The workers' broker refuses connections (a Redis URL at a port nothing listens on)."""
    down = Celery("fc2", broker=f"redis://127.0.0.1:{closed_port()}/0")
    down.conf.broker_connection_timeout = 2
    monkeypatch.setattr("fc2.celery.app", down)
    return monkeypatch


@pytest.fixture
def api(client, alice) -> Api:
    return Api(client, alice)


def submit(api: Api, bundle, digits):
    return api.post("/api/jobs", {"bundle": bundle.pk, "dataset": str(digits.pk), "workers": 1})


def test_api_submission_is_accepted_and_waits_for_a_worker(api, bundle, digits, broker_down):
    response = submit(api, bundle, digits)

    assert response.status_code == 201, response.content
    (job,) = Job.objects.all()
    assert response.json()["id"] == job.pk
    assert job.state == Job.State.QUEUED
    assert job.events.filter(message__startswith=WAITING).count() == 1


def test_rerun_and_cli_submission_with_the_broker_down(api, alice, bundle, digits, broker_down, example_wheel):
    first = submit(api, bundle, digits).json()["id"]

    rerun = api.post(f"/api/jobs/{first}/rerun")
    out = io.StringIO()
    call_command(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--workers", "1", "--user", alice.username,
        "--json", stdout=out,
    )  # fmt: skip

    assert rerun.status_code == 201, rerun.content
    submitted = json.loads(out.getvalue())
    assert Job.objects.count() == 3
    for job in Job.objects.filter(pk__in=[rerun.json()["id"], submitted["id"]]):
        assert job.state == Job.State.QUEUED
        assert job.events.filter(message__startswith=WAITING).exists()


def test_a_waiting_job_is_sent_by_the_sweep_once_the_broker_is_back(api, bundle, digits, broker_down, monkeypatch):
    job_id = submit(api, bundle, digits).json()["id"]
    broker_down.undo()  # the broker is back
    sent = []
    monkeypatch.setattr("fc2.celery.app.send_task", lambda name, **kwargs: sent.append((name, kwargs["args"])))
    monkeypatch.setattr(transaction, "on_commit", lambda func, *args, **kwargs: func())
    Job.objects.filter(pk=job_id).update(lease_until=timezone.now() - timedelta(seconds=1))  # its pickup time passed

    sweep.sweep()

    assert sent == [("fc2.tasks.recommend", [job_id])]
    assert Job.objects.get(pk=job_id).events.filter(message__endswith="recommend sent again").count() == 1
