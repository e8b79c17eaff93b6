"""The `lab` provider: an emulated cloud on this machine, whose nodes are hosts with their own addresses, SSH servers
and shaped links — so that SSH bootstrap, bandwidth limits and latency are real here (FC² §8, Anwar §5.2.3 and §6.2).

A lab node is a network namespace (provisioner/lab/net.py) with its own address on a bridge of its cluster's own, its
link shaped to its instance type's network capacity and its CPU capped at its vCPUs (the `lab` catalogue,
recommender/catalogs/lab.json), an OpenSSH server of its own (provisioner/lab/sshd.py) that lets in the cluster's key
only, and nothing else reachable: the other nodes of its cluster and the platform at the bridge's address. With
`latency_ms`, every packet from one node to another arrives that much later.

The node's "machine image" is this machine's: its Python with the platform's packages (TensorFlow) and the sandbox
tools. Everything job-specific reaches the node over SSH, exactly as on EC2 (provisioner/nodes.py). The node's
"hardware" is made by launch, as a cloud's hypervisor would: the node's directory with a disk of its own
(FC2_LOCAL_NODE_DISK_MB, loop-mounted ext4), a memory cgroup of the instance type's memory, and the cluster's
unprivileged uid — the job's code runs in the same sandbox as on the local provider (provisioner/sandbox.py), in the
node's own network namespace, since a lab node shares this machine's files and kernel with the platform.

The nodes' agents report to the platform through a relay on the bridge's address (provisioner/relay.py), which the
cluster's firewall lets them reach, and nothing else of the platform's machine.

State of a cluster, on the platform (FC2_LAB_DIR/<cluster_id>/, root's, 0700): cluster.json, the cluster's SSH key
(id_ed25519, 0600; never leaves the platform), known_hosts (pinned on first contact), logs/<node>.bootstrap.log,
etc/ (the sandbox's passwd), and nodes/<node>/ — the node's "disk": its directory as the bootstrap sees it
over SSH, with its sshd's configuration and host key in sshd/. Teardown needs only the cluster's name: the network
is found by name (provisioner/lab/net.py), the rest under the cluster's directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
from django.conf import settings

from provisioner import sandbox, ssh
from provisioner.errors import ProvisionError, TransientProvisionError
from provisioner.interface import Machine, NodeCommand
from provisioner.interface import regions as regions  # the default: no regions
from provisioner.lab import net as labnet
from provisioner.lab import sshd
from provisioner.local import sandboxed_command
from provisioner.runners import spawn
from provisioner.types import ClusterInfo, ClusterSpec, NodeInfo, cluster_directory, node_layout

CATALOG = Path(__file__).resolve().parents[2] / "recommender" / "catalogs" / "lab.json"
TF_PORT = 7000  # every node has an address of its own: one TensorFlow port is enough
SSH_PORT = 22
SSH_READY_S = 60
# A node is on this machine's own bridge: its kernel completes a TCP handshake in well under a millisecond, however
# busy the node. Past this, its address is gone (host deleted, link cut) and waiting longer only delays the sweep.
TCP_CONNECT_S = 2


def tag() -> str:
    """This installation's lab tag: its lab directory's, so two installations on one machine never share a name."""
    return hashlib.sha256(str(settings.FC2_LAB_DIR).encode()).hexdigest()[:6]


def unavailable() -> str | None:
    reason = labnet.unavailable() or sandbox.unavailable()
    if reason:
        return f"lab clusters need root and the lab's tools on this machine: {reason} (make lab installs them)"
    return None


def instance_types() -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(CATALOG.read_text())["types"]}


def _instance_type(name: str) -> dict:
    types = instance_types()
    if name not in types:
        raise ProvisionError(f"unknown lab instance type {name!r} (lab types: {', '.join(sorted(types))})")
    return types[name]


def _cluster_dir(cluster_id: str) -> Path:
    return cluster_directory(settings.FC2_LAB_DIR, cluster_id)


def _node_types(spec: ClusterSpec) -> list[tuple[str, int, str]]:
    """(role, index, instance type) of every node: the PS on the PS type (else the workers'), the rest on theirs."""
    default = next(iter(t for t in instance_types().values() if t["role"] in ("worker", "any")))["name"]
    worker_type = spec.worker_type or default
    ps_type = spec.ps_type or worker_type
    layout = node_layout(spec.strategy, spec.workers)
    return [(role, index, ps_type if role == "ps" else worker_type) for role, index in layout]


def launch(spec: ClusterSpec, notify: Callable[[str], None] | None = None) -> ClusterInfo:
    """Make the cluster's nodes: network, shaped links, disks, memory, SSH servers. Idempotent by name: a second
    launch brings what exists to this state; a launch that fails part-way removes everything it made."""
    if reason := unavailable():
        raise ProvisionError(reason)
    workdir = _cluster_dir(spec.cluster_id)
    if launched := ClusterInfo.load(workdir):
        return launched
    nodes_of = _node_types(spec)
    types = {name: _instance_type(name) for _, _, name in nodes_of}
    try:
        workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (workdir / "logs").mkdir(exist_ok=True)
        public_key = ssh.generate_keypair(workdir / "id_ed25519", f"fc2-{spec.cluster_id}")
        shapes = [
            labnet.NodeShape(rate_mbit=types[t]["network_mbps"], cpus=types[t].get("vcpu")) for _, _, t in nodes_of
        ]
        net = labnet.create_cluster_network(
            tag(), spec.cluster_id, shapes, pool=settings.FC2_LAB_NETWORK, latency_ms=spec.latency_ms
        )
        uid = sandbox.free_uid()
        (workdir / "uid").write_text(str(uid))  # before anything runs as it: teardown finds its processes by it
        sandbox.write_etc(workdir / "etc", uid)
        nodes = []
        for (role, index, type_name), node_net in zip(nodes_of, net.nodes, strict=True):
            name = f"{role}-{index}"
            root = workdir / "nodes" / name
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            sandbox.create_disk(root / "disk.img", root / "job", settings.FC2_LOCAL_NODE_DISK_MB)
            sandbox.prepare_dirs(uid, root / "job" / "work", root / "job" / "output")
            memory_mb = int(types[type_name].get("memory_gib") or 2) * 1024
            sandbox.create_memory_cgroup(node_net.netns, memory_mb)
            config = sshd.prepare(root / "sshd", node_net.address, SSH_PORT, public_key)
            pid = sshd.start(config, netns=node_net.netns)
            _join_cpu_cgroup(node_net.netns, pid)
            nodes.append(
                NodeInfo(
                    name=name,
                    role=role,
                    index=index,
                    host=node_net.address,
                    port=TF_PORT,
                    instance_type=type_name,
                    instance_id=node_net.netns,
                    external_host=node_net.address,
                    ssh_port=SSH_PORT,
                    ssh_user="root",
                    workdir=str(root),
                    gpus=int(types[type_name].get("gpus") or 0),
                    cpus=int(types[type_name].get("vcpu") or 0),
                )
            )
        cluster = ClusterInfo(
            cluster_id=spec.cluster_id,
            provider="lab",
            strategy=spec.strategy,
            nodes=tuple(nodes),
            workdir=str(workdir),
            sandbox_uid=uid,
            latency_ms=spec.latency_ms,
        )
        cluster.save(workdir)
        return cluster
    except BaseException:
        teardown(spec.cluster_id)
        raise


def _join_cpu_cgroup(netns: str, pid: int) -> None:
    """The node's sshd into the node's CPU cgroup: everything the bootstrap starts through it runs there too."""
    cgroup = labnet.cpu_cgroup(netns)
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(pid))


