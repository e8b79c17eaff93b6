"""The sandbox narrows the kernel (provisioner/seccomp.py): inside the real sandbox each refused system call fails, as
the filter says and not only for want of capabilities, while the ordinary work of a training job still runs.

Each probe also runs once in the same sandbox without the filter (the control), so that a test passing cannot mean
that the kernel refused the call anyway.
"""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import provisioner
from provisioner import ClusterSpec, RunSpec, local, sandbox, seccomp
from tests.helpers import code_wheel, start_cluster, wait_result

pytestmark = pytest.mark.skipif(sandbox.unavailable() is not None, reason=f"no sandbox here: {sandbox.unavailable()}")

# Each call with arguments that make it fail harmlessly, or do nothing, when the filter lets it through.
PROBE = r"""
import ctypes, errno, json, mmap, os, socket, subprocess, sys, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = {}


def syscall(number, *args):  # 0 or the call's errno
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return ctypes.get_errno() if result == -1 else 0


def call(name, number, *args):
    found[name] = errno.errorcode.get(syscall(number, *args), "ok")


def call_in_child(name, number, *args):  # from a child: the call may change it for good, or be a fork (clone)
    pid = os.fork()
    if pid == 0:
        os._exit(syscall(number, *args))
    found[name] = errno.errorcode.get(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), "ok")


CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
call_in_child("unshare(CLONE_NEWUSER)", 272, CLONE_NEWUSER)
call_in_child("unshare(CLONE_NEWNET)", 272, CLONE_NEWNET)
call_in_child("clone(CLONE_NEWUSER)", 56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)  # the grandchild exits 0 at once
call("clone3", 435, 0, 0)
call("setns", 308, -1, 0)
call("mount", 165, b"none", b"/tmp", b"tmpfs", 0, 0)
call("umount2", 166, b"/tmp", 0)
call("pivot_root", 155, b"/tmp", b"/tmp")
call("open_tree", 428, -100, b"/", 0)
call("fsopen", 430, b"tmpfs", 0)
call("ptrace", 101, 2, 1, 0, 0)  # PTRACE_PEEKDATA of pid 1, which it does not trace
call("process_vm_readv", 310, os.getpid(), 0, 0, 0, 0, 0)
call("keyctl", 250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
call("add_key", 248, 0, 0, 0, 0, -3)
call("request_key", 249, 0, 0, 0, 0)
call("bpf", 321, 0, 0, 0)
call("perf_event_open", 298, 0, 0, -1, -1, 0)
call("userfaultfd", 323, 1)  # UFFD_USER_MODE_ONLY
call("io_uring_setup", 425, 1, 0)
call("init_module", 175, 0, 0, b"")
call("finit_module", 313, -1, b"", 0)
call("delete_module", 176, b"fc2-none", 0)
call("kexec_load", 246, 0, 0, 0, 0)
call("kexec_file_load", 320, -1, -1, 0, 0, 0)
call("reboot", 169, 0, 0, 0, 0)  # no magic numbers: EINVAL even with the capability
call("swapon", 167, 0, 0)
call("clock_settime", 227, 0, 0)
call("iopl", 172, 0)
call("acct", 163, 0)
call("syslog", 103, 10, 0, 0)  # SYSLOG_ACTION_SIZE_BUFFER
call("personality(ADDR_NO_RANDOMIZE)", 135, 0x0040000)
call("personality(PER_LINUX)", 135, 0)
call("modify_ldt", 154, 0, 0, 0)  # read 0 bytes of the table
call("mbind", 237, 0, 0, 0, 0, 0, 0)  # MPOL_DEFAULT on 0 bytes
call_in_child("set_mempolicy", 238, 0, 0, 0)  # MPOL_DEFAULT
call("get_mempolicy", 239, 0, 0, 0, 0, 0)
call("set_mempolicy_home_node", 450, 0, 0, 0, 0)  # on 0 bytes
# The kernel reads an int or unsigned int argument from the register's low 32 bits alone: the upper half set changes
# nothing to it, and must change nothing to the filter.
UPPER = 1 << 32
call("socket(AF_VSOCK | upper half)", 41, UPPER | 40, socket.SOCK_STREAM, 0)
call_in_child("personality(ADDR_NO_RANDOMIZE | upper half)", 135, UPPER | 0x0040000)
call_in_child("personality(PER_LINUX | upper half)", 135, UPPER)
call_in_child("clone(CLONE_NEWUSER | upper half)", 56, UPPER | CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
try:
    socket.socket(40, socket.SOCK_STREAM).close()  # AF_VSOCK
    found["socket(AF_VSOCK)"] = "ok"
except OSError as exc:
    found["socket(AF_VSOCK)"] = errno.errorcode[exc.errno]

# A 32-bit system call (i386 getpid through int 0x80) from a child process: it may be killed for it.
INT80 = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"  # mov eax, 20; int 0x80; ret
child = (
    "import ctypes, mmap; m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC); "
    f"m.write({INT80!r}); "
    "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())"
)
found["int 0x80"] = subprocess.run([sys.executable, "-c", child], capture_output=True).returncode

# The ordinary work of a training job.
results = []
threads = [threading.Thread(target=lambda i=i: results.append(sum(range(i * 1000)))) for i in range(16)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
found["threads"] = len(results)
found["subprocess"] = subprocess.run(["sh", "-c", "echo $((6 * 7))"], capture_output=True, text=True).stdout.strip()
pid = os.fork()
if pid == 0:
    os._exit(7)
found["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
import numpy  # noqa: E402

found["numpy"] = float(numpy.linalg.inv(numpy.array([[2.0, 0.0], [0.0, 4.0]])).trace())
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
found["seccomp mode"] = status["Seccomp"].strip()
found["open fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps(found))
"""

