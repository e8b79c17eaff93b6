"""`manage.py serve [ADDR:PORT]`: the platform as `make run` starts it — the web server and a Celery worker with beat —
supervised.

    serve [127.0.0.1:8000] [--concurrency 2]

Each runs as a child in a process group of its own (so that a terminal's Ctrl-C reaches this command alone, and a
stop reaches everything a child started: runserver's reloaded server, the worker's pool and its beat process):

- a child that dies is started again after a backoff (1 s, doubling up to a minute; back to 1 s once a child has run
  for a minute), with one log line saying which, how it ended and when it starts again. One that dies more than
  FC2_SERVE_RESTARTS_PER_HOUR times in an hour, or at its first start (a port in use, a broken setting), stops the
  platform with status 1: a web server taking jobs that no worker will ever run is worse than no platform.
- TERM or INT (Ctrl-C) stops them all: TERM to each child, then, once they have exited or after FC2_SERVE_STOP_S
  seconds, KILL to whatever is left in their groups. The worker's warm shutdown waits for its running tasks, which
  may take minutes; the pipeline's steps are safe to cut short, since the sweep sends a lost step again
  (fc2/services/sweep.py).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

logger = logging.getLogger(__name__)

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
STEADY_S = 60.0  # a child that ran this long died of something new: its next restart waits FIRST_BACKOFF_S again
STARTUP_S = 5.0  # a child that dies this soon after its first start failed to start: no restart would help
POLL_S = 0.2


@dataclass
class Child:
    """One supervised program and its restarts."""

    name: str  # as the log lines say it
    argv: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    starts: int = 0
    backoff_s: float = FIRST_BACKOFF_S
    restart_at: float | None = None  # when it is due to start again, while it is down
    restarts: deque[float] = field(default_factory=deque)  # when it was started again, within the last hour

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, start_new_session=True)
        self.started_at = time.monotonic()
        self.starts += 1
        self.restart_at = None

    def signal_group(self, signum: int) -> None:
        """The signal to the child's whole process group, which outlives the child when its own children do."""
        if self.process is not None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)


def ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def took(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class Command(BaseCommand):
    help = "Run the web server and a Celery worker with beat, restart either if it dies, stop both on TERM or Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000", help="runserver's ADDR:PORT")
        parser.add_argument("--concurrency", type=int, default=2, help="the worker's processes")

    def handle(self, *args, addrport: str, concurrency: int, **options) -> None:
        self.restarts_per_hour = settings.FC2_SERVE_RESTARTS_PER_HOUR
        self.stop_s = settings.FC2_SERVE_STOP_S
        self.stopping: str | None = None
        python = sys.executable
        self.children = [
            # Without mingle and gossip: with one worker there is nobody to synchronise with, and each is one more
            # broadcast over the broker at start and stop.
            Child(
                "Celery worker",
                [python, "-m", "celery", "-A", "fc2", "worker", "-B", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE]
                + f"--loglevel INFO --concurrency {concurrency} --without-mingle --without-gossip".split(),
            ),
            Child("web server", [python, str(MANAGE_PY), "runserver", addrport]),
        ]
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.on_signal)
        status = 0
        try:
            for child in self.children:
                child.start()
            status = self.supervise()
        finally:
            self.stop()
        if status:
            raise CommandError("stopped: a child could not be kept running", returncode=status)

    def on_signal(self, signum: int, frame) -> None:
        self.stopping = signal.Signals(signum).name

    def supervise(self) -> int:
        """Watch the children until a stop is asked for (0) or one cannot be kept running (1)."""
        while self.stopping is None:
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        child.start()
                    continue
                assert child.process is not None
                returncode = child.process.poll()
                if returncode is None:
                    continue
                up_s = now - child.started_at
                child.signal_group(signal.SIGKILL)  # what it leaves (a pool process, a reloaded server) goes with it
                if child.starts == 1 and up_s < STARTUP_S:
                    logger.error(
                        "fc2 serve: the %s %s at its start; stopping the platform", child.name, ended(returncode)
                    )
                    return 1
                while child.restarts and child.restarts[0] < now - 3600:
                    child.restarts.popleft()
                if len(child.restarts) >= self.restarts_per_hour:
                    logger.error(
                        "fc2 serve: the %s %s, its end number %d in the last hour (FC2_SERVE_RESTARTS_PER_HOUR=%d); "
                        "stopping the platform",
                        child.name, ended(returncode), len(child.restarts) + 1, self.restarts_per_hour,
                    )  # fmt: skip
                    return 1
                if up_s >= STEADY_S:
                    child.backoff_s = FIRST_BACKOFF_S
                child.restarts.append(now)
                child.restart_at = now + child.backoff_s
                logger.warning(
                    "fc2 serve: the %s (pid %d) %s after %s; starting it again in %.0f s (restart %d of at most %d "
                    "an hour)",
                    child.name, child.process.pid, ended(returncode), took(up_s), child.backoff_s,
                    len(child.restarts), self.restarts_per_hour,
                )  # fmt: skip
                child.backoff_s = min(child.backoff_s * 2, MAX_BACKOFF_S)
            time.sleep(POLL_S)
        logger.info("fc2 serve: %s: stopping the web server and the worker", self.stopping)
        return 0

    def stop(self) -> None:
        """TERM to every child's group; KILL to them all once they have exited or FC2_SERVE_STOP_S has passed."""
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in running:
            # To the child alone: it stops its own (the worker its pool, whose processes would otherwise each log
            # being terminated as an error); the KILL below is for the group.
            child.process.terminate()
        deadline = time.monotonic() + self.stop_s
        while time.monotonic() < deadline and any(c.process.poll() is None for c in running):
            time.sleep(POLL_S)
        late = [child.name for child in running if child.process.poll() is None]
        if late:
            logger.warning("fc2 serve: the %s still running after %d s: killed", " and ".join(late), self.stop_s)
        for child in self.children:
            child.signal_group(signal.SIGKILL)
            if child.process is not None:
                child.process.wait()
