"""The `local` provider: a cluster of processes on this machine, each node's code in a sandbox (provisioner/sandbox.py).

Its machines are made by `launch` (the sandbox: a uid, a network namespace and a memory cgroup for the cluster, a
disk per node) and bootstrapped like any provider's (provisioner/nodes.py), through a `LocalRunner`. Everything
of a cluster lives under FC2_LOCAL_CLUSTER_DIR/<cluster_id>/ (root's, mode 0700):

    cluster.json          the ClusterInfo as planned, written first (teardown reads its sandbox uid; a redelivered
                          launch keeps its plan and makes whatever part of it does not exist whole)
    env/                  one virtualenv for the job's wheel, shared by the nodes (they share this machine), layered
                          on the platform's site-packages so TensorFlow is not installed again; read-only inside the
                          sandboxes; env.installed says its install finished
    etc/                  the sandboxes' passwd, group and hosts
    <node>/               the node's directory (bootstrap.py: the agent, token, env.json, node.log, result/, data/),
                          and bootstrap.log, what the bootstrap ran there
    <node>/job/work, <node>/job/output    the only directories the node's code may write (owned by the sandbox
                          uid); sandboxed, <node>/job is a file system of its own (FC2_LOCAL_NODE_DISK_MB, an ext4
                          image <node>/disk.img loop-mounted there), so a node cannot fill the platform's disk

Each node is a node-agent process (monitor/agent.py), run by the platform outside the sandbox, supervising the node's
command inside it; the agent alone holds the token. It runs in a session and in cgroups of its cluster's own
(sandbox.create_node_cgroups), not the Celery worker's: the nodes outlive the worker that started them — a service
manager restarting the worker with its whole control group included — as lab and aws nodes do. The nodes of a
cluster share a network namespace of their own, so their TensorFlow ports never collide with another cluster's, and
a memory cgroup of their own (FC2_LOCAL_CLUSTER_MEMORY_MB for all of them). Teardown, from the cluster's name alone,
stops its agents (found by pid, by working directory and by their cgroups), every process of the cluster's sandbox
uid, unmounts the nodes' disks, removes the cgroups, the network namespace and the directory; it touches nothing else.

A sandboxed cluster is admitted against what the machine has (`_admit`): it holds MAX_TASKS task ids from its launch to
its teardown, recorded by its memory cgroup, and starts only while every local cluster's share on this machine (of
any installation) fits in FC2_LOCAL_CLUSTERS_MAX_TASKS; until then its launch raises NoRoomError, which its job waits
on. All the clusters' memory cgroups together are limited to FC2_LOCAL_CLUSTERS_MEMORY_MB.

Without the sandbox (the platform not running as root), local jobs run as the platform's own user, which is only
acceptable on a single-user machine: the operator must say so with FC2_UNSANDBOXED_LOCAL_JOBS=1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import site
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from django.conf import settings

from provisioner import sandbox
from provisioner.errors import NoRoomError, ProvisionError, TransientProvisionError
from provisioner.interface import AGENT_FILES, Machine, NodeCommand
from provisioner.interface import regions as regions  # the default: no regions
from provisioner.interface import report_url as report_url  # the default: the nodes reach the platform as it is
from provisioner.runners import LocalRunner, reap
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, cluster_directory, node_layout

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
# In a cluster's own network namespace every port is free: node i listens on FIRST_PORT + i.
FIRST_PORT = 20000
# How long a launch waits for room on this machine before it hands back (NoRoomError: tried again later), and how
# often it looks meanwhile.
ADMISSION_WAIT_S = 30.0
ADMISSION_POLL_S = 0.5
# Unsandboxed nodes share the machine's loopback: ports drawn below Linux's ephemeral range (32768+) so an outgoing
# connection can't take one meanwhile.
PORT_RANGE = (20000, 32000)


def unavailable() -> str | None:
    """Why local clusters cannot be made here (the sandbox is missing and unsandboxed jobs are not allowed), or None."""
    reason = sandbox.unavailable()
    if reason is None or settings.FC2_UNSANDBOXED_LOCAL_JOBS:
        return None
    return (
        f"local jobs need the sandbox, which this machine cannot give: {reason}. On a single-user machine the "
        "operator may run them unsandboxed with FC2_UNSANDBOXED_LOCAL_JOBS=1"
    )


def sandboxed() -> bool:
    """Whether this machine's local clusters run sandboxed; refuses when they cannot be and the operator has not
    allowed unsandboxed jobs."""
    if reason := unavailable():
        raise ProvisionError(reason)
    return sandbox.unavailable() is None


def _cluster_dir(cluster_id: str) -> Path:
    return cluster_directory(settings.FC2_LOCAL_CLUSTER_DIR, cluster_id)


def _free_ports(count: int) -> list[int]:
    """Ports nothing listens on now, chosen at random so concurrent clusters rarely collide."""
    ports: list[int] = []
    for port in random.sample(range(*PORT_RANGE), k=min(500, PORT_RANGE[1] - PORT_RANGE[0])):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise TransientProvisionError("no free TCP ports on 127.0.0.1")


def launch(spec: ClusterSpec, notify: Callable[[str], None] | None = None) -> ClusterInfo:
    """Make the cluster's directories and sandbox (uid, network namespace, memory cgroup, the nodes' disks): the
    machines, in a cloud's words. Idempotent by what exists, not by a record written first: a launch redelivered
    after its worker was lost half-way reads the plan (cluster.json: the uid, the nodes, their ports), then goes
    through every part again, reusing each that is complete and making (or redoing) each that is not. A launch that
    fails part-way removes what it made."""
    workdir = _cluster_dir(spec.cluster_id)
    layout = node_layout(spec.strategy, spec.workers)
    cluster = ClusterInfo.load(workdir)
    if cluster is not None and [(n.role, n.index) for n in cluster.nodes] != layout:
        raise ProvisionError(f"cluster {spec.cluster_id} exists with other nodes than asked for")
    try:
        if cluster is None:
            cluster = _plan(spec, workdir, layout)
        if cluster.sandbox_uid is not None:
            _admit(cluster)
        _make(cluster)
    except BaseException:
        teardown(spec.cluster_id)
        raise
    return cluster


def _plan(spec: ClusterSpec, workdir: Path, layout: list[tuple[str, int]]) -> ClusterInfo:
    """The cluster's nodes, ports and sandbox uid, recorded in its directory before anything else is made: the uid is
    how teardown finds the cluster's processes."""
    uid = sandbox.free_uid() if sandboxed() else None
    ports = [FIRST_PORT + i for i in range(len(layout))] if uid else _free_ports(len(layout))
    nodes = tuple(
        NodeInfo(
            name=f"{role}-{index}",
            role=role,
            index=index,
            host=HOST,
            port=port,
            instance_type="local",
            workdir=str(workdir / f"{role}-{index}"),
        )
        for (role, index), port in zip(layout, ports, strict=True)
    )
    cluster = ClusterInfo(
        cluster_id=spec.cluster_id,
        provider="local",
        strategy=spec.strategy,
        nodes=nodes,
        workdir=str(workdir),
        sandbox_uid=uid,
    )
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)
    cluster.save(workdir)
    return cluster


