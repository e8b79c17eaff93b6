#!/usr/bin/env python3
"""FC² node agent: runs one node's training process beside it and reports to the platform.

Standalone on purpose — stdlib, plus psutil when the node has it — because it is copied onto cluster nodes that have
no Django. It:

- starts the node's command, writes its stdout/stderr to the node log, and parses `FC2_PROGRESS {json}` lines;
- reports `started`, then `running` with progress, every progress line since the previous report (`progress_log`, so
  a chief printing many lines a second loses none of its losses) and the resource samples taken since (one a second by
  default; kept, up to an hour's, while the platform cannot be reached — see Sampler), to
  `POST <url>/api/v1/jobs/<job>/report` with the job-scoped token (read from a file only the agent can read: never on
  the command line, never in the environment of the node's command);
- when the command exits, keeps its final report — `succeeded` or `failed` with the exit code, the log tail — and the
  files of the output directory in its result directory (a command that exited 0 but whose output directory cannot
  be read is `failed`: its results are lost), then delivers them, retrying with backoff for as long as the
  job may live (until --deadline): a platform that is down for a while loses nothing, and if the agent itself is gone
  the platform can still fetch the kept result (the completion report is what moves the job on, as in FC² §6);
- on SIGTERM (teardown) stops the command and exits;
- on the chief (--ship-checkpoints), ships each new complete checkpoint the command writes to its checkpoint
  directory (--checkpoints, FC2_CHECKPOINT_DIR) to `POST <url>/api/v1/jobs/<job>/checkpoint` as a tar.gz, while
  training runs — one its index file names once the index names it, any other (no index) once the directory has
  changed and then stayed quiet with no temporary file in it (Shipper), each with the step it was saved at as its
  progress lines tell (NodeRun.step_at); one over --checkpoint-max-mb is not shipped, and its next report says so
  (`checkpoint_skipped`);
- before the command starts, unpacks the checkpoint archive to resume from (--restore) into --restore-to, safely
  (`archive_members`: regular files and folders only, no absolute or `..` path, bounded);
- watches for a spot interruption notice — the instance metadata's `spot/instance-action` (--spot-metadata, aws spot
  nodes only) or the file `spot-instance-action` in the node's directory holding the same JSON (any node: how a
  test or an operator raises one) — and on one asks the command for a checkpoint at once (CHECKPOINT_NOW in its
  checkpoint directory) and reports it (`interruption`); the platform's answer to a report names the job's latest
  notice, so that the chief checkpoints whichever node got it;
- counts the platform's silence from its last exchange with it (any answer, even a refusal): past --orphan-s it
  stops its own machine (--self-stop: `shutdown` halts an EC2 instance, `netns` removes a lab host — every process
  in its network namespace, its cgroups, its disk's mount and the namespace —, `processes` ends the node's command),
  so that a platform gone for good leaves nothing running;
- when the command was killed (SIGKILL) and the memory cgroup it ran in (--memory-cgroup) had the kernel's OOM killer
  kill a process, says so at the end of the log and the log tail: "killed: out of memory (cluster limit N MB)".

The node's command may be hostile (on the local provider it runs sandboxed, as another uid, and the agent does not):
the agent reads what the command left in the output directory without following links, only regular files, within
the size limit, and lists whatever it leaves (a link, a FIFO, a socket, a device, a folder too deep) with why.
Progress reports never block the training: one that cannot be delivered is dropped.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import gzip
import io
import json
import math
import os
import posixpath
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO

try:
    import psutil
except ImportError:  # a bare node still trains and reports progress, just without resource samples
    psutil = None  # type: ignore[assignment]  # the module or None: every use asks `if psutil` first

PROGRESS_PREFIX = b"FC2_PROGRESS "
PROGRESS_KEYS = ("epoch", "epochs", "step", "steps", "loss")
LOG_TAIL_LINES = 60
LOG_TAIL_LINE_CHARS = 1000  # of each line kept in the log tail
MAX_LINE_BYTES = 64 * 1024  # a longer line is read in pieces: the agent never holds more of the output at once
MIN_REPORT_GAP_S = 1.0
MAX_PROGRESS_LOG = 1000  # progress lines one report carries: the newest, when a chief prints faster than that
MAX_STEP_HISTORY = 10_000  # (when read, step) of the newest progress lines, to tell a checkpoint's step (step_at)
MAX_BUFFERED_SAMPLES = 3600  # resource samples kept while the platform cannot be reached: an hour at 1 Hz
MAX_KEPT_SAMPLES = 86400  # samples --keep-samples writes: a day's at 1 Hz (about 10 MB)


class Reporter:
    """POSTs reports (JSON, or multipart with files) to the platform, retrying transient failures."""

    def __init__(self, url: str, job: int, node: str, token: str, timeout: float = 10.0):
        # v1 of the API; agents of an earlier release, on clusters started before an upgrade, post to the unversioned
        # /api/jobs/<job>/report, v1's alias, which keeps answering.
        self.url = f"{url.rstrip('/')}/api/v1/jobs/{job}/report"
        self.node = node
        self.token = token
        self.timeout = timeout
        # The platform said the job is over: stop reporting. No URL: a run that reports to nobody (Scala-Opt's
        # profiling run, which reads the samples the agent keeps on the node, --keep-samples).
        self.closed = not url
        self.refused = False  # the platform refused the last report as it was (sending it again would not help)
        self.stopping = threading.Event()  # set on SIGTERM: give up waiting between tries
        self.base = f"{url.rstrip('/')}/api/v1/jobs/{job}"
        # When the platform last answered anything (time.monotonic()): the orphan watchdog counts its silence from it.
        self.last_exchange = time.monotonic()
        self.answer: dict = {}  # the platform's last answer to a report (it names the job's latest interruption)

    def send(
        self, report: dict, files: dict[str, bytes] | None = None, attempts: int = 3, until: float | None = None
    ) -> bool:
        """Deliver one report: `attempts` tries, or with `until` (a time.time()) as many as fit before then, with
        exponential backoff capped at 30 s. False when it was not delivered or the platform refused it."""
        if self.closed:
            return False
        self.refused = False
        report = {"node": self.node, **report}
        if files:
            body, content_type = encode_multipart(report, files)
        else:
            body, content_type = json.dumps(report).encode(), "application/json"
        delay = 0.5
        attempt = 0
        while True:
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": content_type, "Authorization": f"Bearer {self.token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    answer = response.read(64 * 1024)
                self.last_exchange = time.monotonic()
                with contextlib.suppress(ValueError, RecursionError):
                    if isinstance(loaded := json.loads(answer), dict):
                        self.answer = loaded
                return True
            except urllib.error.HTTPError as exc:
                self.last_exchange = time.monotonic()  # refused, but the platform is there
                detail = exc.read()[:300].decode(errors="replace")
                if exc.code == 409:
                    self.closed = True
                    return False
                if exc.code < 500 and exc.code != 429:
                    print(f"fc2-agent: report refused ({exc.code}): {detail}", file=sys.stderr, flush=True)
                    self.refused = True
                    return False
            except (urllib.error.URLError, OSError) as exc:
                detail = str(exc)
            attempt += 1
            more = time.time() + delay < until if until is not None else attempt < attempts
            if not more or self.stopping.is_set():
                break
            self.stopping.wait(delay)
            delay = min(delay * 2, 30)
        print(f"fc2-agent: report not delivered ({attempt} tries): {detail}", file=sys.stderr, flush=True)
        return False

    def ship(self, archive: IO[bytes], size: int, checkpoint: str, step: int | None = None) -> str | None:
        """POST one checkpoint archive of `size` bytes, streamed from its file (once: the next checkpoint supersedes
        it), with the step it was saved at when known; None when it was taken, else why not."""
        if self.closed:
            return "the job has ended"
        archive.seek(0)
        request = urllib.request.Request(
            f"{self.base}/checkpoint",
            data=archive,
            method="POST",
            headers={
                "Content-Type": "application/gzip",
                "Content-Length": str(size),  # else urllib would send it chunked, which a WSGI server reads as empty
                "Authorization": f"Bearer {self.token}",
                "X-FC2-Node": self.node,
                "X-FC2-Checkpoint": checkpoint,
                **({"X-FC2-Step": str(step)} if step is not None else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=max(self.timeout, 60)) as response:
                response.read(64 * 1024)
            self.last_exchange = time.monotonic()
            return None
        except urllib.error.HTTPError as exc:
            self.last_exchange = time.monotonic()
            return f"refused ({exc.code}): {exc.read()[:300].decode(errors='replace')}"
        except (urllib.error.URLError, OSError) as exc:
            return f"not delivered: {exc}"


def encode_multipart(report: dict, files: dict[str, bytes]) -> tuple[bytes, str]:
    """multipart/form-data with the report as field `report` and each file as field `artifact`."""
    boundary = uuid.uuid4().hex
    out = io.BytesIO()
    out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="report"\r\n'.encode())
    out.write(b"Content-Type: application/json\r\n\r\n" + json.dumps(report).encode() + b"\r\n")
    for name, data in files.items():
        safe = name.replace('"', "_").replace("\r", "_").replace("\n", "_")
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="artifact"; filename="{safe}"\r\n'.encode())
        out.write(b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


def parse_progress(line: bytes) -> dict | None:
    """The progress fields of a `FC2_PROGRESS {json}` line, or None for any other line.

    >>> parse_progress(b'FC2_PROGRESS {"epoch": 1, "steps": 60, "loss": 0.5, "other": 1}\\n')
    {'epoch': 1, 'steps': 60, 'loss': 0.5}
    >>> parse_progress(b'FC2_PROGRESS not json') is None, parse_progress(b'FC2_PROGRESS ' + b'[' * 60000) is None
    (True, True)
    """
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        data = json.loads(line[len(PROGRESS_PREFIX) :])
    except (ValueError, RecursionError):  # not JSON, or nested deep enough to exhaust the decoder
        return None
    if not isinstance(data, dict):
        return None
    return {k: data[k] for k in PROGRESS_KEYS if isinstance(data.get(k), int | float) and not isinstance(data[k], bool)}


class Sampler:
    """What the node uses, sampled every `interval` seconds by a thread of its own into a bounded buffer that
    reports drain (`take`) and give back when they could not be delivered (`give_back`): a platform unreachable for
    a while loses no sample until the buffer is full, then the oldest.

    Each sample: `at` (unix time), CPU and memory of the node's process tree (100 % = one core); with
    `own_machine` (the node is a machine of its own: EC2) the whole machine's CPU; GPU utilisation and memory where
    `nvidia-smi` answers; and with `own_network` (the agent runs in the node's own network namespace or machine:
    lab and EC2 nodes) the bytes in and out of the node, its interfaces' counters without loopback. Nodes that share
    the machine's network (the local provider) have no per-node bytes: they are left unknown, never the machine's."""

    def __init__(
        self, pid: int, *, interval: float = 1.0, own_network: bool = False, own_machine: bool = False,
        buffered: int = MAX_BUFFERED_SAMPLES, keep: Path | None = None,
    ):  # fmt: skip
        self.process = psutil.Process(pid) if psutil else None
        self.interval = interval
        self.own_network, self.own_machine = own_network, own_machine
        self.nvidia_smi = shutil.which("nvidia-smi")
        self.buffer: collections.deque[dict] = collections.deque(maxlen=buffered)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self._children: dict[int, psutil.Process] = {}
        self.keep = keep  # a JSON-lines file every sample is also appended to (up to a day's)
        self.kept = 0
        if psutil:
            self.sample()  # cpu_percent measures from its previous call: the first one only sets the mark
            psutil.cpu_percent(None)

    def start(self) -> None:
        threading.Thread(target=self._run, name="fc2-sampler", daemon=True).start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self.stopped.is_set():
            next_at += self.interval
            if (sample := self.sample()) is not None:
                with self.lock:
                    self.buffer.append(sample)
                if self.keep and self.kept < MAX_KEPT_SAMPLES:
                    with self.keep.open("a") as kept:
                        kept.write(json.dumps(sample) + "\n")
                    self.kept += 1
            self.stopped.wait(max(0.0, next_at - time.monotonic()))

    def take(self) -> list[dict]:
        """Every buffered sample, oldest first; the buffer is emptied."""
        with self.lock:
            samples = list(self.buffer)
            self.buffer.clear()
        return samples

    def give_back(self, samples: list[dict]) -> None:
        """Samples a report could not deliver, before the ones taken since (the oldest go when it is full)."""
        with self.lock:
            newer = list(self.buffer)
            self.buffer.clear()
            self.buffer.extend(samples + newer)

    def sample(self) -> dict | None:
        if self.process is None:
            return None
        try:
            # The same Process objects from one sample to the next: cpu_percent measures since its previous call.
            current = {p.pid: p for p in self.process.children(recursive=True)}
            self._children = {pid: self._children.get(pid, p) for pid, p in current.items()}
            # The command itself gone (or a zombie not yet waited for): no sample. A child gone meanwhile: skipped.
            if self.process.status() == psutil.STATUS_ZOMBIE:
                return None
            cpu, memory = self.process.cpu_percent(None), float(self.process.memory_info().rss)
            for p in self._children.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    cpu += p.cpu_percent(None)
                    memory += p.memory_info().rss
        except psutil.Error:
            return None
        sample = {"at": round(time.time(), 3), "cpu_percent": round(cpu, 1), "memory_mb": round(memory / 2**20, 1)}
        if self.own_machine:
            sample["node_cpu_percent"] = round(psutil.cpu_percent(None) * (psutil.cpu_count() or 1), 1)
        if self.own_network:
            counters = psutil.net_io_counters(pernic=True)
            sample["bytes_sent"] = sum(c.bytes_sent for name, c in counters.items() if name != "lo")
            sample["bytes_recv"] = sum(c.bytes_recv for name, c in counters.items() if name != "lo")
        sample.update(self.gpu())
        return sample

    def gpu(self) -> dict:
        """Mean utilisation (%) and total memory used (MB) of the node's GPUs, when nvidia-smi answers (gpu_figures)."""
        if not self.nvidia_smi:
            return {}
        try:
            out = subprocess.run(
                [self.nvidia_smi, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        return gpu_figures(out)


def gpu_figures(out: str) -> dict:
    r"""nvidia-smi's `utilization.gpu,memory.used` lines (one a GPU) -> the mean utilisation (%) and the total memory
    used (MB). A GPU that cannot tell one of them ("[N/A]", "[Not Supported]": a MIG slice's utilisation, say) leaves
    that figure to the others, and with none the figure is left out; the other figure still counts.

    >>> gpu_figures("100, 1523\n50, 77\n")
    {'gpu_percent': 75.0, 'gpu_memory_mb': 1600.0}
    >>> gpu_figures("[N/A], 4120\n")
    {'gpu_memory_mb': 4120.0}
    >>> gpu_figures("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    {}
    """
    utilisation: list[float] = []
    memory: list[float] = []
    for line in out.splitlines():
        fields = line.split(",")
        if len(fields) != 2:
            continue
        for figures, field in zip((utilisation, memory), fields, strict=True):
            with contextlib.suppress(ValueError):
                if 0 <= (value := float(field)) < float("inf"):
                    figures.append(value)
    return ({"gpu_percent": sum(utilisation) / len(utilisation)} if utilisation else {}) | (
        {"gpu_memory_mb": sum(memory)} if memory else {}
    )


MAX_OUTPUT_FILES = 10_000
MAX_OUTPUT_DEPTH = 128  # a deeper folder is not looked into (a path that deep is over 256 characters)
MAX_NOT_KEPT_LISTED = 100  # outputs not kept that a report names one by one; the rest are counted
MAX_LISTED_PATH = 1000  # characters of a not-kept output's path in a report (the platform takes up to 1020)
CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escape_name(name: str) -> str:
    r"""A file name as printable text, whatever bytes it holds: printable characters as they are, a backslash
    doubled, anything else — control characters, invisible ones, bytes that are not UTF-8 (which os.listdir gives as
    surrogates) — as a Python escape. Two names never escape alike.

    >>> escape_name("model.keras"), escape_name("a\nb"), escape_name(os.fsdecode(b"\xff")), escape_name("x\\y")
    ('model.keras', 'a\\nb', '\\xff', 'x\\\\y')
    """
    out = []
    for char in name:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in CONTROL_ESCAPES:
            out.append(CONTROL_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


class Outputs:
    """What a node's output directory holds, as its final report carries it.

    `files` maps each kept output's wire name — its number, "0", "1", …: a name that is safe in a multipart header, in
    a file system and in a URL, whatever the output was called — to its bytes. `listed` describes each kept output
    (`{"file": wire name, "path": its name escaped, "size": bytes, "archive": true for a directory}`), `not_kept` each
    output left behind and why (`{"path", "size", "reason"}`, the first MAX_NOT_KEPT_LISTED), `not_kept_more` how many
    more were left behind. Nothing is ever dropped without a line in one of them."""

    def __init__(self, max_bytes: int):
        self.files: dict[str, bytes] = {}
        self.listed: list[dict] = []
        self.not_kept: list[dict] = []
        self.not_kept_more = 0
        self.room = max_bytes  # bytes the outputs may still take
        self.max_bytes = max_bytes
        self.count = 0  # regular files read (archive members included)
        self.unreadable: str | None = None  # why the output directory itself could not be read: all of it is lost

    def keep(self, path: str, data: bytes, archive: bool = False) -> None:
        wire = str(len(self.files))
        self.files[wire] = data
        self.listed.append({"file": wire, "path": path, "size": len(data), **({"archive": True} if archive else {})})

    def leave(self, path: str, size: int, reason: str) -> None:
        if len(path) > MAX_LISTED_PATH:  # a path deep in folders: its ends say where it was
            path = f"{path[: MAX_LISTED_PATH // 2 - 1]}…{path[-(MAX_LISTED_PATH // 2 - 1) :]}"
        if len(self.not_kept) < MAX_NOT_KEPT_LISTED:
            self.not_kept.append({"path": path, "size": size, "reason": reason})
        else:
            self.not_kept_more += 1
        print(f"fc2-agent: output {path} ({size} bytes) not kept: {reason}", file=sys.stderr, flush=True)

    def report(self) -> dict:
        """The final report's fields that say what became of the outputs."""
        fields = {"outputs": self.listed, "not_kept": self.not_kept}
        return {**fields, "not_kept_more": self.not_kept_more} if self.not_kept_more else fields

    def over_limit(self) -> str:
        return f"over the {self.max_bytes / 2**20:g} MB limit on a node's outputs (FC2_MAX_ARTIFACT_MB)"


def collect_outputs(output_dir: Path, max_bytes: int) -> Outputs:
    """Files the node left in its output directory; sub-directories (e.g. a SavedModel) are zipped.

    Any name Linux allows is kept (escape_name: the report carries it, the files cross under their numbers). An output
    that does not fit in what is left of `max_bytes` is left behind and said so, and the next ones still count.

    Only regular files count, never reached through a symbolic link at any level: every entry is opened relative to
    its directory's descriptor with O_NOFOLLOW and judged by what was opened (fstat), not by a path looked up again.
    The command that wrote the directory may have planted links to files it cannot read itself, hoping the agent
    would upload them — and while the agent collects, another node of the cluster may still be running and swap a
    directory it has already listed for a link. At most MAX_OUTPUT_FILES files, MAX_OUTPUT_DEPTH levels deep.
    Whatever is not kept — a link, a FIFO, a socket, a device, a folder deeper than that, a file that cannot be read —
    is listed as not kept, with why (`not_kept`): nothing is skipped without a line.
    """
    outputs = Outputs(max_bytes)
    try:
        top = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return outputs  # nothing was written (a command on a cloud node makes the directory if it writes)
    except OSError as error:  # a link, not a directory, not ours to read: what the command wrote there is lost
        outputs.unreadable = f"the output directory {output_dir} cannot be read ({error.strerror})"
        return outputs
    try:
        for path, fd, mode in _entries(top, "", outputs.leave):
            if stat.S_ISDIR(mode):
                _collect_tree(outputs, fd, path)
                continue
            size = os.fstat(fd).st_size
            if outputs.count >= MAX_OUTPUT_FILES:
                outputs.leave(path, size, f"over the {MAX_OUTPUT_FILES} files limit on a node's outputs")
                continue
            try:
                data = _read(fd, outputs.room) if size <= outputs.room else None
            except OSError as error:
                outputs.leave(path, size, f"cannot be read ({error.strerror})")
                continue
            if data is None:
                outputs.leave(path, max(size, os.fstat(fd).st_size), outputs.over_limit())
            else:
                outputs.count += 1
                outputs.room -= len(data)
                outputs.keep(path, data)
    finally:
        os.close(top)
    return outputs


def _collect_tree(outputs: Outputs, fd: int, path: str) -> None:
    """Keep the directory open at `fd` as one zip archive, or leave it whole when it does not fit. What the archive
    leaves out (a link, a FIFO, a folder too deep) is listed once the archive is kept."""
    buffer = io.BytesIO()
    room, count = outputs.room, outputs.count
    left_out: list[tuple[str, int, str]] = []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, member_fd in _tree_files(fd, path, 1, lambda *line: left_out.append(line)):
            count += 1
            if count > MAX_OUTPUT_FILES:
                outputs.leave(
                    f"{path}/", _tree_size(fd), f"over the {MAX_OUTPUT_FILES} files limit on a node's outputs"
                )
                return
            if (data := _read(member_fd, room)) is None:
                outputs.leave(f"{path}/", _tree_size(fd), outputs.over_limit())
                return
            room -= len(data)
            archive.writestr(member, data)
    outputs.room, outputs.count = room, count
    outputs.keep(path, buffer.getvalue(), archive=True)
    for line in left_out:
        outputs.leave(*line)


def _read(fd: int, room: int) -> bytes | None:
    """The bytes of the regular file open at `fd`, or None if it holds more than `room` (it grew since fstat)."""
    chunks = []
    while chunk := os.read(fd, min(2**20, room + 1)):
        chunks.append(chunk)
        room -= len(chunk)
        if room < 0:
            return None
    return b"".join(chunks)


# What an entry that is neither a regular file nor a directory is, as a reason for not keeping it.
NOT_A_FILE = (
    (stat.S_ISLNK, "a symbolic link: links are not followed"),
    (stat.S_ISFIFO, "a named pipe (FIFO), not a file"),
    (stat.S_ISSOCK, "a socket, not a file"),
    (stat.S_ISCHR, "a device, not a file"),
    (stat.S_ISBLK, "a device, not a file"),
)


Leave = Callable[[str, int, str], None]  # told what is left out of the outputs: its path, its size and why


def _entries(dir_fd: int, prefix: str, leave: Leave) -> Iterator[tuple[str, int, int]]:
    """(path under the output directory, descriptor, mode) of each regular file and directory in the directory open
    at `dir_fd`; the descriptor is closed once the caller moves on. Anything else is not opened at all (a FIFO would
    block, a device answer): it is told to `leave(path, size, reason)`.
    An entry swapped for a link between the look and the open fails to open (O_NOFOLLOW): left out too."""
    for name in sorted(os.listdir(dir_fd)):
        path = f"{prefix}/{escape_name(name)}" if prefix else escape_name(name)
        try:
            seen = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            kind = next((why for test, why in NOT_A_FILE if test(seen.st_mode)), None)
            if kind is None and not (stat.S_ISREG(seen.st_mode) or stat.S_ISDIR(seen.st_mode)):
                kind = "not a regular file"
            if kind is not None:
                leave(path, 0 if stat.S_ISLNK(seen.st_mode) else seen.st_size, kind)
                continue
            fd = _open_entry(dir_fd, name)
        except OSError as error:
            leave(path, 0, f"cannot be read ({error.strerror})")
            continue
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                yield path, fd, mode
            else:
                leave(path, 0, "changed while it was read")
        finally:
            os.close(fd)


def _open_entry(dir_fd: int, name: str) -> int:
    """An entry of the directory open at `dir_fd`, opened without following a link (ELOOP) nor blocking (a FIFO)."""
    return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)


def _tree_files(dir_fd: int, prefix: str, depth: int, leave: Leave) -> Iterator[tuple[str, int]]:
    """(path under the output directory, open descriptor) of the regular files under the directory open at `dir_fd`
    (each descriptor is closed once the caller moves on); a member's name is its path with each part escaped
    (escape_name), so any name fits in the archive. What is not a file, and a folder deeper than MAX_OUTPUT_DEPTH, is
    told to `leave`."""
    for path, fd, mode in _entries(dir_fd, prefix, leave):
        if stat.S_ISREG(mode):
            yield path, fd
        elif depth < MAX_OUTPUT_DEPTH:
            yield from _tree_files(fd, path, depth + 1, leave)
        else:
            leave(f"{path}/", 0, f"a folder deeper than {MAX_OUTPUT_DEPTH} levels: not looked into")


def _tree_size(dir_fd: int, depth: int = 1) -> int:
    """Bytes of the regular files under the directory open at `dir_fd`, as _tree_files would read them."""
    total = 0
    for _path, fd, mode in _entries(dir_fd, "", lambda *left: None):  # measuring, not collecting: nothing is left
        if stat.S_ISREG(mode):
            total += os.fstat(fd).st_size
        elif depth < MAX_OUTPUT_DEPTH:
            total += _tree_size(fd, depth + 1)
    return total


def out_of_memory(cgroup: Path) -> str | None:
    """Why the command was killed, if the memory cgroup `cgroup` (v1 or v2; the cluster's, shared by its nodes) had
    the OOM killer kill a process; None otherwise."""
    for events, limit_file in (("memory.oom_control", "memory.limit_in_bytes"), ("memory.events", "memory.max")):
        try:
            counters = dict(line.split() for line in (cgroup / events).read_text().splitlines() if line.strip())
            if int(counters.get("oom_kill", 0)) == 0:
                return None
            limit = (cgroup / limit_file).read_text().strip()
        except (OSError, ValueError):
            continue
        size = f"{int(limit) // 2**20} MB" if limit.isdigit() else limit
        return f"killed: out of memory (cluster limit {size})"
    return None


def keep_result(result_dir: Path, report: dict, files: dict[str, bytes]) -> None:
    """Write the final report and its files where the platform can fetch them if the report never arrives: the
    files first, under their wire names (Outputs), the report last (renamed into place), so a report on disk always
    has all its files — and says which they are (`outputs`): nothing on the node is ever listed to find them."""
    files_dir = result_dir / "files"
    files_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (files_dir / name).write_bytes(data)
    partial = result_dir / "report.json.partial"
    partial.write_text(json.dumps(report))
    partial.replace(result_dir / "report.json")


# ---- checkpoints, interruption notices, the orphan watchdog (issue 45) --------------------------------------------

CHECKPOINT_INDEX = (
    "checkpoint"  # the index file TensorFlow writes (renames into place) last, once a checkpoint is whole
)
CHECKPOINT_NOW = "CHECKPOINT_NOW"  # the agent's request to the command: checkpoint at once (then delete this file)
NOTICE_FILE = "spot-instance-action"  # in the node's directory: an interruption notice raised through the agent
MAX_CHECKPOINT_FILES = 1000  # members of one checkpoint archive
MAX_INDEX_BYTES = 64 * 1024
CHECKPOINT_PATH = re.compile(r'^model_checkpoint_path: "([^"/\\]+)"$', re.MULTILINE)


class ArchiveError(ValueError):
    """A checkpoint archive that cannot be taken as it is; the message says why."""


# What reading a corrupt, truncated or non-gzip archive raises.
UNREADABLE_ARCHIVE = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


def archive_members(archive: tarfile.TarFile, max_bytes: int) -> list[tarfile.TarInfo]:
    """The members of a checkpoint archive, each checked before anything is written: regular files and folders only
    (no link, device or FIFO), relative paths that stay inside (no absolute path, no `..`, no empty or NUL name), at
    most MAX_CHECKPOINT_FILES of them holding at most `max_bytes` together. The platform checks what a node sends
    with it, and a node what it is given to restore; ArchiveError says what is wrong. A corrupt or truncated archive
    is an ArchiveError too."""
    members: list[tarfile.TarInfo] = []
    total = 0
    try:
        for member in archive:
            name = member.name
            if len(members) >= MAX_CHECKPOINT_FILES:
                raise ArchiveError(f"more than {MAX_CHECKPOINT_FILES} members")
            if not (member.isfile() or member.isdir()):
                raise ArchiveError(f"{name!r} is not a regular file or a folder")
            parts = name.split("/")
            if not name or "\0" in name or name.startswith("/") or ".." in parts or len(name) > 1000:
                raise ArchiveError(f"{name!r} is not a relative path inside the archive")
            if posixpath.normpath(name) in ("", "."):
                raise ArchiveError(f"{name!r} names no file")
            total += member.size
            if total > max_bytes:
                raise ArchiveError(f"its files hold more than {max_bytes / 2**20:g} MB")
            members.append(member)
    except UNREADABLE_ARCHIVE as error:
        raise ArchiveError(f"not a readable tar.gz archive ({error})") from error
    if not any(member.isfile() for member in members):
        raise ArchiveError("it holds no file")
    return members


def unpack(archive_path: Path, target: Path, max_bytes: int) -> None:
    """Unpack the checkpoint archive at `archive_path` into `target`, made afresh: a link or anything else already
    there is removed first, never followed. Each member is checked first (archive_members) and written relative to
    the descriptor of its folder (O_NOFOLLOW, O_EXCL): nothing is written outside `target`."""
    with contextlib.suppress(FileNotFoundError):
        if target.is_symlink() or not target.is_dir():
            target.unlink()
        else:
            shutil.rmtree(target)  # fd-based: it does not follow links inside
    target.mkdir(mode=0o700)
    top = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        with tarfile.open(archive_path, "r:gz") as archive:
            members = archive_members(archive, max_bytes)
            for member in members:
                *folders, leaf = posixpath.normpath(member.name).split("/")
                fd = os.dup(top)
                try:
                    for folder in folders + ([leaf] if member.isdir() else []):
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(folder, 0o755, dir_fd=fd)
                        inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                        os.close(fd)
                        fd = inner
                    if member.isfile():
                        source = archive.extractfile(member)
                        assert source is not None  # a regular member always has its data
                        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                        out = os.open(leaf, flags, 0o644, dir_fd=fd)
                        with os.fdopen(out, "wb") as written:
                            shutil.copyfileobj(source, written, 2**20)
                finally:
                    os.close(fd)
    except UNREADABLE_ARCHIVE as error:
        raise ArchiveError(f"not a readable tar.gz archive ({error})") from error
    finally:
        os.chmod(top, 0o755)  # readable by the command (another uid in the sandbox) once whole
        os.close(top)


def own_like_parent(directory: Path) -> None:
    """Make `directory` (a folder in the command's working directory) if it is not there, owned as its parent is (the
    sandbox's uid): the command writes its checkpoints there. Something already there is left as it is."""
    try:
        directory.mkdir(mode=0o755)
    except FileExistsError:
        return
    parent = directory.parent.stat()
    # Through a descriptor opened without following a link: the folder cannot be swapped for one in between.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, parent.st_uid, parent.st_gid)
    finally:
        os.close(fd)


def ask_for_checkpoint(directory: Path) -> bool:
    """Create CHECKPOINT_NOW in the command's checkpoint directory (never through a link); whether it is there."""
    try:
        top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        # Never through a link, nor blocking on a FIFO the command may have put there.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        os.close(os.open(CHECKPOINT_NOW, flags, 0o666, dir_fd=top))
        return True
    except OSError:
        return False
    finally:
        os.close(top)


class Checkpoint:
    """A complete checkpoint in the command's checkpoint directory, as shipped: its name and its files packed (tar.gz)
    into a temporary file as they are read — one at a time, never whole in memory, and without following links (the
    command that wrote them may be hostile). With an index (the file `checkpoint`, which TensorFlow writes last, and
    PyTorch code itself once its `<name>.*` files are whole: examples/digits_torch) the name is the one it names
    (e.g. `ckpt-88`), the files are `<name>.*`, and an index of this checkpoint alone goes with them; without one,
    the name is the file written last and every file goes. `written_at`: when its newest file was written (the
    node's clock)."""

    def __init__(self, name: str, archive: IO[bytes] | None = None, over: str = "", written_at: float = 0.0):
        self.name, self.archive = name, archive
        self.over = over  # why it is not shipped (over the size limit); then nothing is packed
        self.written_at = written_at
        self.members: list[str] = []  # the paths packed

    @property
    def size(self) -> int:
        return self.archive.seek(0, os.SEEK_END) if self.archive else 0

    def close(self) -> None:
        if self.archive:
            self.archive.close()

    @classmethod
    def pack(cls, name: str, files: Iterator[tuple[str, int]], max_bytes: int, own_index: bytes = b"") -> Checkpoint:
        """`files` (path in the archive, open descriptor of a regular file) packed, then `own_index` as the archive's
        CHECKPOINT_INDEX when given; over `max_bytes` or MAX_CHECKPOINT_FILES, nothing packed and why not. An OSError
        when a file shrank while it was read."""
        packed_file = tempfile.TemporaryFile()  # noqa: SIM115 - handed over with the checkpoint, or closed below
        found = cls(name)
        try:
            room = max_bytes
            # Level 1: weights hardly compress, and the packing must not take the training's CPU.
            with tarfile.open(fileobj=packed_file, mode="w:gz", compresslevel=1) as packed:
                for path, fd in files:
                    seen = os.fstat(fd)
                    if len(found.members) >= MAX_CHECKPOINT_FILES:
                        return cls(name, over=f"more than {MAX_CHECKPOINT_FILES} files")
                    if seen.st_size > room:
                        return cls(name, over=f"over the {max_bytes / 2**20:g} MB limit (FC2_CHECKPOINT_MAX_MB)")
                    room -= seen.st_size
                    with os.fdopen(os.dup(fd), "rb") as source:
                        packed.addfile(_member(path, seen.st_size), source)  # exactly `size` bytes, or an OSError
                    found.members.append(path)
                    found.written_at = max(found.written_at, seen.st_mtime)
                if own_index:
                    packed.addfile(_member(CHECKPOINT_INDEX, len(own_index)), io.BytesIO(own_index))
            found.archive = packed_file
            return found
        finally:
            if found.archive is None:
                packed_file.close()

    @classmethod
    def read(cls, directory: Path, max_bytes: int, known: str = "") -> Checkpoint | None:
        """The checkpoint the directory's index names, packed (or, over `max_bytes`, why not); None while
        there is none, while it changes (read again later), and when it is the one named `known` (its files are not
        read again)."""
        try:
            top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            index = _read_index(top)
            match = CHECKPOINT_PATH.search(index or "")
            if match is None or match.group(1) == known:
                return None
            name = match.group(1)
            files = (
                (path, fd)
                for path, fd, mode in _entries(top, "", lambda *left: None)
                if stat.S_ISREG(mode) and path.startswith(f"{name}.")
            )
            # What TensorFlow's latest_checkpoint reads: this checkpoint alone, by a relative path.
            own = f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n'.encode()
            found = cls.pack(name, files, max_bytes, own)
            if not found.over and (not found.members or _read_index(top) != index):
                found.close()
                return None  # written meanwhile: the next look finds it whole
            return found
        except (OSError, tarfile.TarError):
            return None
        finally:
            os.close(top)

    @classmethod
    def read_tree(cls, directory: Path, max_bytes: int, state: TreeState) -> Checkpoint | None:
        """Every file of a checkpoint directory without an index (the agent's CHECKPOINT_NOW aside),
        packed, named after the file written last, when it is still as `state` saw it; None when it changed
        meanwhile (read again later)."""
        try:
            top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            files = ((path, fd) for path, fd in _tree_files(top, "", 1, lambda *left: None) if path != CHECKPOINT_NOW)
            found = cls.pack(state.newest, files, max_bytes)
            if tree_state(directory) != state:
                found.close()
                return None
            return found
        except (OSError, tarfile.TarError):
            return None
        finally:
            os.close(top)


def _member(path: str, size: int) -> tarfile.TarInfo:
    member = tarfile.TarInfo(path)
    member.size, member.mode, member.mtime = size, 0o644, int(time.time())
    return member


def _has_index(directory: Path) -> bool:
    """Whether the directory holds an index, CHECKPOINT_INDEX (a regular file, never a link's target)."""
    try:
        return stat.S_ISREG(os.lstat(directory / CHECKPOINT_INDEX).st_mode)
    except OSError:
        return False


def _read_index(dir_fd: int) -> str | None:
    try:
        fd = _open_entry(dir_fd, CHECKPOINT_INDEX)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read(fd, MAX_INDEX_BYTES)
        return None if data is None else data.decode(errors="replace")
    finally:
        os.close(fd)


# A file a writer has not finished: `torch.save(obj, "ckpt.pt.tmp"); os.replace(...)`'s, a download's `.partial`,
# TensorFlow's `*.tempstate<n>` and the `<prefix>_temp` folder of a sharded save.
TEMPORARY = re.compile(r"\.(tmp|partial)$|tempstate|_temp$")
QUIET_S = 2.0  # a checkpoint directory without an index is shipped once no file changed for this long


@dataclasses.dataclass(frozen=True)
class TreeState:
    """What a checkpoint directory holds, the agent's CHECKPOINT_NOW aside: each regular file's (path, size, mtime),
    the file written last, and whether any file or folder is a temporary one (TEMPORARY)."""

    files: tuple[tuple[str, int, int], ...] = ()
    newest: str = ""
    temporary: bool = False


def tree_state(directory: Path) -> TreeState:
    """The state of the checkpoint directory now (empty when it cannot be read), without following links."""
    try:
        top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return TreeState()
    files: list[tuple[str, int, int]] = []
    newest, temporary = (0, ""), False
    try:
        for path, fd in _tree_files(top, "", 1, lambda *left: None):
            if path == CHECKPOINT_NOW:
                continue
            if len(files) > MAX_CHECKPOINT_FILES:  # enough to say it is too many (Checkpoint.pack)
                break
            seen = os.fstat(fd)
            files.append((path, seen.st_size, seen.st_mtime_ns))
            newest = max(newest, (seen.st_mtime_ns, path))
            temporary = temporary or any(TEMPORARY.search(part) for part in path.split("/"))
    except OSError:
        return TreeState()
    finally:
        os.close(top)
    return TreeState(tuple(files), newest[1], temporary)


class Shipper:
    """The chief's checkpoints, shipped as they come: every `interval` seconds a look at the checkpoint directory. A
    checkpoint with an index (the file `checkpoint`, which TensorFlow renames into place last) is whole once the
    index names it; any other framework's (a directory without one: torch.save's files, Keras's BackupAndRestore
    folder, a plain file) once its content has changed and then stayed as it is for QUIET_S, holding no temporary
    file (TEMPORARY). A checkpoint not shipped yet is packed and sent (once: the next one supersedes it). One over
    the size limit is not shipped, and said so in the next report (`checkpoint_skipped`). With `step_at`
    (NodeRun.step_at), each carries the step it was saved at: that of the last progress line read by the time of its
    newest file."""

    def __init__(
        self, reporter: Reporter, directory: Path, max_bytes: int, interval: float = 1.0,
        step_at: Callable[[float], int | None] | None = None,
    ):  # fmt: skip
        self.reporter, self.directory, self.max_bytes, self.interval = reporter, directory, max_bytes, interval
        self.step_at = step_at
        self.last = ""  # the last checkpoint an index named, shipped or given up on
        self.seen = TreeState()  # the directory without an index as the last look saw it
        self.seen_since = time.monotonic()  # since when it has been so
        self.shipped = TreeState()  # the last such checkpoint shipped or given up on
        self.skipped: collections.deque[dict] = collections.deque(maxlen=20)
        self.lock = threading.Lock()
        self.looking = threading.Lock()
        self.stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="fc2-checkpoints", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.look()

    def look(self, final: bool = False) -> None:
        """Ship the newest checkpoint if it is new (one look at a time: the last one, at the end, waits for the
        thread's). `final`: the command has exited, so a directory without an index is as quiet as it will be."""
        with self.looking:
            found = self._indexed() if _has_index(self.directory) else self._quiet(final)
            if found is not None:
                self._ship(found)

    def _indexed(self) -> Checkpoint | None:
        found = Checkpoint.read(self.directory, self.max_bytes, known=self.last)
        if found is not None:
            self.last = found.name
        return found

    def _quiet(self, final: bool) -> Checkpoint | None:
        now, state = time.monotonic(), tree_state(self.directory)
        if changed := state != self.seen:
            self.seen, self.seen_since = state, now
        quiet = final or (not changed and now - self.seen_since >= QUIET_S)
        if not quiet or not state.files or state.temporary or state == self.shipped:
            return None
        found = Checkpoint.read_tree(self.directory, self.max_bytes, state)
        if found is not None:
            self.shipped = state
        return found

    def _ship(self, found: Checkpoint) -> None:
        name = found.name
        try:
            if found.over or found.archive is None:
                self.skip(name, found.over)
                return
            if (size := found.size) > self.max_bytes:
                self.skip(name, f"packed, over the {self.max_bytes / 2**20:g} MB limit (FC2_CHECKPOINT_MAX_MB)")
                return
            step = self.step_at(found.written_at) if self.step_at and found.written_at else None
            if (why := self.reporter.ship(found.archive, size, name, step)) is not None:
                self.skip(name, why)
            else:
                at = f", step {step}" if step is not None else ""
                print(f"fc2-agent: checkpoint {name} shipped ({size} bytes{at})", file=sys.stderr, flush=True)
        finally:
            found.close()

    def skip(self, name: str, reason: str) -> None:
        print(f"fc2-agent: checkpoint {name} not shipped: {reason}", file=sys.stderr, flush=True)
        with self.lock:
            self.skipped.append({"checkpoint": name, "reason": reason})

    def take_skipped(self) -> list[dict]:
        with self.lock:
            skipped = list(self.skipped)
            self.skipped.clear()
        return skipped


def read_notice(text: str) -> dict | None:
    """An interruption notice (EC2's `spot/instance-action` JSON, `{"action": ..., "time": ...}`) as the report carries
    it, or None when the text is not one.

    >>> read_notice('{"action": "terminate", "time": "2026-11-29T04:22:00Z"}')
    {'at': '2026-11-29T04:22:00Z', 'action': 'terminate'}
    >>> read_notice("<html>404 - Not Found</html>") is None, read_notice('{"action": 7}') is None
    (True, True)
    """
    try:
        notice = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(notice, dict) or not isinstance(notice.get("action"), str):
        return None
    at = notice.get("time")
    return {"at": str(at)[:40] if at else "", "action": notice["action"][:40]}


IMDS_TOKEN_TTL_S = 6 * 3600  # the session token's life the agent asks for: IMDSv2's longest
IMDS_TOKEN_EARLY_S = 60  # a token is renewed this long before it expires (capped at a tenth of its life)


class Metadata:
    """The instance metadata service, IMDSv2: a session token asked for once (`PUT <base>/api/token` with its TTL in
    X-aws-ec2-metadata-token-ttl-seconds) and sent with every read (X-aws-ec2-metadata-token) until a little before
    it expires, or until the service refuses it (401: a token it no longer knows), when a new one is asked for.
    Stdlib only, as the whole agent."""

    def __init__(self, base: str, ttl_s: int = IMDS_TOKEN_TTL_S, timeout: float = 2.0):
        self.base, self.ttl_s, self.timeout = base.rstrip("/"), ttl_s, timeout
        self.token = ""
        self.renew_at = 0.0  # time.monotonic() from which the token is asked for again

    def get(self, path: str) -> str | None:
        """The text at `meta-data/<path>`; None when there is none (404: on `spot/instance-action`, no notice).
        OSError (urllib's errors among them) when the service cannot be reached or refuses."""
        try:
            return self._get(path)
        except urllib.error.HTTPError as error:
            if error.code != 401:
                raise
        self.token = ""  # refused: expired, or revoked early (the service restarted): a new one, once
        return self._get(path)

    def _get(self, path: str) -> str | None:
        request = urllib.request.Request(
            f"{self.base}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token()}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read(MAX_INDEX_BYTES).decode(errors="replace")
        except urllib.error.HTTPError as error:
            error.close()  # its body is not read
            if error.code == 404:
                return None
            raise

    def _token(self) -> str:
        if not self.token or time.monotonic() >= self.renew_at:
            asked_at = time.monotonic()
            request = urllib.request.Request(
                f"{self.base}/api/token", method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.ttl_s)},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                self.token = response.read(4096).decode(errors="replace").strip()
            self.renew_at = asked_at + self.ttl_s - min(IMDS_TOKEN_EARLY_S, self.ttl_s / 10)
        return self.token


class Notices:
    """Interruption notices: the node's notice file (any node) and, on an aws spot node, the instance metadata's
    `spot/instance-action` (IMDSv2, Metadata: its session token kept for its life), looked at every `interval`
    seconds. A notice new to the agent asks the command for a checkpoint (CHECKPOINT_NOW) and is reported once; a
    newer notice of the job, named in the platform's answer to a report (another node's), asks for one too."""

    def __init__(
        self, notice_file: Path, checkpoints: Path | None, metadata: str = "", interval: float = 2.0,
        wake: threading.Event | None = None,
    ):  # fmt: skip
        self.notice_file, self.checkpoints, self.interval = notice_file, checkpoints, interval
        self.metadata = Metadata(metadata) if metadata else None  # its session token kept between looks
        self.seen: dict | None = None
        self.to_report: dict | None = None
        self.acted_on = ""  # the job's latest notice the command was asked to checkpoint for (its `at`)
        self.stopped = threading.Event()
        # Set on a new notice: the report loop waits on it, so that the notice is reported now, not at the next
        # interval — the chief, whichever node got it, learns of it from the answer to its own next report.
        self.wake = wake

    def start(self) -> None:
        threading.Thread(target=self._run, name="fc2-notices", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            notice = self._from_file() or self._from_metadata()
            if notice is not None and notice != self.seen:
                self.seen = self.to_report = notice
                self.act(notice["at"] or "now")
                if self.wake is not None:
                    self.wake.set()

    def act(self, at: str) -> None:
        """Ask the command for a checkpoint, once for the notice of time `at`."""
        if at == self.acted_on:
            return
        self.acted_on = at
        if self.checkpoints is not None and ask_for_checkpoint(self.checkpoints):
            print(f"fc2-agent: interruption notice ({at}): checkpoint asked for", file=sys.stderr, flush=True)

    def _from_file(self) -> dict | None:
        try:
            fd = os.open(self.notice_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            data = _read(fd, MAX_INDEX_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)
        return read_notice(data.decode(errors="replace")) if data else None

    def _from_metadata(self) -> dict | None:
        if self.metadata is None:
            return None
        try:
            text = self.metadata.get("spot/instance-action")
        except (OSError, ValueError):  # urllib's errors are OSErrors
            return None  # no metadata service, or one refusing: nothing to act on
        return None if text is None else read_notice(text)

    def take(self) -> dict | None:
        notice, self.to_report = self.to_report, None
        return notice


# How the agent stops its own machine (--self-stop), per provider (provisioner/registry.py, Provider.self_stop).
SELF_STOPS = ("shutdown", "netns", "processes")


class Watchdog:
    """Counts the platform's silence from the reporter's last exchange; past `limit_s` stops the node's own machine
    (`stop`), once. A platform that answers anything — a report taken, refused, or a job over (409) — is there."""

    def __init__(self, reporter: Reporter, limit_s: float, stop: Callable[[], None], interval: float = 1.0):
        self.reporter, self.limit_s, self.stop, self.interval = reporter, limit_s, stop, interval
        self.stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="fc2-watchdog", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            silent = time.monotonic() - self.reporter.last_exchange
            if silent > self.limit_s:
                print(f"fc2-agent: the platform silent for {silent:.0f} s: stopping this node", file=sys.stderr,
                      flush=True)  # fmt: skip
                self.stop()
                return


def self_stop(action: str, netns: str, disk: Path, end_command: Callable[[], None]) -> None:
    """Stop this node's machine as its provider does: `shutdown` halts it (an EC2 instance launched with
    InstanceInitiatedShutdownBehavior=terminate is then terminated; sudo where the agent is not root), `netns`
    removes the lab host it runs in (`disk`: its disk's mount point), `processes` ends its command (the local
    provider: the node is its processes)."""
    if action == "shutdown" and (emulated := own_netns()) is not None:
        # An instance that is a network namespace of a machine others share (the aws tests' hosts, harness/ec2lab.py):
        # halting would halt them all. It ends as such a host does, as a lab host.
        action, netns = "netns", emulated
    if action == "shutdown":
        halt = ["shutdown", "-h", "now"]
        subprocess.run(halt if os.geteuid() == 0 else ["sudo", "-n", *halt], check=False)
    elif action == "netns" and netns:
        # A script in a session of its own: it leaves the host's cgroups (for its root ones), kills every process of
        # the namespace but itself (the agent among them), then takes the host's cgroups, its disk's mount and the
        # namespace, whose end takes its link with it. What is left of the cluster is the platform's (its bridge,
        # its relay, its directory).
        script = (
            'ns=$1; disk=$2; for procs in /sys/fs/cgroup/*/cgroup.procs; do echo $$ > "$procs"; done 2>/dev/null; '
            'for round in 1 2 3 4 5 6 7 8 9 10; do left=0; for pid in $(ip netns pids "$ns"); do '
            '[ "$pid" = $$ ] || { kill -9 "$pid" 2>/dev/null; left=1; }; done; [ $left = 0 ] && break; sleep 0.2; '
            'done; umount -l "$disk"; for g in /sys/fs/cgroup/*/*/"$ns" /sys/fs/cgroup/*/"$ns"; do '
            '[ -d "$g" ] && rmdir "$g"; done; ip netns delete "$ns"'
        )
        with open("self-stop.log", "ab") as log:  # the node's directory: what the script said, if it failed
            subprocess.Popen(
                ["sh", "-c", script, "sh", netns, str(disk)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        time.sleep(60)  # the script ends this process
    end_command()


def own_netns() -> str | None:
    """The name of the network namespace the agent runs in when it is one of those named under /run/netns (a host
    emulated on a machine others share, such as a lab host); None on a machine of its own, whose network is not one
    of them (pid 1's may be out of reach, even to root, in a container: the names are what tell)."""
    try:
        mine = os.stat("/proc/self/ns/net").st_ino
        entries = list(os.scandir("/run/netns"))
    except OSError:
        return None
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.stat().st_ino == mine:
                return entry.name
    return None


class NodeRun:
    """The node's command, its log and its latest progress."""

    def __init__(
        self, command: list[str], log_path: Path, env: dict[str, str], cwd: Path | None, max_log_bytes: int = 2**60
    ):
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed by the reader thread when the command ends
        self.log_room = max_log_bytes  # what the log may still take of the disk: the command's output is unbounded
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.progress: dict = {}
        self.progress_log: collections.deque[dict] = collections.deque(maxlen=MAX_PROGRESS_LOG)
        self.steps: collections.deque[tuple[float, int]] = collections.deque(maxlen=MAX_STEP_HISTORY)
        self.progress_lock = threading.Lock()
        self.progress_changed = threading.Event()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        output = self.process.stdout
        assert output is not None  # Popen(stdout=PIPE) always has one
        with self.log:
            while line := output.readline(MAX_LINE_BYTES):
                if self.log_room > 0:
                    self.log.write(line[: self.log_room])
                    self.log_room -= len(line)
                    if self.log_room <= 0:
                        self.log.write(b"\nfc2-agent: log limit reached, the rest of the output is not kept\n")
                    self.log.flush()
                self.tail.append(line[:LOG_TAIL_LINE_CHARS].decode(errors="replace").rstrip("\n"))
                progress = parse_progress(line)
                if progress:
                    read_at = time.time()
                    with self.progress_lock:
                        self.progress.update(progress)
                        self.progress_log.append({**progress, "at": round(read_at, 3)})
                        if isinstance(step := progress.get("step"), int):
                            self.steps.append((read_at, step))
                    self.progress_changed.set()

    def take_progress_log(self) -> list[dict]:
        """The progress lines read since the last call (each with `at`, when it was read), oldest first."""
        with self.progress_lock:
            lines = list(self.progress_log)
            self.progress_log.clear()
        return lines

    def step_at(self, when: float) -> int | None:
        """The step of the last progress line read at or before `when` (a time.time(), such as a checkpoint's files'
        time): the step a checkpoint written then was saved at — or, for code that prints a step after saving it, at
        most a progress interval before. None when no line that old is remembered."""
        with self.progress_lock:
            steps = list(self.steps)
        before = bisect.bisect_right(steps, (when, math.inf))  # read in order: sorted by when they were read
        return steps[before - 1][1] if before else None

    def log_tail(self) -> str:
        return "\n".join(self.tail)


# How a node's failure report begins when the dataset could not be fetched: the platform marks the dataset by it.
DATASET_FETCH_FAILED = "cannot download the dataset"


def fetch_dataset(args: argparse.Namespace) -> str | None:
    """Download the job's dataset URL (public addresses only, see safe_fetch.py); an error message on failure."""
    if not args.fetch or args.fetch_to.exists():
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import safe_fetch  # type: ignore[import-not-found]  # beside the agent on every node; checked as monitor.safe_fetch

    args.fetch_to.parent.mkdir(parents=True, exist_ok=True)
    try:
        safe_fetch.fetch(args.fetch, args.fetch_to, args.fetch_max_mb * 2**20, allowed_networks=tuple(args.fetch_allow))
    except safe_fetch.FetchError as exc:
        return f"{DATASET_FETCH_FAILED} {args.fetch}: {exc}"
    args.fetch_to.chmod(0o644)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="platform base URL (empty: report to nobody)")
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--node", required=True, help="node name, e.g. chief-0")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding the job's report token")
    parser.add_argument("--deadline", type=float, help="unix time the job may live until (default: 6 h from now)")
    parser.add_argument("--log", required=True, type=Path, help="where the command's output goes")
    parser.add_argument("--output", required=True, type=Path, help="directory whose files become artifacts")
    parser.add_argument("--result", required=True, type=Path, help="where the final report is kept until delivered")
    parser.add_argument("--cwd", type=Path, help="working directory of the command")
    parser.add_argument("--env-file", type=Path, help="JSON object: the command's whole environment (default: ours)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between reports")
    parser.add_argument("--sample-interval", type=float, default=1.0, help="seconds between resource samples")
    parser.add_argument(
        "--own-network", action="store_true", help="the node's network is its own: report its bytes in and out"
    )
    parser.add_argument("--own-machine", action="store_true", help="the node is a machine: report its whole CPU")
    parser.add_argument("--keep-samples", type=Path, help="also append every resource sample to this JSON-lines file")
    parser.add_argument("--max-artifact-mb", type=int, default=200)
    parser.add_argument("--max-log-mb", type=int, default=16, help="node log size past which output is dropped")
    parser.add_argument("--memory-cgroup", type=Path, help="the command's memory cgroup (to tell an OOM kill)")
    parser.add_argument("--fetch", help="dataset URL to download before starting the command")
    parser.add_argument("--fetch-to", type=Path, help="where the downloaded dataset goes")
    parser.add_argument("--fetch-max-mb", type=int, default=500)
    parser.add_argument("--fetch-allow", action="append", default=[], help="private network (CIDR) to allow")
    parser.add_argument("--checkpoints", type=Path, help="the command's checkpoint directory (FC2_CHECKPOINT_DIR)")
    parser.add_argument("--ship-checkpoints", action="store_true", help="ship its checkpoints (the chief)")
    parser.add_argument("--checkpoint-max-mb", type=int, default=200, help="the largest checkpoint shipped or restored")
    parser.add_argument("--restore", type=Path, help="checkpoint archive to unpack before the command starts")
    parser.add_argument("--restore-to", type=Path, help="where to unpack it (FC2_RESTORE_FROM)")
    parser.add_argument("--orphan-s", type=float, default=0, help="stop the node after this long without the platform")
    parser.add_argument("--self-stop", choices=SELF_STOPS, help="how the node stops itself (its provider's way)")
    parser.add_argument("--netns", default="", help="the lab host's network namespace (--self-stop netns)")
    parser.add_argument("--spot-metadata", default="", help="instance metadata base URL to poll for a spot notice")
    parser.add_argument("--notice-file", type=Path, default=Path(NOTICE_FILE), help="an interruption notice's file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    if args.fetch and not args.fetch_to:
        parser.error("--fetch needs --fetch-to")
    if args.restore and not args.restore_to:
        parser.error("--restore needs --restore-to")
    deadline = args.deadline or time.time() + 6 * 3600

    reporter = Reporter(args.url, args.job, args.node, args.token_file.read_text().strip())
    reporter.send({"status": "started", "pid": os.getpid(), "host": socket.gethostname()})

    def stop(signum: int, _frame: FrameType | None) -> None:
        reporter.stopping.set()
        if run is not None:
            run.process.terminate()

    run: NodeRun | None = None
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.orphan_s > 0 and args.self_stop and not reporter.closed:
        # The node's disk (lab: job/, loop-mounted, holding the command's output and work directories).
        disk = args.output.parent
        Watchdog(
            reporter, args.orphan_s, lambda: self_stop(args.self_stop, args.netns, disk, lambda: stop(0, None))
        ).start()

    failure = fetch_dataset(args) or restore(args)
    if failure:
        with open(args.log, "ab") as log:
            log.write(f"fc2-agent: {failure}\n".encode())
        return finish(reporter, args, {"status": "failed", "exit_code": None, "log_tail": failure}, {}, deadline)
    if reporter.stopping.is_set():
        return 0

    # The command's environment is the one the bootstrap wrote for the node (TF_CONFIG, FC2_*), never the agent's
    # own: whatever the agent was started with (an SSH session's) stays out of the user's code.
    env = json.loads(args.env_file.read_text()) if args.env_file else dict(os.environ)
    run = NodeRun(command, args.log, env, cwd=args.cwd, max_log_bytes=args.max_log_mb * 2**20)
    sampler = Sampler(
        run.process.pid, interval=args.sample_interval, own_network=args.own_network, own_machine=args.own_machine,
        keep=args.keep_samples,
    )  # fmt: skip
    sampler.start()
    notices = Notices(args.notice_file, args.checkpoints, args.spot_metadata, wake=run.progress_changed)
    notices.start()
    shipper = None
    if args.ship_checkpoints and args.checkpoints and not reporter.closed:
        shipper = Shipper(reporter, args.checkpoints, args.checkpoint_max_mb * 2**20, step_at=run.step_at)
        shipper.start()
    last_report = time.monotonic()
    while run.process.poll() is None:
        run.progress_changed.wait(args.interval)
        # Progress lines may come many times a second; report at most once per MIN_REPORT_GAP_S.
        time.sleep(max(0.0, MIN_REPORT_GAP_S - (time.monotonic() - last_report)))
        run.progress_changed.clear()
        if reporter.stopping.is_set() or run.process.poll() is not None:
            break
        # A report that cannot be delivered takes its progress lines with it: training is never held up for them.
        report = {"status": "running", "progress": dict(run.progress), "progress_log": run.take_progress_log()}
        if notice := notices.take():
            report["interruption"] = notice
        if shipper and (skipped := shipper.take_skipped()):
            report["checkpoint_skipped"] = skipped
        samples = sampler.take()
        # Undelivered samples go back for the next report; refused ones do not (they would be refused again).
        if not reporter.send({**report, "samples": samples}, attempts=2) and not (reporter.closed or reporter.refused):
            sampler.give_back(samples)
            notices.to_report = notices.to_report or notice
        # Another node's interruption notice, as the platform names it: the chief checkpoints at once.
        if isinstance(at := reporter.answer.get("interruption_at"), str) and at:
            notices.act(at)
        last_report = time.monotonic()

    try:
        code = run.process.wait(timeout=10 if reporter.stopping.is_set() else None)
    except subprocess.TimeoutExpired:
        run.process.kill()
        code = run.process.wait()
    run.reader.join(timeout=10)
    if reporter.stopping.is_set():
        reporter.timeout = 2
        reporter.stopping.clear()
        reporter.send({"status": "stopped", "exit_code": code}, attempts=1)
        return 0

    # Killed by SIGKILL: -9 when it is the command itself, 128 + 9 when a launcher (bwrap) passes its child's death on.
    if code in (-signal.SIGKILL, 128 + signal.SIGKILL) and args.memory_cgroup:
        reason = out_of_memory(args.memory_cgroup)
        if reason:
            run.tail.append(f"fc2-agent: {reason}")
            with open(args.log, "ab") as log:
                log.write(f"fc2-agent: {reason}\n".encode())
    sampler.stopped.set()
    notices.stopped.set()
    if shipper:  # its last checkpoint, before the final report ends the job and no more are taken
        shipper.stopped.set()
        shipper.look(final=True)
    final = {
        "status": "succeeded" if code == 0 else "failed",
        "exit_code": code,
        "progress": dict(run.progress),
        "progress_log": run.take_progress_log(),
        "samples": sampler.take(),
        "log_tail": run.log_tail(),
        **({"checkpoint_skipped": skipped} if shipper and (skipped := shipper.take_skipped()) else {}),
    }
    outputs = collect_outputs(args.output, args.max_artifact_mb * 2**20) if code == 0 else Outputs(0)
    if outputs.unreadable:  # the code ran, its results did not survive: the node did not succeed
        lost = f"fc2-agent: {outputs.unreadable}: what the command wrote there is lost"
        run.tail.append(lost)
        with open(args.log, "ab") as log:
            log.write(f"{lost}\n".encode())
        final.update(status="failed", log_tail=run.log_tail())
    return finish(reporter, args, {**final, **outputs.report()}, outputs.files, deadline)


def restore(args: argparse.Namespace) -> str | None:
    """Make the command's checkpoint directory, and unpack the checkpoint to resume from; an error message on
    failure."""
    if args.checkpoints:
        own_like_parent(args.checkpoints)
    if not args.restore:
        return None
    try:
        unpack(args.restore, args.restore_to, args.checkpoint_max_mb * 2**20)
    except (ArchiveError, OSError) as error:
        return f"cannot restore the checkpoint {args.restore}: {error}"
    return None


def finish(reporter: Reporter, args: argparse.Namespace, final: dict, files: dict[str, bytes], deadline: float) -> int:
    """Keep the final report on the node, then deliver it for as long as the job may live."""
    keep_result(args.result, final, files)
    reporter.timeout = 60
    reporter.send(final, files=files, until=deadline)
    code = final.get("exit_code")
    return code if isinstance(code, int) and 0 <= code < 256 else 1


if __name__ == "__main__":
    sys.exit(main())
