"""Faults of the local provider that used to lose a job's work, each on real sandboxed clusters: a launch killed
half-way and done again, a node whose disk is gone, the Celery worker that started the nodes killed with its whole
control group (a real worker, as tests/test_faults.py runs them).

Each cluster runs a tiny wheel (no TensorFlow). The launch tests' code writes one file to FC2_OUTPUT_DIR on every
node, and its agents report to nobody: what they kept on the node (their final reports, provisioner.fetch_results)
is what the platform would have received. The worker test's code trains until the test lets it finish."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import provisioner
from fc2.models import Job
from fc2.services import jobs
from fc2.services.bundles import store_bundle
from harness.wheels import GOOD, make_wheel
from provisioner import ClusterInfo, ClusterSpec, RunSpec, local, sandbox
from tests.conftest import cluster_processes, ended_and_released, sweeping, wait_for

pytestmark = [
    pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable())),
    pytest.mark.heavy,  # sandboxed clusters: disks, namespaces, cgroups
]
PROJECT_DIR = Path(__file__).resolve().parent.parent

# Every node writes its name to its output directory (an error there ends the code with a traceback: exit 1).
WRITER = b"""
import os, pathlib
pathlib.Path(os.environ["FC2_OUTPUT_DIR"], os.environ["FC2_ROLE"] + ".txt").write_text("kept")
print("wrote", flush=True)
"""

# A launch whose process is SIGKILLed at the n-th call of a sandbox step: argv is the cluster, the step, n.
KILLED_LAUNCH = """
import os, signal, sys, django
django.setup()
from provisioner import local, sandbox
from provisioner.types import ClusterSpec
name, step, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
done, calls = getattr(sandbox, step), []
def then_die(*args):
    calls.append(args)
    if len(calls) == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return done(*args)
setattr(sandbox, step, then_die)
local.launch(ClusterSpec(name, "local", "mirrored", 2))
"""


@pytest.fixture
def small_disks(settings):
    settings.FC2_LOCAL_NODE_DISK_MB = 16
    return settings


def results(cluster: ClusterInfo, tmp_path: Path, within_s: float = 60) -> dict:
    """Bootstrap the writer on every node, reporting to nobody; node name -> its final report, once all have one."""
    (data := tmp_path / "data.csv").write_text("x\n1\n")
    wheel = make_wheel(tmp_path, {**GOOD, "demo/main.py": WRITER})
    cluster = provisioner.bootstrap(cluster, RunSpec(1, str(wheel), "demo.main", dataset=str(data)))
    deadline = time.monotonic() + within_s
    while len(found := provisioner.fetch_results(cluster)) < len(cluster.nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {name: result.report for name, result in found.items()}


# Where the first launch dies: before the second node's disk exists; with it mounted, before its directories.
KILLED_AT = {"before a node's disk": ("create_disk", 2), "before a node's directories": ("prepare_dirs", 2)}


@pytest.mark.parametrize("where", KILLED_AT)
def test_a_launch_killed_half_way_is_completed_and_every_node_keeps_its_outputs(where, small_disks, tmp_path):
    """The step's worker is lost mid-launch; the launch sent again makes what the first did not, so that every
    node's code can write its outputs (before: the second node had no disk, its code could not write /job/output)."""
    name = f"fc2-halfmade-{os.getpid()}"
    step, n = KILLED_AT[where]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fc2.settings_test"}
    env |= {"FC2_LOCAL_CLUSTER_DIR": str(small_disks.FC2_LOCAL_CLUSTER_DIR), "FC2_LOCAL_NODE_DISK_MB": "16"}
    killed = subprocess.run([sys.executable, "-c", KILLED_LAUNCH, name, step, str(n)], cwd=PROJECT_DIR, env=env)
    assert killed.returncode == -signal.SIGKILL
    planned = ClusterInfo.load(small_disks.FC2_LOCAL_CLUSTER_DIR / name)
    assert planned is not None and not os.path.ismount(Path(planned.nodes[1].workdir) / "job" / "output")

    try:
        cluster = local.launch(ClusterSpec(name, "local", "mirrored", 2))
        assert cluster == planned  # the same plan: its uid, nodes and ports
        reports = results(cluster, tmp_path)
    finally:
        provisioner.teardown("local", name)

    statuses = {node: report["status"] for node, report in reports.items()}
    print(f"\nFIGURE local launch killed {where}: launched again, nodes {statuses}")
    assert statuses == {"worker-0": "succeeded", "worker-1": "succeeded"}
    assert all([o["path"] for o in report["outputs"]] == ["worker.txt"] for report in reports.values()), reports


