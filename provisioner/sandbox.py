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
  uid is drawn at random from a range no account uses and checked unused;
- under a **seccomp filter** (provisioner/seccomp.py, bubblewrap's `--seccomp`): no new namespaces — a user
  namespace, in which the code would be root, least of all — no mounts, no ptrace or reading other processes' memory,
  no kernel keys, eBPF, perf events, io_uring, modules, kexec, clock or swap changes, and the rest of what Docker's
  default profile refuses a container; `clone3` answers ENOSYS (glibc then uses `clone`, whose flags the filter
  reads), and a system call through a 32-bit ABI kills the process. bubblewrap reads the program from a file
  beside the cluster's etc files (SECCOMP_FILE) that a root shell opens as fd SECCOMP_FD: the agent that starts the
  command passes no file descriptor of its own;
- started by a node agent that is in a cgroup of its cluster's own (`create_node_cgroups`), not the Celery worker's:
  the node outlives the worker that started it, as a cloud node does;
- in the cluster's own **memory cgroup** (`create_memory_cgroup`), joined by a root shell step before anything else of
  the chain runs: all the cluster's nodes together get at most FC2_LOCAL_CLUSTER_MEMORY_MB of memory (and no swap
  beyond it). Past it the kernel's OOM killer kills a process of the cluster — never one of the platform's — with
  SIGKILL, and the node's agent says so in the job's failure reason ("killed: out of memory (cluster limit N MB)").
  The sandbox's /tmp and /dev/shm are tmpfs, i.e. memory: what the code writes there counts against that limit.
  Their parent cgroup may be limited too (`all_clusters_mb`): every cluster of the machine together stays within it;
- with its writable directories on a **disk of its own** (`create_disk`): an ext4 file system in a sparse image file
  of FC2_LOCAL_NODE_DISK_MB, loop-mounted by root (nosuid, nodev) at the node's `job/` directory, which holds
  `work/` and `output/`. A node that writes more gets ENOSPC, and the platform's disk never gives more than that
  per node. The image is written only through the kernel's ext4 (the code never sees the image file), and the mount
  is on the host, so the agent reads the outputs after the command ended; teardown unmounts it (the loop device is
  released with it) and deletes the image. Why not tmpfs: the outputs (a model of hundreds of MB) would be memory,
  charged to the cluster's memory cgroup, and the disk and memory limits would eat into each other.

Why bubblewrap run by root with setpriv inside, rather than bubblewrap unprivileged (user namespaces): the process is
then a plain unprivileged uid on the machine — file permissions judge it as that uid, bubblewrap gives it no user
namespace in which it would be root (a large kernel attack surface, and often disabled on hardened hosts), and
joining the cluster's network namespace needs root anyway. Nor can the code make one itself: the kernel lets any
process unshare(CLONE_NEWUSER), and only the seccomp filter refuses it. The price is that the platform must run as
root to sandbox; when it does not, or the filter cannot be built (no libseccomp), `unavailable()` says why and local
jobs are refused unless the operator opts in (FC2_UNSANDBOXED_LOCAL_JOBS=1, for a single-user machine).

