"""The lab provider's network (provisioner/lab/net.py) on real namespaces, bridges, qdiscs, iptables and cgroups:
what a node can reach, how fast and how late its packets go, and that nothing of a cluster outlives its removal.

Every cluster here belongs to a tag made for this run, so an installation's own lab clusters are never touched; the
module's last act is to check that the tag left nothing behind. Figures are printed as `FIGURE …` lines (pytest -s).
"""

from __future__ import annotations

import secrets
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks.lab_network import connect, rtts_ms, serving, throughput_mbit
from provisioner.errors import ProvisionError
from provisioner.lab import net as labnet

REASON = labnet.unavailable()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=f"the lab network cannot run here: {REASON}"),
    pytest.mark.alone,  # rates, delays and CPU shares measured: nothing beside them
]

PROJECT_DIR = Path(__file__).resolve().parent.parent
USED: set[tuple[str, str]] = set()  # (tag, cluster id) of every cluster this module asked for, for the final check


def leftovers(tag: str, cluster_ids: set[str], hashes: set[str] = frozenset()) -> list[str]:
    """Every kernel object of these clusters (or cluster hashes) of installation `tag` still on the machine."""
    hashes = {*hashes, *(labnet.cluster_hash(tag, cluster_id) for cluster_id in cluster_ids)}
    prefixes = tuple(f"fc2lab-{tag}-{h}-" for h in hashes)
    found = [f"namespace {ns}" for ns in labnet._namespaces() if ns.startswith(prefixes)]
    links = labnet._links()
    found += [f"link {link['ifname']}" for link in links if link["ifname"][4:12] in hashes]
    aliases = tuple(f"fc2lab:{tag}:{cluster_id}" for cluster_id in cluster_ids)
    found += [f"link {link['ifname']}" for link in links if link.get("ifalias", "") in aliases]
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout
    found += [f"iptables {line}" for line in rules.splitlines() if any(f"FC2LAB-{h}-" in line for h in hashes)]
    if labnet.CGROUP_ROOT.is_dir():
        found += [f"cgroup {group}" for group in labnet.CGROUP_ROOT.iterdir() if group.name.startswith(prefixes)]
    return found


@pytest.fixture(scope="module")
def tag():
    tag = secrets.token_hex(4)
    yield tag
    labnet.reap(tag)
    for used_tag in {used_tag for used_tag, _ in USED}:
        assert leftovers(used_tag, {cluster_id for t, cluster_id in USED if t == used_tag}) == []
    assert not [ns for ns in labnet._namespaces() if ns.startswith(f"fc2lab-{tag}-")]


@pytest.fixture
def make(tag):
    """create_cluster_network for this test's tag; what it made is removed after the test, whatever happens."""
    made: list[tuple[str, str]] = []

    def make(cluster_id: str, shapes, *, tag: str = tag, **options) -> labnet.ClusterNet:
        made.append((tag, cluster_id))
        USED.add((tag, cluster_id))
        return labnet.create_cluster_network(tag, cluster_id, shapes, **options)

    yield make
    for made_tag, cluster_id in made:
        labnet.delete_cluster_network(made_tag, cluster_id)


def free_port() -> int:
    return 20000 + secrets.randbelow(20000)


def on_node(netns: str, *argv: str) -> str:
    return subprocess.run(labnet.node_argv(netns, argv), capture_output=True, text=True, check=True).stdout


def queue_bound(netns: str) -> bool:
    """Whether the kernel has the delay queue bound in the node's namespace (/proc/net is the reader's namespace:
    each line of this file is a bound queue, its number first)."""
    lines = on_node(netns, "cat", str(labnet.NFQUEUE_PROC)).splitlines()
    return any(line.split()[:1] == [str(labnet.DELAY_QUEUE)] for line in lines)


def test_a_shaped_link_moves_data_at_its_rate_and_a_node_gets_its_cpu_share(make):
    net = make("bw", [labnet.NodeShape(rate_mbit=100, cpus=0.5), labnet.NodeShape(rate_mbit=100)])
    a, b = net.nodes
    mbit = throughput_mbit(a.netns, b.netns, b.address, seconds=3)
    print(f"FIGURE 100 Mbit/s link: {mbit:.1f} Mbit/s of TCP goodput")
    assert 90 <= mbit <= 110

    group = labnet.cpu_cgroup(a.netns)
    assert group is not None
    period = int((group / "cpu.cfs_period_us").read_text())
    assert int((group / "cpu.cfs_quota_us").read_text()) == period // 2
    assert int((labnet.cpu_cgroup(b.netns) / "cpu.cfs_quota_us").read_text()) == -1
    assert f"fc2lab/{a.netns}" in on_node(a.netns, "cat", "/proc/self/cgroup")
    spin = "import os, time\nend = time.monotonic() + 1\nwhile time.monotonic() < end: pass\nprint(sum(os.times()[:2]))"
    cpu_s = float(on_node(a.netns, sys.executable, "-c", spin))
    print(f"FIGURE a node of 0.5 CPU spinning for 1 s used {cpu_s:.2f} s of CPU")
    assert 0.35 <= cpu_s <= 0.65


