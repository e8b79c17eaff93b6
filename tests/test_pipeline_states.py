"""The job state machine: each step claims its transition once, under the job's lease; cancel ends any job that has
not finished training and answers before the teardown; failures are recorded.

No TensorFlow and no node processes: clusters come from `provisioner.local.launch`, which only makes directories.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.utils import timezone

import provisioner
from fc2 import tasks
from fc2.celery import app as celery_app
from fc2.models import Job, JobEvent, Node
from fc2.services import inline, jobs, pipeline
from harness.wheels import GOOD, make_wheel
from monitor import agent
from provisioner import local
from provisioner.errors import TransientProvisionError
from tests.conftest import launch_cluster
from tests.helpers import plan_as_asked

State = Job.State
CANCELLABLE = [s for s in State.values if s not in Job.TERMINAL and s != State.COLLECTING]


@pytest.fixture(autouse=True)
def _private_clusters(settings, tmp_path):
    """Each test its own cluster directory, so a `fc2-job-<pk>` left by another test is never reused."""
    settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "clusters"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def set_state(job: Job, state: str, **fields) -> Job:
    Job.objects.filter(pk=job.pk).update(state=state, **{**plan_as_asked(job), **fields})
    job.refresh_from_db()
    return job


def step_runs(step: str, run):
    """The pipeline's `step` run by `run` instead, for the block."""
    return mock.patch.dict(pipeline.STEPS, {step: dataclasses.replace(pipeline.STEPS[step], run=run)})


def events(job: Job) -> list[tuple[str, str]]:
    return list(job.events.values_list("state", "message"))


# --- claiming a transition ---


def test_transition_claims_once(job):
    second_actor = Job.objects.get(pk=job.pk)  # e.g. a redelivered task, with its own copy of the row
    before = timezone.now()

    first = job.transition(State.QUEUED, State.RECOMMENDING, "choosing the cluster")
    second = second_actor.transition(State.QUEUED, State.RECOMMENDING, "choosing the cluster")

    assert (first, second) == (True, False)
    assert second_actor.state == State.QUEUED  # the loser's copy is not changed either
    job.refresh_from_db()
    assert job.state == State.RECOMMENDING
    (event,) = job.events.filter(state=State.RECOMMENDING)
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
    path = [State.RECOMMENDING, State.PROVISIONING, State.BOOTSTRAPPING, State.RUNNING, State.COLLECTING]
    path.append(State.SUCCEEDED)
    source = State.QUEUED
    for target in path:
        assert job.transition(source, target, f"to {target}")
        assert not job.transition(source, target, "again")
        source = target

    assert events(job)[1:] == [(target, f"to {target}") for target in path]


