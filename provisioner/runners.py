"""Command runners: how the shared bootstrap (provisioner/nodes.py) acts on one node's machine.

A runner runs a command on the node's machine, copies a file there, reads one back, and starts a process that
outlives it. `LocalRunner` does it on this machine with subprocess (the `local` provider, whose nodes are this
machine); `provisioner.ssh.SSHRunner` does the same over SSH (`lab`, `aws`). Both log every command they run, with its
outcome, to the node's bootstrap log on the platform, so a user can see what happened on which node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from provisioner.errors import NodeError, ProvisionError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    exit_status: int  # the command's exit status
    stdout: str  # everything it wrote to stdout
    stderr: str  # everything it wrote to stderr


class Runner(Protocol):
    @property
    def node(self) -> str:
        """The node's name, for error messages."""
        ...

    def wait_ready(self, timeout_s: float) -> None: ...

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        check: bool = True,
        stdin: bytes | None = None,
    ) -> Result: ...

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None: ...

    def put_bytes(self, data: bytes, remote: str, mode: int = 0o600) -> None: ...

    def get(self, remote: str, max_bytes: int | None = None) -> bytes: ...

    def start_detached(self, command: str | Sequence[str], log: str) -> int: ...

    def close(self) -> None: ...


def as_shell(command: str | Sequence[str]) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def failure(node: str, command: str | Sequence[str], result: Result) -> NodeError:
    """The error of a command that exited non-zero: the node, the command (shortened) and the end of its stderr."""
    text = as_shell(command)
    tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-5:])
    return NodeError(node, f"`{text[:120]}{'…' if len(text) > 120 else ''}` exited {result.exit_status}: {tail}")


class LocalRunner:
    """A node whose machine is this one: commands through subprocess, files through the file system."""

    def __init__(self, node: str, log: Path | None = None, cgroups: Sequence[Path] = ()):
        self.node = node
        self.log = log
        self.cgroups = cgroups  # what a detached process joins first: it outlives the caller's cgroup, not only it

    def _note(self, text: str) -> None:
        if self.log is not None:
            with open(self.log, "a") as out:
                out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    def wait_ready(self, timeout_s: float) -> None:
        pass  # this machine is up

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        check: bool = True,
        stdin: bytes | None = None,
    ) -> Result:
        started = time.monotonic()
        try:
            done = subprocess.run(
                command if isinstance(command, str) else list(command),
                shell=isinstance(command, str),
                input=stdin,
                capture_output=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            self._note(f"$ {as_shell(command)}\n  timed out after {timeout_s} s")
            raise NodeError(self.node, f"`{as_shell(command)[:120]}` timed out after {timeout_s} s") from None
        result = Result(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
        tail = " | ".join(result.stderr.strip().splitlines()[-3:])
        self._note(f"$ {as_shell(command)}\n  exit {result.exit_status} in {time.monotonic() - started:.1f} s {tail}")
        if check and result.exit_status != 0:
            raise failure(self.node, command, result)
        return result

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None:
        partial = f"{remote}.partial"
        shutil.copyfile(local, partial)
        os.chmod(partial, mode)
        os.replace(partial, remote)
        self._note(f"put {local.name} -> {remote}")

    def put_bytes(self, data: bytes, remote: str, mode: int = 0o600) -> None:
        partial = f"{remote}.partial"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, remote)
        self._note(f"put {len(data)} bytes -> {remote}")

    def get(self, remote: str, max_bytes: int | None = None) -> bytes:
        size = os.path.getsize(remote)
        if max_bytes is not None and size > max_bytes:
            raise NodeError(self.node, f"{remote} is {size} bytes, more than the {max_bytes} expected")
        with open(remote, "rb") as data:
            return data.read()

    def start_detached(self, command: str | Sequence[str], log: str) -> int:
        pid = spawn(command, log, cgroups=self.cgroups)
        self._note(f"started {as_shell(command)[:200]} (pid {pid})")
        return pid

    def close(self) -> None:
        pass


# Popen objects of the processes this process started, reaped so that finished ones don't linger as zombies.
_children: list[subprocess.Popen] = []


def spawn(command: str | Sequence[str], log: str | Path, cwd: Path | None = None, cgroups: Sequence[Path] = ()) -> int:
    """Start a process on this machine that outlives the caller's session (its own session, stdin from /dev/null,
    output appended to `log`, only PATH from our environment) and, given `cgroups`, outside the caller's cgroups too:
    a shell joins each of them, then execs the command. Returns its pid."""
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    if cgroups:  # a shell, not preexec_fn: the bootstrap starts nodes from several threads at once
        join = " && ".join(f"echo $$ > {shlex.quote(str(Path(cgroup) / 'cgroup.procs'))}" for cgroup in cgroups)
        argv = ["sh", "-c", f'{join} && exec "$@"', "sh", *argv]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    _children.append(process)
    return process.pid


def reap() -> None:
    _children[:] = [p for p in _children if p.poll() is None]


def run_parallel(calls: Mapping[str, Callable[[], T]], max_workers: int | None = None) -> dict[str, T]:
    """Run one call per node at once and return each result by node name. When calls fail, all are still waited for,
    then the first failure in the order of `calls` is raised as a NodeError naming its node (the others are logged)."""
    if not calls:
        return {}
    with ThreadPoolExecutor(max_workers=max_workers or len(calls), thread_name_prefix="node") as pool:
        futures = {node: pool.submit(call) for node, call in calls.items()}
    errors = {node: future.exception() for node, future in futures.items()}
    failures = {node: error for node, error in errors.items() if error is not None}
    if not failures:
        return {node: future.result() for node, future in futures.items()}
    for node, error in list(failures.items())[1:]:
        logger.warning("node %s failed too: %s", node, error)
    node, error = next(iter(failures.items()))
    if isinstance(error, NodeError):
        raise error
    transient = isinstance(error, ProvisionError) and error.transient
    raise NodeError(node, f"{type(error).__name__}: {error}", transient=transient) from error
