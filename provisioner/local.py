"""The `local` provider: a cluster of processes on this machine.

Each node is a node-agent process (monitor/agent.py) supervising `python -m <main module>` with its own TF_CONFIG,
directory and log, all under FC2_LOCAL_CLUSTER_DIR/<cluster_id>/. The job's wheel goes into one virtualenv per
cluster, layered on the platform's own site-packages (a .pth file) so TensorFlow is not installed again.
Teardown kills every process of the cluster (by pid, and by the FC2_CLUSTER_ID each carries in its environment)
and removes the directory.
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
import urllib.request
from pathlib import Path

import psutil
from django.conf import settings

from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, RunSpec, is_chief, node_layout

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_WORKERS = 8  # each node is a TensorFlow process of ~600 MB
# Ports are drawn below Linux's ephemeral range (32768+) so an outgoing connection can't take one meanwhile.
PORT_RANGE = (20000, 32000)
AGENT = Path(__file__).resolve().parent.parent / "monitor" / "agent.py"
# Environment the platform passes through to user code; everything else (database URLs, secrets) stays out.
PASSTHROUGH_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")


class LocalProvisionError(RuntimeError):
    pass


def _cluster_dir(cluster_id: str) -> Path:
    if not cluster_id or "/" in cluster_id or cluster_id.startswith("."):
        raise LocalProvisionError(f"invalid cluster id {cluster_id!r}")
    return settings.FC2_LOCAL_CLUSTER_DIR / cluster_id


def _free_ports(count: int) -> list[int]:
    """Ports nothing listens on now, chosen at random so concurrent clusters rarely collide."""
    ports: list[int] = []
    candidates = random.sample(range(*PORT_RANGE), k=min(500, PORT_RANGE[1] - PORT_RANGE[0]))
    for port in candidates:
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
    ports = _free_ports(len(layout))
    nodes = []
    for (role, index), port in zip(layout, ports, strict=True):
        name = f"{role}-{index}"
        node_dir = workdir / name
        (node_dir / "output").mkdir(parents=True, exist_ok=True)
        nodes.append(
            NodeInfo(
                name=name, role=role, index=index, host=HOST, port=port, instance_type="local", workdir=str(node_dir)
            )
        )
    cluster = ClusterInfo(
        cluster_id=spec.cluster_id, provider="local", strategy=spec.strategy, nodes=tuple(nodes), workdir=str(workdir)
    )
    state.write_text(json.dumps(cluster.to_dict()))
    return cluster


def _make_env(workdir: Path) -> Path:
    """A virtualenv for the job's wheel that also sees the platform's packages (TensorFlow, numpy, psutil)."""
    env_dir = workdir / "env"
    python = env_dir / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, capture_output=True)
        (purelib,) = env_dir.glob("lib/python*/site-packages")
        (purelib / "fc2-platform.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def _install_wheel(python: Path, wheel: str, log: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "--no-input",
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


def _fetch_dataset(source: str, data_dir: Path) -> Path:
    data_dir.mkdir(exist_ok=True)
    if source.startswith(("http://", "https://")):
        target = data_dir / (Path(source.split("?")[0]).name or "dataset")
        limit = settings.FC2_MAX_DATASET_MB * 2**20
        try:
            with urllib.request.urlopen(source, timeout=60) as response, open(target, "wb") as out:
                copied = 0
                while chunk := response.read(1 << 20):
                    copied += len(chunk)
                    if copied > limit:
                        raise LocalProvisionError(
                            f"dataset at {source} is larger than {settings.FC2_MAX_DATASET_MB} MB"
                        )
                    out.write(chunk)
        except OSError as exc:
            raise LocalProvisionError(f"cannot download dataset {source}: {exc}") from exc
        return target
    path = Path(source)
    if not path.is_file():
        raise LocalProvisionError(f"dataset file {source} does not exist")
    target = data_dir / path.name
    if not target.exists():
        target.symlink_to(path)
    return target


def _node_env(cluster: ClusterInfo, node: NodeInfo, run: RunSpec, dataset: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in PASSTHROUGH_ENV if key in os.environ}
    tf_config = {"cluster": cluster.tf_cluster(), "task": {"type": node.role, "index": node.index}}
    env.update(
        TF_CONFIG=json.dumps(tf_config),
        FC2_STRATEGY=cluster.strategy,
        FC2_ROLE=node.role,
        FC2_TASK_INDEX=str(node.index),
        FC2_IS_CHIEF="1" if is_chief(cluster.strategy, node.role, node.index) else "0",
        FC2_DATA=str(dataset),
        FC2_OUTPUT_DIR=str(Path(node.workdir) / "output"),
        FC2_JOB_ID=str(run.job_id),
        FC2_CLUSTER_ID=cluster.cluster_id,
        FC2_AGENT_TOKEN=run.token,
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return env


def start(cluster: ClusterInfo, run: RunSpec) -> ClusterInfo:
    workdir = Path(cluster.workdir)
    python = _make_env(workdir)
    _install_wheel(python, run.wheel_path, workdir / "install.log")
    agent = workdir / "fc2_agent.py"
    shutil.copyfile(AGENT, agent)
    dataset = _fetch_dataset(run.dataset, workdir / "data")
    started = []
    for node in cluster.nodes:
        if node.pid and _process(node):  # started before (a redelivered step)
            started.append(node)
            continue
        node_dir = Path(node.workdir)
        (node_dir / "tf_config.json").write_text(json.dumps({"cluster": cluster.tf_cluster()}))
        command = [
            str(python),
            str(agent),
            "--url",
            run.report_url,
            "--job",
            str(run.job_id),
            "--node",
            node.name,
            "--log",
            str(node_dir / "node.log"),
            "--output",
            str(node_dir / "output"),
            "--max-artifact-mb",
            str(settings.FC2_MAX_ARTIFACT_MB),
            "--",
            str(python),
            "-m",
            run.main_module,
            *run.args,
        ]
        with open(node_dir / "agent.log", "ab") as agent_log:
            process = subprocess.Popen(
                command,
                cwd=node_dir,
                env=_node_env(cluster, node, run, dataset),
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
    (workdir / "cluster.json").write_text(json.dumps(cluster.to_dict()))
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


def _cluster_processes(cluster_id: str) -> list[psutil.Process]:
    """Every live process carrying this cluster's id in its environment (nodes and anything they spawned)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("FC2_CLUSTER_ID") == cluster_id and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def teardown(cluster: ClusterInfo, grace_s: float = 5.0) -> None:
    processes = {p.pid: p for p in _cluster_processes(cluster.cluster_id)}
    for node in cluster.nodes:
        if (process := _process(node)) is not None:
            processes[process.pid] = process
    for process in processes.values():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(process.pid) == process.pid:  # an agent: its whole session goes, user code included
                os.killpg(process.pid, signal.SIGTERM)
            else:
                process.terminate()
    _gone, left = psutil.wait_procs(list(processes.values()), timeout=grace_s)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=grace_s)
    _reap()
    leftover = _cluster_processes(cluster.cluster_id)
    if leftover:
        raise LocalProvisionError(f"processes {[p.pid for p in leftover]} of {cluster.cluster_id} survived teardown")
    shutil.rmtree(cluster.workdir or _cluster_dir(cluster.cluster_id), ignore_errors=True)
