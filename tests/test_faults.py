"""Faults on real clusters: a Celery worker SIGKILLed inside each step, a platform its nodes cannot reach, cancel.

Each job is the smallest that trains for real (TensorFlow, one mirrored worker, a couple of steps, ~15–30 s); leases
and pickup times are 3 s and the test process itself runs the sweep every half second. On the broker configured (the
filesystem broker by default, Redis when REDIS_URL is set): a killed worker's message is gone either way (Redis would
give it back only after an hour). The figures are printed (`pytest -s`); benchmarks/worker_loss.py collects them.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from django.utils import timezone

from fc2.models import Job
from fc2.services import jobs, pipeline, sweep
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged, live_instances
from recommender.catalog import load_catalog
from tests.conftest import (
    Outage,
    aws_worker_env,
    cluster_processes,
    ended_and_released,
    seconds_since,
    sweeping,
    wait_for,
)

# Real TensorFlow jobs, with fault timings asserted: `make test`'s heavy part.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

State = Job.State
# Where the worker is killed: held there by FC2_FAULT_PAUSE (see pipeline._hold), except `running`, when no step runs.
KILLED_WHILE = {
    State.RECOMMENDING: State.SUCCEEDED,  # recommended again
    State.PROVISIONING: State.SUCCEEDED,  # launched, not recorded: launched again, finding the same cluster
    State.BOOTSTRAPPING: State.FAILED,  # nodes started, not recorded: failed, and the nodes torn down
    State.RUNNING: State.SUCCEEDED,  # nothing was running on the worker: the nodes' reports move the job on
    State.COLLECTING: State.SUCCEEDED,  # collected again
}


def submit(owner, bundle, dataset, strategy: str = "mirrored", **parameters: str) -> Job:
    request = jobs.JobRequest(
        bundle=bundle, dataset=dataset, strategy=strategy, workers=1,
        parameters={"epochs": "1", "steps_per_epoch": "2", **parameters},
    )  # fmt: skip
    return jobs.submit(owner, request, driver=Job.Driver.CELERY)


def assert_nothing_left(job: Job, runtime_dir: Path) -> None:
    left = cluster_processes()
    assert left == [], [(p.pid, p.cmdline()[:4]) for p in left]
    assert job.cluster_name and not (runtime_dir / "clusters" / job.cluster_name).exists()


@pytest.mark.parametrize("state", KILLED_WHILE)
def test_a_worker_killed_at_any_step_leaves_no_job_hanging(state, alice, bundle, digits, workers, runtime_dir):
    """Two workers as two hosts (each its own --hostname): the one running the job's step is SIGKILLed inside it, and
    the other, which was idle all along, finishes the job (or fails it, where the step may not be done again)."""
    pause = {} if state == State.RUNNING else {"FC2_FAULT_PAUSE": f"{state}=120"}
    first, first_log = workers.start(hostname="fc2-host-a@%h", **pause)
    # Held in bootstrap, the nodes already train: they must outlast the second host's start, or the chief's result
    # ends the job before the first host is lost (their teardown ends them).
    job = submit(alice, bundle, digits, **({"epochs": "500"} if state == State.BOOTSTRAPPING else {}))
    if state == State.RUNNING:
        wait_for(lambda: Job.objects.get(pk=job.pk).state == State.RUNNING, "running", workers)
    else:
        held = f"job {job.pk}: {state} held"
        wait_for(lambda: held in first_log.read_text(errors="replace"), f"held while {state}", workers)
    # The second host joins while the first holds the step (started after, so that the first is the one holding it).
    _, second_log = workers.start(hostname="fc2-host-b@%h")
    wait_for(lambda: re.search(r"fc2-host-b@\S+ ready\.", second_log.read_text(errors="replace")), "b up", workers)

    workers.kill(first)
    killed_at = timezone.now()
    job = sweeping(job, ended_and_released, f"killed while {state}", workers)

    moved_s, how = seconds_since(killed_at, job)
    ended_s = (job.finished_at - killed_at).total_seconds()
    print(f"\nFIGURE worker killed while {state}: moved on {moved_s:.1f} s ({how!r}), {job.state} {ended_s:.1f} s")
    assert job.state == KILLED_WHILE[state], (job.failure_reason, workers.logs())
    if job.state == State.FAILED:
        assert job.failure_reason == "the worker running bootstrap was lost"
    else:
        assert "model.keras" in set(job.artifacts.values_list("name", flat=True))
        step = "collect" if state == State.RUNNING else pipeline.STEP_OF[state]
        assert f"fc2.tasks.{step}[" in second_log.read_text(errors="replace"), "the other host did the step"
    assert_nothing_left(job, runtime_dir)


def test_a_worker_killed_while_provisioning_on_aws_makes_no_double_and_leaves_no_instance(
    alice, bundle, digits, workers, ec2_hosts, settings
):
    """The worker dies with the instances launched but not recorded; the next one launches again, finds them by
    their tag (no second set), trains on them and terminates them: moto's EC2 and its instances as lab hosts."""
    load_catalog("fc2-2018")
    on_aws = aws_worker_env(settings)
    first, first_log = workers.start(FC2_FAULT_PAUSE="provisioning=120", **on_aws)
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, provider="aws", region=REGION, strategy="mirrored", workers=1,
        worker_type="c4.xlarge", parameters={"epochs": "1", "steps_per_epoch": "2"},
    )  # fmt: skip
    job = jobs.submit(alice, request, driver=Job.Driver.CELERY)
    wait_for(lambda: f"job {job.pk}: provisioning held" in first_log.read_text(errors="replace"), "launched", workers)
    launched = {i["InstanceId"] for i in live_instances(job.cluster_name)}

    workers.kill(first)
    workers.start(**on_aws)
    job = sweeping(job, ended_and_released, "killed while provisioning on aws", workers)

    assert job.state == State.SUCCEEDED, (job.failure_reason, workers.logs())
    assert len(launched) == 1, "the held launch had made the cluster"
    reservations = ec2().describe_instances(Filters=[{"Name": "tag:fc2:cluster", "Values": [job.cluster_name]}])
    assert {i["InstanceId"] for r in reservations["Reservations"] for i in r["Instances"]} == launched, "no double"
    assert everything_tagged(job.cluster_name) == NOTHING
    assert job.events.filter(message="the worker running provision was lost: provision sent again").exists()


