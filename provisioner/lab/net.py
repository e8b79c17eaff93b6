"""The `lab` provider's network: each cluster node a Linux network namespace on a bridge of its cluster, with its own
address, a shaped link, a CPU share and an emulated latency, so that a cluster's network is real and measurable on one
machine (FC² §8.1–8.2 measure bandwidth between PS and workers; Anwar §5.2.3/§6.2 add 20–100 ms of latency with NetEm).

This module owns the kernel objects of a lab cluster and nothing else (no Django, no SSH: the provider passes settings
in and starts sshd on the nodes through `node_argv`):

    bridge     fc2b{h}                    the cluster's L2 segment; address .1 of its /24 = the platform (gateway);
                                          link alias `fc2lab:{tag}:{cluster_id}` so a reaper can list cluster ids
    namespace  fc2lab-{tag}-{h}-{i}       node i: lo, eth0 = .{i+2}, only the connected /24 (no default route)
    veth       fc2v{h}{i:02d}             node i's host end, a port of the bridge (the node end is its eth0)
    tbf        on eth0 (upload) and on the host veth (download), rate = NodeShape.rate_mbit
    cgroup     /sys/fs/cgroup/cpu/fc2lab/{namespace}   cfs quota = NodeShape.cpus × period (cgroup v1 `cpu`)
    iptables   host chains FC2LAB-{h}-IN / -FWD: from the bridge only replies and the platform's ports reach the host,
               nothing is forwarded in or out of the bridge; in each node, chain FC2DELAY queues packets from other
               nodes to the delay daemon (provisioner/lab/delay.py)

where h = sha256(f"{tag}/{cluster_id}")[:8] and `tag` identifies the installation, so teardown and the reaper find
everything from (tag, cluster_id) alone, with no saved state, and two installations on one machine never collide.

Why these choices:
- Latency by NFQUEUE: this kernel has no netem (nor fq, which would honour a BPF-set departure time), so a packet
  from another node is queued to a userspace daemon in the receiving node's namespace and released L ms later — the
  same one-way L per node as NetEm's `delay L` on each machine. Only node↔node packets are delayed: the platform's
  SSH and the agents' reports are not part of the emulated datacentre.
- tbf's burst is at least one 64 KB GSO packet, so veth's TSO super-packets pass whole instead of being segmented by
  tbf; its queue holds ~20 ms at the rate (a cloud link's buffer is shallow; a deep one would add seconds of
  bufferbloat to every RTT under load). TCP's goodput is ~95.6 % of the rate: the rate counts Ethernet, IP and TCP
  headers (1448 payload bytes per 1514 on the wire), as a cloud provider's advertised bandwidth does.
- Subnets are chosen under a machine-wide lock (/run/fc2lab.lock) as the first /24 of the pool that no address or
  route on the host overlaps, so concurrent launches and several installations pick different ones. The same lock
  serialises every create, delete and reap, which is also what makes create idempotent.
- IPv6 is disabled on the bridge and in the nodes: a link-local address would otherwise reach host services listening
  on [::] around the IPv4 firewall.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import ProvisionError
from provisioner.lab import delay

LOCK_PATH = Path("/run/fc2lab.lock")
NETNS_DIR = Path("/run/netns")
CPU_CONTROLLER = Path("/sys/fs/cgroup/cpu")
CGROUP_ROOT = CPU_CONTROLLER / "fc2lab"
SSHD = Path("/usr/sbin/sshd")
NFQUEUE_PROC = Path("/proc/net/netfilter/nfnetlink_queue")
DELAY_QUEUE = 0
DELAY_CHAIN = "FC2DELAY"
# How long a delay daemon may take to bind its queue: Python starting on cores a dozen TensorFlow processes share
# took more than 10 s in CI; past this it is stuck, not slow.
DELAY_START_S = 60
TBF_MIN_BURST_BYTES = 70_000  # one 64 KiB GSO packet plus headers: tbf never has to segment one
TBF_QUEUE_S = 0.020
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class NodeShape:
    """What one lab node's machine is like."""

    rate_mbit: float | None = None  # link capacity in each direction (Mbit/s on the wire); None = unshaped
    cpus: float | None = None  # CPU share in cores (0.5 = half a core); None = unlimited
    address: str | None = None  # its address on the cluster's subnet; None = .{index + 2}


