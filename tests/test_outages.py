"""The platform's database (PostgreSQL) and broker (Redis) restarted mid-job, and what everyone sees meanwhile.

First, in this process: an outage error raised where a request can meet it — a view, the session middleware before
the view, a task sent on commit, the node agents' report endpoint — answers 503 with Retry-After (JSON under /api/,
a plain page elsewhere), and any other error stays a 500 (fc2/outage.py).

Then for real: a PostgreSQL and a Redis of the test's own (never the machine's: initdb into a scratch directory, a
free port each), the platform as it is deployed — a gunicorn web server and a Celery worker with embedded beat, both
pointed at them — and a job on the local provider whose code reports a step every half second. Each server is stopped
for 12 s from 4 s before the code ends, so that the chief's completion falls in the outage: meanwhile the API answers
503 where it needs what is down and works where it does not, never 500; once it is back the job succeeds, every
state entered once and no step done twice (its events). Skipped, with the reason, where PostgreSQL's or Redis's
programs are missing. The figures are printed (`pytest -s`); benchmarks/faults.py collects them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.sessions.backends.cached_db import SessionStore
from django.contrib.sessions.middleware import SessionMiddleware
from django.db import InterfaceError, OperationalError

import provisioner
from fc2 import outage
from fc2.models import Job
from harness.ec2lab import free_port
from tests.conftest import PROJECT_DIR, trainer_wheel

PG_BIN = Path("/usr/lib/postgresql/15/bin")
REDIS_SERVER = shutil.which("redis-server")


# --- in this process: where an outage error can be met ------------------------------------------------------------


def assert_outage(response, api: bool) -> None:
    what = "API" if api else "page"
    print(f"FIGURE {what}: answered {response.status_code}, Retry-After {response.get('Retry-After')}")
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == str(outage.RETRY_AFTER_S)
    if api:
        assert response["Content-Type"] == "application/json" and "cannot be reached" in response.json()["error"]
    else:
        assert response["Content-Type"].startswith("text/html") and b"Temporarily unavailable" in response.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    "error",
    [OperationalError("server closed the connection"), InterfaceError("closed")],
    ids=lambda error: type(error).__name__,
)
def test_a_database_error_in_a_view_is_a_503(error, client, alice, monkeypatch):
    client.force_login(alice)

    def down(*args, **kwargs):
        raise error

    monkeypatch.setattr("fc2.views.filter_jobs", down)
    assert_outage(client.get("/jobs/"), api=False)
    monkeypatch.setattr("fc2.jobs_api.JobsView.get", down)
    assert_outage(client.get("/api/jobs"), api=True)


@pytest.mark.django_db
def test_a_database_error_reading_the_session_is_a_503(client, alice, monkeypatch):
    """The session is read (lazily) when the view or the authentication asks who is signed in."""
    client.force_login(alice)

    def down(self, *args, **kwargs):
        raise OperationalError("could not connect to server: Connection refused")

    monkeypatch.setattr(SessionStore, "load", down)
    assert_outage(client.get("/jobs/"), api=False)
    assert_outage(client.get("/api/me"), api=True)


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["process_request", "process_response"])
def test_a_database_error_in_a_middleware_around_the_view_is_a_503(where, client, alice, monkeypatch):
    """Raised in a middleware (a session saved after the view, one read before it), where Django makes it a 500 at
    that middleware's layer, before any process_exception could see it."""
    client.raise_request_exception = False  # as a server: the answer, not the exception
    client.force_login(alice)

    def down(self, request, *args):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(SessionMiddleware, where, down)
    assert_outage(client.get("/jobs/"), api=False)
    assert_outage(client.get("/api/me"), api=True)


@pytest.mark.django_db
def test_the_node_report_endpoint_answers_503_for_the_agent_to_retry(client, job, monkeypatch):
    """The agent retries a 5xx (monitor/agent.py) and gives up on a 4xx: a database down must not lose a report."""

    def down(*args, **kwargs):
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr("fc2.api.JobTokenAuthentication.authenticate", down)
    response = client.post(f"/api/jobs/{job.pk}/report", {"node": "worker-0"}, content_type="application/json")
    assert_outage(response, api=True)


@pytest.mark.django_db
def test_a_broker_error_sending_a_task_is_a_503(client, alice, monkeypatch):
    import kombu.exceptions

    client.force_login(alice)

    def down(*args, **kwargs):
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr("fc2.views.filter_jobs", down)
    assert_outage(client.get("/jobs/"), api=False)