def _admit(cluster: ClusterInfo) -> None:
    """Hold the cluster's share of the machine — its memory cgroup, which every launch on this machine counts — as
    soon as the machine has room for it (sandbox.no_room): the launch waits up to ADMISSION_WAIT_S, then raises
    NoRoomError saying why, which the pipeline tries again until the cluster is admitted (a queue, as Slurm's pending
    jobs, the reason on the job's timeline). Two launches at once are admitted one after the other
    (sandbox.admission_lock)."""
    name = sandbox.netns_name(Path(cluster.workdir))
    deadline = time.monotonic() + ADMISSION_WAIT_S
    while True:
        with sandbox.admission_lock():
            if sandbox.memory_cgroup(name).is_dir():
                return  # admitted before (a redelivered launch)
            if (reason := sandbox.no_room(settings.FC2_LOCAL_CLUSTERS_MAX_TASKS)) is None:
                sandbox.create_memory_cgroup(
                    name, settings.FC2_LOCAL_CLUSTER_MEMORY_MB, settings.FC2_LOCAL_CLUSTERS_MEMORY_MB
                )
                return
        if time.monotonic() >= deadline:
            raise NoRoomError(f"no room on this machine for another local cluster now: {reason}")
        time.sleep(ADMISSION_POLL_S)