@dataclass(frozen=True)
class NodeNet:
    """One node's place on the cluster's network."""

    index: int  # position in the shapes given to create_cluster_network (0-based)
    netns: str  # network namespace name: run the node's processes with node_argv(netns, argv)
    address: str  # the node's IPv4 address on eth0, e.g. "10.213.0.2"
    veth: str  # the host end of the node's link (a port of the bridge)


@dataclass(frozen=True)
class ClusterNet:
    """A lab cluster's network as it exists on this machine."""

    cluster_id: str  # the caller's id of the cluster
    bridge: str  # the bridge joining the nodes and the platform
    subnet: str  # the cluster's /24, e.g. "10.213.0.0/24"
    gateway: str  # the bridge's address: the platform as the nodes see it (SSH from, reports to)
    nodes: tuple[NodeNet, ...]  # in index order
    latency_ms: float  # one-way delay added to every node↔node packet (a round trip takes twice this)


# Naming: everything is derived from (tag, cluster_id), so nothing needs to be remembered between calls.


def cluster_hash(tag: str, cluster_id: str) -> str:
    """The 8 hex digits naming a cluster's kernel objects.

    >>> cluster_hash("ab12", "job-7")
    '2a5b666c'
    """
    return hashlib.sha256(f"{tag}/{cluster_id}".encode()).hexdigest()[:8]


def bridge_name(h: str) -> str:
    return f"fc2b{h}"


def netns_prefix(tag: str, h: str) -> str:
    """What the names of a cluster's node namespaces (and its cgroups, delay daemons) begin with."""
    return f"fc2lab-{tag}-{h}-"


def netns_name(tag: str, h: str, index: int) -> str:
    return f"{netns_prefix(tag, h)}{index}"


def veth_name(h: str, index: int) -> str:
    return f"fc2v{h}{index:02d}"


def _alias(tag: str, cluster_id: str) -> str:
    return f"fc2lab:{tag}:{cluster_id}"


def _chains(h: str) -> tuple[str, str]:
    return f"FC2LAB-{h}-IN", f"FC2LAB-{h}-FWD"


def _check_tag(tag: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{1,16}", tag):
        raise ProvisionError(f"lab installation tag must be 1-16 lowercase hex digits, not {tag!r}")


# Running commands.


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if check and result.returncode != 0:
        reason = (result.stderr or "").strip() or f"exit status {result.returncode}"
        raise ProvisionError(f"lab network: `{shlex.join(argv)}` failed: {reason}")
    return result


def _ms(latency_ms: float) -> str:
    return f"{float(latency_ms):g}"


def _json(argv: Sequence[str]) -> list[dict]:
    return json.loads(_run(argv).stdout or "[]")


def _in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv]