def test_latency_delays_node_to_node_packets_only(make):
    port = free_port()
    net = make("lat", [labnet.NodeShape(), labnet.NodeShape()], latency_ms=40, platform_ports=[port])
    a, b = net.nodes
    between_nodes = statistics.median(rtts_ms(a.netns, b.netns, b.address, count=20))
    with_platform = statistics.median(rtts_ms(a.netns, None, net.gateway, count=20, port=port))
    print(f"FIGURE latency 40 ms: RTT node↔node {between_nodes:.2f} ms, node↔gateway {with_platform:.2f} ms")
    assert 72 <= between_nodes <= 88
    assert with_platform < 5
    mbit = throughput_mbit(a.netns, b.netns, b.address, seconds=3)
    print(f"FIGURE latency 40 ms, unshaped: {mbit:.1f} Mbit/s of TCP goodput over 3 s (slow start included)")
    assert mbit > 50


def test_a_node_reaches_its_cluster_and_the_platform_ports_only(make, tag):
    allowed, other = free_port(), free_port() + 1
    one = make("iso-one", [labnet.NodeShape(), labnet.NodeShape()], platform_ports=[allowed])
    two = make("iso-two", [labnet.NodeShape()])
    node, peer, stranger = one.nodes[0], one.nodes[1], two.nodes[0]
    assert one.subnet != two.subnet
    assert on_node(node.netns, "ip", "-4", "route").split()[0] == one.subnet  # its /24 and nothing else

    with serving(None, "echo", one.gateway, allowed), serving(None, "echo", one.gateway, other):
        assert connect(node.netns, one.gateway, allowed) == "open"
        assert connect(node.netns, one.gateway, other) == "timeout"  # dropped, as PostgreSQL's port would be
        labnet.allow_platform_port(tag, one.cluster_id, other)
        labnet.allow_platform_port(tag, one.cluster_id, other)
        assert connect(node.netns, one.gateway, other) == "open"
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout
    assert rules.count(f"--dport {other} -j ACCEPT") == 1

    with serving(peer.netns, "echo", peer.address, allowed):
        assert connect(node.netns, peer.address, allowed) == "open"
    with serving(stranger.netns, "echo", stranger.address, allowed):
        assert connect(node.netns, stranger.address, allowed) != "open"  # another cluster: no route to it
        assert connect(stranger.netns, peer.address, allowed) != "open"


def test_create_is_idempotent_and_finishes_a_half_made_cluster(make):
    shapes = [labnet.NodeShape(rate_mbit=50), labnet.NodeShape(rate_mbit=50)]
    first = make("again", shapes, latency_ms=5)
    assert make("again", shapes, latency_ms=5) == first

    # A creator that crashed half-way through node 1: its namespace made, its link and delay daemon not.
    (daemon,) = labnet._delay_daemons(first.nodes[1].netns)
    labnet._kill([daemon[0]])
    subprocess.run(["ip", "link", "del", first.nodes[1].veth], check=True)
    assert make("again", shapes, latency_ms=5) == first
    assert labnet._alive(labnet._delay_daemons(first.nodes[1].netns)[0][0])
    assert queue_bound(first.nodes[1].netns)
    qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", first.nodes[1].veth], capture_output=True, text=True)
    assert "tbf" in qdiscs.stdout

    with pytest.raises(ProvisionError, match="already has 2 nodes"):
        make("again", shapes[:1])


def test_a_node_made_again_at_a_removed_nodes_address_is_reached_at_once(make, tag):
    """EC2 gives a terminated instance's private address to the next one (an aws restart's relaunch, on moto's lab
    hosts): its peers, which talked to the lost one, reach the new one at once — not after their entries for the old
    link address expire (35–55 s here, when add_node did not make them forget it)."""
    port = free_port()
    net = make("again-at", [labnet.NodeShape(), labnet.NodeShape()])
    a, b = net.nodes
    with serving(b.netns, "echo", b.address, port):
        assert connect(a.netns, b.address, port) == "open"  # a now knows b's link address
    labnet.remove_node(tag, "again-at", b.index)
    again = labnet.add_node(tag, "again-at", b.index, labnet.NodeShape())
    assert again.address == b.address
    with serving(again.netns, "echo", again.address, port):
        assert connect(a.netns, again.address, port, timeout_s=2) == "open"


def test_a_failed_create_removes_what_it_made(make, tag):
    with pytest.raises(ProvisionError, match="must be positive"):
        make("broken", [labnet.NodeShape(rate_mbit=100), labnet.NodeShape(rate_mbit=-1)], latency_ms=5)
    assert leftovers(tag, {"broken"}) == []