def test_redelivered_recommend_does_nothing(job):
    assert pipeline.recommend(job.pk) is True
    count = JobEvent.objects.filter(job=job).count()

    assert pipeline.recommend(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.RECOMMENDING
    assert JobEvent.objects.filter(job=job).count() == count
    assert job.events.filter(state=State.RECOMMENDING, message="choosing the cluster").count() == 1


def test_provision_makes_nodes_once(job):
    set_state(job, State.RECOMMENDING)

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
    pipeline.cancel(job, "test")
    pipeline.release(job.pk)  # leave no cluster directory behind
    assert not Path(job.cluster["workdir"]).exists()


def test_provision_cancelled_while_launching_keeps_the_cluster_recorded_for_release(job):
    """What a step made is recorded before it looks whether the job is still its own, so that release finds it."""
    set_state(job, State.RECOMMENDING)
    launch = local.launch

    def launch_while_cancelled(spec, notify=None):
        Job.objects.filter(pk=job.pk).update(state=State.CANCELLED)
        return launch(spec, notify)

    with mock.patch("provisioner.launch", launch_while_cancelled):
        assert pipeline.provision(job.pk) is False

    job.refresh_from_db()
    assert job.cluster is not None and job.state_label == "cancelling"
    assert not job.nodes.exists()
    assert pipeline.release(job.pk) is True
    assert not Path(job.cluster["workdir"]).exists()


@pytest.mark.parametrize("step", ["provision", "bootstrap", "collect"])
def test_step_out_of_order_does_nothing(job, step):
    """A step that finds the job elsewhere than its source state (e.g. cancelled meanwhile) changes nothing."""
    set_state(job, State.CANCELLED)
    count = job.events.count()

    assert pipeline.STEPS[step].run(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert job.events.count() == count


# --- cancel ---


@pytest.mark.parametrize("state", CANCELLABLE)
def test_cancel_from_any_state_before_collecting(job, state):
    set_state(job, state)

    assert pipeline.cancel(job, by="alice") is True

    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert job.finished_at is not None
    assert events(job)[-1] == (State.CANCELLED, "cancelled by alice")


def test_a_collecting_job_is_not_cancelled(job):
    """Collecting means the chief has succeeded and its results are stored: the job can only succeed now."""
    set_state(job, State.COLLECTING)

    assert pipeline.cancel(job, by="alice") is False

    job.refresh_from_db()
    assert job.state == State.COLLECTING
    assert pipeline.collect(job.pk) is True
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED


@pytest.mark.parametrize("state", Job.TERMINAL)
def test_terminal_job_cannot_be_cancelled(job, state):
    set_state(job, state)
    count = job.events.count()

    assert pipeline.cancel(job, by="alice") is False

    job.refresh_from_db()
    assert job.state == state
    assert job.events.count() == count


def test_cancel_answers_before_the_teardown_then_release_tears_down(job):
    set_state(job, State.RUNNING)
    cluster = launch_cluster(job)
    chief = next(n for n in cluster.nodes if n.name == "chief-0")
    (Path(chief.workdir) / "node.log").write_text("step 1\nstep 2\n")
    Node.objects.filter(job=job, name="worker-1").update(status=Node.Status.SUCCEEDED)
    assert Path(cluster.workdir).is_dir()

    assert pipeline.cancel(job, by="alice") is True

    job.refresh_from_db()
    assert (job.state, job.state_label, job.tearing_down) == (State.CANCELLED, "cancelling", True)
    assert Path(cluster.workdir).is_dir()

    assert pipeline.release(job.pk) is True

    job.refresh_from_db()
    assert job.state_label == State.CANCELLED
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
    assert pipeline.release(job.pk) is True
    count = job.events.count()

    assert pipeline.release(job.pk) is False

    assert job.events.count() == count
    assert not Path(cluster.workdir).exists()


# --- fail, collect, release ---


def test_fail_keeps_the_first_reason(job):
    assert pipeline.fail(job, "first") is True
    assert pipeline.fail(job, "second") is False

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "first")


def test_complete_then_collect_succeeds_before_the_teardown(job):
    set_state(job, State.RUNNING, started_at=timezone.now())
    cluster = launch_cluster(job)
    (Path(cluster.nodes[0].workdir) / "node.log").write_text("serving\n")

    assert pipeline.complete(job) is True
    assert pipeline.complete(job) is False
    assert pipeline.collect(job.pk) is True
    assert pipeline.collect(job.pk) is False

    job.refresh_from_db()
    assert job.state == State.SUCCEEDED
    assert job.progress_percent == 100
    assert list(job.artifacts.values_list("name", flat=True)) == ["logs/ps-0.log"]  # kept before the teardown
    assert Path(cluster.workdir).is_dir() and job.tearing_down and job.state_label == State.SUCCEEDED
    assert pipeline.release(job.pk) is True
    assert not Path(cluster.workdir).exists()
    assert [state for state, _ in events(job)][-3:] == ["collecting", "succeeded", "succeeded"]


def test_release_keeps_the_cluster_recorded_until_the_teardown_succeeds(job):
    set_state(job, State.FAILED)
    cluster = launch_cluster(job)

    with mock.patch("provisioner.teardown", side_effect=OSError("cloud API down")), pytest.raises(OSError):
        pipeline.release(job.pk)

    job.refresh_from_db()
    assert job.cluster["cluster_id"] == cluster.cluster_id and job.lease_until is None  # for the next try, by anyone
    assert pipeline.release(job.pk) is True
    assert not Path(cluster.workdir).exists()


def test_release_leaves_a_job_whose_lease_is_held_to_its_holder(job):
    """A step still running (it holds the lease) may still be making the cluster: it releases the job when it ends."""
    set_state(job, State.CANCELLED)
    cluster = launch_cluster(job)
    holder = pipeline.Lease.claim(job.pk)

    assert pipeline.release(job.pk) is False
    assert Path(cluster.workdir).is_dir()

    assert pipeline.release(job.pk, holder) is True
    assert not Path(cluster.workdir).exists()


def test_release_never_tears_down_an_active_job(job):
    set_state(job, State.RUNNING)
    cluster = launch_cluster(job)

    assert pipeline.release(job.pk) is False

    assert Path(cluster.workdir).is_dir()
    pipeline.cancel(job, by="test")
    pipeline.release(job.pk)


def test_bootstrap_cancelled_while_starting_leaves_no_cluster_directory(job, settings):
    """The nodes being started when the job is cancelled are found and torn down by the step's own runner, after the
    start: never a teardown that the start then undoes by making the directory again."""
    set_state(job, State.PROVISIONING)
    cluster = launch_cluster(job)
    started = dataclasses.replace(cluster, nodes=tuple(dataclasses.replace(n, pid=None) for n in cluster.nodes))

    def start_while_cancelled(cluster, run):
        assert pipeline.cancel(Job.objects.get(pk=job.pk), by="alice")
        assert pipeline.release(job.pk) is False  # the cancel's release task: the bootstrap holds the job
        Path(cluster.workdir).mkdir(exist_ok=True)
        return started

    with (
        mock.patch("provisioner.bootstrap", start_while_cancelled),
        mock.patch.object(celery_app, "send_task"),
    ):
        pipeline.advance("bootstrap", celery_job(job).pk)

    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.cluster is None and job.lease_until is None
    assert not Path(cluster.workdir).exists()


# --- leases ---


def test_a_lease_is_claimed_once_and_changes_only_through_its_holder(job, settings):
    first = pipeline.Lease.claim(job.pk)
    assert first is not None and pipeline.Lease.claim(job.pk) is None
    seen = first.until

    assert first.renew() and first.until > seen
    assert pipeline.Lease.take(job.pk, seen) is None  # an old value (a stale message) takes nothing

    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))  # it expired
    second = pipeline.Lease.claim(job.pk)
    assert second is not None
    assert not first.renew() and first.lost  # the first holder learns it lost the job
    first.end()
    assert Job.objects.get(pk=job.pk).lease_until == second.until

    handed = second.hand_over()
    assert handed is not None and not second.held
    assert pipeline.Lease.take(job.pk, handed) is not None  # the message's step takes it


