"""The sweep (fc2/services/sweep.py): what becomes of a job whose worker was lost, at each step, and of running jobs
whose nodes went quiet — without TensorFlow or node processes (clusters are `provisioner.local.launch` directories;
whether nodes are alive, and what they kept, is patched at the provisioner's interface). tests/test_faults.py kills real
workers.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fc2.celery import app as celery_app
from fc2.models import Job, Node
from fc2.services import pipeline, sweep
from provisioner import ClusterSpec, NodeError, NodeResult, local
from tests.conftest import launch_cluster, make_job
from tests.helpers import plan_as_asked

State = Job.State
LONG_AGO = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _timings(settings, tmp_path):
    settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "clusters"
    settings.FC2_STEP_PICKUP_S = 60
    settings.FC2_NODE_SILENCE_S = 20
    settings.FC2_STEP_RESENDS = 2


@pytest.fixture
def sent():
    """The tasks sent to the workers meanwhile, as [(task name, args, kwargs)], sent at once rather than on commit (this
    test's transaction never commits)."""
    calls: list[tuple[str, list, dict]] = []

    def send_task(name, args, kwargs, queue):
        calls.append((name, args, kwargs))

    with (
        mock.patch.object(celery_app, "send_task", send_task),
        mock.patch.object(transaction, "on_commit", lambda func, *args, **kwargs: func()),
    ):
        yield calls


def lost(job: Job, state: str, **fields) -> Job:
    """The job at `state`, driven by the workers, whose lease expired a while ago: its worker (or message) is gone."""
    fields = {"lease_until": timezone.now() - timedelta(seconds=5), **plan_as_asked(job), **fields}
    Job.objects.filter(pk=job.pk).update(state=state, driver=Job.Driver.CELERY, **fields)
    job.refresh_from_db()
    return job


def alive(**nodes: bool):
    return mock.patch("provisioner.alive", return_value=nodes)


def silent(job: Job, *names: str) -> None:
    """These nodes' last report is older than FC2_NODE_SILENCE_S: the sweep looks at their machines."""
    quiet = timezone.now() - timedelta(seconds=settings.FC2_NODE_SILENCE_S + 1)
    Node.objects.filter(job=job, name__in=names).update(last_report_at=quiet)


def kept(**results: NodeResult):
    return mock.patch("provisioner.fetch_results", return_value=results)


def messages(job: Job) -> list[str]:
    return list(job.events.values_list("message", flat=True))


# --- a step whose worker was lost ---


def test_a_queued_job_nobody_picked_up_is_sent_again_once(job, sent):
    lost(job, State.QUEUED)

    assert sweep.sweep() == 1
    assert sweep.sweep() == 0  # the step sent again holds the lease until it is picked up

    ((name, args, kwargs),) = sent
    assert (name, args) == ("fc2.tasks.recommend", [job.pk])
    assert "resume" not in kwargs
    job.refresh_from_db()
    assert job.lease_until == datetime.fromisoformat(kwargs["lease"]) > timezone.now()
    assert messages(job)[-1] == "no worker started the job within 60 s: recommend sent again"


@pytest.mark.parametrize(
    ("state", "step"),
    [(State.RECOMMENDING, "recommend"), (State.PROVISIONING, "provision"), (State.COLLECTING, "collect")],
)
def test_a_lost_step_that_is_safe_to_redo_is_resumed(job, sent, state, step):
    lost(job, state)

    sweep.sweep()

    ((name, args, kwargs),) = sent
    assert (name, args, kwargs["resume"]) == (f"fc2.tasks.{step}", [job.pk], True)
    job.refresh_from_db()
    assert job.state == state
    assert messages(job)[-1] == f"the worker running {step} was lost: {step} sent again"


def test_a_resumed_provision_finds_the_cluster_the_lost_one_launched(job, sent):
    job = lost(job, State.PROVISIONING)
    first = local.launch(ClusterSpec(pipeline.cluster_name(job), "local", job.strategy, job.workers))
    sweep.sweep()
    ((_, _, kwargs),) = sent

    pipeline.advance("provision", job.pk, **kwargs)

    job.refresh_from_db()
    assert [node["port"] for node in job.cluster["nodes"]] == [node.port for node in first.nodes]
    assert job.nodes.count() == len(first.nodes)
    assert sent[-1][0] == "fc2.tasks.bootstrap"
    pipeline.cancel(job, by="test")
    pipeline.release(job.pk)


def test_a_lost_bootstrap_fails_the_job_and_tears_its_cluster_down(job, sent):
    lost(job, State.BOOTSTRAPPING)
    cluster = launch_cluster(job, workers=1)

    sweep.sweep()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "the worker running bootstrap was lost")
    assert job.cluster is None and job.lease_until is None
    assert not Path(cluster.workdir).exists()