def test_a_result_that_never_reached_the_platform_is_fetched_from_the_node(alice, bundle, digits, workers, runtime_dir):
    """The nodes cannot reach the platform at all (its address is wrong for them): the chief's agent keeps its result
    and keeps trying; the sweep fetches the result from the node and the job succeeds with its model."""
    workers.start(FC2_PUBLIC_URL="http://127.0.0.1:9")  # the discard port: nothing listens
    job = submit(alice, bundle, digits)

    job = sweeping(job, ended_and_released, "result never delivered", workers)

    assert job.state == State.SUCCEEDED, (job.failure_reason, workers.logs())
    assert {"model.keras", "metrics.json"} <= set(job.artifacts.values_list("name", flat=True))
    assert job.metrics.get("test_accuracy") is not None
    assert job.events.filter(message__contains="its report never arrived").exists()
    assert_nothing_left(job, runtime_dir)


def test_cancel_answers_before_the_teardown(alice, bundle, digits, workers, runtime_dir, client):
    workers.start()
    job = submit(alice, bundle, digits, epochs="500")
    wait_for(lambda: job.nodes.filter(step__gt=0).exists(), "training", workers)
    client.force_login(alice)

    started = time.perf_counter()
    response = client.post(f"/jobs/{job.pk}/cancel/")
    answered_s = time.perf_counter() - started

    job.refresh_from_db()
    assert response.status_code == 302
    assert job.state == State.CANCELLED and job.tearing_down  # answered before the teardown
    assert "cancelling" in client.get(f"/jobs/{job.pk}/").content.decode()
    job = sweeping(job, ended_and_released, "torn down after cancel", workers)
    torn_down_s = (job.events.get(message__endswith="torn down").at - job.finished_at).total_seconds()
    assert answered_s < 1.0
    assert_nothing_left(job, runtime_dir)
    print(f"\nFIGURE cancel: answered in {answered_s:.3f} s; cluster torn down {torn_down_s:.1f} s after")