def machine(cluster: ClusterInfo, node: NodeInfo) -> Machine:
    return Machine(
        runner=ssh.cluster_runner(Path(cluster.workdir), node, tcp_connect_s=TCP_CONNECT_S),
        host=node.external_host,
        root=node.workdir,
        python=sys.executable,
        install_dir=node.workdir,
    )


def node_command(cluster: ClusterInfo, node: NodeInfo, argv: list[str], dataset: str) -> NodeCommand:
    # No network namespace to enter: the agent runs in the node's own, started through the node's sshd.
    cgroup = sandbox.memory_cgroup(node.instance_id)
    return sandboxed_command(cluster, node, Path(node.workdir) / "env", None, cgroup, argv, dataset)


def report_url(cluster: ClusterInfo, url: str) -> str:
    """The platform's URL as the nodes reach it: the bridge's address, through the cluster's relay to `url`."""
    gateway = gateway_of(cluster)
    target = urlsplit(url)
    port = target.port or (443 if target.scheme == "https" else 80)
    _start_relay(Path(cluster.workdir), f"{gateway}:{port}", f"{target.hostname}:{port}")
    labnet.allow_platform_port(tag(), cluster.cluster_id, port)
    return urlunsplit((target.scheme, f"{gateway}:{port}", target.path, "", ""))