def test_a_step_lost_again_and_again_fails_the_job(job, sent):
    for _ in range(2):
        lost(job, State.RECOMMENDING)
        sweep.sweep()
    lost(job, State.RECOMMENDING)

    sweep.sweep()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "the worker running recommend was lost")
    assert [name for name, _, _ in sent] == ["fc2.tasks.recommend", "fc2.tasks.recommend", "fc2.tasks.release"]


def test_a_step_whose_lease_is_renewed_is_left_alone(job, sent):
    Job.objects.filter(pk=job.pk).update(
        state=State.PROVISIONING, driver=Job.Driver.CELERY, lease_until=timezone.now() + timedelta(seconds=20)
    )

    assert sweep.sweep() == 0

    assert sent == []


def test_a_just_submitted_inline_job_is_not_taken_for_a_lost_one(job, sent):
    assert job.driver == Job.Driver.INLINE and job.lease_until is None

    assert sweep.sweep() == 0

    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - LONG_AGO)
    assert sweep.sweep() == 1
    job.refresh_from_db()
    assert job.driver == Job.Driver.CELERY  # its process never claimed it: the workers take it over
    assert sent[0][0] == "fc2.tasks.recommend"


def test_an_inline_job_whose_process_died_is_adopted_by_the_workers(job, sent):
    Job.objects.filter(pk=job.pk).update(state=State.PROVISIONING, lease_until=timezone.now() - timedelta(seconds=1))

    sweep.sweep()

    job.refresh_from_db()
    assert job.driver == Job.Driver.CELERY
    assert "the process running this job (submit_job --inline) is gone" in messages(job)[-2]
    assert sent[0][:2] == ("fc2.tasks.provision", [job.pk])


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_handle_a_job_once(alice, bundle, digits, settings):
    jobs = [lost(make_job(alice, bundle, digits), State.RECOMMENDING) for _ in range(3)]
    handled: list[int] = []
    start = threading.Barrier(2)

    def slow_reconcile(job, lease):
        handled.append(job.pk)
        time.sleep(0.2)  # both sweeps are looking at the same jobs meanwhile

    def one_sweep():
        start.wait()
        sweep.sweep()

    with mock.patch.object(sweep, "reconcile", slow_reconcile):
        threads = [threading.Thread(target=one_sweep) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert sorted(handled) == sorted(job.pk for job in jobs)


# --- running jobs: nodes gone, silent, or whose result never arrived ---


def test_a_running_job_whose_node_is_gone_without_a_result_fails_with_its_log(job, sent):
    job = lost(job, State.RUNNING, started_at=timezone.now(), lease_until=None)
    cluster = launch_cluster(job, strategy="mirrored", workers=1)
    (node,) = cluster.nodes
    (Path(node.workdir) / "node.log").write_text("epoch 1\nKilled\n")
    silent(job, node.name)

    with alive(**{node.name: False}), kept():
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "worker-0 stopped without reporting a result; its log ends:\nepoch 1\nKilled\n"
    assert job.cluster is None and not Path(cluster.workdir).exists()
    assert job.artifacts.get().name == "logs/worker-0.log"


def test_only_nodes_without_a_result_are_blamed(job):
    job = lost(job, State.RUNNING, started_at=timezone.now(), lease_until=None)
    launch_cluster(job, workers=2)
    Node.objects.filter(job=job, name__in=["ps-0", "worker-1"]).update(status=Node.Status.SUCCEEDED)
    silent(job, "worker-0")

    with alive(), kept():
        sweep.check_running(job)

    job.refresh_from_db()
    assert job.failure_reason == "worker-0 stopped without reporting a result"


def test_a_running_job_whose_nodes_are_alive_and_reporting_is_left_running(job, sent):
    job = lost(job, State.RUNNING, started_at=timezone.now(), lease_until=None)
    cluster = launch_cluster(job, workers=1)

    with alive(**{n.name: True for n in cluster.nodes}) as is_alive, kept() as fetch_results:
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.RUNNING and job.lease_until is None
    # Nothing to look for: every node reported a moment ago (their reports are the heartbeat; no SSH to the nodes).
    fetch_results.assert_not_called()
    is_alive.assert_not_called()


def test_a_chief_whose_success_never_arrived_completes_the_job_with_its_model(job, sent):
    """The platform was down when training ended; the agent gave up, or died: its kept result is the job's result."""
    job = lost(job, State.RUNNING, started_at=timezone.now(), lease_until=None)
    cluster = launch_cluster(job, workers=1)
    result = NodeResult(
        report={"status": "succeeded", "exit_code": 0, "progress": {"epoch": 1, "epochs": 1}, "log_tail": "done"},
        files={"model.keras": b"weights", "metrics.json": b'{"test_accuracy": 0.975}'},
    )

    silent(job, "chief-0")

    with alive(**{n.name: n.role != "chief" for n in cluster.nodes}), kept(**{"chief-0": result}):
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.COLLECTING
    assert {"model.keras", "metrics.json"} <= set(job.artifacts.values_list("name", flat=True))
    assert job.metrics == {"test_accuracy": 0.975}
    assert job.nodes.get(name="chief-0").status == Node.Status.SUCCEEDED
    assert "chief-0 succeeded; its report never arrived: the result kept on the node was fetched" in messages(job)
    assert sent[-1][0] == "fc2.tasks.collect"


def test_a_silent_node_whose_agent_is_alive_is_waited_for(job, sent, settings):
    """Its agent could not reach the platform and keeps trying until the job's deadline: not a failure."""
    job = lost(job, State.RUNNING, started_at=timezone.now() - LONG_AGO, lease_until=None)
    cluster = launch_cluster(job, workers=1)
    Node.objects.filter(job=job).update(last_report_at=timezone.now() - timedelta(minutes=5))

    with alive(**{n.name: True for n in cluster.nodes}), kept() as fetch_results:
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.RUNNING
    fetch_results.assert_called_once()  # looked for a kept result: none yet


@pytest.mark.parametrize("reachable", [True, False], ids=["agent-alive", "machine-unreachable"])
def test_a_node_silent_past_the_lost_limit_fails_the_job_by_name_and_is_torn_down(job, sent, settings, reachable):
    """Alive but unable to reach the platform, or on a machine nobody can reach: after FC2_NODE_LOST_S the job fails
    naming the node, and its cluster goes — no hang until the time limit."""
    settings.FC2_NODE_LOST_S = 240
    job = lost(job, State.RUNNING, started_at=timezone.now() - LONG_AGO, lease_until=None)
    cluster = launch_cluster(job, workers=1)
    Node.objects.filter(job=job).update(last_report_at=timezone.now())
    Node.objects.filter(job=job, name="worker-0").update(last_report_at=timezone.now() - timedelta(minutes=5))
    answer = (
        alive(**{n.name: True for n in cluster.nodes})
        if reachable
        else mock.patch("provisioner.alive", side_effect=NodeError("worker-0", "ssh: connection timed out"))
    )

    with answer, kept():
        sweep.sweep()
        sweep.sweep()  # the release it sent

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason.startswith("worker-0 has not reported for 300 s")
    assert ("its agent is running" if reachable else "it cannot be reached") in job.failure_reason
    assert job.cluster is None and not Path(cluster.workdir).exists()


@pytest.mark.parametrize(("quiet_s", "ends"), [(30, False), (50, True)])
def test_a_node_whose_machine_does_not_answer_is_lost_once_silent_long_enough(job, sent, settings, quiet_s, ends):
    """Its host gone or its link cut: after FC2_NODE_UNREACHABLE_S of silence (not FC2_NODE_LOST_S) the job fails
    naming it; the other nodes' machines answer as usual."""
    settings.FC2_NODE_UNREACHABLE_S = 40
    job = lost(job, State.RUNNING, started_at=timezone.now() - LONG_AGO, lease_until=None)
    cluster = launch_cluster(job, workers=1)
    Node.objects.filter(job=job, name="worker-0").update(last_report_at=timezone.now() - timedelta(seconds=quiet_s))

    answers = alive(**{n.name: None if n.name == "worker-0" else True for n in cluster.nodes})
    logs = mock.patch("provisioner.fetch_logs", return_value={})
    with answers, kept() as fetch_results, logs as fetch_logs:
        sweep.sweep()
        sweep.sweep()  # the release it sent

    job.refresh_from_db()
    # Its machine, which did not answer, is not asked for a kept result or its log, by the look or by the release
    # (on aws another 10 s of SSH timeout each)
    read = [call.args[0] for call in [*fetch_results.call_args_list, *fetch_logs.call_args_list]]
    assert all("worker-0" not in [node.name for node in each.nodes] for each in read)
    if not ends:
        assert job.state == State.RUNNING and not read
        return
    assert job.state == State.FAILED
    assert job.failure_reason.startswith("worker-0 is lost: its machine does not answer and it has not reported for")
    assert job.cluster is None and not Path(cluster.workdir).exists()
    assert fetch_logs.call_count == 1  # the others' logs are kept


def test_a_silent_node_whose_command_ended_has_its_kept_result_applied(job, sent):
    job = lost(job, State.RUNNING, started_at=timezone.now() - LONG_AGO, lease_until=None)
    cluster = launch_cluster(job, strategy="mirrored", workers=1)
    Node.objects.filter(job=job).update(last_report_at=timezone.now() - timedelta(minutes=5))
    failed = NodeResult(report={"status": "failed", "exit_code": 3, "log_tail": "Traceback: boom"})

    with alive(**{n.name: True for n in cluster.nodes}), kept(**{"worker-0": failed}):
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "worker-0 failed with exit code 3; its log ends:\nTraceback: boom"
    assert job.cluster is None


# --- time limits, everywhere ---


def test_time_limit_is_enforced_on_a_step_whose_runner_still_holds_the_job(job, sent, settings):
    settings.FC2_JOB_TIMEOUT_S = 60
    Job.objects.filter(pk=job.pk).update(
        state=State.PROVISIONING, created_at=timezone.now() - timedelta(seconds=61),
        lease_until=timezone.now() + timedelta(seconds=20),
    )  # fmt: skip

    sweep.sweep()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "timed out after 60 s")