@pytest.mark.django_db
def test_any_other_error_stays_a_500(client, alice, monkeypatch, settings):
    client.raise_request_exception = False
    client.force_login(alice)

    def broken(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr("fc2.views.filter_jobs", broken)
    response = client.get("/jobs/")
    print(f"FIGURE page: answered {response.status_code}")
    assert response.status_code == 500


# --- for real: a PostgreSQL and a Redis of the test's own, restarted under a running platform ----------------------

DOWN_S = 12  # how long each server stays down: longer than the lease and the pickup time, several agent retries
TRAIN_S = 12  # the job's code: 24 steps of half a second
STOP_AT_STEP = 2 * TRAIN_S - 8  # each server is stopped 4 s before the code ends: its end falls in the outage
JOB_WITHIN_S = 150  # from the server's return to the job's end


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kwargs)


def _as_postgres(*argv) -> list:
    return ["runuser", "-u", "postgres", "--", *argv]  # initdb and postgres refuse to run as root


class Postgres:
    """A PostgreSQL of this test's own: initdb into a scratch directory (not under pytest's root-only tmp, which the
    postgres user cannot enter), a free port on 127.0.0.1, trust authentication, no fsync."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="fc2-outage-pg-"))
        shutil.chown(self.root, "postgres", "postgres")
        self.port = free_port()
        self.data = self.root / "data"
        self.url = f"postgres://fc2@127.0.0.1:{self.port}/fc2"
        _run(_as_postgres(PG_BIN / "initdb", "-D", self.data, "-U", "fc2", "-A", "trust", "--no-sync", "-E", "UTF8"))
        self.start()
        _run(_as_postgres(PG_BIN / "createdb", "-h", "127.0.0.1", "-p", self.port, "-U", "fc2", "fc2"))

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        _run(_as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "-l", self.root / "log", "-w", "-o", options, "start"))

    def stop(self) -> None:
        _run(_as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"))

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def query(self, sql: str, *params) -> list[tuple]:
        import psycopg2

        with contextlib.closing(psycopg2.connect(self.url)) as db, db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()


class Redis:
    """A Redis of this test's own on a free port, persisting nothing (a restart loses what it held, as a cache's or a
    broker's restart without persistence does)."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="fc2-outage-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.root / "log", "ab") as log:
            self.process = subprocess.Popen([*argv, "--dir", str(self.root)], stdout=log, stderr=subprocess.STDOUT)
        import redis

        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.RedisError):
                if redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping():
                    return
            assert time.monotonic() < deadline, (self.root / "log").read_text()
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Platform:
    """The platform as deployed, on `pg` and `redis`: migrated, a gunicorn web server, a Celery worker with beat (the
    sweep every 2 s), in a scratch FC2_VAR_DIR; leases 3 s, a lost message sent again after 5 s."""

    def __init__(self, pg: Postgres, redis: Redis, var_dir: Path):
        self.pg, self.var_dir = pg, var_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "fc2.settings_test",
            "DATABASE_URL": pg.url,
            "REDIS_URL": redis.url,
            "FC2_VAR_DIR": str(var_dir),
            "FC2_PUBLIC_URL": self.url,
            "FC2_QUEUE": "fc2-outage",
            "FC2_LEASE_S": "3",
            "FC2_STEP_PICKUP_S": "5",
            "FC2_SWEEP_INTERVAL_S": "2",
            "FC2_NODE_SILENCE_S": "5",
        }
        for name in ("FC2_MEDIA_ROOT", "FC2_LOCAL_CLUSTER_DIR", "FC2_LAB_DIR"):
            self.env.pop(name, None)
        self.manage("migrate", "--noinput")
        self.manage("shell", "-c", "from django.contrib.auth.models import User; User.objects.create_user('alice')")
        self.token = json.loads(self.manage("api_token", "create", "alice", "--name", "outage", "--json"))["token"]
        self.processes: list[subprocess.Popen] = []
        web = [sys.executable, "-m", "gunicorn", "fc2.wsgi:application", "--bind", f"127.0.0.1:{self.port}"]
        self._start("web", [*web, "--workers", "1", "--threads", "4", "--timeout", "60"])
        beat = ["--beat", "--schedule", str(var_dir / "celerybeat-schedule")]
        worker = [sys.executable, "-m", "celery", "-A", "fc2", "worker", "-Q", "fc2-outage", "--concurrency", "1"]
        self._start("worker", [*worker, *beat, "--hostname", "outage@%h", "--without-gossip", "--without-mingle"])
        deadline = time.monotonic() + 60
        while self.get("/healthz")[0] != 200:
            assert time.monotonic() < deadline, self.logs()
            time.sleep(0.5)

    def manage(self, *args: str) -> str:
        return _run([sys.executable, "manage.py", *args], cwd=PROJECT_DIR, env=self.env).stdout

    def _start(self, name: str, argv: list) -> None:
        with open(self.var_dir / f"{name}.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    argv, cwd=PROJECT_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def request(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        """(status, headers, body) of one request; a token authenticates it as the API's clients and agents do."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token:
            headers["Authorization"] = token
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, error.read()

    def get(self, path: str, token: str | None = None):
        try:
            return self.request("GET", path, token=token)
        except OSError as error:  # not listening yet
            return 0, {}, str(error).encode()

    def job(self, job_id: int) -> tuple[str, list[tuple[str, str]]]:
        """The job's state and its events (state, message), read from the database itself."""
        (state,) = self.pg.query("SELECT state FROM fc2_job WHERE id = %s", job_id)[0]
        return state, self.pg.query("SELECT state, message FROM fc2_jobevent WHERE job_id = %s ORDER BY at, id", job_id)

    def released(self, job_id: int) -> bool:
        """The job has ended and its cluster is torn down."""
        state, cluster = self.pg.query("SELECT state, cluster FROM fc2_job WHERE id = %s", job_id)[0]
        return state in Job.TERMINAL and cluster is None

    def nothing_left(self) -> list[str]:
        """The clusters' directories, mounts and processes still on the machine."""
        clusters = self.var_dir / "clusters"
        left = [str(p) for p in clusters.iterdir()] if clusters.is_dir() else []
        left += [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(self.var_dir) in line]
        return left

    def submit(self, wheel: Path) -> int:
        argv = ["submit_job", "--bundle", str(wheel), "--main", "main.py", "--dataset", "digits", "--provider"]
        argv += ["local", "--workers", "1", "--strategy", "mirrored", "--param", f"seconds={TRAIN_S}"]
        return json.loads(self.manage(*argv, "--user", "alice", "--json"))["id"]

    def logs(self) -> str:
        return "\n".join(
            f"== {log.name}\n" + log.read_text(errors="replace")[-4000:] for log in self.var_dir.glob("*.log")
        )

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()


def _missing() -> str | None:
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL 15's programs are not in {PG_BIN} (Debian package postgresql-15)"
    if REDIS_SERVER is None:
        return "redis-server is not installed (Debian package redis-server)"
    if os.geteuid() != 0 or provisioner.unavailable("local"):
        return provisioner.unavailable("local") or "needs root (runuser postgres, the local provider's sandbox)"
    return None


@pytest.fixture
def platform(tmp_path, settings) -> Iterator[Platform]:
    if reason := _missing():
        pytest.skip(reason)
    pg = Postgres()
    redis = Redis()
    served = None
    try:
        served = Platform(pg, redis, tmp_path / "var")
        served.pg, served.redis = pg, redis
        yield served
    finally:
        if served is not None:
            served.close()
            # Whatever a failed test left running (the platform's clusters are under its own FC2_VAR_DIR).
            settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "var" / "clusters"
            for name in provisioner.list_clusters("local"):
                provisioner.teardown("local", name)
        redis.close()
        pg.close()


def wait_until(what: str, predicate: Callable[[], bool], within_s: float, platform: Platform) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}\n{platform.logs()}"
        time.sleep(0.5)