The node agent stays outside the sandbox (it holds the job's report token, which the code must never see) and starts
the command built by `command()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import psutil

from provisioner import seccomp
from provisioner.errors import ProvisionError

# Sandbox uids: far above any account (Debian gives users 1000–59999 and systemd's dynamic users 61184–65519) and
# below 2^31, so no file on the machine belongs to one unless a sandbox made it.
UID_RANGE = (1_000_000, 1_999_999)
TOOLS = ("bwrap", "setpriv", "nsenter", "ip", "prlimit", "mkfs.ext4", "mount", "umount")
# Processes and threads a cluster's uid may have at once, all its nodes together (RLIMIT_NPROC counts per uid): the
# machine's pid space is shared (pid_max is 32768 on a small machine), and a fork or thread bomb must not leave the
# platform unable to fork. A TensorFlow process has tens to a few hundred threads.
MAX_TASKS = 4096
# Paths inside the sandbox.
WORK = "/job/work"  # the node's writable working directory (cwd and HOME)
OUTPUT = "/job/output"  # the node's writable output directory (its files become artifacts)
DATA = "/job/data"  # the dataset, read-only
# The seccomp program, written beside the cluster's etc files (Mounts.etc; the sandbox never sees it), and the file
# descriptor the shell ahead of bubblewrap opens it as (a single digit: dash's redirections take no more).
SECCOMP_FILE = "seccomp.bpf"
SECCOMP_FD = 9


class SandboxError(ProvisionError):
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
    reason = seccomp.unavailable()
    if reason:
        return reason
    with tempfile.TemporaryDirectory() as directory:
        bwrap = ["bwrap", "--seccomp", str(SECCOMP_FD), "--unshare-pid", "--ro-bind", "/", "/", "--", "true"]
        program = seccomp.write(Path(directory, SECCOMP_FILE))
        probe = subprocess.run([*_with_seccomp(program), *bwrap], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces under a seccomp filter here: {probe.stderr.strip()[:200]}"
    if _memory_hierarchy() is None:
        return "no memory cgroup controller (cgroup v1 /sys/fs/cgroup/memory or v2 with `memory`) to limit jobs with"
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


# Memory cgroups: v1 (a `memory` hierarchy of its own) or v2 (the unified hierarchy with the memory controller).
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_PARENT = "fc2"  # every cluster's cgroup is a child of this one, in the hierarchy's root


def _memory_hierarchy() -> tuple[int, Path] | None:
    """(cgroup version, root) of the memory controller, or None when there is none."""
    if (CGROUP_V1 / "memory.limit_in_bytes").exists():
        return 1, CGROUP_V1
    controllers = CGROUP_V2 / "cgroup.controllers"
    with contextlib.suppress(OSError):
        if "memory" in controllers.read_text().split():
            return 2, CGROUP_V2
    return None


def memory_cgroup(name: str) -> Path:
    """Where the memory cgroup of the cluster whose network namespace is `name` lives (whether or not it exists)."""
    hierarchy = _memory_hierarchy()
    if hierarchy is None:
        raise SandboxError("no memory cgroup controller")
    return hierarchy[1] / CGROUP_PARENT / name


def create_memory_cgroup(name: str, limit_mb: int, all_clusters_mb: int | None = None) -> Path:
    """The cluster's memory cgroup, limited to `limit_mb` of memory and no more with swap (idempotent); with
    `all_clusters_mb`, their parent (every cluster's, of every installation on this machine) is limited to that: all
    together never take the platform's share, and the OOM killer acts among them."""
    version, root = _memory_hierarchy() or (0, Path())
    cgroup = memory_cgroup(name)
    try:
        if version == 2:  # the controller must be enabled for the children of each level, and no process at fc2/
            _write(root / "cgroup.subtree_control", "+memory")
            cgroup.parent.mkdir(exist_ok=True)
            _write(cgroup.parent / "cgroup.subtree_control", "+memory")
        cgroup.mkdir(parents=True, exist_ok=True)
        if all_clusters_mb is not None:
            _limit_memory(version, cgroup.parent, all_clusters_mb)
        _limit_memory(version, cgroup, limit_mb)
    except OSError as exc:
        raise SandboxError(f"cannot make the memory cgroup {cgroup}: {exc}") from exc
    return cgroup


def _limit_memory(version: int, cgroup: Path, limit_mb: int) -> None:
    limit = str(limit_mb * 2**20)
    if version == 2:
        _write(cgroup / "memory.max", limit)
        with contextlib.suppress(FileNotFoundError):  # no swap accounting in this kernel: nothing to swap to
            _write(cgroup / "memory.swap.max", "0")
    else:
        # memsw may be neither below the limit nor above it once set: the two in the order that keeps memsw >= limit.
        memory, memsw = cgroup / "memory.limit_in_bytes", cgroup / "memory.memsw.limit_in_bytes"
        lowering = not memsw.exists() or int(memsw.read_text()) > int(limit)
        for path in (memory, memsw) if lowering else (memsw, memory):
            with contextlib.suppress(FileNotFoundError):
                _write(path, limit)


# Admission (the local provider's): a local cluster holds its share of the machine — MAX_TASKS task ids — from when
# its memory cgroup is made to when it is removed, and is admitted only while every cluster's share fits in what the
# machine gives them together. The memory cgroups are the record, machine-wide (every installation's clusters), and
# what exists: nothing to fall out of step with them. The lock is their parent directory's (flock), taken by every
# launch on this machine.
LOCAL_CLUSTER = re.compile(r"fc2-[0-9a-f]{16}")  # a local cluster's memory cgroup: named as netns_name names it


@contextlib.contextmanager
def admission_lock() -> Iterator[None]:
    """Held while a cluster is admitted: by one launch at a time on this machine, of any installation."""
    parent = memory_cgroup("admission").parent
    parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def admitted() -> list[str]:
    """The local clusters on this machine that hold their share (their memory cgroup exists), any installation's."""
    parent = memory_cgroup("admission").parent
    if not parent.is_dir():
        return []
    return sorted(path.name for path in parent.iterdir() if path.is_dir() and LOCAL_CLUSTER.fullmatch(path.name))


def no_room(max_tasks: int) -> str | None:
    """Why one more local cluster does not fit in the `max_tasks` task ids they may have together, or None."""
    held = len(admitted())
    if (held + 1) * MAX_TASKS <= max_tasks:
        return None
    return (
        f"{held} local cluster{'s' if held != 1 else ''} hold{'' if held != 1 else 's'} {held * MAX_TASKS} of the "
        f"{max_tasks} task ids local clusters may have together (FC2_LOCAL_CLUSTERS_MAX_TASKS), and one more needs "
        f"{MAX_TASKS}: it starts when one ends"
    )


def delete_memory_cgroup(name: str, timeout: float = 5.0) -> None:
    """Remove the cluster's memory cgroup once its processes are gone (nothing to do when it is gone)."""
    if _memory_hierarchy() is None:
        return
    _delete_cgroup(memory_cgroup(name), timeout)


# The node agents' own cgroups, one per cluster in each hierarchy a service manager tracks processes by: the agents
# leave the cgroup of the worker that started them, so that a service manager stopping or restarting the worker
# with its control group (systemd's KillMode=control-group) does not take every running job with it.
NODES_PARENT = "fc2-nodes"


def tracking_hierarchies() -> list[Path]:
    """Where the cgroup hierarchies that track processes without limiting them are mounted: cgroup v2 (the unified
    hierarchy, alone or beside v1) and v1's `name=systemd`."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            _source, target, kind, options, *_ = line.split()
            if kind == "cgroup2" or (kind == "cgroup" and "name=systemd" in options.split(",")):
                found.append(Path(_unescape(target)))
    return found


def node_cgroups(name: str) -> list[Path]:
    """The cgroups of the agents of the cluster whose network namespace is `name` (whether or not they exist)."""
    return [root / NODES_PARENT / name for root in tracking_hierarchies()]


def create_node_cgroups(name: str) -> list[Path]:
    """The cluster's agents' cgroups (idempotent)."""
    cgroups = node_cgroups(name)
    for cgroup in cgroups:
        try:
            cgroup.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxError(f"cannot make the cgroup {cgroup}: {exc}") from exc
    return cgroups


def cgroup_processes(cgroup: Path) -> list[psutil.Process]:
    """The live processes in `cgroup` (none when it does not exist)."""
    found = []
    with contextlib.suppress(OSError):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(psutil.Error):
                if (process := psutil.Process(int(pid))).status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
    return found


def delete_node_cgroups(name: str, timeout: float = 5.0) -> None:
    """Remove the cluster's agents' cgroups once their processes are gone (nothing to do when they are gone)."""
    for cgroup in node_cgroups(name):
        _delete_cgroup(cgroup, timeout)


def _delete_cgroup(cgroup: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:  # EBUSY: a process that was just killed has not left it yet
            if time.monotonic() > deadline:
                raise SandboxError(f"cannot remove the cgroup {cgroup}: {exc}") from exc
            time.sleep(0.05)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as file:
        file.write(value)


def create_disk(image: Path, mount_point: Path, size_mb: int) -> None:
    """An ext4 file system of `size_mb` in the sparse file `image`, loop-mounted at `mount_point` (idempotent: a
    redelivered step finds it mounted). Its root stays root's; the caller makes the directories the code may write."""
    if os.path.ismount(mount_point):
        return
    mount_point.mkdir(mode=0o755, exist_ok=True)
    with open(image, "wb") as file:  # sparse: takes the platform's disk only as the node writes
        file.truncate(size_mb * 2**20)
    # No reserved blocks (the node may use all of it), no journal (scratch space, gone at teardown).
    _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "root_owner=0:0", str(image))
    _run("mount", "-t", "ext4", "-o", "loop,nosuid,nodev", str(image), str(mount_point))


def remove_disks(directory: Path) -> None:
    """Unmount every file system mounted under `directory` (deepest first; the loop devices go with them), so that
    deleting the directory deletes only the platform's own files. A mount still busy is detached lazily."""
    for mount_point in sorted(mounts_under(directory), key=lambda p: len(p.parts), reverse=True):
        try:
            _run("umount", str(mount_point))
        except SandboxError:
            _run("umount", "--lazy", str(mount_point))
    left = mounts_under(directory)
    if left:
        raise SandboxError(f"{', '.join(map(str, left))} still mounted")


def mounts_under(directory: Path) -> list[Path]:
    """The mount points of this mount namespace inside `directory`."""
    found: list[Path] = []
    if not os.path.exists("/proc/self/mounts"):  # not Linux: no sandbox, nothing mounted
        return found
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            target = Path(_unescape(line.split()[1]))
            if target.is_relative_to(directory):
                found.append(target)
    return found


def _unescape(field: str) -> str:
    r"""A path as /proc/self/mounts writes it (space, tab, newline and backslash as \ooo octal)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _run(*args: str) -> None:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SandboxError(f"{' '.join(args)}: {result.stderr.strip()[:300]}")


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


def command(
    netns: str | None, uid: int, hostname: str, mounts: Mounts, argv: list[str], cgroup: Path | None = None
) -> list[str]:
    """The command line that runs `argv` in the node's sandbox (see the module docstring), in the network namespace
    `netns` (None: the one it is started in — a lab node's own) and in the memory cgroup `cgroup` if given: a root
    shell joins it, then execs the rest, so every process of the chain starts in it. The same shell opens the seccomp
    program (written to the cluster's etc directory if it is not there yet) as SECCOMP_FD for bubblewrap."""
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
        "--seccomp",
        str(SECCOMP_FD),
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
    program = seccomp.write(mounts.etc / SECCOMP_FILE)
    enter = ["nsenter", f"--net=/run/netns/{netns}", "--"] if netns else []
    return [*_with_seccomp(program, cgroup), *enter, *bwrap, *drop, *argv]


def _with_seccomp(program: Path, cgroup: Path | None = None) -> list[str]:
    """A root shell that opens `program` as SECCOMP_FD (and joins `cgroup` first, if given), then execs the rest."""
    script = f'exec "$@" {SECCOMP_FD}<"$0"'
    if cgroup is None:
        return ["sh", "-c", script, str(program)]
    return ["sh", "-c", f'echo $$ > "$1" && shift && {script}', str(program), str(cgroup / "cgroup.procs")]


def processes(uid: int) -> list[psutil.Process]:
    """Every live process running as a sandbox uid (the cluster's code and anything it spawned, however detached)."""
    found = []
    for process in psutil.process_iter(["uids", "status"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if uid in process.info["uids"] and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found