def gateway_of(cluster: ClusterInfo) -> str:
    """The platform's address on the cluster's bridge: the first of the nodes' /24 (labnet's layout)."""
    return str(ipaddress.ip_interface(f"{cluster.nodes[0].host}/24").network[1])


def _start_relay(workdir: Path, listen: str, to: str) -> None:
    if _relays(workdir):
        return
    relay = [sys.executable, "-m", "provisioner.relay", "--listen", listen, "--to", to, "--cluster", str(workdir)]
    spawn(relay, workdir / "logs" / "relay.log", cwd=Path(__file__).resolve().parents[2])
    host, _, port = listen.rpartition(":")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
            return
        if not _relays(workdir):
            break
        time.sleep(0.1)
    raise TransientProvisionError(f"the relay to the platform on {listen} did not start (see logs/relay.log)")


def _relays(workdir: Path) -> list[psutil.Process]:
    """The cluster's relay, found by the directory on its command line (so a crash loses nothing that finds it)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            line = process.info["cmdline"]
            named = "provisioner.relay" in line and line[line.index("--cluster") + 1] == str(workdir)
            if named and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def get_cluster(cluster_id: str, region: str = "") -> ClusterInfo | None:
    return ClusterInfo.load(_cluster_dir(cluster_id))


def list_clusters(region: str = "") -> list[str]:
    root = settings.FC2_LAB_DIR
    made = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
    return sorted(made | set(labnet.list_cluster_networks(tag())))


def teardown(cluster_id: str, region: str = "") -> list[str]:
    """Remove everything of the cluster, found from its name: processes (on its nodes, its relay, its sandbox uid's),
    network (namespaces, links, qdiscs, firewall rules, cgroups), disks, memory cgroups and its directory. Returns
    what was removed."""
    workdir = _cluster_dir(cluster_id)
    relays = _relays(workdir)
    for relay in relays:
        with contextlib.suppress(psutil.Error):
            relay.terminate()
    psutil.wait_procs(relays, timeout=5)
    removed = [f"relay {relay.pid}" for relay in relays]
    removed += labnet.delete_cluster_network(tag(), cluster_id)  # every process in the nodes' namespaces, the network
    with contextlib.suppress(OSError, ValueError):
        uid = int((workdir / "uid").read_text())
        for process in sandbox.processes(uid):  # however it got out of the node's namespace
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(sandbox.processes(uid), timeout=5)
    # The nodes' memory cgroups are named after their namespaces, which labnet names after the cluster.
    prefix = labnet.netns_name(tag(), labnet.cluster_hash(tag(), cluster_id), 0).removesuffix("0")
    for cgroup in sandbox.memory_cgroup(prefix).parent.glob(f"{prefix}*"):
        sandbox.delete_memory_cgroup(cgroup.name)
    sandbox.remove_disks(workdir)
    if workdir.exists():
        removed.append(f"directory {workdir}")
    shutil.rmtree(workdir, ignore_errors=True)
    return removed