def near_its_end(platform: Platform, job_id: int) -> bool:
    state, _ = platform.job(job_id)
    steps = platform.pg.query("SELECT max(step) FROM fc2_node WHERE job_id = %s", job_id)[0][0]
    assert state not in Job.TERMINAL, platform.job(job_id)
    return state == Job.State.RUNNING and (steps or 0) >= STOP_AT_STEP


def each_step_once(events: list[tuple[str, str]]) -> None:
    """Every state entered once (no step done again), and no step's work done twice."""
    entered = [state for i, (state, _) in enumerate(events) if i == 0 or state != events[i - 1][0]]
    assert len(entered) == len(set(entered)), entered
    messages = [message for _, message in events]
    assert messages.count("results stored") == 1 and messages.count("the chief finished training") == 1, messages
    assert not [m for m in messages if "bootstrap sent again" in m or "provision sent again" in m], messages


@pytest.mark.heavy
def test_postgres_restarted_mid_job_answers_503_meanwhile_and_the_job_goes_on(platform, tmp_path):
    job_id = platform.submit(trainer_wheel(tmp_path))
    wait_until("near its end", lambda: near_its_end(platform, job_id), 120, platform)
    token = f"Token {platform.token}"

    platform.pg.stop()
    stopped = time.monotonic()
    answers = {}
    while time.monotonic() - stopped < DOWN_S:
        answers = {
            "job (API)": platform.request("GET", f"/api/jobs/{job_id}", token=token),
            "jobs (API)": platform.request("GET", "/api/jobs", token=token),
            "report (agent)": platform.request(
                "POST", f"/api/jobs/{job_id}/report", {"node": "worker-0"}, token="Bearer not-the-token"
            ),
            "health": platform.request("GET", "/healthz"),
            "login page": platform.request("GET", "/accounts/login/"),
        }
        time.sleep(2)
    platform.pg.start()
    back = time.monotonic()

    statuses = {what: status for what, (status, _, _) in answers.items()}
    assert statuses == {
        "job (API)": 503, "jobs (API)": 503, "report (agent)": 503, "health": 503, "login page": 200,
    }, {what: body[:200] for what, (_, _, body) in answers.items()}  # fmt: skip
    for what in ("job (API)", "report (agent)"):
        _, headers, body = answers[what]
        assert headers["Retry-After"] == str(outage.RETRY_AFTER_S) and "database" in json.loads(body)["error"]

    wait_until("ended and torn down", lambda: platform.released(job_id), JOB_WITHIN_S, platform)
    state, events = platform.job(job_id)
    print(f"\nFIGURE postgres down {DOWN_S} s at the end of training: {state} {time.monotonic() - back:.1f} s after")
    assert state == Job.State.SUCCEEDED, (events, platform.logs())
    each_step_once(events)
    assert platform.get(f"/api/jobs/{job_id}", token=token)[0] == 200
    assert platform.nothing_left() == []


