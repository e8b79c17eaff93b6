"""Nodes that stop themselves (issue 45 §4): a node's agent counts the platform's silence from its last exchange with
it, and past RunSpec.orphan_s stops its own machine, its provider's way — so that a platform gone for good leaves
nothing running — while a platform only down for a while (shorter than the limit) changes nothing.

The agent alone, with a command that sleeps (light); then a lab cluster whose platform goes away: each host removes
itself within the limit, and the provider's teardown finds none of them (heavy)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

import provisioner
from harness.wheels import sleeper_wheel
from monitor import agent
from provisioner import ClusterSpec, RunSpec, lab
from tests.conftest import Outage, lab_leftovers, nothing_left

AGENT = Path(agent.__file__)


class Platform:
    """A stand-in for the platform's report API that answers every report 200, and can be taken down and brought back
    on the same port."""

    def __init__(self) -> None:
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        class Answer(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"ok": true, "state": "running"}')

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Answer)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def start_agent(tmp_path: Path, url: str, orphan_s: float) -> subprocess.Popen:
    (tmp_path / "token").write_text("t")
    argv = [sys.executable, str(AGENT), "--url", url, "--job", "1", "--node", "worker-0"]
    argv += ["--token-file", str(tmp_path / "token"), "--log", str(tmp_path / "node.log")]
    argv += ["--output", str(tmp_path / "out"), "--result", str(tmp_path / "result"), "--interval", "0.5"]
    argv += ["--orphan-s", str(orphan_s), "--self-stop", "processes", "--", "sleep", "600"]
    with (tmp_path / "agent.log").open("wb") as log:
        return subprocess.Popen(argv, cwd=tmp_path, stderr=log)


def sleeps(agent_process: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(agent_process.pid).children() if p.name() == "sleep"]


def test_a_node_whose_platform_is_gone_ends_its_command_within_the_limit(tmp_path):
    platform = Platform()
    process = start_agent(tmp_path, platform.url, orphan_s=3)
    try:
        time.sleep(1.5)
        command = sleeps(process)
        assert len(command) == 1
        platform.down()
        gone = time.monotonic()
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - gone < 3 + 4  # the limit, a report's timeout and the watchdog's look
        assert not command[0].is_running()
        assert "the platform silent for" in (tmp_path / "agent.log").read_text()
    finally:
        process.kill()
        platform.down()


def test_a_platform_down_for_less_than_the_limit_changes_nothing(tmp_path):
    platform = Platform()
    process = start_agent(tmp_path, platform.url, orphan_s=5)
    try:
        time.sleep(1.5)
        platform.down()
        time.sleep(3)
        platform.up()
        time.sleep(6)  # past the limit counted from the outage's start
        assert process.poll() is None and len(sleeps(process)) == 1
    finally:
        process.kill()
        process.wait()
        platform.down()


def test_without_a_limit_the_agent_never_stops_its_node(tmp_path):
    process = start_agent(tmp_path, "http://127.0.0.1:9", orphan_s=0)
    try:
        time.sleep(3)
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


# --- the lab (heavy) --------------------------------------------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
@pytest.mark.django_db(transaction=True)
def test_lab_hosts_remove_themselves_once_the_platform_is_gone_for_longer_than_the_limit(live_server, tmp_path):
    """The platform answers (403: no such job's token, which is an answer all the same), is down for 4 s — less than
    the 12 s limit — and back: nothing happens. Then it goes for good: within the limit (plus a look) every host has
    removed itself — its processes, namespace, cgroups and disk's mount — and the teardown finds none of them."""
    limit = 12
    outage = Outage(live_server.url)
    dataset = tmp_path / "data.npz"
    dataset.write_bytes(b"-")
    cluster = provisioner.launch(ClusterSpec("fc2-lab-self-stop", "lab", "mirrored", 2, worker_type="lab-w-100"))
    directory, tag = lab._cluster_dir(cluster.cluster_id), lab.tag()
    try:
        run = RunSpec(
            1, str(sleeper_wheel(tmp_path)), "demo.main", dataset=str(dataset), report_url=outage.url, token="x",
            orphan_s=limit,
        )  # fmt: skip
        cluster = provisioner.bootstrap(cluster, run)
        time.sleep(2)
        outage.down()
        time.sleep(4)
        outage.up()
        time.sleep(limit)
        assert provisioner.alive(cluster) == {"worker-0": True, "worker-1": True}

        outage.down()
        gone = time.monotonic()
        hosts = {node.instance_id for node in cluster.nodes}
        while hosts & {line.split()[0] for line in lab_leftovers(cluster.cluster_id, directory, tag)["namespaces"]}:
            assert time.monotonic() - gone < limit + 10, "the hosts did not remove themselves"
            time.sleep(0.5)
        took = time.monotonic() - gone
        left = nothing_left(lab_leftovers(cluster.cluster_id, directory, tag))
        # What is left is the platform's side of the cluster: its relay, bridge, firewall and directory.
        assert set(left) <= {"processes", "links", "iptables", "directory"}, left
        assert all("provisioner.relay" in line for line in left.get("processes", [])), left
        print(f"hosts gone {took:.1f} s after the platform (limit {limit} s)")
    finally:
        if outage.listener is not None:
            outage.down()
        removed = provisioner.teardown("lab", cluster.cluster_id)
    assert not [line for line in removed if line.startswith(("namespace", "process", "cgroup"))], removed
    assert nothing_left(lab_leftovers(cluster.cluster_id, directory, tag)) == {}


@pytest.mark.skipif(bool(provisioner.unavailable("lab")), reason=str(provisioner.unavailable("lab")))
def test_an_instance_that_is_a_namespace_of_a_shared_machine_is_never_halted():
    """The aws tests' instances are lab hosts on this machine (harness/ec2lab.py): an agent told to `shutdown` there
    must not halt the machine they share. It finds itself in a named network namespace, and removes that instead."""
    name = f"fc2-test-own-netns-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        found = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c",
             f"import sys; sys.path.insert(0, {str(AGENT.parent)!r}); import agent; print(agent.own_netns())"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)
    assert found == name
    assert agent.own_netns() is None  # this machine's own network: a real instance would halt