def _make(cluster: ClusterInfo) -> None:
    """Every part of the cluster, each step idempotent: what exists whole is kept, the rest made again (a disk image
    not mounted is made afresh; a node's directories are made and owned by the sandbox uid, whatever was there)."""
    workdir, uid = Path(cluster.workdir), cluster.sandbox_uid
    for node in cluster.nodes:
        Path(node.workdir).mkdir(mode=0o700, exist_ok=True)
    if uid is None:
        return
    sandbox.create_netns(sandbox.netns_name(workdir))
    sandbox.create_node_cgroups(sandbox.netns_name(workdir))
    sandbox.create_memory_cgroup(
        sandbox.netns_name(workdir), settings.FC2_LOCAL_CLUSTER_MEMORY_MB, settings.FC2_LOCAL_CLUSTERS_MEMORY_MB
    )
    sandbox.write_etc(workdir / "etc", uid)
    for node in cluster.nodes:
        node_dir = Path(node.workdir)
        sandbox.create_disk(node_dir / "disk.img", node_dir / "job", settings.FC2_LOCAL_NODE_DISK_MB)
        sandbox.prepare_dirs(uid, node_dir / "job" / "work", node_dir / "job" / "output")


def _unready(cluster: ClusterInfo, node: NodeInfo) -> str | None:
    """Why the node's sandbox cannot keep what its code writes (its disk not mounted, its directories not the
    sandbox uid's), or None. Only a launch that did not finish leaves a node so; its code would run, fail to write
    its outputs and, if it swallowed the error, end as if it had succeeded."""
    node_dir = Path(node.workdir)
    if not os.path.ismount(node_dir / "job"):
        return "its disk is not mounted"
    for sub in ("work", "output"):
        try:
            owner = (node_dir / "job" / sub).lstat()
        except OSError as error:
            return f"its {sub} directory cannot be found ({error.strerror})"
        if not stat.S_ISDIR(owner.st_mode) or owner.st_uid != cluster.sandbox_uid:
            return f"its {sub} directory is not the sandbox's"
    return None


def list_clusters(region: str = "") -> list[str]:
    """The names of this installation's local clusters that exist (launched, not yet torn down)."""
    root = settings.FC2_LOCAL_CLUSTER_DIR
    return sorted(path.name for path in root.iterdir() if path.is_dir()) if root.is_dir() else []


def machine(cluster: ClusterInfo, node: NodeInfo) -> Machine:
    """A local node's machine is this one; its nodes share one install of the job's wheel, in the cluster's env."""
    node_dir = Path(node.workdir)
    # The agents leave the worker's cgroups for their cluster's own: they outlive the worker, as a cloud node does.
    cgroups = [] if cluster.sandbox_uid is None else sandbox.node_cgroups(sandbox.netns_name(Path(cluster.workdir)))
    return Machine(
        runner=LocalRunner(
            node.name,
            log=node_dir / "bootstrap.log" if node_dir.is_dir() else None,
            cgroups=[cgroup for cgroup in cgroups if cgroup.is_dir()],
        ),
        host=HOST,
        root=str(node_dir),
        python=sys.executable,
        install_dir=cluster.workdir,
        platform_storage=True,
    )


