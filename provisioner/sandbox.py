"""The sandbox a job's code runs in on a machine the platform shares with it (the local provider; lab nodes too).

A job's code is untrusted: it must not read the platform's database, settings, environment or other jobs, nor act
with the platform's rights. Each node's command runs:

- in the cluster's own **network namespace** (`ip netns`), which has a loopback and nothing else: the cluster's nodes
  reach each other at 127.0.0.1, and nothing of the machine's network — not the platform's web server, PostgreSQL or
  Redis, not the internet;
- under **bubblewrap** (Debian's `bwrap`), in new mount, PID, IPC, UTS and cgroup namespaces, on a root of its own:
  `/usr` and the Python runtime read-only, the cluster's virtualenv and the dataset read-only, the node's work and
  output directories writable, a private `/tmp`, and no other file of the machine — no platform file, no other
  cluster, no `/proc` of any process outside the sandbox;
- as the cluster's **own unprivileged uid** (`setpriv` inside the sandbox): no capabilities (bounding set emptied),
  no-new-privs, no supplementary groups, at most MAX_TASKS processes and threads (`prlimit`, RLIMIT_NPROC). The
  uid is drawn at random from a range no account uses and checked unused.

Why bubblewrap run by root with setpriv inside, rather than bubblewrap unprivileged (user namespaces): the process is
then a plain unprivileged uid on the machine — file permissions judge it as that uid, it has no user namespace in
which it would be root (a large kernel attack surface, and often disabled on hardened hosts), and joining the
cluster's network namespace needs root anyway. The price is that the platform must run as root to sandbox; when it
does not, `unavailable()` says why and local jobs are refused unless the operator opts in
(FC2_UNSANDBOXED_LOCAL_JOBS=1, for a single-user machine).

The node agent stays outside the sandbox (it holds the job's report token, which the code must never see) and starts
the command built by `command()`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import psutil

# Sandbox uids: far above any account (Debian gives users 1000–59999 and systemd's dynamic users 61184–65519) and
# below 2^31, so no file on the machine belongs to one unless a sandbox made it.
UID_RANGE = (1_000_000, 1_999_999)
TOOLS = ("bwrap", "setpriv", "nsenter", "ip", "prlimit")
# Processes and threads a cluster's uid may have at once, all its nodes together (RLIMIT_NPROC counts per uid): the
# machine's pid space is shared (pid_max is 32768 on a small machine), and a fork or thread bomb must not leave the
# platform unable to fork. A TensorFlow process has tens to a few hundred threads.
MAX_TASKS = 4096
# Paths inside the sandbox.
WORK = "/job/work"  # the node's writable working directory (cwd and HOME)
OUTPUT = "/job/output"  # the node's writable output directory (its files become artifacts)
DATA = "/job/data"  # the dataset, read-only


class SandboxError(RuntimeError):
    """The sandbox cannot be set up; the message says why."""


@functools.cache
def unavailable() -> str | None:
    """Why job code cannot be sandboxed on this machine, or None when it can (checked once per process)."""
    if sys.platform != "linux":
        return "the sandbox needs Linux namespaces"
    if os.geteuid() != 0:
        return "the platform does not run as root, so it cannot give job code a uid and namespaces of its own"
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not installed (Debian packages bubblewrap, util-linux, iproute2)"
    probe = subprocess.run(
        ["bwrap", "--unshare-pid", "--ro-bind", "/", "/", "--", "true"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[:200]}"
    return None


def free_uid() -> int:
    """A sandbox uid no running process uses (so two clusters, of this or another installation, never share one)."""
    used = set()
    for process in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error, TypeError):
            used.update(process.info["uids"])
    for _ in range(1000):
        uid = random.randint(*UID_RANGE)
        if uid not in used:
            return uid
    raise SandboxError("no free sandbox uid")


def netns_name(cluster_dir: Path) -> str:
    """The network namespace of the cluster living in `cluster_dir`: named after that directory, so that clusters of
    two installations on one machine never share one, even under the same cluster name."""
    return "fc2-" + hashlib.sha256(str(cluster_dir).encode()).hexdigest()[:16]


def create_netns(name: str) -> None:
    """A network namespace with its loopback up (idempotent)."""
    if not Path("/run/netns", name).exists():
        _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")


def delete_netns(name: str) -> None:
    """Remove a network namespace (nothing to do when it is gone)."""
    if Path("/run/netns", name).exists():
        _ip("netns", "delete", name)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass(frozen=True)
class Mounts:
    """What one node's sandbox sees of the machine, besides /usr."""

    work: Path  # host directory mounted writable at WORK (owned by the sandbox uid)
    output: Path  # host directory mounted writable at OUTPUT (owned by the sandbox uid)
    etc: Path  # host directory with the sandbox's passwd, group and hosts files
    read_only: tuple[Path, ...]  # host paths mounted read-only at the same path (runtime, virtualenv)
    dataset: Path | None = None  # host file mounted read-only at DATA/<its name>