def test_time_limit_of_a_queued_job_nobody_ran(job, sent, settings):
    settings.FC2_JOB_TIMEOUT_S = 60
    lost(job, State.QUEUED, created_at=timezone.now() - timedelta(seconds=61))

    sweep.sweep()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "timed out after 60 s")


def test_a_running_job_past_its_time_limit_fails_and_is_torn_down(job, sent, settings):
    settings.FC2_JOB_TIMEOUT_S = 60
    job = lost(job, State.RUNNING, started_at=timezone.now() - timedelta(seconds=61), lease_until=None)
    cluster = launch_cluster(job, workers=1)

    with alive(**{n.name: True for n in cluster.nodes}), kept():
        sweep.sweep()

    job.refresh_from_db()
    assert (job.state, job.failure_reason) == (State.FAILED, "timed out after 60 s")
    assert not Path(cluster.workdir).exists()


def test_a_job_past_its_time_limit_whose_chief_succeeded_is_not_failed(job, sent, settings):
    settings.FC2_JOB_TIMEOUT_S = 60
    job = lost(job, State.RUNNING, started_at=timezone.now() - timedelta(seconds=61), lease_until=None)
    cluster = launch_cluster(job, workers=1)
    done = NodeResult(report={"status": "succeeded", "exit_code": 0}, files={"model.keras": b"weights"})

    with alive(**{n.name: True for n in cluster.nodes}), kept(**{"chief-0": done}):
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.COLLECTING


