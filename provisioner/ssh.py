"""Commands and files on a remote node over SSH (paramiko): the command runner of the `lab` and `aws` providers.

Owns the cluster's key pair (`generate_keypair`), the node's address (`Endpoint`), one reusable SSH connection per node
(`SSHRunner`: wait until the node answers, run a command, copy a file in or out atomically, start a detached process),
host-key pinning (trust on first use, recorded in the cluster's known_hosts, then any other key is refused). Every
command and its outcome goes to the node's log.

Errors are `NodeError`s naming the node (provisioner/errors.py): transient when the node may answer later (not up
yet, connection dropped), permanent when retrying cannot help (key refused, host key changed, command failed).
No Django here.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import posixpath
import secrets
import select
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TypeVar

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from common.retry import retry
from provisioner.errors import NodeError, transient
from provisioner.runners import Result
from provisioner.types import NodeInfo

logger = logging.getLogger(__name__)

T = TypeVar("T")

STDERR_LINES = 5  # of a command's stderr, in an error message and in the log
COMMAND_CHARS = 200  # of a command line, in an error message
READ_CHUNK = 65536


def generate_keypair(private_key: Path, comment: str, passphrase: bytes | None = None) -> str:
    """Make an Ed25519 key pair at `private_key` (OpenSSH format, mode 0600; encrypted with `passphrase` when given)
    and return the public key line `ssh-ed25519 AAAA… comment`. If the file exists, its public key is returned and
    nothing is made."""
    if not private_key.parent.exists():
        private_key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not private_key.exists():
        encryption = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption
        )
        # Written under a temporary name and linked into place, so a concurrent caller sees either no key or a
        # whole one; O_EXCL with 0600 so the key is never readable by others, not even for an instant.
        partial = private_key.with_name(f".{private_key.name}.{secrets.token_hex(4)}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(pem)
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):  # another caller made it first: theirs is the key
                os.link(partial, private_key)
        finally:
            partial.unlink()
    key = serialization.load_ssh_private_key(private_key.read_bytes(), password=passphrase)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{public.decode()} {comment}"


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where one node's sshd is and how to log in to it."""

    host: str  # address the platform reaches the node's sshd at
    port: int = 22  # the node's sshd port
    user: str = "root"  # account the bootstrap runs as
    key_path: Path  # the cluster's private key (generate_keypair)
    key_passphrase: bytes | None = field(default=None, repr=False)  # what the key file is encrypted with, if it is
    known_hosts: Path  # the cluster's known_hosts file, shared by its nodes: host keys pinned on first contact
    node: str  # node name ("worker-1"), in every error message

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class _PinOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Records a host key seen for the first time in the cluster's known_hosts file.

    The runners of one cluster may meet their nodes at the same moment from different threads: the file is locked and
    read again before the entry is appended, so no entry is lost, and a key another runner recorded meanwhile for the
    same host:port is held against this one like any pinned key.
    """

    def __init__(self, known_hosts: Path):
        self.known_hosts = known_hosts
        self.recorded: paramiko.PKey | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a+", opener=lambda path, flags: os.open(path, flags, 0o600)) as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # released when the file is closed
            os.fchmod(file.fileno(), 0o600)
            pinned = paramiko.HostKeys(str(self.known_hosts)).lookup(hostname)
            if pinned:
                if pinned.get(key.get_name()) != key:
                    raise paramiko.BadHostKeyException(hostname, key, next(iter(pinned.values())))
                return
            file.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")  # as HostKeyEntry.to_line writes it
            file.flush()
            os.fsync(file.fileno())
        self.recorded = key


class SSHRunner:
    """Runs commands on one node over one SSH connection, reused for every call (reconnected once if it dropped).

    One runner per node, used from one thread. Every command, file copy and outcome is appended to `log` (the node's
    bootstrap log) with a timestamp. Command lines are logged: secrets go through `stdin` or `put_bytes`, which are
    never logged (and a command line is visible in the node's process list anyway).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        log: Path | None = None,
        connect_timeout_s: float = 10,
        tcp_connect_s: float | None = None,
    ):
        self.endpoint = endpoint
        self.log = log
        self.connect_timeout_s = connect_timeout_s
        # The TCP handshake alone, where the node is known to be near (the kernel answers it, however busy its sshd):
        # the address of a node that is gone black-holes, and every probe of it would otherwise wait the whole
        # connect timeout.
        self.tcp_connect_s = tcp_connect_s
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def node(self) -> str:
        return self.endpoint.node

    def __enter__(self) -> SSHRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def wait_ready(self, timeout_s: float) -> None:
        """Connect (TCP, SSH handshake, authentication), trying again with backoff until it works or `timeout_s`
        passes (then a transient NodeError). A refused key or a changed host key fails at once, permanently."""
        if self._connected():
            return
        deadline = time.monotonic() + timeout_s
        try:
            retry(
                lambda: self._connect(min(self.connect_timeout_s, max(deadline - time.monotonic(), 0.1))),
                retryable=transient,
                attempts=None,
                timeout_s=timeout_s,
                first_delay_s=0.1,
                max_delay_s=2.0,
                what=f"SSH to {self.endpoint.node}",
            )
        except NodeError as error:
            if not error.transient:
                raise
            raise NodeError(
                self.endpoint.node,
                f"SSH at {self.endpoint.address} did not answer within {timeout_s:g} s: {error.reason}",
                transient=True,
            ) from None

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        check: bool = True,
        stdin: bytes | None = None,
    ) -> Result:
        """Run `command` (a shell line, or a sequence of arguments quoted with shlex.join) and return its outcome.

        With `check`, a non-zero exit raises a NodeError with the command and the end of its stderr. Past `timeout_s`
        a NodeError is raised and the channel closed; the remote command is not killed (it gets SIGPIPE on its next
        write), so a command that may hang should bound itself. A connection lost meanwhile is a transient NodeError.
        """
        line = command if isinstance(command, str) else shlex.join(command)
        self._log(f"$ {line}")
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s
        channel = self._open_session()
        try:
            channel.exec_command(line)
            if stdin:
                channel.settimeout(timeout_s)
                channel.sendall(stdin)
            channel.shutdown_write()
            stdout, stderr = _read_all(channel, deadline)
            # The exit status may come after the end of the output.
            if not channel.status_event.wait(None if deadline is None else max(deadline - time.monotonic(), 0)):
                raise self._timed_out(line, timeout_s)
            status = channel.recv_exit_status()
        except TimeoutError:
            raise self._timed_out(line, timeout_s) from None
        except (paramiko.SSHException, EOFError, OSError) as error:
            raise self._dropped(f"running `{_shorten(line)}`", error) from error
        finally:
            channel.close()
        if status == -1 and not self._connected():
            raise self._dropped(f"running `{_shorten(line)}`", "connection closed")
        result = Result(status, stdout.decode(errors="replace"), stderr.decode(errors="replace"))
        tail = _tail(result.stderr)
        self._log(f"  exit {status} in {time.monotonic() - started:.2f} s" + (f"; stderr: {tail}" if tail else ""))
        if check and status != 0:
            outcome = "was killed by a signal" if status == -1 else f"exited with status {status}"
            raise NodeError(self.endpoint.node, f"`{_shorten(line)}` {outcome}: {tail or '(no stderr)'}")
        return result

    def put(self, local: Path, remote: str, mode: int = 0o644) -> None:
        """Copy the file `local` to `remote` on the node, with `mode`, replacing it atomically."""
        self._log(f"put {local} -> {remote} ({local.stat().st_size} bytes, mode {mode:04o})")
        with open(local, "rb") as file:
            self._upload(file, remote, mode)

    def put_bytes(self, data: bytes, remote: str, mode: int = 0o600) -> None:
        """Write `data` to `remote` on the node, with `mode`, replacing it atomically. `data` is never logged: this is
        the way to hand a node a secret."""
        self._log(f"put {len(data)} bytes -> {remote} (mode {mode:04o})")
        self._upload(io.BytesIO(data), remote, mode)

    def get(self, remote: str, max_bytes: int | None = None) -> bytes:
        """The content of the file `remote` on the node; a NodeError if it is larger than `max_bytes`."""
        try:
            with self._sftp_client().open(remote, "rb") as file:
                size = file.stat().st_size
                if max_bytes is not None and size is not None and size > max_bytes:
                    raise NodeError(self.endpoint.node, f"{remote} is {size} bytes, more than the {max_bytes} allowed")
                file.prefetch(size)
                # Read one byte more than allowed: a file growing while it is read must not get past the limit.
                data = file.read() if max_bytes is None else file.read(max_bytes + 1)
        except (paramiko.SSHException, EOFError, OSError) as error:
            raise self._sftp_error(f"reading {remote}", error) from error
        if max_bytes is not None and len(data) > max_bytes:
            raise NodeError(self.endpoint.node, f"{remote} grew past the {max_bytes} bytes allowed while read")
        self._log(f"get {remote} ({len(data)} bytes)")
        return data

    def start_detached(self, command: str | Sequence[str], log: str) -> int:
        """Start `command` on the node so that it outlives this SSH session (its own session, stdin from /dev/null,
        stdout and stderr appended to the node's file `log`) and return its pid on the node: the program itself for a
        sequence of arguments, the `sh -c` running it for a shell line. That pid leads its own process group, so
        `kill -- -PID` stops it and everything it started."""
        program = f"sh -c {shlex.quote(command)}" if isinstance(command, str) else shlex.join(command)
        # In the background of a non-interactive shell, setsid is not a group leader, so it calls setsid() and execs
        # the program without forking: $! is the program's pid.
        launcher = f"setsid {program} </dev/null >>{shlex.quote(log)} 2>&1 & echo $!"
        result = self.run(launcher, timeout_s=self.connect_timeout_s)
        try:
            return int(result.stdout.strip())
        except ValueError:
            raise NodeError(
                self.endpoint.node, f"`{_shorten(program)}` started but gave no pid: {result.stdout!r}"
            ) from None

    def _transport(self) -> paramiko.Transport | None:
        """The connection's transport while it is up."""
        transport = self._client.get_transport() if self._client is not None else None
        return transport if transport is not None and transport.is_active() else None

    def _connected(self) -> bool:
        return self._transport() is not None

    def _connect(self, timeout_s: float) -> None:
        """One attempt at a connection: a NodeError, transient when trying again may help."""
        self.close()
        endpoint = self.endpoint
        started = time.monotonic()
        try:
            # bytes: paramiko hands it to cryptography, which refuses a str (types-paramiko says str)
            key = paramiko.PKey.from_path(endpoint.key_path, password=endpoint.key_passphrase)  # type: ignore[arg-type]
        except (OSError, paramiko.SSHException) as error:
            raise NodeError(endpoint.node, f"cannot read the SSH key {endpoint.key_path}: {error}") from error
        client = paramiko.SSHClient()
        if endpoint.known_hosts.exists():
            client.get_host_keys().load(str(endpoint.known_hosts))
        policy = _PinOnFirstUse(endpoint.known_hosts)
        client.set_missing_host_key_policy(policy)
        try:
            client.connect(
                endpoint.host,
                endpoint.port,
                username=endpoint.user,
                pkey=key,
                timeout=min(timeout_s, self.tcp_connect_s or timeout_s),
                banner_timeout=timeout_s,
                auth_timeout=timeout_s,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as error:
            client.close()
            raise NodeError(
                endpoint.node,
                f"host key of {endpoint.address} changed (offered {error.key.fingerprint}, pinned "
                f"{error.expected_key.fingerprint} in {endpoint.known_hosts}): refusing to connect",
            ) from error
        except paramiko.AuthenticationException as error:
            client.close()
            raise NodeError(
                endpoint.node, f"SSH at {endpoint.address} refused the key {endpoint.key_path} for {endpoint.user}"
            ) from error
        except (paramiko.SSHException, EOFError, OSError) as error:
            client.close()
            raise NodeError(endpoint.node, f"{type(error).__name__}: {error}", transient=True) from error
        self._client = client
        pinned = f"; host key {policy.recorded.fingerprint} recorded" if policy.recorded is not None else ""
        self._log(f"connected to {endpoint.user}@{endpoint.address} in {time.monotonic() - started:.2f} s{pinned}")

    def _open_session(self) -> paramiko.Channel:
        """A new channel on the connection, reconnecting once when the connection turns out to have dropped."""
        for attempt in (1, 2):
            if not self._connected():
                self._connect(self.connect_timeout_s)
            try:
                if (transport := self._transport()) is None:  # dropped as soon as it was made
                    raise EOFError("the connection closed")
                return transport.open_session(timeout=self.connect_timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as error:
                self.close()
                if attempt == 2:
                    raise self._dropped("opening a session", error) from error
        raise AssertionError("unreachable")

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None or not self._connected():
            channel = self._open_session()
            channel.invoke_subsystem("sftp")
            self._sftp = paramiko.SFTPClient(channel)
        return self._sftp

    def _upload(self, file: IO[bytes], remote: str, mode: int) -> None:
        """Write `file` to `remote` through a private directory beside it: the file is whole and has its mode before it
        is renamed into place, and nobody can open it before (SFTP creates files with the server's umask)."""
        staging = posixpath.join(posixpath.dirname(remote), f".{posixpath.basename(remote)}.{secrets.token_hex(4)}")
        staged = posixpath.join(staging, posixpath.basename(remote))
        try:
            sftp = self._sftp_client()
            sftp.mkdir(staging, 0o700)
            try:
                sftp.putfo(file, staged)
                sftp.chmod(staged, mode)
                sftp.posix_rename(staged, remote)
            finally:
                # Whatever happened, nothing is left of the staging directory.
                with contextlib.suppress(FileNotFoundError):
                    sftp.remove(staged)
                sftp.rmdir(staging)
        except (paramiko.SSHException, EOFError, OSError) as error:
            raise self._sftp_error(f"writing {remote}", error) from error

    def _sftp_error(self, what: str, error: BaseException) -> NodeError:
        """A failed SFTP call: the node's answer (no such file, permission denied, …) while the connection lives,
        otherwise a lost connection."""
        if not self._connected():
            return self._dropped(what, error)
        self._log(f"  {what}: {error}")
        return NodeError(self.endpoint.node, f"{what} failed: {error}")

    def _timed_out(self, line: str, timeout_s: float | None) -> NodeError:
        self._log(f"  timed out after {timeout_s:g} s")
        return NodeError(self.endpoint.node, f"`{_shorten(line)}` did not finish within {timeout_s:g} s")

    def _dropped(self, what: str, error: object) -> NodeError:
        self.close()
        self._log(f"  connection lost: {error}")
        return NodeError(
            self.endpoint.node,
            f"SSH connection to {self.endpoint.address} lost {what}: {error}",
            transient=True,
        )

    def _log(self, message: str) -> None:
        if self.log is None:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        with open(self.log, "a", encoding="utf-8") as file:
            file.write(f"{stamp} {message}\n")


def _read_all(channel: paramiko.Channel, deadline: float | None) -> tuple[bytes, bytes]:
    """Everything the command writes on stdout and stderr, read as it comes on both: reading one stream to its end
    first would stall a command that fills the other's window."""
    stdout, stderr = bytearray(), bytearray()
    # The channel's fileno is readable when either stream has data, and for good once it is closed.
    while not (channel.eof_received or channel.closed) or channel.recv_ready() or channel.recv_stderr_ready():
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError
        select.select([channel], [], [], remaining)
        while channel.recv_ready():
            stdout += channel.recv(READ_CHUNK)
        while channel.recv_stderr_ready():
            stderr += channel.recv_stderr(READ_CHUNK)
    return bytes(stdout), bytes(stderr)


def _shorten(text: str) -> str:
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"


def _tail(text: str) -> str:
    return " | ".join(text.strip().splitlines()[-STDERR_LINES:])


def cluster_runner(
    workdir: Path, node: NodeInfo, passphrase: bytes | None = None, tcp_connect_s: float | None = None
) -> SSHRunner:
    """The runner of a remote node of a cluster whose platform-side directory is `workdir`: its key (id_ed25519,
    encrypted with `passphrase` when given), its pinned host keys (known_hosts) and the node's bootstrap log;
    `tcp_connect_s` bounds the TCP handshake alone (SSHRunner)."""
    endpoint = Endpoint(
        host=node.external_host,
        port=node.ssh_port,
        user=node.ssh_user or "root",
        key_path=workdir / "id_ed25519",
        key_passphrase=passphrase,
        known_hosts=workdir / "known_hosts",
        node=node.name,
    )
    log = workdir / "logs" / f"{node.name}.bootstrap.log"
    return SSHRunner(endpoint, log=log if log.parent.is_dir() else None, tcp_connect_s=tcp_connect_s)
