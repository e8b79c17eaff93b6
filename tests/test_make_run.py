"""`make run` and what it starts (`manage.py serve`): everything stops within seconds of a TERM to its process group, a
worker that dies is started again (and one that keeps dying stops the platform), and its log keeps the periodic sweep
and a node's late report out of sight while a job step's lines and real warnings stay."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from fc2.management.commands.serve import STARTUP_S
from tests.conftest import PROJECT_DIR

STOP_WITHIN_S = 15


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def platform_env(var: Path, **extra: str) -> dict[str, str]:
    """A platform of its own: its data directory (SQLite, the embedded broker, or REDIS_URL's Redis when set), and a
    queue of its own so that a worker on a shared Redis takes no one else's tasks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_SETTINGS_MODULE"))}
    env.pop("DATABASE_URL", None)  # `make run` sets up its database: its own SQLite, never the tests'
    env.update(FC2_VAR_DIR=str(var), FC2_QUEUE=f"fc2-run-{uuid.uuid4().hex[:8]}", DEBUG="1", **extra)
    return env


def processes_of(var: Path) -> list[int]:
    """Every process started for this platform: they all carry its FC2_VAR_DIR in their environment."""
    marker = f"FC2_VAR_DIR={var}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile
                pass
    return pids


def wait_for(condition: Callable[[], object], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def ready(log: Path, workers: int = 1) -> Callable[[], bool]:
    def check() -> bool:
        text = log.read_text()
        return text.count(" ready.") >= workers and "Starting development server at" in text

    return check


def gone_within(var: Path, seconds: float) -> float:
    start = time.monotonic()
    while processes_of(var) and time.monotonic() - start < seconds:
        time.sleep(0.1)
    return time.monotonic() - start


@pytest.fixture
def var(tmp_path):
    var = tmp_path / "var"
    yield var
    for pid in processes_of(var):  # whatever a failed test left
        os.kill(pid, signal.SIGKILL)


@pytest.mark.heavy
def test_make_run_stops_everything_it_started_within_seconds_of_a_term(var, tmp_path):
    env = platform_env(var, FC2_SWEEP_INTERVAL_S="1")
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        # The virtualenv is taken as it is (-o): a test never reinstalls it.
        make = subprocess.Popen(
            ["make", "-o", ".venv/bin/.installed", "run", f"PORT={free_port()}"],
            cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(ready(log), 240, "the web server and the worker", log)
        # A task that is not periodic has its lines; meanwhile a sweep runs every second, and has none.
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c",
             "from fc2.celery import app; app.send_task('celery.accumulate', args=(1,))"],
            cwd=PROJECT_DIR, env=env, check=True, capture_output=True,
        )  # fmt: skip
        wait_for(lambda: "celery.accumulate" in log.read_text(), 60, "the task's log line", log)
        time.sleep(3)
        started = processes_of(var)
        assert len(started) >= 5  # make, serve, the worker, its pool and beat, runserver and its server

        os.killpg(make.pid, signal.SIGTERM)
        took = gone_within(var, STOP_WITHIN_S)
    finally:
        make.kill()
        make.wait()
    text = log.read_text()
    assert processes_of(var) == [], text[-4000:]
    assert took < STOP_WITHIN_S
    assert "fc2 serve: SIGTERM: stopping the web server and the worker" in text
    assert not re.search(r"Task fc2\.tasks\.sweep\[", text) and "Sending due task" not in text
    assert re.search(r"Task celery\.accumulate\[\S+\] succeeded", text)
    assert "Unrecoverable error" not in text


@pytest.mark.heavy
def test_a_worker_that_dies_is_started_again_and_one_that_keeps_dying_stops_the_platform(var, tmp_path):
    env = platform_env(var, FC2_SERVE_RESTARTS_PER_HOUR="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=PROJECT_DIR, env=env, check=True)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "manage.py", "serve", f"127.0.0.1:{free_port()}"],
            cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(ready(log), 240, "the web server and the worker", log)
        first = worker_pid(serve.pid)
        # Killed within STARTUP_S of its first start, a worker "failed to start" and stops the platform: this one is
        # killed once past that, as a worker that was running. Counted from its "ready", which comes after serve
        # started it: the process's own start time is not serve's (under load, Popen returns a second or more after
        # the fork, and /proc's start time is that of the fork, rounded to a second's boot time).
        time.sleep(STARTUP_S + 0.5)
        os.kill(first, signal.SIGKILL)
        wait_for(ready(log, workers=2), 120, "a second worker", log)
        assert re.search(
            rf"fc2 serve: the Celery worker \(pid {first}\) was killed by SIGKILL after \d+ s; starting it again in "
            r"1 s \(restart 1 of at most 1 an hour\)",
            log.read_text(),
        ), log.read_text()
        second = worker_pid(serve.pid)
        assert second != first

        os.kill(second, signal.SIGKILL)
        assert serve.wait(timeout=STOP_WITHIN_S) == 1
        took = gone_within(var, STOP_WITHIN_S)
    finally:
        serve.kill()
        serve.wait()
    assert processes_of(var) == [] and took < STOP_WITHIN_S
    assert (
        "the Celery worker was killed by SIGKILL, its end number 2 in the last hour (FC2_SERVE_RESTARTS_PER_HOUR=1); "
        "stopping the platform" in log.read_text()
    )


def worker_pid(serve: int) -> int:
    """The Celery worker that `serve` started (its child)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == serve and b"celery" in cmdline:
                return int(entry.name)
    raise AssertionError("no worker")


# --- the log's filters, as settings.LOGGING installs them ------------------------------------------------------------


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept():
    """What reaches the handlers of the loggers below (after the loggers' own filters)."""
    handler = Kept()
    names = ("celery.beat", "celery.worker.strategy", "celery.app.trace", "django.server")
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler.records
    for name in names:
        logging.getLogger(name).removeHandler(handler)


def test_the_periodic_tasks_lines_are_dropped_and_a_job_step_s_kept(kept):
    from celery.app import trace

    for task in ("fc2.tasks.sweep", "fc2.tasks.compact_samples", "fc2.tasks.provision"):
        context = {
            "id": "1",
            "name": task,
            "args": "()",
            "kwargs": "{}",
            "eta": None,
            "return_value": None,
            "runtime": 0,
        }
        logging.getLogger("celery.worker.strategy").info(trace.LOG_RECEIVED, context)
        logging.getLogger("celery.app.trace").info(trace.LOG_SUCCESS, context)
        logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", task.rpartition(".")[2], task)
    logging.getLogger("celery.app.trace").error(
        trace.LOG_FAILURE, {**context, "name": "fc2.tasks.sweep", "description": "raised unexpected", "exc": "E"}
    )

    assert [r.getMessage() for r in kept] == [
        "Task fc2.tasks.provision[1] received",
        "Task fc2.tasks.provision[1] succeeded in 0s: None",
        "Scheduler: Sending due task provision (fc2.tasks.provision)",
        "Task fc2.tasks.sweep[1] raised unexpected: E",
    ]


def test_a_late_report_s_409_is_an_info_line_and_other_refusals_stay_warnings(kept):
    server = logging.getLogger("django.server")
    for line, status in [
        ("POST /api/jobs/7/report HTTP/1.1", "409"),
        ("POST /api/v1/jobs/7/report HTTP/1.1", "409"),
        ("POST /api/jobs/7/report HTTP/1.1", "403"),
        ("POST /api/jobs/7/cancel HTTP/1.1", "409"),
        ("GET /api/jobs/7/report HTTP/1.1", "409"),
    ]:
        server.warning('"%s" %s %s', line, status, 30, extra={"status_code": int(status)})

    assert [r.levelname for r in kept] == ["INFO", "INFO", "WARNING", "WARNING", "WARNING"]