# --- ended jobs whose cluster is still there ---


def test_an_ended_job_is_released_again_until_the_teardown_succeeds(job, sent):
    lost(job, State.CANCELLED)
    cluster = launch_cluster(job, workers=1)

    with mock.patch("provisioner.teardown", side_effect=OSError("cloud API down")):
        sweep.sweep()
    job.refresh_from_db()
    assert job.tearing_down and job.state_label == "cancelling" and job.lease_until is None

    sweep.sweep()

    job.refresh_from_db()
    assert job.cluster is None and job.state_label == State.CANCELLED
    assert not Path(cluster.workdir).exists()
    assert messages(job)[-1] == f"cluster {cluster.cluster_id} torn down"


def test_the_sweep_tears_down_job_clusters_no_job_records(job):
    """A cluster named for a job whose row is gone (deleted, or a database restored from before it) is torn down by
    the next sweep; the cluster a job records, and one made by hand (`cluster up`), are left alone."""
    orphan, recorded, by_hand = "fc2-999-0a1b2c3d", pipeline.cluster_name(job), "my-cluster"
    for name in (orphan, recorded, by_hand):
        local.launch(ClusterSpec(name, "local", "mirrored", 1))
    Job.objects.filter(pk=job.pk).update(cluster={"cluster_id": recorded, "provider": "local", "nodes": []})

    sweep.sweep()

    assert local.list_clusters() == sorted([recorded, by_hand])