def node_command(cluster: ClusterInfo, node: NodeInfo, argv: list[str], dataset: str) -> NodeCommand:
    """The node's command in the cluster's sandbox (or as the platform's user, when the operator allowed that)."""
    workdir, node_dir = Path(cluster.workdir), Path(node.workdir)
    if not (workdir / "cluster.json").exists():  # torn down meanwhile (a cancel): never start anything again
        raise ProvisionError(f"cluster {cluster.cluster_id} no longer exists")
    work, output = node_dir / "job" / "work", node_dir / "job" / "output"
    if cluster.sandbox_uid is None:
        for sub in (work, output):
            sub.mkdir(parents=True, exist_ok=True)
        return NodeCommand(tuple(argv), dataset, str(output), str(work), str(output), str(work))
    if reason := _unready(cluster, node):
        raise ProvisionError(f"{node.name} of cluster {cluster.cluster_id} is not ready: {reason}")
    netns = sandbox.netns_name(workdir)
    return sandboxed_command(cluster, node, workdir / "env", netns, sandbox.memory_cgroup(netns), argv, dataset)


def sandboxed_command(
    cluster: ClusterInfo,
    node: NodeInfo,
    env_dir: Path,
    netns: str | None,
    cgroup: Path,
    argv: list[str],
    dataset: str,
) -> NodeCommand:
    """The node's command in its sandbox (provisioner/sandbox.py), on this machine or a lab node: the node's disk
    (`job/work`, `job/output` in its directory), the cluster's etc/, the job's env, the dataset and the PyTorch
    launcher in the node's directory (nodes.node_argv), read-only; in network namespace `netns` (None: the one the
    agent runs in) and memory cgroup `cgroup`."""
    work, output = Path(node.workdir) / "job" / "work", Path(node.workdir) / "job" / "output"
    mounts = sandbox.Mounts(
        work=work,
        output=output,
        etc=Path(cluster.workdir) / "etc",
        read_only=(*read_only_mounts(env_dir), Path(node.workdir) / AGENT_FILES["launcher.py"]),
        dataset=Path(dataset) if dataset else None,
    )
    if cluster.sandbox_uid is None:  # launched without a sandbox (local.node_command runs such a node bare)
        raise ProvisionError(f"cluster {cluster.cluster_id} has no sandbox uid for {node.name}")
    wrapped = sandbox.command(netns, cluster.sandbox_uid, node.name, mounts, argv, cgroup)
    data = sandbox.dataset_path(Path(dataset)) if dataset else ""
    # --memory-cgroup: to say why the command was killed, if the node ran out of memory.
    return NodeCommand(
        tuple(wrapped), data, sandbox.OUTPUT, sandbox.WORK, str(output), str(work), ("--memory-cgroup", str(cgroup))
    )


def read_only_mounts(env_dir: Path) -> tuple[Path, ...]:
    """What the sandbox needs of the machine to run Python with the platform's packages: the interpreter's prefix,
    the platform's virtualenv (site-packages) and the job's, each once (none inside another)."""
    wanted = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), env_dir}
    wanted |= {Path(p).resolve() for p in site.getsitepackages()}
    return tuple(sorted(p for p in wanted if not any(other in p.parents for other in wanted)))


def _process(node: NodeInfo) -> psutil.Process | None:
    """The node's agent process, if it is still the one started (it runs the agent from the node's directory)."""
    reap()
    if not node.pid:
        return None
    try:
        process = psutil.Process(node.pid)
        agent = str(Path(node.workdir) / AGENT_FILES["agent.py"])
        if agent not in process.cmdline():
            return None
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except psutil.Error:
        return None