REFUSED = [
    "unshare(CLONE_NEWUSER)", "unshare(CLONE_NEWNET)", "clone(CLONE_NEWUSER)", "setns", "mount", "umount2",
    "pivot_root", "open_tree", "fsopen", "ptrace", "process_vm_readv", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "clock_settime", "iopl", "acct", "syslog", "personality(ADDR_NO_RANDOMIZE)",
    "socket(AF_VSOCK)", "modify_ldt", "mbind", "set_mempolicy", "get_mempolicy", "set_mempolicy_home_node",
    "socket(AF_VSOCK | upper half)", "personality(ADDR_NO_RANDOMIZE | upper half)", "clone(CLONE_NEWUSER | upper half)",
]  # fmt: skip
# What this kernel (6.18) lets an unprivileged process without capabilities do, or answers otherwise than EPERM,
# when no filter stands in the way: the filter, not a missing capability, is what refuses these.
REFUSED_BY_THE_FILTER_ALONE = [
    "unshare(CLONE_NEWUSER)", "clone(CLONE_NEWUSER)", "clone3", "setns", "open_tree", "ptrace", "process_vm_readv",
    "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd", "io_uring_setup", "clock_settime",
    "personality(ADDR_NO_RANDOMIZE)", "socket(AF_VSOCK)", "int 0x80", "modify_ldt", "mbind", "set_mempolicy",
    "get_mempolicy", "set_mempolicy_home_node", "socket(AF_VSOCK | upper half)",
    "personality(ADDR_NO_RANDOMIZE | upper half)", "clone(CLONE_NEWUSER | upper half)",
]  # fmt: skip


def probe(tmp_path: Path, filtered: bool = True) -> dict:
    """PROBE's findings, run in a node's sandbox as the local provider makes it (without the filter: the same command
    less `--seccomp`)."""
    uid = sandbox.free_uid()
    sandbox.write_etc(tmp_path / "etc", uid)
    work, output = tmp_path / "job" / "work", tmp_path / "job" / "output"
    sandbox.prepare_dirs(uid, work, output)
    mounts = sandbox.Mounts(work, output, tmp_path / "etc", local.read_only_mounts(Path(sys.prefix)))
    command = sandbox.command(None, uid, "fc2-probe", mounts, [sys.executable, "-c", textwrap.dedent(PROBE)])
    if not filtered:
        at = command.index("--seccomp")
        del command[at : at + 2]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    return probe(tmp_path_factory.mktemp("seccomp"))


@pytest.mark.parametrize("name", REFUSED)
def test_the_filter_refuses(found, name):
    assert found[name] == "EPERM"


