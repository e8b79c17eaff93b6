"""The `local` provider: a cluster of processes on this machine, each node's code in a sandbox (provisioner/sandbox.py).

Everything of a cluster lives under FC2_LOCAL_CLUSTER_DIR/<cluster_id>/ (root's, mode 0700):

    cluster.json          the ClusterInfo, rewritten as nodes start (a redelivered step reuses what is there)
    env/                  one virtualenv for the job's wheel, layered on the platform's site-packages (a .pth file)
                          so TensorFlow is not installed again; read-only inside the sandboxes
    etc/                  the sandboxes' passwd, group and hosts
    fc2_agent.py, safe_fetch.py   the node agent, as it would be copied onto a remote node
    <node>/               the agent's directory: node.log, agent.log, the report token (0600), result/ (the final
                          report it keeps until delivered), data/ (a dataset it fetched)
    <node>/job/work, <node>/job/output    the only directories the node's code may write (owned by the sandbox
                          uid); sandboxed, <node>/job is a file system of its own (FC2_LOCAL_NODE_DISK_MB, an ext4
                          image <node>/disk.img loop-mounted there), so a node cannot fill the platform's disk

Each node is a node-agent process (monitor/agent.py), run by the platform outside the sandbox, supervising the node's
command inside it; the agent alone holds the token. The nodes of a cluster share a network namespace of their own, so
their TensorFlow ports never collide with another cluster's, and a memory cgroup of their own
(FC2_LOCAL_CLUSTER_MEMORY_MB for all of them). Teardown stops the agents it started (pid and start time), every process
of the cluster's sandbox uid, unmounts the nodes' disks, removes the memory cgroup, the network namespace and the
directory; it touches nothing else.

Without the sandbox (the platform not running as root), local jobs run as the platform's own user, which is only
acceptable on a single-user machine: the operator must say so with FC2_UNSANDBOXED_LOCAL_JOBS=1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from django.conf import settings

from provisioner import sandbox
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, NodeResult, RunSpec, is_chief, node_layout

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_WORKERS = 8  # each node is a TensorFlow process of ~600 MB
# In a cluster's own network namespace every port is free: node i listens on FIRST_PORT + i.
FIRST_PORT = 20000
# Unsandboxed nodes share the machine's loopback: ports drawn below Linux's ephemeral range (32768+) so an outgoing
# connection can't take one meanwhile.
PORT_RANGE = (20000, 32000)
MONITOR_DIR = Path(__file__).resolve().parent.parent / "monitor"
# The node agent and the module it downloads datasets with, under the names the agent runs by on a node.
AGENT_FILES = {"agent.py": "fc2_agent.py", "safe_fetch.py": "safe_fetch.py"}
# Environment the platform passes through to user code; everything else (database URLs, secrets) stays out.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ")


class LocalProvisionError(RuntimeError):
    pass


def sandboxed() -> bool:
    """Whether this machine's local clusters run sandboxed; refuses (LocalProvisionError) when they cannot be and the
    operator has not allowed unsandboxed jobs."""
    reason = sandbox.unavailable()
    if reason is None:
        return True
    if settings.FC2_UNSANDBOXED_LOCAL_JOBS:
        return False
    raise LocalProvisionError(
        f"local jobs need the sandbox, which this machine cannot give: {reason}. On a single-user machine the "
        "operator may run them unsandboxed with FC2_UNSANDBOXED_LOCAL_JOBS=1"
    )


def _cluster_dir(cluster_id: str) -> Path:
    if not cluster_id or "/" in cluster_id or cluster_id.startswith("."):
        raise LocalProvisionError(f"invalid cluster id {cluster_id!r}")
    return settings.FC2_LOCAL_CLUSTER_DIR / cluster_id


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
    raise LocalProvisionError("no free TCP ports on 127.0.0.1")


def launch(spec: ClusterSpec) -> ClusterInfo:
    workdir = _cluster_dir(spec.cluster_id)
    state = workdir / "cluster.json"
    if state.exists():  # launched before (a redelivered step): reuse what is there
        return ClusterInfo.from_dict(json.loads(state.read_text()))
    layout = node_layout(spec.strategy, spec.workers)
    uid = sandbox.free_uid() if sandboxed() else None
    ports = [FIRST_PORT + i for i in range(len(layout))] if uid else _free_ports(len(layout))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)
    for role, index in layout:
        (workdir / f"{role}-{index}").mkdir(mode=0o700, exist_ok=True)
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
    _save(cluster)
    return cluster


def _save(cluster: ClusterInfo) -> None:
    state = Path(cluster.workdir) / "cluster.json"
    partial = state.with_suffix(".partial")
    partial.write_text(json.dumps(cluster.to_dict()))
    partial.replace(state)


def _make_env(workdir: Path) -> Path:
    """A virtualenv for the job's wheel that also sees the platform's packages (TensorFlow, numpy, psutil)."""
    env_dir = workdir / "env"
    python = env_dir / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, capture_output=True)
        (purelib,) = env_dir.glob("lib/python*/site-packages")
        (purelib / "fc2-platform.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def _prepare_env(workdir: Path, wheel: str) -> Path:
    """The cluster's virtualenv with the job's wheel installed, made once: the env's interpreter runs as root (pip's
    --python runs it) only while the env holds nothing of the wheel. After the install it would run, as root, every
    .pth file the wheel put in site-packages, or a bin/python the wheel's .data/scripts replaced — so a redelivered
    step reuses an env marked installed, and makes one whose install did not finish again from scratch."""
    env_dir = workdir / "env"
    installed = workdir / "env.installed"  # outside the env: nothing the wheel installs can make it
    if not installed.exists():
        shutil.rmtree(env_dir, ignore_errors=True)
        _install_wheel(_make_env(workdir), wheel, workdir / "install.log")
        installed.touch()
    return env_dir / "bin" / "python"


def _install_wheel(python: Path, wheel: str, log: Path) -> None:
    # Only wheels: pip runs no code to install one, whereas building a source distribution (a dependency's) would
    # run its setup.py here, as the platform.
    command = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--no-input",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--quiet",
        wheel,
    ]
    with open(log, "ab") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise LocalProvisionError("installing the bundle failed: " + " | ".join(tail))


def _dataset(source: str, node_dir: Path) -> tuple[Path, str]:
    """(host path of the node's dataset file, URL its agent fetches it from or "")."""
    if source.startswith(("http://", "https://")):
        name = Path(source.split("?")[0].split("#")[0]).name or "dataset"
        return node_dir / "data" / name, source
    path = Path(source)
    if not path.is_file():
        raise LocalProvisionError(f"dataset file {source} does not exist")
    return path, ""


def _node_env(cluster: ClusterInfo, node: NodeInfo, data: str, output: str) -> dict[str, str]:
    env = {key: os.environ[key] for key in PASSTHROUGH_ENV if key in os.environ}
    tf_config = {"cluster": cluster.tf_cluster(), "task": {"type": node.role, "index": node.index}}
    env.update(
        TF_CONFIG=json.dumps(tf_config),
        FC2_STRATEGY=cluster.strategy,
        FC2_ROLE=node.role,
        FC2_TASK_INDEX=str(node.index),
        FC2_IS_CHIEF="1" if is_chief(cluster.strategy, node.role, node.index) else "0",
        FC2_DATA=data,
        FC2_OUTPUT_DIR=output,
        FC2_CLUSTER_ID=cluster.cluster_id,
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def _read_only_mounts(env_dir: Path) -> tuple[Path, ...]:
    """What the sandbox needs of the machine to run Python with the platform's packages: the interpreter's prefix,
    the platform's virtualenv (site-packages) and the cluster's, each once (none inside another)."""
    wanted = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), env_dir}
    wanted |= {Path(p).resolve() for p in site.getsitepackages()}
    return tuple(sorted(p for p in wanted if not any(other in p.parents for other in wanted)))


