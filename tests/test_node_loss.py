"""Nodes that die mid-training, each way a cloud host dies, on the lab (namespaces with their own sshd and links) and
on aws (moto's EC2, its instances lab hosts): the node's SSH server killed, its agent killed, its host gone (namespace
deleted, its processes killed — what a terminated instance is), its link cut (the veth down, or removed).

Each job is 2 mirrored workers running code that sleeps and reports a step every half second (no TensorFlow: the
fault is the node's, not the training's); where the loss must fail the job, for far longer than the loss may take to
be seen, so that no machine's load lets the training end first. A real Celery worker drives it, with the sweep run
here every half second; a node silent for 3 s is looked at over SSH, and one silent for 10 s fails the job with its
name. What each case checks is what a user would see: the job ends within 60 s of the loss — failed, naming the node,
or succeeded where nothing of the run was lost — and nothing of the cluster is left on the machine
(tests/conftest.py's lab_leftovers), nor found by `cluster reap`. The figures are printed (`pytest -s`);
benchmarks/faults.py collects them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from django.utils import timezone

import provisioner
from fc2.models import Job
from fc2.services import jobs, sweep
from fc2.services.bundles import store_bundle
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged, live_instances
from provisioner import ClusterInfo, ClusterSpec, RunSpec, aws, lab
from provisioner.lab import net as labnet
from recommender.catalog import load_catalog
from tests.conftest import (
    Workers,
    aws_worker_env,
    call_json,
    lab_leftovers,
    nothing_left,
    trainer_wheel,
    wait_for,
)

pytestmark = [
    pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab"))),
    pytest.mark.django_db(transaction=True),
    pytest.mark.heavy,  # the lab's network, loss timings asserted
]

State = Job.State
SILENCE_S = 3  # FC2_NODE_SILENCE_S: a node silent this long is looked at on its machine
LOST_S = 10  # FC2_NODE_LOST_S: a node silent this long fails the job, whether or not it can be reached
ENDED_WITHIN_S = 60  # of a loss the platform can see
RELEASED_WITHIN_S = 30  # from the job's end to its cluster gone
VICTIM = "worker-1"  # not the chief: the chief's nodes keep reporting while it is gone
LATENCY_MS = 2  # so that every node has a delay daemon too, which must go with it

# --- the faults: what happens to the victim node's machine ----------------------------------------------------------


def _node(cluster: ClusterInfo, name: str):
    return next(node for node in cluster.nodes if node.name == name)


def kill_sshd(cluster: ClusterInfo, name: str) -> None:
    os.kill(int((Path(_node(cluster, name).workdir) / "sshd" / "sshd.pid").read_text()), signal.SIGKILL)


def kill_agent(cluster: ClusterInfo, name: str) -> None:
    os.kill(_node(cluster, name).pid, signal.SIGKILL)  # the command it started goes on, reporting to nobody


def host_gone(cluster: ClusterInfo, name: str) -> None:
    """As a hypervisor loses a machine: every process of the node killed, its namespace (and so its link) deleted."""
    node = _node(cluster, name)
    labnet.remove_node(lab.tag(), cluster.cluster_id, int(node.instance_id.rsplit("-", 1)[1]))


def link_down(cluster: ClusterInfo, name: str) -> None:
    subprocess.run(["ip", "link", "set", _veth(cluster, name), "down"], check=True)


def link_removed(cluster: ClusterInfo, name: str) -> None:
    subprocess.run(["ip", "link", "del", _veth(cluster, name)], check=True)  # both ends: the node has no eth0


def _veth(cluster: ClusterInfo, name: str) -> str:
    index = int(_node(cluster, name).instance_id.rsplit("-", 1)[1])
    return labnet.veth_name(labnet.cluster_hash(lab.tag(), cluster.cluster_id), index)


# The code's --seconds where the loss must fail the job: far past the time it may take to be seen, so that nothing
# but the loss can end the job, however loaded the machine (training that ended first would have it succeed).
UNTIL_LOST_S = 3600
# fault -> (how, the code's --seconds, the job's state after it: a failure names the victim)
FAULTS: dict[str, tuple[Callable[[ClusterInfo, str], None], int, str]] = {
    # The platform cannot see it until it needs SSH: the run goes on and succeeds; its logs are what is lost.
    "sshd killed": (kill_sshd, 12, State.SUCCEEDED),
    "agent killed": (kill_agent, UNTIL_LOST_S, State.FAILED),
    "host gone": (host_gone, UNTIL_LOST_S, State.FAILED),
    "link down": (link_down, UNTIL_LOST_S, State.FAILED),
    "link removed": (link_removed, UNTIL_LOST_S, State.FAILED),
}


@pytest.fixture
def node_loss(settings, workers):
    settings.FC2_NODE_SILENCE_S = SILENCE_S
    settings.FC2_NODE_LOST_S = LOST_S
    settings.FC2_NODE_UNREACHABLE_S = LOST_S  # (where the sweep has it: a node neither reporting nor answering)
    workers.env["FC2_WORKERS_FINISH_S"] = "5"
    return workers


def submit_trainer(owner, dataset, tmp_path, seconds: int, **resources) -> Job:
    """A 2-worker mirrored job of the trainer wheel (it reports a step every 0.5 s for `seconds`), to the workers."""
    with trainer_wheel(tmp_path).open("rb") as wheel:
        bundle = store_bundle(owner, wheel, "demo-1.0-py3-none-any.whl")
    request = jobs.JobRequest(
        bundle=bundle, dataset=dataset, strategy="mirrored", workers=2, parameters={"seconds": str(seconds)},
        **resources,
    )  # fmt: skip
    return jobs.submit(owner, request, driver=Job.Driver.CELERY)


def run_until_killed(job: Job, fault: Callable[[ClusterInfo, str], None], workers: Workers) -> ClusterInfo:
    """Wait until the job trains (the chief reports steps, the victim's agent has reported), then hit the victim."""

    def training() -> bool:
        victim_up = job.nodes.filter(name=VICTIM, started_at__isnull=False).exists()
        return Job.objects.get(pk=job.pk).is_terminal or (victim_up and job.nodes.filter(step__gte=2).exists())

    wait_for(training, "training", workers)
    job.refresh_from_db()
    assert job.state == State.RUNNING, (job.state, job.failure_reason, workers.logs())
    cluster = ClusterInfo.from_dict(job.cluster)
    fault(cluster, VICTIM)
    return cluster


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sweep_until(job: Job, done: Callable[[Job], bool], within_s: float) -> Job:
    deadline = time.monotonic() + within_s
    while not done(job := Job.objects.get(pk=job.pk)) and time.monotonic() < deadline:
        sweep.sweep()
        time.sleep(0.5)
    return job


def check_ended(job: Job, killed_at, expected: str, name: str, workers: Workers) -> tuple[Job, float]:
    job = sweep_until(job, lambda j: j.is_terminal, ENDED_WITHIN_S + 15)
    assert job.is_terminal, f"still {job.state} {ENDED_WITHIN_S + 15} s after the loss\n{workers.logs()}"
    ended_s = (job.finished_at - killed_at).total_seconds()
    assert job.state == expected, (job.failure_reason, workers.logs())
    if expected == State.FAILED:
        assert job.failure_reason.startswith(name), job.failure_reason  # the node, named first
    assert ended_s < ENDED_WITHIN_S
    return job, ended_s


def check_released(job: Job, what: str) -> float:
    job = sweep_until(job, lambda j: j.cluster is None, RELEASED_WITHIN_S)
    released_s = (timezone.now() - job.finished_at).total_seconds()
    assert job.cluster is None, f"{what}: cluster still recorded {RELEASED_WITHIN_S} s after the end: " + " | ".join(
        job.events.order_by("-pk").values_list("message", flat=True)[:3]
    )
    return released_s


@pytest.mark.parametrize("fault", FAULTS)
def test_a_lab_node_lost_mid_training_ends_the_job_by_name_and_leaves_nothing(
    fault, alice, digits, node_loss, tmp_path
):
    """Every node of the cluster is removed, the victim's remains included, and the nodes that could still be reached
    have their logs kept: one node out of reach blocks neither."""
    how, seconds, expected = FAULTS[fault]
    load_catalog("lab")
    node_loss.start()
    job = submit_trainer(
        alice, digits, tmp_path, seconds, provider="lab", worker_type="lab-w-100", latency_ms=LATENCY_MS
    )
    cluster = run_until_killed(job, how, node_loss)
    killed_at = timezone.now()

    job, ended_s = check_ended(job, killed_at, expected, VICTIM, node_loss)
    print(f"\nFIGURE lab {fault}: {job.state} {ended_s:.1f} s after ({job.failure_reason[:100]!r})")
    released_s = check_released(job, f"lab {fault}")
    print(f"FIGURE lab {fault}: torn down {released_s:.1f} s after the end")
    left = nothing_left(lab_leftovers(cluster.cluster_id, Path(cluster.workdir), lab.tag()))
    print(f"FIGURE lab {fault}: left {left or 'nothing'}")
    assert left == {}
    assert sweep.orphans("lab", every=True) == []
    kept = set(job.artifacts.values_list("name", flat=True))
    assert "logs/worker-0.log" in kept, kept  # the nodes that could be reached have their logs kept


@pytest.mark.parametrize("fault", FAULTS)
def test_the_lab_teardown_after_each_loss_removes_everything(fault, tmp_path):
    """The provider's part alone (no job): a cluster that was running its code when a node died is removed to the
    last process, namespace, veth, bridge, chain, cgroup, mount and delay daemon — by the teardown, and by the reaper
    when nothing records it."""
    how = FAULTS[fault][0]
    name = f"fc2-loss-{fault.replace(' ', '-')}"
    cluster = provisioner.launch(ClusterSpec(name, "lab", "mirrored", 2, worker_type="lab-w-100", latency_ms=2))
    try:
        (data := tmp_path / "data.csv").write_text("x\n1\n")
        wheel, args = str(trainer_wheel(tmp_path)), ("--seconds=60",)
        run = RunSpec(1, wheel, "demo.main", args=args, dataset=str(data), report_url="http://127.0.0.1:9")
        cluster = provisioner.bootstrap(cluster, run)
        how(cluster, VICTIM)
        before = nothing_left(lab_leftovers(name, Path(cluster.workdir), lab.tag()))
        assert before["processes"] and before["cgroups"] and before["mounts"]  # there was something to remove
    finally:
        code, reaped, _ = call_json("cluster", "reap", "--provider", "lab", "--all")
    assert code == 0 and name in reaped["removed"], reaped
    assert nothing_left(lab_leftovers(name, Path(cluster.workdir), lab.tag())) == {}
    assert provisioner.list_clusters("lab") == []


def test_an_ec2_instance_terminated_behind_the_platforms_back_fails_the_job_and_leaves_nothing(
    alice, digits, node_loss, ec2_hosts, settings, tmp_path
):
    """EC2 terminates one of the job's two instances mid-run (a spot reclaim, an operator's console): its lab host
    goes with it. The job fails naming the node, and the rest is terminated: no instance, key pair, group, subnet."""
    load_catalog("fc2-2018")
    node_loss.start(**aws_worker_env(settings))
    job = submit_trainer(alice, digits, tmp_path, UNTIL_LOST_S, provider="aws", region=REGION, worker_type="c4.xlarge")

    def terminate(cluster: ClusterInfo, name: str) -> None:
        ec2().terminate_instances(InstanceIds=[_node(cluster, name).instance_id])

    cluster = run_until_killed(job, terminate, node_loss)
    # The loss is timed from when it took effect — the emulated host gone, its agent with it — not from the API call:
    # on a loaded machine the emulator may take a while to act on it.
    victim = _node(cluster, VICTIM)
    wait_for(lambda: victim.instance_id not in ec2_hosts.hosts and not _alive(victim.pid), "host gone", node_loss)
    killed_at = timezone.now()

    job, ended_s = check_ended(job, killed_at, State.FAILED, VICTIM, node_loss)
    print(f"\nFIGURE aws instance terminated: {job.state} {ended_s:.1f} s after ({job.failure_reason[:100]!r})")
    released_s = check_released(job, "aws instance terminated")
    print(f"FIGURE aws instance terminated: torn down {released_s:.1f} s after the end")
    assert everything_tagged(job.cluster_name) == NOTHING and live_instances() == []
    assert aws.list_clusters(REGION) == [] and sweep.orphans("aws", REGION, every=True) == []
    kept = set(job.artifacts.values_list("name", flat=True))
    assert "logs/worker-0.log" in kept, kept  # the node that could be reached has its log kept