def test_clone3_says_enosys_so_that_glibc_falls_back_to_clone(found):
    assert found["clone3"] == "ENOSYS"


def test_a_32_bit_system_call_kills_the_process(found):
    assert found["int 0x80"] == -signal.SIGSYS


def test_ordinary_work_still_runs(found):
    assert found["threads"] == 16 and found["subprocess"] == "42" and found["fork"] == 7
    assert found["numpy"] == 0.75
    assert found["personality(PER_LINUX)"] == "ok"
    assert found["personality(PER_LINUX | upper half)"] == "ok"  # the bits the kernel does not read refuse nothing
    assert found["seccomp mode"] == "2"  # filtered
    assert sandbox.SECCOMP_FD not in found["open fds"]  # bubblewrap closed the program's fd behind it


def test_without_the_filter_the_kernel_answers_otherwise(found, tmp_path):
    """The control: the same sandbox less `--seccomp` answers these calls differently (unshare(CLONE_NEWUSER)
    succeeds, a 32-bit call returns)."""
    control = probe(tmp_path, filtered=False)
    assert control["seccomp mode"] == "0"
    same = {name: control[name] for name in REFUSED_BY_THE_FILTER_ALONE if control[name] == found[name]}
    assert same == {}
    assert control["unshare(CLONE_NEWUSER)"] == "ok" and control["int 0x80"] == 0


# A job's own code, as a hostile bundle runs it: each call the filter refuses, the int argument given with its upper
# half set as the kernel ignores it.
NODE_PROBE = """
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
    found = {"seccomp": status["Seccomp"].strip()}
    for name, number, args in [("unshare", 272, [0x10000000]), ("vsock", 41, [1 << 32 | 40, 1, 0]),
                               ("modify_ldt", 154, [0, 0, 0]), ("mbind", 237, [0, 0, 0, 0, 0, 0])]:
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        found[name] = ctypes.get_errno() if result == -1 else "ok"
    json.dump(found, open(os.path.join(os.environ["FC2_OUTPUT_DIR"], "seccomp.json"), "w"))
"""


@pytest.mark.parametrize("provider", ["local", pytest.param("lab", marks=pytest.mark.heavy)])
def test_a_nodes_command_runs_under_the_filter(provider, tmp_path, settings):
    """The path a job takes (the node agent starts the command built by sandbox.command()), on a local and on a lab
    node: its code is filtered. tests/test_sandbox.py's hostile bundle then trains TensorFlow, under the filter, on
    two nodes."""
    if provider == "lab" and (why := provisioner.unavailable("lab")):
        pytest.skip(why)
    wheel = code_wheel(tmp_path, NODE_PROBE)
    if provider == "local":
        cluster = start_cluster(tmp_path / "agent", wheel, settings)
    else:
        cluster = provisioner.launch(ClusterSpec(f"fc2-seccomp-{tmp_path.name}"[:40], "lab", "mirrored", 1,
                                                 worker_type="lab-w-100"))  # fmt: skip
        (data := tmp_path / "data.npz").write_bytes(b"data")
        run = RunSpec(1, str(wheel), "demo.main", dataset=str(data), report_url="http://127.0.0.1:9", token="t")
        cluster = provisioner.bootstrap(cluster, run)
    try:
        wait_result(cluster)
        found = json.loads((Path(cluster.nodes[0].workdir) / "job" / "output" / "seccomp.json").read_text())
    finally:
        provisioner.teardown(provider, cluster.cluster_id)
    eperm = errno.EPERM
    assert found == {"seccomp": "2", "unshare": eperm, "vsock": eperm, "modify_ldt": eperm, "mbind": eperm}
    assert not (Path(cluster.workdir) / "etc" / sandbox.SECCOMP_FILE).exists()  # gone with the cluster


def test_the_program_is_built_once_and_written_only_when_it_differs(tmp_path):
    path = seccomp.write(tmp_path / "seccomp.bpf")
    assert path.read_bytes() == seccomp.program() and len(seccomp.program()) % 8 == 0  # struct sock_filter[]
    mtime = path.stat().st_mtime_ns
    seccomp.write(path)
    assert path.stat().st_mtime_ns == mtime