def _iptables(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["iptables", "-w", *args]
    return _run(_in_netns(netns, argv) if netns else argv, check=check)


def _ensure_rule(chain: str, rule: Sequence[str], *, position: int | None = None, netns: str | None = None) -> None:
    """Add `rule` to `chain` unless it is there: appended, or inserted at `position` (1-based) when given."""
    if _iptables("-C", chain, *rule, netns=netns, check=False).returncode == 0:
        return
    if position is None:
        _iptables("-A", chain, *rule, netns=netns)
    else:
        _iptables("-I", chain, str(position), *rule, netns=netns)


def _ensure_chain(chain: str, *, netns: str | None = None) -> None:
    if _iptables("-n", "-L", chain, netns=netns, check=False).returncode != 0:
        _iptables("-N", chain, netns=netns)


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    # One lock for every installation on the machine: subnet choice must see the other launches' bridges.
    with open(os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600), "r+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _links(kind: str | None = None) -> list[dict]:
    return _json(["ip", "-j", "link", "show", *(["type", kind] if kind else [])])


def _link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip", *(["-n", netns] if netns else []), "link", "show", name]
    return _run(argv, check=False).returncode == 0


def _namespaces() -> list[str]:
    return sorted(entry.name for entry in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


# Availability.


def unavailable() -> str | None:
    """Why the lab cannot work on this machine, in one line, or None when it can."""
    if os.geteuid() != 0:
        return "the lab provider needs root (network namespaces, bridges, iptables, cgroups)"
    tools = {"ip": "iproute2", "tc": "iproute2", "iptables": "iptables", "setsid": "util-linux", "sysctl": "procps"}
    missing = {tool: package for tool, package in tools.items() if shutil.which(tool) is None}
    if missing:
        packages = ", ".join(sorted(set(missing.values())))
        return f"the lab provider needs {', '.join(missing)} (Debian packages {packages})"
    if not SSHD.exists():
        return f"the lab provider needs an OpenSSH server at {SSHD} (Debian package openssh-server)"
    if not NFQUEUE_PROC.exists():
        return "the kernel has no NFQUEUE (nfnetlink_queue), which the lab's latency emulation needs"
    if not (CPU_CONTROLLER / "cgroup.procs").exists():
        return f"the cgroup v1 cpu controller is not mounted at {CPU_CONTROLLER} (the lab's CPU shares need it)"
    return None


# Creating.


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for link in _json(["ip", "-j", "-4", "addr", "show"]):
        for info in link.get("addr_info", []):
            used.append(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network)
    for route in _json(["ip", "-j", "-4", "route", "show", "table", "all"]):
        if route.get("dst") not in (None, "default"):
            used.append(ipaddress.IPv4Network(route["dst"], strict=False))
    return used


def _pick_subnet(pool: str) -> ipaddress.IPv4Network:
    network = ipaddress.ip_network(pool)
    if not isinstance(network, ipaddress.IPv4Network) or network.prefixlen > 24:
        raise ProvisionError(f"lab address pool {pool} must be an IPv4 network of /24 or larger")
    used = _used_networks()
    for candidate in network.subnets(new_prefix=24):
        if not any(candidate.overlaps(other) for other in used):
            return candidate
    raise ProvisionError(f"every /24 of the lab address pool {pool} is in use on this machine: remove a lab cluster")


def _bridge_subnet(bridge: str) -> ipaddress.IPv4Network | None:
    for link in _json(["ip", "-j", "-4", "addr", "show", "dev", bridge]):
        for info in link.get("addr_info", []):
            return ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network
    return None


def _disable_ipv6(interface: str) -> None:
    Path(f"/proc/sys/net/ipv6/conf/{interface}/disable_ipv6").write_text("1")


def _given_subnet(subnet: str) -> ipaddress.IPv4Network:
    network = ipaddress.ip_network(subnet)
    if not isinstance(network, ipaddress.IPv4Network) or network.prefixlen != 24:
        raise ProvisionError(f"a lab cluster's subnet must be an IPv4 /24, not {subnet}")
    if any(network.overlaps(other) for other in _used_networks()):
        raise ProvisionError(f"lab subnet {subnet} overlaps a network in use on this machine")
    return network


def _ensure_bridge(tag: str, cluster_id: str, h: str, pool: str, subnet: str | None) -> ipaddress.IPv4Network:
    bridge = bridge_name(h)
    chosen = _bridge_subnet(bridge) if _link_exists(bridge) else None
    chosen = chosen or (_given_subnet(subnet) if subnet else _pick_subnet(pool))
    if not _link_exists(bridge):
        _run(["ip", "link", "add", "name", bridge, "type", "bridge"])
    _run(["ip", "link", "set", bridge, "alias", _alias(tag, cluster_id)])
    with contextlib.suppress(FileNotFoundError):  # a kernel without IPv6 has nothing to disable
        _disable_ipv6(bridge)
    _run(["ip", "addr", "replace", f"{chosen.network_address + 1}/24", "dev", bridge])
    return chosen


def _ensure_host_firewall(tag: str, cluster_id: str, h: str, platform_ports: Sequence[int]) -> None:
    """Made before any node is linked to the bridge, so no packet ever passes unfiltered."""
    bridge, (chain_in, chain_fwd) = bridge_name(h), _chains(h)
    comment = ["-m", "comment", "--comment", _alias(tag, cluster_id)]
    _ensure_chain(chain_in)
    _ensure_rule(chain_in, ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"], position=1)
    for port in platform_ports:
        _ensure_rule(chain_in, ["-p", "tcp", "--dport", str(int(port)), "-j", "ACCEPT"], position=2)
    _ensure_rule(chain_in, ["-j", "DROP"])
    _ensure_chain(chain_fwd)
    # With br_netfilter (bridge-nf-call-iptables=1) frames between two nodes pass FORWARD too: let them, whatever
    # the host's policy, and nothing else.
    _ensure_rule(chain_fwd, ["-i", bridge, "-o", bridge, "-j", "ACCEPT"], position=1)
    _ensure_rule(chain_fwd, ["-j", "DROP"])
    _ensure_rule("INPUT", ["-i", bridge, *comment, "-j", chain_in], position=1)
    _ensure_rule("FORWARD", ["-i", bridge, *comment, "-j", chain_fwd], position=1)
    _ensure_rule("FORWARD", ["-o", bridge, *comment, "-j", chain_fwd], position=1)


def _tbf(rate_mbit: float) -> list[str]:
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(TBF_MIN_BURST_BYTES, int(rate_bytes * 0.002))
    limit = burst + int(rate_bytes * TBF_QUEUE_S)
    return ["tbf", "rate", f"{int(rate_mbit * 1e6)}bit", "burst", str(burst), "limit", str(limit)]


def _shape(device: str, rate_mbit: float | None, netns: str | None = None) -> None:
    tc = ["tc", *(["-n", netns] if netns else [])]
    if rate_mbit is None:
        _run([*tc, "qdisc", "del", "dev", device, "root"], check=False)  # back to the default qdisc
    else:
        if rate_mbit <= 0:
            raise ProvisionError(f"a lab node's link rate must be positive, not {rate_mbit} Mbit/s")
        _run([*tc, "qdisc", "replace", "dev", device, "root", *_tbf(rate_mbit)])


def _ensure_cgroup(netns: str, cpus: float | None) -> None:
    if not (CPU_CONTROLLER / "cgroup.procs").exists():
        if cpus is not None:
            raise ProvisionError(f"cannot give a lab node {cpus} CPUs: no cgroup v1 cpu controller at {CPU_CONTROLLER}")
        return
    group = CGROUP_ROOT / netns
    group.mkdir(parents=True, exist_ok=True)
    period = int((group / "cpu.cfs_period_us").read_text())
    if cpus is not None and cpus <= 0:
        raise ProvisionError(f"a lab node's CPU share must be positive, not {cpus}")
    quota = -1 if cpus is None else max(1000, int(cpus * period))
    (group / "cpu.cfs_quota_us").write_text(str(quota))


def _ensure_node(
    tag: str, cluster_id: str, h: str, index: int, shape: NodeShape, subnet: ipaddress.IPv4Network
) -> NodeNet:
    netns, veth = netns_name(tag, h, index), veth_name(h, index)
    address = shape.address or str(subnet.network_address + 2 + index)
    if ipaddress.ip_address(address) not in subnet or address == str(subnet.network_address + 1):
        raise ProvisionError(f"lab node address {address} is not a host address of {subnet} (its .1 is the gateway)")
    if not (NETNS_DIR / netns).exists():
        _run(["ip", "netns", "add", netns])
    if not _link_exists("eth0", netns):
        if _link_exists(veth):  # a crashed call made the pair but never moved the node end: start again
            _run(["ip", "link", "del", veth])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    _run(["ip", "link", "set", veth, "alias", _alias(tag, cluster_id)])
    if Path("/proc/sys/net/ipv6").is_dir():
        no_ipv6 = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]  # `all` includes eth0
        _run(_in_netns(netns, ["sysctl", "-qw", *no_ipv6]))
    _run(["ip", "-n", netns, "link", "set", "lo", "up"])
    _run(["ip", "-n", netns, "addr", "replace", f"{address}/24", "dev", "eth0"])
    _run(["ip", "-n", netns, "link", "set", "eth0", "up"])
    _shape("eth0", shape.rate_mbit, netns)
    _shape(veth, shape.rate_mbit)
    _ensure_cgroup(netns, shape.cpus)
    _run(["ip", "link", "set", veth, "master", bridge_name(h), "up"])
    return NodeNet(index=index, netns=netns, address=address, veth=veth)


def _delay_daemons(node: str, *, prefix: bool = False) -> list[tuple[int, list[str]]]:
    """The delay daemons (pid, argv) started for node `node`, or for every node whose name starts with it.

    Found by their `--node` argument, not by their namespace: a daemon whose namespace lost its name (deleted by hand
    while the daemon ran) would otherwise run on forever where nothing can see it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if "provisioner.lab.delay" in argv and "--node" in argv:
                serves = (argv[argv.index("--node") + 1 :] or [""])[0]
                if (serves.startswith(node) if prefix else serves == node) and _alive(int(entry.name)):
                    found.append((int(entry.name), argv))
    return found


def _netns_pids(netns: str) -> list[int]:
    return [int(pid) for pid in _run(["ip", "netns", "pids", netns], check=False).stdout.split()]


def _start_delay_daemon(netns: str, latency_ms: float) -> None:
    """Start the node's delay daemon and return once it says its queue is bound (delay.READY): a start slowed by a
    busy machine is waited for, up to DELAY_START_S; a daemon that dies first is an error naming its last words."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "provisioner.lab.delay", "--queue", str(DELAY_QUEUE), "--delay-ms", _ms(latency_ms)]
    argv += ["--node", netns]
    # Its errors to an unlinked file, not a pipe: the daemon outlives us, and a pipe nobody reads would one day block
    # or break it. Its output is a pipe read here: it says READY there once, then lets go of it (delay.say_ready).
    with tempfile.TemporaryFile() as errors:
        # setsid -f: the daemon is nobody's child (it outlives the caller, and no Popen is left to wait for it) and
        # in a session of its own (not killed with the caller's process group); delete_cluster_network kills it.
        starter = subprocess.Popen(
            _in_netns(netns, ["setsid", "-f", *argv]), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=errors,
        )  # fmt: skip
        assert starter.stdout is not None  # stdout=PIPE
        with starter.stdout:
            said = _first_line(starter.stdout.fileno(), time.monotonic() + DELAY_START_S)
        starter.wait()
        if said == delay.READY:
            return
        errors.seek(0)
        detail = errors.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        if said is None:  # still starting: it is not left to bind a queue behind a cluster that failed
            _kill([pid for pid, _ in _delay_daemons(netns)])
            why = f"its queue not bound within {DELAY_START_S} s"
        else:
            why = "it exited before binding its queue"
        raise ProvisionError(f"lab node {netns}: the latency daemon did not start ({why}): {detail[0]}")


def _first_line(fd: int, deadline: float) -> str | None:
    """The first line read from `fd` ("" at its end without one), or None if none came by `deadline` (monotonic)."""
    read = b""
    while b"\n" not in read:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        if not (chunk := os.read(fd, 4096)):
            return ""
        read += chunk
    return read.split(b"\n", 1)[0].decode(errors="replace")


def _ensure_latency(netns: str, subnet: ipaddress.IPv4Network, latency_ms: float) -> None:
    gateway = str(subnet.network_address + 1)
    running = _delay_daemons(netns)
    wanted = _ms(latency_ms)
    if latency_ms <= 0:
        # The rule first: fail-closed, a queue with no daemon would drop the nodes' packets.
        _iptables("-D", "INPUT", "-j", DELAY_CHAIN, netns=netns, check=False)
        _iptables("-F", DELAY_CHAIN, netns=netns, check=False)
        _iptables("-X", DELAY_CHAIN, netns=netns, check=False)
        _kill([pid for pid, _ in running])
        return
    stale = [pid for pid, argv in running if argv[argv.index("--delay-ms") + 1 :][:1] != [wanted]]
    if stale or not running:
        _kill([pid for pid, _ in running])
        # Started before the rule exists, so no packet is queued with no one to release it.
        _start_delay_daemon(netns, latency_ms)
    _ensure_chain(DELAY_CHAIN, netns=netns)
    _ensure_rule(DELAY_CHAIN, ["-s", gateway, "-j", "RETURN"], position=1, netns=netns)
    # No --queue-bypass (fail-closed): see provisioner/lab/delay.py.
    _ensure_rule(DELAY_CHAIN, ["-s", str(subnet), "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE)], netns=netns)
    _ensure_rule("INPUT", ["-j", DELAY_CHAIN], position=1, netns=netns)


def create_cluster_network(
    tag: str,
    cluster_id: str,
    shapes: Sequence[NodeShape],
    *,
    pool: str = "10.213.0.0/16",
    latency_ms: float = 0,
    platform_ports: Sequence[int] = (),
    subnet: str | None = None,
) -> ClusterNet:
    """The network of lab cluster `cluster_id`: one node per shape, made or brought to this state.

    Its /24 is the first free one of `pool`, or `subnet` when given (then `shapes` may be empty: nodes come later,
    with `add_node`). Idempotent: for a cluster that exists (even half-made by a call that crashed) it finishes what
    is missing and returns the same subnet and nodes. A failure part-way through a first creation removes what it
    made before raising. A cluster that has more nodes than `shapes` is an error, not silently shrunk.
    """
    _check_tag(tag)
    if not shapes and not subnet:
        raise ProvisionError("a lab cluster needs at least one node")
    if len(shapes) > 253:
        raise ProvisionError(f"a lab cluster has at most 253 nodes (one /24), not {len(shapes)}")
    if latency_ms < 0:
        raise ProvisionError(f"a lab cluster's latency cannot be negative ({latency_ms} ms)")
    h = cluster_hash(tag, cluster_id)
    with _machine_lock():
        made_here = not _link_exists(bridge_name(h))
        try:
            present = [ns for ns in _namespaces() if ns.startswith(netns_prefix(tag, h))]
            if len(present) > len(shapes):
                raise ProvisionError(f"lab cluster {cluster_id} already has {len(present)} nodes, not {len(shapes)}")
            network = _ensure_bridge(tag, cluster_id, h, pool, subnet)
            _ensure_host_firewall(tag, cluster_id, h, platform_ports)
            _run(["ip", "link", "set", bridge_name(h), "up"])
            nodes = tuple(_ensure_node(tag, cluster_id, h, i, shape, network) for i, shape in enumerate(shapes))
            for node in nodes:
                _ensure_latency(node.netns, network, latency_ms)
        except BaseException:
            if made_here:
                _delete(tag, h)
            raise
    return ClusterNet(
        cluster_id=cluster_id,
        bridge=bridge_name(h),
        subnet=str(network),
        gateway=str(network.network_address + 1),
        nodes=nodes,
        latency_ms=latency_ms,
    )


def add_node(tag: str, cluster_id: str, index: int, shape: NodeShape) -> NodeNet:
    """Node `index` of an existing cluster network, made or brought to `shape` (no latency: a machine joining a
    network, as an instance joins its subnet).

    Reachable at once, as a cloud's network makes a new instance, even at an address a removed node held (EC2 gives a
    terminated instance's private address to the next): the other nodes and the host forget that address's link
    address, which they would otherwise keep using, unanswered, until their entries expire (35–55 s measured)."""
    _check_tag(tag)
    h = cluster_hash(tag, cluster_id)
    with _machine_lock():
        subnet = _bridge_subnet(bridge_name(h)) if _link_exists(bridge_name(h)) else None
        if subnet is None:
            raise ProvisionError(f"lab cluster {cluster_id} has no network to add a node to")
        node = _ensure_node(tag, cluster_id, h, index, shape, subnet)
        for other in _namespaces():
            if other.startswith(netns_prefix(tag, h)) and other != node.netns:
                _run(["ip", "-n", other, "neigh", "flush", "to", node.address], check=False)
        _run(["ip", "neigh", "flush", "to", node.address, "dev", bridge_name(h)], check=False)
        return node


def remove_node(tag: str, cluster_id: str, index: int) -> list[str]:
    """Remove node `index` of a cluster network: every process in its namespace, the namespace (and its link), its
    CPU cgroup. Returns what it removed; nothing when there is nothing."""
    _check_tag(tag)
    netns = netns_name(tag, cluster_hash(tag, cluster_id), index)
    removed: list[str] = []
    with _machine_lock():
        if netns in _namespaces():
            pids = _netns_pids(netns) + [pid for pid, _ in _delay_daemons(netns)]
            removed += [f"process {pid}" for pid in _kill(sorted(set(pids)))]
            _run(["ip", "netns", "del", netns])
            removed.append(f"namespace {netns}")
        removed += _remove_cgroup(CGROUP_ROOT / netns)
    return removed


def allow_platform_port(tag: str, cluster_id: str, port: int) -> None:
    """Let the cluster's nodes open TCP connections to `port` on the platform (the gateway address); idempotent."""
    _check_tag(tag)
    chain_in, _ = _chains(cluster_hash(tag, cluster_id))
    with _machine_lock():
        if _iptables("-n", "-L", chain_in, check=False).returncode != 0:
            raise ProvisionError(f"lab cluster {cluster_id} has no network on this machine")
        _ensure_rule(chain_in, ["-p", "tcp", "--dport", str(int(port)), "-j", "ACCEPT"], position=2)


# Running processes on a node.


def cpu_cgroup(netns: str) -> Path | None:
    """The node's cgroup in the v1 cpu controller, or None when it has none."""
    group = CGROUP_ROOT / netns
    return group if group.is_dir() else None


def node_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """A command line that runs `argv` on the node: in its network namespace and its CPU cgroup (children too).

    >>> node_argv("fc2lab-ab-00000000-0", ["true"])[-5:]
    ['ip', 'netns', 'exec', 'fc2lab-ab-00000000-0', 'true']
    """
    inner = _in_netns(netns, argv)
    group = cpu_cgroup(netns)
    if group is None:
        return inner
    # Into the cgroup before entering the namespace: `ip netns exec` remounts /sys, hiding /sys/fs/cgroup.
    procs = shlex.quote(str(group / "cgroup.procs"))
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "_", *inner]


# Removing.


def _kill(pids: Sequence[int], timeout_s: float = 5.0) -> list[int]:
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + timeout_s
    for pid in killed:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
    return killed


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    # A zombie holds no namespace and no cgroup; its parent (not us) reaps it.
    return not re.search(r"^State:\s+Z", status, re.MULTILINE)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _remove_jumps(builtin: str, target_prefix: str) -> list[str]:
    removed = []
    for line in _iptables("-S", builtin).stdout.splitlines():
        words = shlex.split(line)
        if words[:1] == ["-A"] and "-j" in words and words[words.index("-j") + 1].startswith(target_prefix):
            _iptables("-D", *words[1:], check=False)
            removed.append(f"iptables rule {line}")
    return removed


def _delete(tag: str, h: str) -> list[str]:
    """Remove every kernel object named after (tag, h). Call with the machine lock held."""
    removed: list[str] = []
    prefix = netns_prefix(tag, h)
    namespaces = [ns for ns in _namespaces() if ns.startswith(prefix)]
    groups = sorted(CGROUP_ROOT.glob(f"{prefix}*")) if CGROUP_ROOT.is_dir() else []
    pids = {pid for ns in namespaces for pid in _netns_pids(ns)}
    pids.update(pid for pid, _ in _delay_daemons(prefix, prefix=True))
    for group in groups:
        with contextlib.suppress(OSError):
            pids.update(int(pid) for pid in (group / "cgroup.procs").read_text().split())
    commands = {pid: _command(pid) for pid in pids}
    removed += [f"process {pid} ({commands[pid]})" for pid in _kill(sorted(pids))]
    for ns in namespaces:
        _run(["ip", "netns", "del", ns])  # takes its eth0, and so the veth pair, with it
        removed.append(f"namespace {ns}")
    for link in _links():
        name = link["ifname"].split("@")[0]
        if name.startswith(f"fc2v{h}"):  # a host end whose node end never made it into a namespace
            _run(["ip", "link", "del", name], check=False)
            removed.append(f"veth {name}")
    if _link_exists(bridge_name(h)):
        _run(["ip", "link", "del", bridge_name(h)])
        removed.append(f"bridge {bridge_name(h)}")
    removed += _remove_jumps("INPUT", f"FC2LAB-{h}-") + _remove_jumps("FORWARD", f"FC2LAB-{h}-")
    for chain in _chains(h):
        if _iptables("-n", "-L", chain, check=False).returncode == 0:
            _iptables("-F", chain)
            _iptables("-X", chain)
            removed.append(f"iptables chain {chain}")
    for group in groups:
        removed += _remove_cgroup(group)
    return removed


def _remove_cgroup(group: Path, timeout_s: float = 5.0) -> list[str]:
    """Remove a node's CPU cgroup, killing what is still in it first: a command joins the cgroup before it enters the
    node's namespace (node_argv), so one just starting is in the one and not yet in the other, and keeps the cgroup
    busy. What it removed; nothing when the cgroup is gone."""
    removed: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            commands = {int(pid): _command(int(pid)) for pid in (group / "cgroup.procs").read_text().split()}
            removed += [f"process {pid} ({commands[pid]})" for pid in _kill(list(commands))]
            group.rmdir()
        except FileNotFoundError:
            return removed
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)  # a process killed but not yet gone, or one that joined meanwhile
            continue
        return [*removed, f"cgroup {group}"]


def delete_cluster_network(tag: str, cluster_id: str) -> list[str]:
    """Remove lab cluster `cluster_id` of installation `tag`: its processes (every one in its namespaces or cgroups),
    namespaces, links, qdiscs, iptables chains and cgroups. Returns what it removed; nothing when there is nothing."""
    _check_tag(tag)
    with _machine_lock():
        return _delete(tag, cluster_hash(tag, cluster_id))


def list_cluster_networks(tag: str) -> list[str]:
    """The ids of installation `tag`'s lab clusters on this machine (from their bridges' aliases)."""
    _check_tag(tag)
    return sorted(_clusters(tag).values())


def _clusters(tag: str) -> dict[str, str]:
    """cluster hash → cluster id, for every bridge of installation `tag`."""
    prefix = _alias(tag, "")
    return {
        link["ifname"].removeprefix("fc2b"): link["ifalias"].removeprefix(prefix)
        for link in _links("bridge")
        if link.get("ifalias", "").startswith(prefix) and link["ifname"].startswith("fc2b")
    }


def _orphan_hashes(tag: str) -> set[str]:
    """Hashes of installation `tag` that still name a namespace, cgroup, veth or iptables rule."""
    found: set[str] = set()
    pattern = re.compile(rf"^fc2lab-{tag}-([0-9a-f]{{8}})-\d+$")
    names = _namespaces() + ([group.name for group in CGROUP_ROOT.iterdir()] if CGROUP_ROOT.is_dir() else [])
    found.update(match[1] for name in names if (match := pattern.match(name)))
    alias = _alias(tag, "")
    found.update(link["ifname"][4:12] for link in _links() if link.get("ifalias", "").startswith(alias))
    for builtin in ("INPUT", "FORWARD"):
        for line in _iptables("-S", builtin).stdout.splitlines():
            if alias in line and (match := re.search(r"-j FC2LAB-([0-9a-f]{8})-", line)):
                found.add(match[1])
    return found


def reap(tag: str, keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove every lab cluster network of installation `tag` whose id is not in `keep`, and every leftover of that
    installation (namespace, cgroup, veth, iptables chain) whose cluster's bridge is gone. Returns what it removed."""
    _check_tag(tag)
    removed: list[str] = []
    with _machine_lock():
        clusters = _clusters(tag)
        for h, cluster_id in clusters.items():
            if cluster_id not in keep:
                removed += _delete(tag, h)
        alive = {h for h, cluster_id in clusters.items() if cluster_id in keep}
        alive |= {cluster_hash(tag, cluster_id) for cluster_id in keep}
        for h in sorted(_orphan_hashes(tag) - alive):
            removed += _delete(tag, h)
    return removed
