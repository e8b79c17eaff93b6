#!/usr/bin/env python3
"""FC² node agent: runs one node's training process beside it and reports to the platform.

Standalone on purpose — stdlib, plus psutil when the node has it — because it is copied onto cluster nodes that have
no Django. It:

- starts the node's command, writes its stdout/stderr to the node log, and parses `FC2_PROGRESS {json}` lines;
- reports `started`, then `running` with progress and a resource sample every interval, to
  `POST <url>/api/jobs/<job>/report` with the job-scoped token (env FC2_AGENT_TOKEN, never on the command line);
- when the command exits, reports `succeeded` or `failed` with the exit code, the log tail and the files of the
  output directory as artifacts (the completion report is what moves the job on, as in FC² §6);
- on SIGTERM (teardown) stops the command and exits.

A report that cannot be delivered is retried and then dropped: the agent never blocks the training it watches.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path

try:
    import psutil
except ImportError:  # a bare node still trains and reports progress, just without resource samples
    psutil = None

PROGRESS_PREFIX = b"FC2_PROGRESS "
PROGRESS_KEYS = ("epoch", "epochs", "step", "steps", "loss")
LOG_TAIL_LINES = 60
MIN_REPORT_GAP_S = 1.0


class Reporter:
    """POSTs reports (JSON, or multipart with files) to the platform, retrying transient failures."""

    def __init__(self, url: str, job: int, node: str, token: str, timeout: float = 10.0):
        self.url = f"{url.rstrip('/')}/api/jobs/{job}/report"
        self.node = node
        self.token = token
        self.timeout = timeout
        self.closed = False  # the platform said the job is over: stop reporting

    def send(self, report: dict, files: dict[str, bytes] | None = None, attempts: int = 3) -> bool:
        if self.closed:
            return False
        report = {"node": self.node, **report}
        if files:
            body, content_type = encode_multipart(report, files)
        else:
            body, content_type = json.dumps(report).encode(), "application/json"
        delay = 0.5
        for attempt in range(attempts):
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": content_type, "Authorization": f"Bearer {self.token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
                return True
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode(errors="replace")
                if exc.code == 409:
                    self.closed = True
                    return False
                if exc.code < 500 and exc.code != 429:
                    print(f"fc2-agent: report refused ({exc.code}): {detail}", file=sys.stderr, flush=True)
                    return False
            except (urllib.error.URLError, OSError) as exc:
                detail = str(exc)
            if attempt + 1 < attempts:
                time.sleep(delay)
                delay = min(delay * 2, 10)
        print(f"fc2-agent: report not delivered: {detail}", file=sys.stderr, flush=True)
        return False


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
    >>> parse_progress(b'FC2_PROGRESS not json') is None
    True
    """
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        data = json.loads(line[len(PROGRESS_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {k: data[k] for k in PROGRESS_KEYS if isinstance(data.get(k), int | float) and not isinstance(data[k], bool)}


class Sampler:
    """CPU and memory of the node's process tree, network bytes of the host (or network namespace), GPU if any."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid) if psutil else None
        self.nvidia_smi = shutil.which("nvidia-smi")

    def sample(self) -> dict | None:
        if self.process is None:
            return None
        try:
            procs = [self.process, *self.process.children(recursive=True)]
            cpu = sum(p.cpu_percent(None) for p in procs)
            memory = sum(p.memory_info().rss for p in procs)
        except psutil.Error:
            return None
        net = psutil.net_io_counters()
        return {
            "cpu_percent": round(cpu, 1),
            "memory_mb": round(memory / 2**20, 1),
            "bytes_sent": net.bytes_sent,
            "bytes_recv": net.bytes_recv,
            "gpu_percent": self.gpu_percent(),
        }

    def gpu_percent(self) -> float | None:
        if not self.nvidia_smi:
            return None
        try:
            out = subprocess.run(
                [self.nvidia_smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
            return sum(float(v) for v in out) / len(out) if out else None
        except (OSError, ValueError, subprocess.SubprocessError):
            return None


def collect_outputs(output_dir: Path, max_bytes: int) -> dict[str, bytes]:
    """Files the node left in its output directory; sub-directories (e.g. a SavedModel) are zipped."""
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(output_dir.iterdir()) if output_dir.is_dir() else []:
        if path.is_dir():
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for member in sorted(path.rglob("*")):
                    if member.is_file():
                        archive.write(member, member.relative_to(output_dir))
            name, data = f"{path.name}.zip", buffer.getvalue()
        elif path.is_file():
            name, data = path.name, path.read_bytes()
        else:
            continue
        total += len(data)
        if total > max_bytes:
            print(f"fc2-agent: outputs exceed {max_bytes} bytes; {name} and later files not uploaded", file=sys.stderr)
            break
        files[name] = data
    return files


class NodeRun:
    """The node's command, its log and its latest progress."""

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str], cwd: str | None):
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed by the reader thread when the command ends
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.progress: dict = {}
        self.progress_changed = threading.Event()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with self.log:
            for line in self.process.stdout:
                self.log.write(line)
                self.log.flush()
                self.tail.append(line.decode(errors="replace").rstrip("\n"))
                progress = parse_progress(line)
                if progress:
                    self.progress.update(progress)
                    self.progress_changed.set()

    def log_tail(self) -> str:
        return "\n".join(self.tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="platform base URL")
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--node", required=True, help="node name, e.g. chief-0")
    parser.add_argument("--log", required=True, type=Path, help="where the command's output goes")
    parser.add_argument("--output", required=True, type=Path, help="directory whose files become artifacts")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between reports")
    parser.add_argument("--max-artifact-mb", type=int, default=200)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")

    env = dict(os.environ)
    token = env.pop("FC2_AGENT_TOKEN", "")
    reporter = Reporter(args.url, args.job, args.node, token)
    reporter.send({"status": "started", "pid": os.getpid(), "host": socket.gethostname()})

    args.output.mkdir(parents=True, exist_ok=True)
    run = NodeRun(command, args.log, env, cwd=None)
    stopping = threading.Event()

    def stop(signum, _frame):
        stopping.set()
        run.process.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    sampler = Sampler(run.process.pid)
    sampler.sample()  # psutil's cpu_percent needs a first call to measure against
    last_report = time.monotonic()
    while run.process.poll() is None:
        run.progress_changed.wait(args.interval)
        # Progress lines may come many times a second; report at most once per MIN_REPORT_GAP_S.
        time.sleep(max(0.0, MIN_REPORT_GAP_S - (time.monotonic() - last_report)))
        run.progress_changed.clear()
        if stopping.is_set() or run.process.poll() is not None:
            break
        reporter.send({"status": "running", "progress": dict(run.progress), "sample": sampler.sample()}, attempts=2)
        last_report = time.monotonic()

    try:
        code = run.process.wait(timeout=10 if stopping.is_set() else None)
    except subprocess.TimeoutExpired:
        run.process.kill()
        code = run.process.wait()
    run.reader.join(timeout=10)
    if stopping.is_set():
        reporter.timeout = 2
        reporter.send({"status": "stopped", "exit_code": code}, attempts=1)
        return 0

    final = {
        "status": "succeeded" if code == 0 else "failed",
        "exit_code": code,
        "progress": dict(run.progress),
        "log_tail": run.log_tail(),
    }
    files = collect_outputs(args.output, args.max_artifact_mb * 2**20) if code == 0 else {}
    reporter.timeout = 60
    reporter.send(final, files=files, attempts=8)
    return code


if __name__ == "__main__":
    sys.exit(main())