@pytest.mark.django_db(transaction=True)  # the heartbeat thread has a connection of its own
def test_a_lease_is_renewed_while_its_holder_works(job, settings):
    settings.FC2_LEASE_S = 0.3
    lease = pipeline.Lease.claim(job.pk)
    first = lease.until

    with lease.renewing():
        time.sleep(0.5)
        assert lease.until > first

    lease.end()
    assert Job.objects.get(pk=job.pk).lease_until is None


# --- advance: the Celery driver ---


def test_advance_turns_an_exception_into_a_failed_job(job):
    def broken(job_id, **_):
        raise OSError("disk full")

    with step_runs("recommend", broken):
        pipeline.advance("recommend", job.pk)

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "recommend failed: disk full"
    assert events(job)[-1] == (State.FAILED, "recommend failed: disk full")
    assert job.lease_until is None


def celery_job(job: Job) -> Job:
    Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY)
    job.refresh_from_db()
    return job


@pytest.mark.parametrize(("step", "next_step"), [("recommend", "provision"), ("provision", "bootstrap")])
def test_advance_hands_the_lease_to_the_next_step(job, settings, django_capture_on_commit_callbacks, step, next_step):
    settings.FC2_STEP_PICKUP_S = 60
    celery_job(job)

    with (
        step_runs(step, lambda job_id, **_: True),
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True),
    ):
        pipeline.advance(step, job.pk)

    (sent,) = send_task.call_args_list
    assert sent.args == (f"fc2.tasks.{next_step}",)
    assert sent.kwargs["args"] == [job.pk]
    job.refresh_from_db()
    handed = datetime.fromisoformat(sent.kwargs["kwargs"]["lease"])
    assert job.lease_until == handed
    assert timedelta(seconds=59) < handed - timezone.now() <= timedelta(seconds=60)


