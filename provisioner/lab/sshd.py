"""A node's SSH server: OpenSSH's own sshd (Debian's `openssh-server`), one per node, configured and run from a
directory of its own.

The `lab` provider starts one inside each node's network namespace; the tests start one on 127.0.0.1. Everything of
one server lives in its directory (mode 0700):

    ssh_host_ed25519_key(.pub)   the node's host key, kept across restarts so a pinned key stays valid
    authorized_keys              the cluster's public key: the only way in (no passwords, no keyboard-interactive)
    sshd_config                  written by `prepare`, checked with `sshd -t`
    sshd.pid, sshd.log           the listener's pid and its log (LogLevel VERBOSE)

Stdlib only; nothing here speaks SSH (provisioner/ssh.py is the client).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from provisioner.errors import ProvisionError

# sshd re-executes itself for every connection, which it only does when started by an absolute path.
SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
# sshd's privilege separation directory; Debian's package creates it only when its service starts.
PRIVSEP_DIR = Path("/run/sshd")

HOST_KEY = "ssh_host_ed25519_key"
AUTHORIZED_KEYS = "authorized_keys"
CONFIG = "sshd_config"
PID_FILE = "sshd.pid"
LOG_FILE = "sshd.log"

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


def prepare(directory: Path, listen: str, port: int, authorized_keys: str) -> Path:
    """Make `directory` the home of one node's sshd listening on listen:port and letting in `authorized_keys` (public
    key lines); returns the path of its sshd_config, checked by sshd itself. The host key is made once and kept."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host_key = directory / HOST_KEY
    if not host_key.exists():
        keygen = [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", f"fc2-node-{listen}:{port}", "-f", str(host_key)]
        made = subprocess.run(keygen, capture_output=True, text=True)
        if made.returncode != 0:
            raise ProvisionError(f"ssh-keygen could not make the host key {host_key}: {made.stderr.strip()}")
    keys = directory / AUTHORIZED_KEYS
    with open(keys, "w", opener=lambda path, flags: os.open(path, flags, 0o600)) as file:
        file.write(authorized_keys.strip() + "\n")
    keys.chmod(0o600)
    config = directory / CONFIG
    config.write_text(
        f"""# Written by provisioner/lab/sshd.py: the SSH server of one node, key-only root login, no forwarding.
Port {port}
ListenAddress {listen}
HostKey {host_key}
AuthorizedKeysFile {keys}
# StrictModes would refuse a key file under a world-writable ancestor such as /tmp; the files are ours, in a 0700
# directory made above, which is the protection StrictModes is after.
StrictModes no
PidFile {directory / PID_FILE}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding no
X11Forwarding no
PermitTunnel no
AllowAgentForwarding no
Subsystem sftp internal-sftp
# sshd runs each command through root's shell, and Debian's bash then sources ~/.bashrc: on the lab, this machine's
# root's. Whatever that runs (a pyenv or conda init, slow; a lock a killed one left, which stalls every command after)
# is none of a node's business. Bash skips it in a nested shell, which SHLVL=1 makes this one.
SetEnv SHLVL=1
# The bootstrap opens a connection per node at once, and may retry together; the default (10) drops some of them.
MaxStartups 200
LogLevel VERBOSE
"""
    )
    config.chmod(0o600)
    checked = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
    if checked.returncode != 0:
        raise ProvisionError(f"sshd refused its configuration {config}: {checked.stderr.strip()}")
    return config


def start(config: Path, netns: str | None = None) -> int:
    """Start sshd with `config` (inside network namespace `netns` when given) and return its pid once it listens. If
    that sshd already runs, return its pid."""
    running = _running_pid(config)
    if running is not None:
        return running
    directory = config.parent
    command = [SSHD, "-f", str(config), "-E", str(directory / LOG_FILE)]
    if netns is not None:
        # nsenter, not `ip netns exec`: that one also gives the process a mount namespace with a /sys of its own, in
        # which the machine's cgroup hierarchies are not mounted — and the sessions of this sshd put the node's
        # processes in their cgroups.
        command = ["nsenter", f"--net=/run/netns/{netns}", "--", *command]
    # A bad option or key shows here; sshd detaches before it binds its port, so a port taken shows in the loop below.
    started = subprocess.run(command, capture_output=True, text=True)
    if started.returncode != 0:
        raise ProvisionError(f"sshd did not start ({config}): {started.stderr.strip()} {_log_tail(directory)}")
    port = int(_setting(config, "Port"))
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        pid = _running_pid(config)
        if pid is not None and _listens(pid, port):
            return pid
        if pid is None and not _any_sshd(config):
            raise ProvisionError(f"sshd ({config}) exited as it started: {_log_tail(directory)}")
        time.sleep(0.05)
    raise ProvisionError(
        f"sshd ({config}) did not listen on port {port} within {START_TIMEOUT_S:g} s: {_log_tail(directory)}"
    )


def host_public_key(directory: Path) -> str:
    """The node's host public key line (`ssh-ed25519 AAAA… comment`), to pin it before the first connection."""
    return (directory / f"{HOST_KEY}.pub").read_text().strip()


def stop(directory: Path) -> None:
    """Stop the sshd of `directory`: SIGTERM, then SIGKILL if it lingers. Nothing happens when it does not run."""
    pid = _running_pid(directory / CONFIG)
    if pid is None:
        return
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _is_sshd(pid):
                return
            time.sleep(0.05)
    raise ProvisionError(f"sshd {pid} ({directory}) survived SIGKILL")


def _running_pid(config: Path) -> int | None:
    """The pid in the config's PidFile if that process is an sshd started with this config (not a recycled pid)."""
    try:
        pid = int(Path(_setting(config, "PidFile")).read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    return pid if _is_sshd(pid, config) else None


def _any_sshd(config: Path) -> bool:
    """Whether some sshd started with `config` runs: before the detached sshd writes its PidFile, only its command
    line tells it is there."""
    return any(_is_sshd(int(entry.name), config) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def _is_sshd(pid: int, config: Path | None = None) -> bool:
    """Whether `pid` is a live sshd (a zombie has no exe), started with `config` when given."""
    try:
        if os.readlink(f"/proc/{pid}/exe") != os.path.realpath(SSHD):
            return False
        # sshd rewrites its title to "sshd: /usr/sbin/sshd -f CONFIG … [listener] …", keeping the arguments.
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return config is None or f" -f {config} " in f" {cmdline} "


def _listens(pid: int, port: int) -> bool:
    """Whether a TCP socket listens on `port` in the network namespace of `pid` (so it works inside a netns too)."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "0A":  # 0A is TCP_LISTEN
                return True
    return False


def _setting(config: Path, name: str) -> str:
    """The value of `name` in an sshd_config written by `prepare` (one setting per line)."""
    for line in config.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return value.strip()
    raise ProvisionError(f"{config} has no {name}")


def _log_tail(directory: Path, lines: int = 10) -> str:
    try:
        tail = (directory / LOG_FILE).read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return "(sshd wrote no log)"
    return " | ".join(tail)
