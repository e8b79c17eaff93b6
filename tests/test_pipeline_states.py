"""The job state machine: each step claims its transition once, cancel ends any active job, failures are recorded.

No TensorFlow and no node processes: clusters come from `provisioner.local.launch`, which only makes directories.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.utils import timezone

from fc2.celery import app as celery_app
from fc2.models import Job, JobEvent, Node
from fc2.services import pipeline
from provisioner import ClusterSpec, local
from tests.conftest import make_job

State = Job.State
ACTIVE = [s for s in State.values if s not in Job.TERMINAL]


@pytest.fixture(autouse=True)
def _private_clusters(settings, tmp_path):
    """Each test its own cluster directory, so a `fc2-job-<pk>` left by another test is never reused."""
    settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "clusters"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def set_state(job: Job, state: str, **fields) -> Job:
    Job.objects.filter(pk=job.pk).update(state=state, **fields)
    job.refresh_from_db()
    return job


def launch_cluster(job: Job, strategy: str = "ps", workers: int = 2):
    """A local cluster's directories, stored on the job with its Node rows, as `provision` leaves them."""
    cluster = local.launch(ClusterSpec(f"fc2-job-{job.pk}", "local", strategy, workers))
    Job.objects.filter(pk=job.pk).update(cluster=cluster.to_dict())
    for node in cluster.nodes:
        Node.objects.create(job=job, name=node.name, role=node.role, index=node.index, status=Node.Status.RUNNING)
    job.refresh_from_db()
    return cluster


def events(job: Job) -> list[tuple[str, str]]:
    return list(job.events.values_list("state", "message"))


# --- claiming a transition ---


def test_transition_claims_once(job):
    second_actor = Job.objects.get(pk=job.pk)  # e.g. a redelivered task, with its own copy of the row
    before = timezone.now()

    first = job.transition(State.QUEUED, State.PROFILING, "choosing the cluster")
    second = second_actor.transition(State.QUEUED, State.PROFILING, "choosing the cluster")

    assert (first, second) == (True, False)
    assert second_actor.state == State.QUEUED  # the loser's copy is not changed either
    job.refresh_from_db()
    assert job.state == State.PROFILING
    (event,) = job.events.filter(state=State.PROFILING)
    assert event.message == "choosing the cluster"
    assert before <= event.at <= timezone.now()


def test_transition_from_several_sources_and_timestamps(job):
    set_state(job, State.BOOTSTRAPPING)

    assert job.transition((State.BOOTSTRAPPING, State.RUNNING), State.RUNNING, "started")
    assert job.started_at is not None
    assert job.finished_at is None
    assert job.transition(pipeline.ACTIVE, State.FAILED, "boom", failure_reason="boom")
    assert not job.transition(pipeline.ACTIVE, State.CANCELLED, "too late")

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "boom")
    assert job.started_at <= job.finished_at
    assert [state for state, _ in events(job)] == ["queued", "running", "failed"]
    times = list(job.events.values_list("at", flat=True))
    assert times == sorted(times)


def test_every_successful_transition_logs_one_event(job):
    path = [State.PROFILING, State.PROVISIONING, State.BOOTSTRAPPING, State.RUNNING, State.COLLECTING, State.SUCCEEDED]
    source = State.QUEUED
    for target in path:
        assert job.transition(source, target, f"to {target}")
        assert not job.transition(source, target, "again")
        source = target

    assert events(job)[1:] == [(target, f"to {target}") for target in path]