@pytest.mark.heavy
def test_redis_restarted_mid_job_answers_503_meanwhile_and_the_job_recovers(platform, tmp_path):
    """The chief finishes while the broker is down: its completion cannot be sent to the workers (the report answers
    503, and the agent tries again), the broker comes back empty, and the sweep sends the lost step again."""
    job_id = platform.submit(trainer_wheel(tmp_path))
    wait_until("near its end", lambda: near_its_end(platform, job_id), 120, platform)
    token = f"Token {platform.token}"

    platform.redis.stop()
    stopped = time.monotonic()
    # Sending a task is what needs the broker: a re-run, once (it makes a job).
    rerun = platform.request("POST", f"/api/jobs/{job_id}/rerun", {}, token=token)
    answers = {}
    while time.monotonic() - stopped < DOWN_S:
        answers = {
            "job (API)": platform.request("GET", f"/api/jobs/{job_id}", token=token),
            "jobs (API)": platform.request("GET", "/api/jobs", token=token),
            "login page": platform.request("GET", "/accounts/login/"),
        }
        time.sleep(2)
    platform.redis.start()
    back = time.monotonic()

    # What needs no broker works meanwhile; what must send a task answers 503 (or, once the job it made is left to
    # the sweep to send, 201) — never a 500.
    assert {what: status for what, (status, _, _) in answers.items()} == dict.fromkeys(answers, 200)
    assert rerun[0] in (201, 503), rerun[2][:300]
    if rerun[0] == 503:
        assert rerun[1]["Retry-After"] == str(outage.RETRY_AFTER_S) and "broker" in json.loads(rerun[2])["error"]
    for (other,) in platform.pg.query("SELECT id FROM fc2_job WHERE id <> %s", job_id):
        platform.request("POST", f"/api/jobs/{other}/cancel", {}, token=token)  # not to run beside this one

    wait_until("ended and torn down", lambda: platform.released(job_id), JOB_WITHIN_S, platform)
    state, events = platform.job(job_id)
    resent = [message for _, message in events if "sent again" in message]
    print(
        f"\nFIGURE redis down {DOWN_S} s at the end of training: {state} {time.monotonic() - back:.1f} s after its "
        f"return; a re-run meanwhile answered {rerun[0]}; {resent or 'no step sent again'}"
    )
    assert state == Job.State.SUCCEEDED, (events, platform.logs())
    each_step_once(events)
    every = [row[0] for row in platform.pg.query("SELECT id FROM fc2_job")]
    wait_until("every job torn down", lambda: all(platform.released(j) for j in every), 60, platform)
    assert platform.nothing_left() == []
