"""The lab's latency: a daemon that holds every packet of one NFQUEUE queue for a fixed time, then lets it in.

Anwar et al. (§5.2.3) emulate the datacentre's latency with NetEm's `delay L` on every machine. This kernel has no
netem, so each lab node runs this daemon inside its network namespace and an iptables rule there
(`INPUT -s <subnet> ! -s <gateway> -j NFQUEUE`, see provisioner/lab/net.py) hands it every packet that arrives from
another node of the cluster. A packet is accepted `delay_ms` after it was queued, so one way between two nodes takes L
and a round trip 2L, as with NetEm on each machine; traffic with the platform (the gateway) is not queued at all.

It speaks the nfnetlink_queue protocol itself over a netlink socket (stdlib only) rather than through the
NetfilterQueue package: that package is a C extension built against libnetfilter_queue, which would make every
installation need a compiler and Debian's libnetfilter-queue-dev, and it gives one verdict per packet. Here:

- Order: the delay is the same for every packet, so the packets are due in the order they came; the daemon keeps a
  FIFO of (due time, packet id) and, when the oldest are due, sends ONE batch verdict (NFQNL_MSG_VERDICT_BATCH:
  "accept every queued packet with an id up to N"), so nothing is ever reordered and a burst costs one system call.
- Cost: the queue copies only the packet's metadata (NFQNL_COPY_META), never its payload, and asks for GSO packets
  whole (NFQA_CFG_F_GSO), so a 64 KB TCP segment is one message, not 45. A message is ~100 bytes; the kernel holds
  the packets themselves (up to --max-len of them, 100 000 by default: ~1 s of a 1 Gbit/s link in 1500-byte packets,
  far beyond one link's bandwidth-delay product) and the socket's receive buffer is forced to 64 MB so a burst is
  never dropped for want of room. One CPU core moves a few hundred Mbit/s of 1500-byte packets this way.
- Timing: it waits with select() until the next packet is due (microsecond timeout), so a packet is late by the
  scheduler's wake-up time (tens of microseconds), not by a polling period.

Fail-closed: the rule has no --queue-bypass. If this daemon dies, packets between nodes are dropped (the kernel
drops what it cannot queue) and the training stalls visibly, rather than silently running with no latency and
producing figures that claim a latency the run never had. The platform's own traffic (SSH, reports) is never queued,
so it can still see the cluster, diagnose it and tear it down.

    python -m provisioner.lab.delay --queue 0 --delay-ms 40 [--node NETNS]

Once its queue is bound (the kernel has acknowledged the binding) it prints one line, `ready`, on its standard output
and lets go of it: whoever starts it waits for that line (provisioner/lab/net.py), not for a fixed while, so a start
slowed by a busy machine is waited for and a daemon that dies is seen at once, by the end of its output. SIGTERM or
SIGINT: every packet still held is accepted at once and the daemon exits 0.
"""

from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NETLINK_NO_ENOBUFS = 5
SOL_NETLINK = 270
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT_BATCH = 3
NFQNL_MSG_CONFIG = 2
NFQNL_CFG_CMD_BIND = 1
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_GSO = 4
NFQNL_COPY_META = 1
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NF_ACCEPT = 1

READY = "ready"  # the daemon's one line on its standard output, once its queue is bound

NLMSGHDR = struct.Struct("=IHHII")
NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big-endian queue number, packed by hand)


def _attr(kind: int, payload: bytes) -> bytes:
    header = struct.pack("=HH", 4 + len(payload), kind)
    return header + payload + b"\0" * (-len(payload) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, *, family: int = socket.AF_INET, flags: int = 0) -> bytes:
    body = NFGENMSG.pack(family, 0, socket.htons(queue)) + attrs
    return (
        NLMSGHDR.pack(NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, NLM_F_REQUEST | flags, 0, 0)
        + body
    )