def test_redelivered_profile_does_nothing(job):
    assert pipeline.profile(job.pk) is True
    count = JobEvent.objects.filter(job=job).count()

    assert pipeline.profile(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.PROFILING
    assert JobEvent.objects.filter(job=job).count() == count
    assert job.events.filter(state=State.PROFILING, message="choosing the cluster").count() == 1


def test_provision_makes_nodes_once(job):
    set_state(job, State.PROFILING)

    assert pipeline.provision(job.pk) is True
    assert pipeline.provision(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.PROVISIONING
    assert [n["name"] for n in job.cluster["nodes"]] == ["ps-0", "chief-0", "worker-0", "worker-1"]
    assert list(job.nodes.values_list("name", "role", "index")) == [
        ("ps-0", "ps", 0),
        ("chief-0", "chief", 0),
        ("worker-0", "worker", 0),
        ("worker-1", "worker", 1),
    ]
    assert Path(job.cluster["workdir"]).is_dir()
    assert pipeline.chief_names(job) == {"chief-0"}
    pipeline.cancel(job, "test")  # leave no cluster directory behind
    assert not Path(job.cluster["workdir"]).exists()


@pytest.mark.parametrize("step", ["provision", "bootstrap", "collect"])
def test_step_out_of_order_does_nothing(job, step):
    """A step that finds the job elsewhere than its source state (e.g. cancelled meanwhile) changes nothing."""
    set_state(job, State.CANCELLED)
    count = job.events.count()

    assert pipeline.STEPS[step](job.pk) is False

    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert job.events.count() == count


# --- cancel ---


@pytest.mark.parametrize("state", ACTIVE)
def test_cancel_from_any_active_state(job, state):
    set_state(job, state)

    assert pipeline.cancel(job, by="alice") is True

    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert job.finished_at is not None
    assert events(job)[-1] == (State.CANCELLED, "cancelled by alice")


@pytest.mark.parametrize("state", Job.TERMINAL)
def test_terminal_job_cannot_be_cancelled(job, state):
    set_state(job, state)
    count = job.events.count()

    assert pipeline.cancel(job, by="alice") is False

    job.refresh_from_db()
    assert job.state == state
    assert job.events.count() == count


def test_cancel_tears_down_a_launched_cluster(job):
    set_state(job, State.RUNNING)
    cluster = launch_cluster(job)
    chief = next(n for n in cluster.nodes if n.name == "chief-0")
    (Path(chief.workdir) / "node.log").write_text("step 1\nstep 2\n")
    Node.objects.filter(job=job, name="worker-1").update(status=Node.Status.SUCCEEDED)
    assert Path(cluster.workdir).is_dir()

    assert pipeline.cancel(job, by="alice") is True

    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert not Path(cluster.workdir).exists()
    assert job.cluster is None
    (log,) = job.artifacts.all()
    assert (log.name, log.node.name) == ("logs/chief-0.log", "chief-0")
    with log.file.open("rb") as f:
        assert f.read() == b"step 1\nstep 2\n"
    statuses = dict(job.nodes.values_list("name", "status"))
    assert statuses == {"ps-0": "stopped", "chief-0": "stopped", "worker-0": "stopped", "worker-1": "succeeded"}
    assert events(job)[-1] == (State.CANCELLED, f"cluster {cluster.cluster_id} torn down")


def test_release_runs_once(job):
    set_state(job, State.RUNNING)
    cluster = launch_cluster(job)
    pipeline.cancel(job, by="alice")
    count = job.events.count()

    assert pipeline.release(job.pk) is False

    assert job.events.count() == count
    assert not Path(cluster.workdir).exists()


# --- watch, fail, collect ---


def test_watch_fails_job_whose_node_is_gone(job):
    """Every node of a launched-but-never-started cluster has pid None: alive() says none is running."""
    job = make_job(job.owner, job.bundle, job.dataset, strategy=Job.Strategy.MIRRORED, workers=1)
    set_state(job, State.RUNNING, started_at=timezone.now())
    cluster = launch_cluster(job, strategy="mirrored", workers=1)
    (chief,) = cluster.nodes
    assert chief.pid is None
    (Path(chief.workdir) / "node.log").write_text("epoch 1\nKilled\n")

    assert pipeline.watch(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "worker-0 stopped without reporting a result; its log ends:\nepoch 1\nKilled\n"
    assert not Path(cluster.workdir).exists()


def test_watch_blames_only_nodes_without_a_result(job):
    set_state(job, State.RUNNING, started_at=timezone.now())
    cluster = launch_cluster(job)
    Node.objects.filter(job=job, name__in=["ps-0", "chief-0"]).update(status=Node.Status.SUCCEEDED)

    assert pipeline.watch(job.pk) is False

    job.refresh_from_db()
    assert job.failure_reason == "worker-0 stopped without reporting a result"
    assert not Path(cluster.workdir).exists()


def test_watch_keeps_watching_while_nodes_are_alive(job):
    set_state(job, State.RUNNING, started_at=timezone.now())
    cluster = launch_cluster(job)

    with mock.patch("provisioner.alive", return_value={n.name: True for n in cluster.nodes}):
        assert pipeline.watch(job.pk) is True

    job.refresh_from_db()
    assert job.state == State.RUNNING
    pipeline.cancel(job, by="test")


def test_watch_times_out_a_long_job(job, settings):
    settings.FC2_JOB_TIMEOUT_S = 60
    set_state(job, State.RUNNING, started_at=timezone.now() - timedelta(seconds=61))

    assert pipeline.watch(job.pk) is False

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "timed out after 60 s")


@pytest.mark.parametrize("state", [State.QUEUED, State.COLLECTING, State.SUCCEEDED, State.CANCELLED])
def test_watch_ignores_a_job_not_running(job, state):
    set_state(job, state)

    assert pipeline.watch(job.pk) is False

    job.refresh_from_db()
    assert job.state == state


def test_fail_keeps_the_first_reason(job):
    assert pipeline.fail(job, "first") is True
    assert pipeline.fail(job, "second") is False

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "first")


def test_complete_then_collect_succeeds_and_tears_down(job):
    set_state(job, State.RUNNING, started_at=timezone.now())
    cluster = launch_cluster(job)

    assert pipeline.complete(job) is True
    assert pipeline.complete(job) is False
    assert pipeline.collect(job.pk) is True
    assert pipeline.collect(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.SUCCEEDED
    assert job.progress_percent == 100
    assert not Path(cluster.workdir).exists()
    assert [state for state, _ in events(job)][-3:] == ["collecting", "collecting", "succeeded"]


# --- advance: the Celery driver ---


def test_advance_turns_an_exception_into_a_failed_job(job):
    def broken(job_id, **_):
        raise OSError("disk full")

    with mock.patch.dict(pipeline.STEPS, {"profile": broken}):
        pipeline.advance("profile", job.pk)

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "profile failed: disk full"
    assert events(job)[-1] == (State.FAILED, "profile failed: disk full")


def celery_job(job: Job) -> Job:
    Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY)
    job.refresh_from_db()
    return job


@pytest.mark.parametrize(
    ("step", "next_step", "countdown"),
    [
        ("profile", "provision", None),
        ("provision", "bootstrap", None),
        ("bootstrap", "watch", 2),
        ("watch", "watch", 2),
    ],
)
def test_advance_queues_the_next_step_on_commit(
    job, settings, django_capture_on_commit_callbacks, step, next_step, countdown
):
    settings.FC2_WATCH_INTERVAL_S = 2
    celery_job(job)

    with (
        mock.patch.dict(pipeline.STEPS, {step: lambda job_id, **_: True}),
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True),
    ):
        pipeline.advance(step, job.pk)

    (sent,) = send_task.call_args_list
    assert sent.args == (f"fc2.tasks.{next_step}",)
    assert (sent.kwargs["args"], sent.kwargs.get("countdown")) == ([job.pk], countdown)


@pytest.mark.parametrize("step", ["profile", "collect"])
def test_advance_stops_when_the_step_did_nothing(job, django_capture_on_commit_callbacks, step):
    celery_job(job)

    with (
        mock.patch.dict(pipeline.STEPS, {step: lambda job_id, **_: False}),
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True),
    ):
        pipeline.advance(step, job.pk)

    send_task.assert_not_called()


def test_inline_jobs_send_no_tasks(job, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        pipeline.advance("profile", job.pk)

    assert job.driver == Job.Driver.INLINE
    assert callbacks == []
