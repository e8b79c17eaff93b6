"""provisioner/ssh.py and provisioner/lab/sshd.py against OpenSSH's real sshd on 127.0.0.1, through real paramiko.

The "node" is this machine, so a remote path is a local path under tmp_path and the tests look at it directly.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import threading
import time
from pathlib import Path

import paramiko
import pytest

from provisioner.errors import NodeError, ProvisionError
from provisioner.lab import sshd
from provisioner.runners import Result, run_parallel
from provisioner.ssh import Endpoint, SSHRunner, generate_keypair

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="sshd needs root: it writes /run/sshd and logs users in"),
    pytest.mark.skipif(not Path(sshd.SSHD).exists(), reason="OpenSSH's sshd is missing (Debian: openssh-server)"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def client_key(tmp_path) -> Path:
    path = tmp_path / "keys" / "id_ed25519"
    generate_keypair(path, "fc2-test")
    return path


@pytest.fixture
def start_sshd(request, tmp_path, client_key):
    """Starts an sshd letting `client_key` in, on a free port unless told; each one is stopped after the test."""

    def start(name: str = "node-0", port: int | None = None) -> tuple[Path, int]:
        port = port or free_port()
        directory = tmp_path / "sshd" / name
        request.addfinalizer(lambda: sshd.stop(directory))
        sshd.start(sshd.prepare(directory, "127.0.0.1", port, generate_keypair(client_key, "fc2-test")))
        return directory, port

    return start


@pytest.fixture
def endpoint(tmp_path, client_key):
    def make(port: int, node: str = "node-0", key_path: Path | None = None) -> Endpoint:
        known_hosts = tmp_path / "cluster" / "known_hosts"
        return Endpoint(
            host="127.0.0.1", port=port, key_path=key_path or client_key, known_hosts=known_hosts, node=node
        )

    return make


@pytest.fixture
def node(start_sshd):
    """The sshd directory and port of one running node."""
    return start_sshd()


@pytest.fixture
def runner(node, endpoint, tmp_path):
    with SSHRunner(endpoint(node[1]), log=tmp_path / "node-0.log") as runner:
        runner.wait_ready(10)
        yield runner


def test_run_returns_stdout_stderr_and_exit_status(runner):
    assert runner.run("echo out; echo err >&2; exit 3", check=False) == Result(3, "out\n", "err\n")
    assert runner.run(["printf", "%s|", "two words", "$HOME"]).stdout == "two words|$HOME|"
    assert runner.run("cat", stdin=b"fed on stdin").stdout == "fed on stdin"


def test_failing_command_names_the_node_and_its_stderr(runner):
    with pytest.raises(NodeError) as raised:
        runner.run("echo first >&2; echo pip: no matching distribution >&2; exit 2")
    assert raised.value.node == "node-0"
    assert not raised.value.transient
    message = str(raised.value)
    assert message.startswith("node node-0: `echo first")
    assert "status 2" in message and "pip: no matching distribution" in message


def test_a_command_filling_stderr_does_not_stall(runner):
    # More than paramiko's 2 MB window on stderr before anything on stdout: reading stdout alone would hang.
    result = runner.run(
        "head -c 4000000 /dev/zero | tr '\\0' e >&2; head -c 3000000 /dev/zero | tr '\\0' o", timeout_s=30
    )
    assert (len(result.stdout), len(result.stderr)) == (3_000_000, 4_000_000)


def test_a_command_past_its_timeout_is_an_error_and_the_runner_goes_on(runner):
    started = time.monotonic()
    with pytest.raises(NodeError, match=r"`sleep 3` did not finish within 0.5 s"):
        runner.run("sleep 3", timeout_s=0.5)
    assert time.monotonic() - started < 2
    assert runner.run("echo still here").stdout == "still here\n"


def test_a_dropped_connection_is_transient_and_the_next_call_reconnects(runner):
    # $PPID is the session's own sshd process: killing it cuts the connection under the running command.
    with pytest.raises(NodeError, match="lost") as raised:
        runner.run("kill -9 $PPID; sleep 5")
    assert raised.value.transient
    assert runner.run("echo back").stdout == "back\n"


def test_files_go_in_and_out_whole_with_their_mode(runner, tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(5 * 1024 * 1024))
    runner.put(blob, f"{remote}/blob.bin")
    runner.put_bytes(b"token-1", f"{remote}/token")
    runner.put_bytes(b"token-2", f"{remote}/token")  # replaces the file in place
    runner.put(blob, f"{remote}/tool", mode=0o755)

    assert runner.get(f"{remote}/blob.bin") == blob.read_bytes()
    assert runner.get(f"{remote}/token") == b"token-2"
    assert mode_of(remote / "blob.bin") == 0o644
    assert mode_of(remote / "token") == 0o600
    assert mode_of(remote / "tool") == 0o755
    assert sorted(os.listdir(remote)) == ["blob.bin", "token", "tool"]  # no staging left behind


def test_writing_where_the_node_has_no_directory_is_a_permanent_error(runner, tmp_path):
    with pytest.raises(NodeError, match="writing .*/missing/file failed") as raised:
        runner.put_bytes(b"x", f"{tmp_path}/missing/file")
    assert not raised.value.transient


def test_get_refuses_a_file_larger_than_allowed(runner, tmp_path):
    (tmp_path / "log").write_bytes(b"x" * 1000)
    assert runner.get(f"{tmp_path}/log", max_bytes=1000) == b"x" * 1000
    with pytest.raises(NodeError, match="1000 bytes, more than the 999 allowed"):
        runner.get(f"{tmp_path}/log", max_bytes=999)
    with pytest.raises(NodeError, match="reading .*/absent failed"):
        runner.get(f"{tmp_path}/absent")


def test_a_detached_command_outlives_the_session(runner, tmp_path):
    log = tmp_path / "detached.log"
    pid = runner.start_detached(["sh", "-c", "echo started; echo warned >&2; exec sleep 300"], str(log))
    try:
        runner.close()
        time.sleep(0.3)
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00300\x00"
        assert os.getsid(pid) == pid  # a session of its own: no hangup from the SSH session
        assert log.read_text().splitlines() == ["started", "warned"]
    finally:
        os.killpg(pid, signal.SIGKILL)


def test_host_key_is_recorded_on_first_contact_and_then_pinned(node, endpoint, runner):
    directory, port = node
    known_hosts = endpoint(port).known_hosts
    host_key = sshd.host_public_key(directory).split()
    assert known_hosts.read_text().split() == [f"[127.0.0.1]:{port}", host_key[0], host_key[1]]
    assert mode_of(known_hosts) == 0o600
    with SSHRunner(endpoint(port)) as again:
        again.wait_ready(10)
    assert len(known_hosts.read_text().splitlines()) == 1


def test_runners_meeting_one_node_at_once_pin_one_entry(node, endpoint):
    runners = {f"client-{i}": SSHRunner(endpoint(node[1])) for i in range(8)}
    try:
        run_parallel({name: lambda r=runner: r.wait_ready(10) for name, runner in runners.items()})
    finally:
        for runner in runners.values():
            runner.close()
    assert len(endpoint(node[1]).known_hosts.read_text().splitlines()) == 1


def test_a_tampered_known_hosts_entry_is_refused(node, endpoint, client_key):
    # Any ed25519 key but the node's own: the client's public key will do.
    forged = f"[127.0.0.1]:{node[1]} {generate_keypair(client_key, 'forged')}\n"
    endpoint(node[1]).known_hosts.parent.mkdir()
    endpoint(node[1]).known_hosts.write_text(forged)
    with SSHRunner(endpoint(node[1])) as runner, pytest.raises(NodeError, match="changed") as raised:
        runner.wait_ready(30)
    assert not raised.value.transient


def test_a_changed_host_key_is_refused_at_once(node, start_sshd, endpoint, runner):
    directory, port = node
    runner.close()
    sshd.stop(directory)
    shutil.rmtree(directory)  # the node comes back on the same port with a new host key
    start_sshd(port=port)
    pinned = endpoint(port).known_hosts.read_text()

    started = time.monotonic()
    with SSHRunner(endpoint(port)) as impostor, pytest.raises(NodeError) as raised:
        impostor.wait_ready(30)
    assert time.monotonic() - started < 5  # not retried
    assert not raised.value.transient
    assert f"host key of 127.0.0.1:{port} changed" in str(raised.value)
    assert "refusing to connect" in str(raised.value)
    assert endpoint(port).known_hosts.read_text() == pinned


def test_a_node_whose_sshd_is_down_is_transient_after_the_timeout(endpoint):
    started = time.monotonic()
    with SSHRunner(endpoint(free_port(), node="worker-3")) as runner, pytest.raises(NodeError) as raised:
        runner.wait_ready(1.5)
    assert 1.5 <= time.monotonic() - started < 4
    assert raised.value.transient
    assert str(raised.value).startswith("node worker-3: SSH at 127.0.0.1:")
    assert "did not answer within 1.5 s" in str(raised.value)


def test_a_wrong_client_key_is_refused_at_once(node, endpoint, tmp_path):
    stranger = tmp_path / "stranger" / "id_ed25519"
    generate_keypair(stranger, "stranger")
    started = time.monotonic()
    with SSHRunner(endpoint(node[1], key_path=stranger)) as runner, pytest.raises(NodeError) as raised:
        runner.wait_ready(30)
    assert time.monotonic() - started < 5
    assert not raised.value.transient
    assert "refused the key" in str(raised.value)


def test_run_parallel_meets_every_node_and_names_the_failing_one(start_sshd, endpoint, tmp_path):
    nodes = {name: start_sshd(name) for name in ("ps-0", "worker-0", "worker-1")}
    runners = {name: SSHRunner(endpoint(port, node=name)) for name, (_, port) in nodes.items()}
    try:
        # All three first contacts at once: each host key must land in the shared known_hosts.
        ready = run_parallel({name: lambda r=r: r.wait_ready(10) for name, r in runners.items()})
        assert ready == dict.fromkeys(nodes)
        recorded = {tuple(line.split()[:3:2]) for line in runners["ps-0"].endpoint.known_hosts.read_text().splitlines()}
        expected = {(f"[127.0.0.1]:{port}", sshd.host_public_key(d).split()[1]) for d, port in nodes.values()}
        assert recorded == expected

        done = tmp_path / "ps-0.done"
        calls = {
            "ps-0": lambda: runners["ps-0"].run(f"sleep 0.5; touch {done}"),
            "worker-0": lambda: runners["worker-0"].run("sleep 0.3; echo late failure >&2; exit 4"),
            "worker-1": lambda: runners["worker-1"].run("echo early failure >&2; exit 5"),
        }
        with pytest.raises(NodeError) as raised:
            run_parallel(calls)
        assert raised.value.node == "worker-0"  # first by node order, not by time
        assert "late failure" in str(raised.value)
        assert done.exists()  # every call finished before the error came out
    finally:
        for runner in runners.values():
            runner.close()


def test_run_parallel_names_the_node_of_any_error():
    def broken() -> None:
        raise ValueError("no such role")

    with pytest.raises(NodeError, match="node worker-2: ValueError: no such role") as raised:
        run_parallel({"worker-1": lambda: 1, "worker-2": broken})
    assert isinstance(raised.value.__cause__, ValueError)
    assert run_parallel({"a": lambda: 1, "b": lambda: 2}, max_workers=1) == {"a": 1, "b": 2}


def test_generate_keypair_is_private_and_idempotent(tmp_path):
    key = tmp_path / "cluster" / "keys" / "id_ed25519"
    public = generate_keypair(key, "fc2-cluster-7")
    assert public.startswith("ssh-ed25519 AAAA") and public.endswith(" fc2-cluster-7")
    assert mode_of(key) == 0o600 and mode_of(key.parent) == 0o700
    made = key.read_bytes()
    assert generate_keypair(key, "fc2-cluster-7") == public
    assert key.read_bytes() == made
    assert os.listdir(key.parent) == ["id_ed25519"]
    assert paramiko.PKey.from_path(key).get_base64() == public.split()[1]


def test_generate_keypair_has_one_key_when_called_at_once(tmp_path):
    key = tmp_path / "id_ed25519"
    publics: list[str] = []
    threads = [threading.Thread(target=lambda: publics.append(generate_keypair(key, "c"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(publics)) == 1 and os.listdir(tmp_path) == ["id_ed25519"]


def test_the_node_log_has_every_command_but_no_secret(runner, tmp_path):
    runner.run("echo visible-step")
    runner.run("cat > /dev/null", stdin=b"stdin-secret-42")
    runner.put_bytes(b"token-secret-42", f"{tmp_path}/token")
    runner.run("false", check=False)
    log = (tmp_path / "node-0.log").read_text()
    assert "$ echo visible-step" in log and "$ false" in log and "exit 1 in" in log
    assert f"put 15 bytes -> {tmp_path}/token (mode 0600)" in log
    assert "secret-42" not in log
    assert all(line[:4].isdigit() for line in log.splitlines())  # each entry starts with its timestamp


def test_sshd_start_is_idempotent_and_stop_is_safe(node, tmp_path):
    directory, port = node
    config = directory / sshd.CONFIG
    pid = sshd.start(config)
    assert sshd.start(config) == pid
    assert mode_of(directory) == 0o700
    assert sshd.host_public_key(directory).startswith("ssh-ed25519 ")
    sshd.stop(directory)
    sshd.stop(directory)
    assert not Path(f"/proc/{pid}/exe").exists()
    with socket.socket() as probe:  # the port is free again
        probe.bind(("127.0.0.1", port))
    sshd.stop(tmp_path / "never-started")


def test_sshd_refuses_a_bad_config_and_a_taken_port(tmp_path):
    with pytest.raises(ProvisionError, match="sshd refused its configuration .*[Pp]ort"):
        sshd.prepare(tmp_path / "bad", "127.0.0.1", 70000, "ssh-ed25519 AAAA x")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = sshd.prepare(tmp_path / "taken", "127.0.0.1", taken.getsockname()[1], "ssh-ed25519 AAAA x")
        try:
            with pytest.raises(ProvisionError, match="Address already in use"):
                sshd.start(config)
        finally:
            sshd.stop(config.parent)