def test_a_ps_job_does_not_wait_in_collecting_for_its_servers(alice, bundle, digits, workers, runtime_dir):
    """PS and worker tasks serve until killed: the job succeeds once the logs are kept, and the teardown follows."""
    workers.start(concurrency=2)
    job = submit(alice, bundle, digits, strategy="ps")

    job = sweeping(job, ended_and_released, "PS job", workers)

    assert job.state == State.SUCCEEDED, (job.failure_reason, workers.logs())
    collecting = job.events.filter(state=State.COLLECTING).first().at
    collecting_s = (job.finished_at - collecting).total_seconds()
    torn_down_s = (job.events.get(message__endswith="torn down").at - job.finished_at).total_seconds()
    assert collecting_s < 3.0
    assert_nothing_left(job, runtime_dir)
    print(
        f"\nFIGURE PS job: {collecting_s:.1f} s in collecting; cluster torn down {torn_down_s:.1f} s after succeeding"
    )


# Long enough for the agent to try five times (its backoff doubles from half a second) and many times the workers'
# lease and pickup times (3 s): what a longer outage adds is more of the same wait.
OUTAGE_S = 20
TRAINED_WITHIN_S = 180  # of the outage's start: the chief's few steps, however busy the machine


def test_the_web_server_down_at_the_end_of_training_loses_no_result(
    alice, bundle, digits, workers, runtime_dir, live_server, settings
):
    """The platform is unreachable for its nodes from before the chief finishes for OUTAGE_S or more: the chief's agent
    keeps its result and retries until the platform is back, the job is never failed meanwhile, and it succeeds with
    its model. (The sweep is kept from fetching the kept result, so that the agent's own delivery is what is tested.)"""
    settings.FC2_NODE_SILENCE_S = 10 * OUTAGE_S
    proxy = Outage(live_server.url)
    workers.start(FC2_PUBLIC_URL=proxy.url)
    job = submit(alice, bundle, digits, steps_per_epoch="20")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == State.RUNNING, "running", workers)
    proxy.down()
    down_at = time.monotonic()
    kept = runtime_dir / "clusters" / Job.objects.get(pk=job.pk).cluster_name / "worker-0" / "result" / "report.json"
    # OUTAGE_S at least, and until the chief has kept its result (on a busy machine its training may take longer).
    while time.monotonic() - down_at < OUTAGE_S or not kept.exists():
        sweep.sweep()
        assert not Job.objects.get(pk=job.pk).is_terminal, Job.objects.get(pk=job.pk).failure_reason
        assert time.monotonic() - down_at < TRAINED_WITHIN_S, "the chief never finished training: make the job shorter"
        time.sleep(0.5)
    proxy.up()
    up_at, down_s = timezone.now(), time.monotonic() - down_at

    job = sweeping(job, ended_and_released, "result delivered after the outage", workers)

    assert job.state == State.SUCCEEDED, (job.failure_reason, workers.logs())
    assert {"model.keras", "metrics.json"} <= set(job.artifacts.values_list("name", flat=True))
    assert job.metrics.get("test_accuracy") is not None
    assert not job.events.filter(message__contains="its report never arrived").exists()  # the agent delivered it
    delivered_s = (job.events.get(state=State.COLLECTING).at - up_at).total_seconds()
    print(f"\nFIGURE web down {down_s:.0f} s at the end of training: delivered {delivered_s:.1f} s after its return")
    proxy.down()
    assert_nothing_left(job, runtime_dir)