def test_a_node_whose_disk_is_gone_is_never_started(small_disks, tmp_path):
    """What a launch left unfinished and nothing completed: the bootstrap refuses the node, naming it and why, rather
    than run code whose outputs cannot be kept."""
    name = f"fc2-nodisk-{os.getpid()}"
    cluster = local.launch(ClusterSpec(name, "local", "mirrored", 2))
    try:
        subprocess.run(["umount", str(Path(cluster.nodes[1].workdir) / "job")], check=True)
        with pytest.raises(provisioner.ProvisionError, match="worker-1 .* not ready: its disk is not mounted") as no:
            results(cluster, tmp_path)
        print(f"\nFIGURE local node's disk gone: bootstrap refused ({str(no.value)[:100]!r})")
    finally:
        provisioner.teardown("local", name)


# Trains (a progress line every 0.3 s) until the test lets it finish: a file `finish` in its work directory.
WAITER = b"""
import json, os, pathlib, time
step = 0
while not pathlib.Path(os.environ["HOME"], "finish").exists():
    step += 1
    print("FC2_PROGRESS " + json.dumps({"epoch": 1, "step": step}), flush=True)
    time.sleep(0.3)
pathlib.Path(os.environ["FC2_OUTPUT_DIR"], "metrics.json").write_text(json.dumps({"steps": step}))
"""


def unified_cgroup_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _source, target, kind, *_ = line.split()
        if kind == "cgroup2":
            return Path(target)
    return None


@contextlib.contextmanager
def forking_into(cgroup: Path):
    """This process in `cgroup` meanwhile, so that what it starts is born there (as a service manager starts a
    service in its own control group), then back where it was."""
    root = unified_cgroup_root()
    was = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield
    finally:
        (root / was.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))


def kill_control_group(cgroup: Path) -> None:
    """What systemd does to stop a service (KillMode=control-group): SIGKILL every process in its cgroup, until none
    is left."""
    deadline = time.monotonic() + 30
    while pids := (cgroup / "cgroup.procs").read_text().split():
        assert time.monotonic() < deadline, f"{pids} still in {cgroup}"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.1)


@pytest.mark.skipif(unified_cgroup_root() is None, reason="no cgroup v2 hierarchy to put a worker in")
@pytest.mark.django_db(transaction=True)
def test_local_nodes_outlive_a_worker_killed_with_its_control_group(alice, digits, workers, runtime_dir, tmp_path):
    """The Celery worker that started a local job's nodes is killed with everything in its cgroup, as a service
    manager restarting it does; the nodes train on, and another worker finishes the job (before: the agents were in
    the worker's cgroup and died with it, and the job failed)."""
    service = unified_cgroup_root() / f"fc2-test-worker-{os.getpid()}"
    service.mkdir()
    try:
        with forking_into(service):
            workers.start()
        with make_wheel(tmp_path, {**GOOD, "demo/main.py": WAITER}).open("rb") as wheel:
            bundle = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
        request = jobs.JobRequest(bundle=bundle, dataset=digits, strategy="mirrored", workers=1)
        job = jobs.submit(alice, request, driver=Job.Driver.CELERY)
        wait_for(lambda: job.nodes.filter(step__gte=2).exists(), "training", workers)

        kill_control_group(service)
        agents = [psutil.Process(node.pid) for node in ClusterInfo.from_dict(Job.objects.get(pk=job.pk).cluster).nodes]
        assert all(agent.is_running() and agent.status() != psutil.STATUS_ZOMBIE for agent in agents)
    finally:
        service.rmdir()
    workers.start()
    cluster = ClusterInfo.from_dict(Job.objects.get(pk=job.pk).cluster)
    (Path(cluster.nodes[0].workdir) / "job" / "work" / "finish").touch()
    job = sweeping(job, ended_and_released, "the nodes of a killed worker", workers)

    print(f"\nFIGURE worker's cgroup killed: the nodes lived on; another worker ended the job {job.state}")
    assert job.state == Job.State.SUCCEEDED, (job.failure_reason, workers.logs())
    assert "metrics.json" in set(job.artifacts.values_list("name", flat=True))
    assert cluster_processes() == [] and not Path(cluster.workdir).exists()
    assert not any(cgroup.exists() for cgroup in sandbox.node_cgroups(sandbox.netns_name(Path(cluster.workdir))))