def dataset_path(dataset: Path) -> str:
    """Where the node's code finds the dataset inside the sandbox."""
    return str(PurePosixPath(DATA) / dataset.name)


def write_etc(etc: Path, uid: int, hostname: str = "fc2-node") -> None:
    """The few /etc files a program expects: an account for the sandbox uid (getpass, TensorFlow), hosts."""
    etc.mkdir(parents=True, exist_ok=True)
    nologin = "/usr/sbin/nologin"
    (etc / "passwd").write_text(f"root:x:0:0::/:{nologin}\nfc2:x:{uid}:{uid}:FC2 job:{WORK}:{nologin}\n")
    (etc / "group").write_text(f"root:x:0:\nfc2:x:{uid}:\n")
    (etc / "hosts").write_text(f"127.0.0.1 localhost {hostname}\n::1 localhost\n")
    for name in ("passwd", "group", "hosts"):
        (etc / name).chmod(0o644)


def prepare_dirs(uid: int, *directories: Path) -> None:
    """Directories the sandboxed code may write: made, and owned by its uid (no one else's files inside)."""
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, uid, uid)
        directory.chmod(0o700)


def command(netns: str, uid: int, hostname: str, mounts: Mounts, argv: list[str]) -> list[str]:
    """The command line that runs `argv` in the node's sandbox (see the module docstring)."""
    binds: list[tuple[str, str, str]] = [("--ro-bind", str(path), str(path)) for path in mounts.read_only]
    binds += [("--bind", str(mounts.work), WORK), ("--bind", str(mounts.output), OUTPUT)]
    if mounts.dataset is not None:
        binds.append(("--ro-bind", str(mounts.dataset), dataset_path(mounts.dataset)))
    for name in ("passwd", "group", "hosts"):
        binds.append(("--ro-bind", str(mounts.etc / name), f"/etc/{name}"))
    binds += [("--ro-bind-try", path, path) for path in ("/etc/ld.so.cache", "/etc/localtime")]
    # bwrap makes missing parents of a mount point mode 0700 (root's): open them, or the uid cannot pass through.
    parents = sorted({str(p) for _, _, target in binds for p in PurePosixPath(target).parents if str(p) != "/"})
    bwrap = [
        "bwrap",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        hostname,
        "--die-with-parent",
        "--new-session",  # no ioctl(TIOCSTI) into a terminal outside
        "--ro-bind",
        "/usr",
        "/usr",
        *[arg for link in ("bin", "lib", "lib64", "sbin") for arg in ("--symlink", f"usr/{link}", f"/{link}")],
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
        *[arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)],
        *[arg for bind in binds for arg in bind],
        "--chdir",
        WORK,
        "--setenv",
        "HOME",
        WORK,
        # Just what setpriv needs to become the uid; it empties the bounding set before the job's code starts.
        *[arg for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP") for arg in ("--cap-add", cap)],
        "--",
    ]
    drop = [
        "prlimit",
        f"--nproc={MAX_TASKS}",
        "--",
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--no-new-privs",
        "--",
    ]
    return ["nsenter", f"--net=/run/netns/{netns}", "--", *bwrap, *drop, *argv]


def processes(uid: int) -> list[psutil.Process]:
    """Every live process running as a sandbox uid (the cluster's code and anything it spawned, however detached)."""
    found = []
    for process in psutil.process_iter(["uids", "status"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if uid in process.info["uids"] and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found