def test_a_step_whose_message_was_replaced_does_nothing(job, django_capture_on_commit_callbacks):
    """The sweep sent the step again (a new lease): the first message, turning up late, must not run it too."""
    celery_job(job)
    with mock.patch.object(celery_app, "send_task") as send_task, django_capture_on_commit_callbacks(execute=True):
        pipeline.enqueue(job, "recommend")
        pipeline.enqueue(job, "recommend")
    (first, second) = (call.kwargs["kwargs"]["lease"] for call in send_task.call_args_list)
    ran = []

    with (
        step_runs("recommend", lambda job_id, **_: ran.append(job_id)),
        mock.patch.object(celery_app, "send_task"),
    ):
        pipeline.advance("recommend", job.pk, first)
        assert ran == []
        pipeline.advance("recommend", job.pk, second)
        assert ran == [job.pk]


@pytest.mark.parametrize("step", ["recommend", "collect"])
def test_advance_stops_when_the_step_did_nothing(job, django_capture_on_commit_callbacks, step):
    celery_job(job)

    with (
        step_runs(step, lambda job_id, **_: False),
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True),
    ):
        pipeline.advance(step, job.pk)

    send_task.assert_not_called()
    assert Job.objects.get(pk=job.pk).lease_until is None


def test_inline_jobs_send_no_tasks(job, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        pipeline.advance("recommend", job.pk)

    assert job.driver == Job.Driver.INLINE
    assert callbacks == []


def test_the_cancel_button_answers_for_a_collecting_job_without_cancelling_it(client, alice, job):
    set_state(job, State.COLLECTING)
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)

    assert "Cancel job" not in page
    assert f"Job {job.pk} has finished training; its results are being collected." in response.content.decode()
    job.refresh_from_db()
    assert job.state == State.COLLECTING


def test_release_keeps_the_report_of_a_node_that_finished_after_its_job_ended(job):
    """Mirrored worker 1 finished after the chief had ended the job: its report was refused (409), but the result its
    agent kept on the node is kept before the teardown — its outputs, and on its record its status, exit code, log
    tail and last samples (not "stopped" by the teardown, as a node that never finished is)."""
    cluster = launch_cluster(job, strategy="mirrored", workers=2)
    succeeded = {"status": "succeeded", "exit_code": 0, "log_tail": "epoch 2\nsent 31457280"}
    outputs = {"outputs": [{"file": "0", "path": "x.txt", "size": 1}]}
    samples = {"samples": [{"at": 1.8e9, "bytes_sent": 10}, {"at": 1.8e9 + 1, "bytes_sent": 31_500_000}]}
    agent.keep_result(Path(cluster.nodes[1].workdir) / "result", {**succeeded, **outputs, **samples}, {"0": b"1"})
    # The chief's report arrived (its files are stored from it): what it kept is not stored again.
    outputs = {"outputs": [{"file": "0", "path": "y", "size": 1}]}
    agent.keep_result(Path(cluster.nodes[0].workdir) / "result", {**succeeded, **outputs}, {"0": b"2"})
    set_state(job, State.SUCCEEDED)
    Node.objects.filter(job=job, name="worker-0").update(status=Node.Status.SUCCEEDED)

    assert pipeline.release(job.pk) is True

    assert list(job.artifacts.values_list("name", flat=True)) == ["worker-1/x.txt"]
    with job.artifacts.get().file.open("rb") as stored:
        assert stored.read() == b"1"
    late = job.nodes.get(name="worker-1")
    assert (late.status, late.exit_code, late.log_tail) == (Node.Status.SUCCEEDED, 0, "epoch 2\nsent 31457280")
    assert [s.bytes_sent for s in late.samples.order_by("measured_at")] == [10, 31_500_000]
    assert not Path(cluster.workdir).exists()


def test_release_keeps_no_invalid_late_report_and_still_tears_down(job):
    """A node's kept result is the node's word, not the platform's: one that is no valid report is a line on the
    timeline, the node is stopped with the rest, and the cluster goes."""
    cluster = launch_cluster(job, strategy="mirrored", workers=2)
    agent.keep_result(Path(cluster.nodes[1].workdir) / "result", {"status": "succeeded", "exit_code": "zero"}, {})
    set_state(job, State.SUCCEEDED)
    Node.objects.filter(job=job, name="worker-0").update(status=Node.Status.SUCCEEDED)

    assert pipeline.release(job.pk) is True

    assert job.nodes.get(name="worker-1").status == Node.Status.STOPPED
    assert any("worker-1: the result kept on the node is no valid report" in m for _, m in events(job))
    assert not job.artifacts.exists() and not Path(cluster.workdir).exists()