class PacketQueue:
    """One nfnetlink_queue queue of the current network namespace, bound in copy-meta mode."""

    def __init__(self, queue: int, *, max_len: int, socket_bytes: int):
        self.queue = queue
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        # Root may exceed net.core.rmem_max; a full buffer would drop packets the kernel has already queued.
        self.sock.setsockopt(socket.SOL_SOCKET, 33, socket_bytes)  # SO_RCVBUFFORCE
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._configure(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)))
        params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        params += _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", max_len))
        params += _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO))
        params += _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
        self._configure(params)
        self.sock.setblocking(False)
        self._buffer = bytearray(1 << 16)

    def _configure(self, attrs: bytes) -> None:
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs, family=socket.AF_UNSPEC, flags=NLM_F_ACK))
        reply = self.sock.recv(4096)
        _, kind, _, _, _ = NLMSGHDR.unpack_from(reply)
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", reply, NLMSGHDR.size)
            if code:
                raise OSError(-code, f"nfqueue configuration refused: {os.strerror(-code)}")

    def receive(self) -> list[int]:
        """The ids of the packets queued since the last call (never blocks)."""
        ids: list[int] = []
        while True:
            try:
                size = self.sock.recv_into(self._buffer)
            except BlockingIOError:
                return ids
            except OSError as error:
                if error.errno == errno.ENOBUFS:
                    continue
                raise
            view = memoryview(self._buffer)[:size]
            offset = 0
            while offset + NLMSGHDR.size <= size:
                length, kind, _, _, _ = NLMSGHDR.unpack_from(view, offset)
                if length < NLMSGHDR.size:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    packet_id = self._packet_id(view, offset + NLMSGHDR.size + NFGENMSG.size, offset + length)
                    if packet_id is not None:
                        ids.append(packet_id)
                offset += (length + 3) & ~3

    @staticmethod
    def _packet_id(view: memoryview, start: int, end: int) -> int | None:
        while start + 4 <= end:
            length, kind = struct.unpack_from("=HH", view, start)
            if length < 4:
                return None
            if kind & 0x7FFF == NFQA_PACKET_HDR:
                return struct.unpack_from("!I", view, start + 4)[0]
            start += (length + 3) & ~3
        return None

    def accept_up_to(self, packet_id: int) -> None:
        """Accept every packet still queued whose id is at most packet_id."""
        verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
        self.sock.send(_message(NFQNL_MSG_VERDICT_BATCH, self.queue, verdict))


def say_ready() -> None:
    """Say READY on the standard output, then put /dev/null in its place: the daemon outlives whoever started it,
    and a pipe nobody reads any more must never block it or break it (nor hold the starter's read open)."""
    sys.stdout.write(f"{READY}\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run(queue: int, delay_s: float, *, max_len: int = 100_000, socket_bytes: int = 64 << 20) -> None:
    packets = PacketQueue(queue, max_len=max_len, socket_bytes=socket_bytes)
    held: collections.deque[tuple[float, int]] = collections.deque()
    # select() is restarted after a signal handler returns (PEP 475); the wake-up socket makes a signal end the wait.
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: None)
    say_ready()  # bound, and a signal from now on ends the loop below
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable, _, _ = select.select([packets.sock, wake_read], [], [], timeout)
        if wake_read in readable:
            break
        arrived = packets.receive()
        if arrived:
            due = time.monotonic() + delay_s
            held.extend((due, packet_id) for packet_id in arrived)
        now = time.monotonic()
        last = None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
        if last is not None:
            packets.accept_up_to(last)
    if held:
        packets.accept_up_to(held[-1][1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Hold every packet of an NFQUEUE queue for a fixed delay.")
    parser.add_argument("--queue", type=int, default=0, help="NFQUEUE queue number (per network namespace)")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to each packet")
    parser.add_argument("--max-len", type=int, default=100_000, help="packets the kernel may hold for us")
    # Unused here: it names the lab node on the command line, which is how teardown finds this daemon.
    parser.add_argument("--node", default="", help="the lab node (network namespace) this daemon serves")
    args = parser.parse_args(argv)
    run(args.queue, args.delay_ms / 1000, max_len=args.max_len)


if __name__ == "__main__":
    main()