def start(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo:
    workdir = Path(cluster.workdir)
    if not (workdir / "cluster.json").exists():  # torn down meanwhile (a cancel): never make it again
        raise LocalProvisionError(f"cluster {cluster.cluster_id} no longer exists")
    python = _prepare_env(workdir, run.wheel_path)
    for source, name in AGENT_FILES.items():
        shutil.copyfile(MONITOR_DIR / source, workdir / name)
    uid = cluster.sandbox_uid
    cgroup = None
    if uid is not None:
        sandbox.create_netns(sandbox.netns_name(workdir))
        cgroup = sandbox.create_memory_cgroup(sandbox.netns_name(workdir), settings.FC2_LOCAL_CLUSTER_MEMORY_MB)
        sandbox.write_etc(workdir / "etc", uid)
        for node in cluster.nodes:  # every node's disk before any node starts, so that the nodes start together
            node_dir = Path(node.workdir)
            sandbox.create_disk(node_dir / "disk.img", node_dir / "job", settings.FC2_LOCAL_NODE_DISK_MB)
            sandbox.prepare_dirs(uid, node_dir / "job" / "work", node_dir / "job" / "output")
    deadline = time.time() + settings.FC2_JOB_TIMEOUT_S
    started = []
    for node in cluster.nodes:
        if node.pid and _process(node):  # started before (a redelivered step)
            started.append(node)
            continue
        node_dir = Path(node.workdir)
        token_file = node_dir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(run.token)
        dataset, url = _dataset(run.dataset, node_dir)
        argv = [str(python), "-m", run.main_module, *run.args]
        work, output = node_dir / "job" / "work", node_dir / "job" / "output"
        if uid is not None:
            mounts = sandbox.Mounts(
                work=work,
                output=output,
                etc=workdir / "etc",
                read_only=_read_only_mounts(workdir / "env"),
                dataset=dataset,
            )
            command = sandbox.command(sandbox.netns_name(workdir), uid, node.name, mounts, argv, cgroup)
            env = _node_env(cluster, node, sandbox.dataset_path(dataset), sandbox.OUTPUT)
        else:
            for sub in (work, output):
                sub.mkdir(parents=True, exist_ok=True)
            command = argv
            env = {**_node_env(cluster, node, str(dataset), str(output)), "HOME": str(work)}
        agent = [
            sys.executable,
            str(workdir / "fc2_agent.py"),
            *("--url", run.report_url, "--job", str(run.job_id), "--node", node.name),
            *("--token-file", str(token_file), "--deadline", str(int(deadline))),
            *("--log", str(node_dir / "node.log"), "--output", str(output)),
            *("--result", str(node_dir / "result"), "--cwd", str(work)),
            *("--max-artifact-mb", str(settings.FC2_MAX_ARTIFACT_MB)),
        ]
        if cgroup is not None:  # to say why the command was killed, if the cluster ran out of memory
            agent += ["--memory-cgroup", str(cgroup)]
        if url:
            agent += ["--fetch", url, "--fetch-to", str(dataset), "--fetch-max-mb", str(settings.FC2_MAX_DATASET_MB)]
            agent += [arg for net in settings.FC2_DATASET_ALLOWED_NETWORKS for arg in ("--fetch-allow", net)]
        with open(node_dir / "agent.log", "ab") as agent_log:
            process = subprocess.Popen(
                [*agent, "--", *command],
                cwd=node_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=agent_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _children.append(process)
        started.append(
            dataclasses.replace(node, pid=process.pid, pid_started=psutil.Process(process.pid).create_time())
        )
    cluster = dataclasses.replace(cluster, nodes=tuple(started))
    _save(cluster)
    return cluster


# Popen objects of the nodes this process started, reaped so that finished nodes don't linger as zombies.
_children: list[subprocess.Popen] = []


def _reap() -> None:
    _children[:] = [p for p in _children if p.poll() is None]


def _process(node: NodeInfo) -> psutil.Process | None:
    """The node's agent process if it is still the one we started and has not exited."""
    _reap()
    if not node.pid:
        return None
    try:
        process = psutil.Process(node.pid)
        if node.pid_started is not None and abs(process.create_time() - node.pid_started) > 0.01:
            return None
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except psutil.Error:
        return None


def alive(cluster: ClusterInfo) -> dict[str, bool]:
    return {node.name: _process(node) is not None for node in cluster.nodes}


def fetch_logs(cluster: ClusterInfo) -> dict[str, str]:
    logs = {}
    for node in cluster.nodes:
        path = Path(node.workdir) / "node.log"
        if path.exists():
            logs[node.name] = path.read_text(errors="replace")
    return logs


def fetch_results(cluster: ClusterInfo) -> dict[str, NodeResult]:
    results = {}
    for node in cluster.nodes:
        result_dir = Path(node.workdir) / "result"
        try:
            report = json.loads((result_dir / "report.json").read_text())
        except (OSError, ValueError):
            continue  # no final report kept: the command has not ended, or the agent died before it could keep one
        kept = sorted((result_dir / "files").glob("*"))
        results[node.name] = NodeResult(report=report, files={p.name: p.read_bytes() for p in kept if p.is_file()})
    return results


def _agents(cluster: ClusterInfo) -> list[psutil.Process]:
    """The cluster's live agents: by pid and start time, and by their working directory inside the cluster's (so an
    agent started by a step that died before recording it is found too)."""
    found = {agent.pid: agent for node in cluster.nodes if (agent := _process(node)) is not None}
    workdir = Path(cluster.workdir or _cluster_dir(cluster.cluster_id))
    for process in psutil.process_iter(["cwd"]):
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            if Path(process.info["cwd"]).is_relative_to(workdir) and _running(process):
                found.setdefault(process.pid, process)
    return list(found.values())


def cluster_processes(cluster: ClusterInfo) -> list[psutil.Process]:
    """The live processes this provider started for `cluster`: its agents with everything they spawned, and every
    process of the cluster's sandbox uid (however it detached)."""
    found: dict[int, psutil.Process] = {}
    for agent in _agents(cluster):
        found[agent.pid] = agent
        with contextlib.suppress(psutil.Error):
            found.update((child.pid, child) for child in agent.children(recursive=True))
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


def teardown(cluster: ClusterInfo, grace_s: float = 5.0) -> None:
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
            break
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        _wait_gone(left, grace_s)
        processes = []
    _reap()
    leftover = cluster_processes(cluster)
    if leftover:
        raise LocalProvisionError(f"processes {[p.pid for p in leftover]} of {cluster.cluster_id} survived teardown")
    workdir = Path(cluster.workdir or _cluster_dir(cluster.cluster_id))
    if cluster.sandbox_uid is not None:
        sandbox.delete_memory_cgroup(sandbox.netns_name(workdir))
        sandbox.delete_netns(sandbox.netns_name(workdir))
    # The nodes' disks first (whatever made them: a half-made cluster too), so that deleting the directory deletes
    # the platform's own files only; rmtree does not follow symlinks, so what the job's code left in its directories
    # cannot lead it elsewhere.
    sandbox.remove_disks(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
