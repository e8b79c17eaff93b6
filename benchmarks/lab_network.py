"""The lab provider's network as the nodes see it: requested vs achieved bandwidth and round-trip time between two lab
nodes (provisioner/lab/net.py), measured with plain TCP sockets run inside the nodes' namespaces:

    sudo .venv/bin/python benchmarks/lab_network.py [--seconds 4]

Bandwidth: a TCP bulk transfer from node 0 to node 1, both shaped to the rate, measured at the receiver from its first
byte to its last (goodput: TCP/IP headers take ~4.4 % of a 1500-byte packet, so 100 Mbit/s on the wire is ~95.6 of
payload). RTT: the median of 50 one-byte ping-pongs on one TCP connection (TCP_NODELAY), node to node and node to the
gateway (the platform, which the lab does not delay). Throughput under latency: the same bulk transfer over the delayed
link, with Linux's default socket buffers (a 4 MB send buffer caps it near 4 MB / RTT, as it would on a cloud VM), and
including slow start. Every cluster made here is removed before the script ends, even on Ctrl-C.

The probe functions are also what tests/test_labnet.py measures with.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

from provisioner.lab import net as labnet  # noqa: E402

# Run as `python -c PROBE MODE HOST PORT [ARG]`: stdlib only, so it runs on a node as it is.
PROBE = r"""
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode in ("sink", "echo"):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen()
    print("ready", flush=True)
    peer, _ = server.accept()
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode == "echo":
        while data := peer.recv(64):
            peer.sendall(data)
    else:
        buffer, total, first, last = bytearray(1 << 20), 0, None, None
        while n := peer.recv_into(buffer):
            last = time.monotonic()
            first = first or last
            total += n
        print(json.dumps({"bytes": total, "seconds": (last - first) if first else 0.0}), flush=True)
elif mode == "source":
    peer = socket.create_connection((host, port), timeout=10)
    chunk, end = b"\0" * (1 << 16), time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        peer.sendall(chunk)
    peer.close()
elif mode == "ping":
    peer = socket.create_connection((host, port), timeout=10)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(int(sys.argv[4]) + 1):
        start = time.perf_counter()
        peer.sendall(b"x")
        peer.recv(64)
        rtts.append((time.perf_counter() - start) * 1000)
    print(json.dumps(rtts[1:]))  # the first carries the connection's setup
elif mode == "connect":
    try:
        socket.create_connection((host, port), timeout=float(sys.argv[4])).close()
        print("open")
    except socket.timeout:
        print("timeout")
    except OSError as error:
        print(type(error).__name__)
"""


def _probe_argv(netns: str | None, *args: object) -> list[str]:
    argv = [sys.executable, "-c", PROBE, *map(str, args)]
    return labnet.node_argv(netns, argv) if netns else argv


@contextlib.contextmanager
def serving(netns: str | None, mode: str, host: str, port: int) -> Iterator[subprocess.Popen[str]]:
    """A probe server (`sink` or `echo`) on the node (or on the host when netns is None), ready to accept."""
    server = subprocess.Popen(_probe_argv(netns, mode, host, port), stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout is None or server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"probe {mode} server on {netns or 'host'} did not start")
        yield server
    finally:
        server.kill()
        server.wait()
        if server.stdout:
            server.stdout.close()


def _client(netns: str | None, *args: object, timeout_s: float = 60) -> str:
    return subprocess.run(
        _probe_argv(netns, *args), capture_output=True, text=True, timeout=timeout_s, check=True
    ).stdout


def throughput_mbit(sender: str, receiver: str, address: str, *, seconds: float = 3, port: int = 5201) -> float:
    """TCP goodput from node `sender` to node `receiver` (at `address`) over `seconds` of bulk transfer."""
    with serving(receiver, "sink", address, port) as sink:
        _client(sender, "source", address, port, seconds)
        assert sink.stdout is not None
        result = json.loads(sink.stdout.readline())
    return result["bytes"] * 8 / result["seconds"] / 1e6


def rtts_ms(client: str, server: str | None, address: str, *, count: int = 20, port: int = 5202) -> list[float]:
    """Round trips of one byte on one TCP connection from node `client` to a server on `server` (None = the host)."""
    with serving(server, "echo", address, port):
        return json.loads(_client(client, "ping", address, port, count))


def connect(client: str, address: str, port: int, *, timeout_s: float = 1.0) -> str:
    """From node `client`: 'open', 'timeout' (dropped) or the error's name ('OSError': no route to it)."""
    return _client(client, "connect", address, port, timeout_s).strip()


@contextlib.contextmanager
def lab_cluster(
    tag: str, cluster_id: str, shapes: Sequence[labnet.NodeShape], **options: Any
) -> Iterator[labnet.ClusterNet]:
    """A lab cluster network that is removed when the block ends, however it ends."""
    try:
        yield labnet.create_cluster_network(tag, cluster_id, shapes, **options)
    finally:
        labnet.delete_cluster_network(tag, cluster_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4, help="length of each bulk transfer")
    args = parser.parse_args()
    if reason := labnet.unavailable():
        sys.exit(f"lab unavailable: {reason}")
    tag = secrets.token_hex(4)
    try:
        print(f"{'requested Mbit/s':>18} {'achieved Mbit/s':>16} {'ratio':>6}")
        for rate in (50, 100, 450, None):
            with lab_cluster(tag, f"bw-{rate}", [labnet.NodeShape(rate_mbit=rate)] * 2) as net:
                a, b = net.nodes
                got = throughput_mbit(a.netns, b.netns, b.address, seconds=args.seconds)
            ratio = f"{got / rate:.3f}" if rate else ""
            print(f"{rate or 'unshaped':>18} {got:>16.1f} {ratio:>6}", flush=True)
        print()
        header = ("latency ms", "RTT node↔node ms", "RTT node↔gateway ms", "unshaped Mbit/s", "100 Mbit/s link")
        print(" ".join(f"{h:>20}" for h in header))
        for latency in (0, 20, 40, 80):
            row = [str(latency)]
            unshaped = [labnet.NodeShape()] * 2
            with lab_cluster(tag, f"lat-{latency}", unshaped, latency_ms=latency, platform_ports=[5203]) as net:
                a, b = net.nodes
                row.append(f"{statistics.median(rtts_ms(a.netns, b.netns, b.address, count=50)):.2f}")
                row.append(f"{statistics.median(rtts_ms(a.netns, None, net.gateway, count=50, port=5203)):.2f}")
                row.append(f"{throughput_mbit(a.netns, b.netns, b.address, seconds=args.seconds):.1f}")
            shaped = [labnet.NodeShape(rate_mbit=100)] * 2
            with lab_cluster(tag, f"lat-{latency}-100", shaped, latency_ms=latency) as net:
                a, b = net.nodes
                row.append(f"{throughput_mbit(a.netns, b.netns, b.address, seconds=args.seconds):.1f}")
            print(" ".join(f"{cell:>20}" for cell in row), flush=True)
    finally:
        removed = labnet.reap(tag)
        if removed:
            print(f"cleaned up {len(removed)} leftovers")


if __name__ == "__main__":
    main()