def test_removing_a_node_ends_a_command_that_joined_its_cgroup_and_not_yet_its_namespace(make, tag):
    """node_argv puts a command in the node's cgroup before it enters the namespace: one caught between the two (here
    held there for good) kept the cgroup busy, and removing the node failed with EBUSY."""
    net = make("between", [labnet.NodeShape(cpus=0.5), labnet.NodeShape()])
    group = labnet.cpu_cgroup(net.nodes[0].netns)
    assert group is not None
    between = subprocess.Popen(["sh", "-c", f"echo $$ > {group / 'cgroup.procs'} && exec sleep 600"])
    try:
        deadline = time.monotonic() + 5
        while str(between.pid) not in (group / "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline, "the command never joined the node's cgroup"
            time.sleep(0.01)
        removed = labnet.remove_node(tag, "between", 0)
        assert between.wait(timeout=5) == -signal.SIGKILL
        assert f"cgroup {group}" in removed and not group.exists()
    finally:
        between.kill()
        between.wait()


def test_delete_twice_and_reap_what_a_crashed_creator_left(tag):
    USED.update({(tag, "crashed"), (tag, "kept")})
    crashed = labnet.create_cluster_network(tag, "crashed", [labnet.NodeShape()] * 2, latency_ms=10)
    labnet.create_cluster_network(tag, "kept", [labnet.NodeShape()])
    daemons = [pid for node in crashed.nodes for pid in labnet._netns_pids(node.netns)]
    assert len(daemons) == 2
    orphan = labnet.netns_name(tag, "0badcafe", 0)  # a namespace whose bridge is gone
    subprocess.run(["ip", "netns", "add", orphan], check=True)
    try:
        assert labnet.list_cluster_networks(tag) == ["crashed", "kept"]
        removed = labnet.reap(tag, keep=frozenset({"kept"}))
        assert f"namespace {orphan}" in removed and f"bridge {crashed.bridge}" in removed
        assert labnet.list_cluster_networks(tag) == ["kept"]
        assert leftovers(tag, {"crashed"}, {"0badcafe"}) == []
        assert not any(labnet._alive(pid) for pid in daemons)  # gone, or a zombie left for init to reap
    finally:
        assert labnet.delete_cluster_network(tag, "kept")
        assert labnet.delete_cluster_network(tag, "kept") == []
        labnet.reap(tag)


def test_two_installations_launching_at_once_get_different_subnets(make):
    tags = [secrets.token_hex(4), secrets.token_hex(4)]
    with ThreadPoolExecutor(2) as pool:
        nets = list(pool.map(lambda t: make("same-id", [labnet.NodeShape()], tag=t), tags))
    assert nets[0].subnet != nets[1].subnet
    assert nets[0].bridge != nets[1].bridge


def test_the_delay_daemon_says_ready_once_bound_and_exits_on_sigterm(make):
    net = make("daemon", [labnet.NodeShape()])
    node = net.nodes[0]
    daemon = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, sys.executable, "-m", "provisioner.lab.delay", "--delay-ms", "5"],
        cwd=PROJECT_DIR, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert daemon.stdout is not None
        assert daemon.stdout.readline() == "ready\n"
        assert queue_bound(node.netns)
        assert daemon.stdout.read() == ""  # it let go of its output: nothing more is ever written there
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=5) == 0
    finally:
        daemon.kill()
        daemon.communicate()  # reaped, its output closed


def test_a_delay_daemon_slow_to_start_is_waited_for_until_its_queue_is_bound(make, monkeypatch, tmp_path):
    """A clean-clone CI run under heavy load failed a lab sweep with "the latency daemon did not start: no output":
    its Python took longer than the 10 s the start-up then allowed. Here Python starts 12 s late (a sitecustomize
    that sleeps, on the daemon's PYTHONPATH): the start waits for the daemon's own word that its queue is bound."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(12)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    node = make("slow", [labnet.NodeShape()]).nodes[0]
    started = time.monotonic()
    labnet._start_delay_daemon(node.netns, 5)
    took = time.monotonic() - started
    print(f"FIGURE a delay daemon whose Python starts 12 s late: bound and ready after {took:.1f} s")
    assert took >= 12
    assert queue_bound(node.netns)
    assert len(labnet._delay_daemons(node.netns)) == 1


def test_a_delay_daemon_that_dies_at_start_is_said_with_its_error_at_once(make):
    """A second daemon on a node whose queue is bound already is refused the queue by the kernel (EPERM) and exits:
    the start says so with the daemon's last words, at once, and the daemon that holds the queue is left as it is."""
    node = make("dies", [labnet.NodeShape()], latency_ms=5).nodes[0]
    (first,) = labnet._delay_daemons(node.netns)
    started = time.monotonic()
    with pytest.raises(ProvisionError, match=r"exited before binding its queue\): .*nfqueue configuration refused"):
        labnet._start_delay_daemon(node.netns, 5)
    assert time.monotonic() - started < labnet.DELAY_START_S / 2
    assert labnet._delay_daemons(node.netns) == [first] and queue_bound(node.netns)


def test_delete_finds_a_delay_daemon_whose_namespace_lost_its_name(make, tag):
    net = make("nameless", [labnet.NodeShape()] * 2, latency_ms=5)
    (daemon,) = labnet._delay_daemons(net.nodes[0].netns)
    subprocess.run(["ip", "netns", "del", net.nodes[0].netns], check=True)  # by hand, the daemon still running
    assert f"process {daemon[0]}" in " ".join(labnet.delete_cluster_network(tag, "nameless"))
    assert not labnet._alive(daemon[0])