def test_every_state_is_either_active_or_terminal_never_both():
    assert sorted(Job.ACTIVE + Job.TERMINAL) == sorted(Job.State.values)
    assert not set(Job.ACTIVE) & set(Job.TERMINAL)


def flaky(failures: int):
    """A step's run that fails transiently `failures` times (a cloud API throttling), then succeeds; its calls."""
    calls: list[dict] = []

    def run(job_id, **kwargs):
        calls.append(kwargs)
        if len(calls) <= failures:
            raise TransientProvisionError("RequestLimitExceeded: throttled")
        return True

    run.calls = calls
    return run


def test_a_transient_failure_is_retried_by_celery_with_the_lease_handed_on(job, django_capture_on_commit_callbacks):
    """No worker sleeps: the task's retry (run at once here: `apply`) carries the step again, with the job's lease and
    the next attempt."""
    celery_job(set_state(job, State.RECOMMENDING))
    run = flaky(failures=2)

    with (
        step_runs("provision", run),
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True),
    ):
        tasks.STEP_TASKS["provision"].apply(args=[job.pk])

    assert [call.get("resume", False) for call in run.calls] == [False, True, True]
    messages = [message for _, message in events(job)]
    assert sum("provision: RequestLimitExceeded: throttled — trying again in" in m for m in messages) == 2
    assert "(attempt 3)" in messages[-1]
    assert [call.args[0] for call in send_task.call_args_list] == ["fc2.tasks.bootstrap"]
    job.refresh_from_db()
    assert job.lease_until is not None  # handed to the bootstrap message


def test_a_step_failing_transiently_past_its_attempts_fails_the_job(job, settings):
    settings.FC2_STEP_ATTEMPTS = 2
    celery_job(set_state(job, State.RECOMMENDING))

    with step_runs("provision", flaky(failures=5)), mock.patch.object(celery_app, "send_task"):
        tasks.STEP_TASKS["provision"].apply(args=[job.pk])

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "provision failed: RequestLimitExceeded: throttled"


@pytest.mark.django_db(transaction=True)
def test_the_inline_driver_retries_a_transient_failure_itself(alice, digits, tmp_path):
    """`submit_job --inline` has no Celery: its own process waits and runs the step again (attempt 2, resumed)."""
    wheel = make_wheel(tmp_path, {**GOOD, "demo/main.py": b"print('trained')\n"})
    with wheel.open("rb") as upload:
        job = jobs.submit_upload(
            alice, upload, wheel.name, "demo/main.py", dataset=digits, driver=Job.Driver.INLINE,
            strategy="mirrored", workers=1,
        )  # fmt: skip
    real = provisioner.launch
    calls = []

    def throttled_once(spec, **kwargs):  # the cloud's API, throttling the first launch
        calls.append(spec.cluster_id)
        if len(calls) == 1:
            raise TransientProvisionError("RequestLimitExceeded: throttled")
        return real(spec, **kwargs)

    with mock.patch("provisioner.launch", throttled_once):
        job = inline.run_inline(job.pk)

    assert job.state == State.SUCCEEDED, job.failure_reason
    assert len(calls) == 2 and calls[0] == calls[1]  # the same cluster, launched again
    assert job.events.filter(message__contains="trying again in 2 s (attempt 2)").count() == 1


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals reach the main thread")
@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)])
def test_an_interrupt_python_swallowed_is_raised_again_by_the_runners_check(signum, raised):
    """The inline runner's Ctrl-C or `kill`, even with SIGINT ignored by the parent and its exception swallowed where
    Python drops it (a destructor, a garbage-collector callback): the next `check()` raises it, and the process's own
    handlers come back afterwards."""
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a parent that ignores Ctrl-C leaves it
    try:
        with inline.Interrupts() as interrupts:
            interrupts.check()  # nothing received: nothing raised
            with contextlib.suppress(raised):  # swallowed, as in a destructor
                signal.raise_signal(signum)
            with pytest.raises(raised) as stopped:
                interrupts.check()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, ignored)
    if raised is SystemExit:
        assert stopped.value.code == 128 + signum  # the status a process killed by the signal has
