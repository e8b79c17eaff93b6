"""The seccomp filter a job's code runs under (provisioner/sandbox.py hands it to bubblewrap with `--seccomp FD`).

It narrows the kernel the code can reach: the system calls a training job never makes and that are the usual way from
an unprivileged process to the kernel's less trodden code — new namespaces (a user namespace above all, in which the
code would be root), mounts, tracing or reading other processes, kernel keys, eBPF, perf events, io_uring, modules,
kexec, the clocks, swap, reboot, and the rest of what Docker's default profile (moby/moby
profiles/seccomp/default.json) refuses a container without capabilities — are answered EPERM. Everything else is
allowed: the filter is a deny list (default ALLOW), so a system call newer than libseccomp's table passes.

- `clone` and `unshare` are refused only with a namespace flag: threads, fork and vfork stay as they are.
- `clone3` answers ENOSYS: its flags are in a struct seccomp cannot read, and on ENOSYS glibc falls back to `clone`,
  whose flags the filter does check (Docker does the same).
- `personality` is allowed only with the flags Docker allows (PER_LINUX, PER_LINUX32, UNAME26 and their union), so
  the code cannot turn off address-space randomisation for what it execs; the query (0xffffffff) is refused too.
- `socket(AF_VSOCK)` is refused (the host side of a virtual machine), as Docker does. Every other family is left
  alone: the nodes train over TCP (TensorFlow's gRPC, PyTorch DDP's gloo and its rendezvous store), a DataLoader's
  workers pass tensors over AF_UNIX and /dev/shm; a 2-node DDP all-reduce needed nothing the filter refuses
  (tests/test_torch_nodes.py runs one in the sandbox).
- Every argument rule looks at the argument as wide as the kernel reads it: libseccomp compares all 64 bits of the
  register, while the kernel reads an `int` from the low 32 alone, so `socket(0x100000028, …)` is `socket(AF_VSOCK)` to
  the kernel and an unmasked rule lets it through. A rule on a flag looks at its bit alone; a rule on a value masks it
  to the argument's width.
- Only x86_64 system calls pass: one through another ABI (i386's `int 0x80`, x32) would get around a filter written
  for x86_64 numbers, so it kills the process.

The program is built with libseccomp (through the ctypes binding `pyseccomp`) once per process; `program()` raises
`SeccompError` saying why when it cannot be built, and the sandbox's `unavailable()` says so.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from provisioner.errors import ProvisionError

# Refused with EPERM whatever their arguments. Names libseccomp resolves for x86_64; those x86_64 never had (vm86,
# create_module…) cost nothing and keep the list Docker's.
DENIED = (
    # namespaces and mounts
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    # other processes: tracing, reading or writing their memory, taking their file descriptors
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "migrate_pages",
    "move_pages",
    # kernel interfaces with a long record of privilege escalations
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fanotify_init",
    "lookup_dcookie",
    "open_by_handle_at",
    "name_to_handle_at",
    "syslog",
    # kernel modules, kexec, reboot
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    # the machine's settings: clocks, swap, accounting, quotas, names, I/O ports
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "clock_adjtime",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "sethostname",
    "setdomainname",
    "vhangup",
    "iopl",
    "ioperm",
    # the local descriptor table (a 16-bit code segment, and a long record of kernel bugs) and the NUMA memory policy
    # (Docker allows these only with CAP_SYS_NICE)
    "modify_ldt",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    # obsolete or unimplemented calls nothing needs
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "vm86",
    "vm86old",
    "afs_syscall",
    "tuxcall",
    "security",
    "getpmsg",
    "putpmsg",
)
# Newer than libseccomp 2.5.4's table, so named by their x86_64 number: open_tree_attr (Linux 6.15), open_tree with
# mount attributes; set_mempolicy_home_node (Linux 5.17), the NUMA policy as above.
DENIED_NUMBERS = {"open_tree_attr": 467, "set_mempolicy_home_node": 450}
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (Docker's mask, 0x7E020000). CLONE_NEWTIME (0x80) only
# for unshare: in clone's flags that bit is part of the exit signal.
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
CLONE_NEWTIME = 0x00000080
# personality values Docker allows: PER_LINUX, PER_LINUX32 (0x8), UNAME26 (0x20000) and both. Any other bit is refused.
PERSONALITY_BITS = 0x00020008
AF_VSOCK = 40
# The bits of an `int` argument (socket's family): the kernel never reads the register's upper half.
INT_WIDTH = 0xFFFFFFFF


class SeccompError(ProvisionError):
    """The seccomp filter cannot be built here; the message says why."""


@functools.cache
def program() -> bytes:
    """The filter as a classic BPF program (struct sock_filter[], what `bwrap --seccomp` reads)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: the binding found no libseccomp
        raise SeccompError(f"no seccomp filter: {exc} (PyPI package pyseccomp, Debian package libseccomp2)") from exc
    deny = seccomp.ERRNO(errno.EPERM)
    try:
        rules = seccomp.SyscallFilter(seccomp.ALLOW)
        if seccomp.system_arch() != seccomp.Arch.X86_64:
            raise SeccompError("the seccomp filter is written for x86_64 system calls only")
        rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
        for name in DENIED:
            rules.add_rule(deny, name)
        for number in DENIED_NUMBERS.values():
            rules.add_rule(deny, number)
        for flag in CLONE_NAMESPACES:
            rules.add_rule(deny, "clone", has_bit(seccomp, 0, flag))
        for flag in (*CLONE_NAMESPACES, CLONE_NEWTIME):
            rules.add_rule(deny, "unshare", has_bit(seccomp, 0, flag))
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        # One rule per refused bit: libseccomp cannot compare one argument twice in a rule. personality's argument is
        # an unsigned int: the bits above 31 are never read, so none is refused.
        for bit in range(32):
            if not PERSONALITY_BITS & 1 << bit:
                rules.add_rule(deny, "personality", has_bit(seccomp, 0, 1 << bit))
        rules.add_rule(deny, "socket", int_equals(seccomp, 0, AF_VSOCK))
        with tempfile.TemporaryFile() as file:
            rules.export_bpf(file)
            file.seek(0)
            return file.read()
    except OSError as exc:
        raise SeccompError(f"libseccomp cannot build the filter: {exc}") from exc


def has_bit(seccomp: Any, index: int, bit: int) -> Any:
    """The comparison "argument `index` has `bit` set", whatever its other bits, in the register's upper half too."""
    return seccomp.Arg(index, seccomp.MASKED_EQ, bit, bit)


def int_equals(seccomp: Any, index: int, value: int) -> Any:
    """The comparison "argument `index`, an `int` to the kernel, is `value`": the low 32 bits alone, as the kernel
    reads them (an EQ would also compare the upper half, which the caller fills as it likes)."""
    return seccomp.Arg(index, seccomp.MASKED_EQ, INT_WIDTH, value)


def unavailable() -> str | None:
    """Why the filter cannot be built here, or None when it can."""
    try:
        program()
    except SeccompError as exc:
        return str(exc)
    return None


def write(path: Path) -> Path:
    """The program in the file `path` (root's, read by bubblewrap before the code starts; rewritten only when it
    differs, and atomically: nodes of a cluster start in parallel)."""
    data = program()
    try:
        if path.read_bytes() == data:
            return path
    except FileNotFoundError:
        pass
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