def _agents(cluster: ClusterInfo) -> list[psutil.Process]:
    """The cluster's live agents: by pid, and by their working directory inside the cluster's (so an agent started by
    a step that died before recording it is found too)."""
    found = {agent.pid: agent for node in cluster.nodes if (agent := _process(node)) is not None}
    workdir = Path(cluster.workdir)
    for process in psutil.process_iter(["cwd"]):
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            if Path(process.info["cwd"]).is_relative_to(workdir) and _running(process):
                found.setdefault(process.pid, process)
    return list(found.values())


def cluster_processes(cluster: ClusterInfo) -> list[psutil.Process]:
    """The live processes this provider started for `cluster`: its agents with everything they spawned, every
    process of its agents' cgroups and of the cluster's sandbox uid (however it detached)."""
    found: dict[int, psutil.Process] = {}
    for agent in _agents(cluster):
        found[agent.pid] = agent
        with contextlib.suppress(psutil.Error):
            found.update((child.pid, child) for child in agent.children(recursive=True))
    for cgroup in sandbox.node_cgroups(sandbox.netns_name(Path(cluster.workdir))):
        found.update((p.pid, p) for p in sandbox.cgroup_processes(cgroup))
    if cluster.sandbox_uid is not None:
        found.update((p.pid, p) for p in sandbox.processes(cluster.sandbox_uid))
    return [p for p in found.values() if _running(p)]


def _running(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.status() != psutil.STATUS_ZOMBIE
    return False


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still running after up to `timeout` s. A zombie counts as gone: one that another process (the
    worker that started the agents) has not reaped yet would otherwise hold us for the whole timeout."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in processes if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def get_cluster(cluster_id: str, region: str = "") -> ClusterInfo | None:
    """The cluster as launch recorded it, or None."""
    return ClusterInfo.load(_cluster_dir(cluster_id))


def teardown(cluster_id: str, region: str = "", grace_s: float = 5.0) -> list[str]:
    """Stop and remove everything of the cluster, found from its name; safe twice and on a half-made cluster.
    Returns what was removed."""
    # Launch died before recording anything: what the name alone says (the directory, the sandbox named after it).
    cluster = get_cluster(cluster_id) or ClusterInfo(cluster_id, "local", "", (), workdir=str(_cluster_dir(cluster_id)))
    # The agents first: each stops its command and says so; then whatever is left is killed.
    processes = cluster_processes(cluster)
    agents = _agents(cluster)
    for agent in agents:
        with contextlib.suppress(psutil.Error):
            agent.send_signal(signal.SIGTERM)
    left = _wait_gone(agents, grace_s)
    for _ in range(3):  # code that forks while being killed: go round until nothing of the cluster is left
        left = [p for p in {*left, *processes, *cluster_processes(cluster)} if _running(p)]
        if not left:
            reap()
            # A node's sandbox wrapper caught between its fork and joining its cgroup (orphaned by its agent's death,
            # not yet the sandbox uid's) shows only once it has joined: one more look before the cluster is gone.
            if not (left := cluster_processes(cluster)):
                break
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        _wait_gone(left, grace_s)
        processes = []
    reap()
    leftover = cluster_processes(cluster)
    if leftover:
        raise TransientProvisionError(f"processes {[p.pid for p in leftover]} of {cluster_id} survived teardown")
    workdir = Path(cluster.workdir)
    # Whether or not launch got as far as recording a sandbox: both are named after the directory alone.
    sandbox.delete_memory_cgroup(sandbox.netns_name(workdir))
    sandbox.delete_node_cgroups(sandbox.netns_name(workdir))
    sandbox.delete_netns(sandbox.netns_name(workdir))
    # The nodes' disks first (whatever made them: a half-made cluster too), so that deleting the directory deletes
    # the platform's own files only; rmtree does not follow symlinks, so what the job's code left in its directories
    # cannot lead it elsewhere.
    sandbox.remove_disks(workdir)
    removed = [f"process {process.pid}" for process in processes] + (
        [f"directory {workdir}"] if workdir.exists() else []
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return removed
