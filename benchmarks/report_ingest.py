"""Report endpoint on PostgreSQL: the resource samples a second POST /api/jobs/<id>/report stores while every node of
a 64-node job reports at once, against the 64 samples/s such a cluster sends at 1 Hz.

A real server — gunicorn as the Dockerfile runs it (3 sync workers, `--workers` to change; `manage.py runserver
--noreload` where gunicorn is missing) — on a scratch PostgreSQL database beside DATABASE_URL's (default
postgres://postgres@127.0.0.1:5432/postgres): `fc2_bench_<pid>`, created, migrated and dropped here, also on Ctrl-C or
failure. A mirrored job of `--nodes` running nodes; one client thread per node posts what monitor/agent.py posts (its
samples as an EC2 node takes them, the chief's progress and loss lines), a new connection per report as the agent's
urllib opens. Three phases:

- paced: each node reports every `--interval` s (2) the samples it took at 1 Hz since its last report, and waits
  `--interval` s after each report, as agents do — the load a real cluster puts on the platform;
- flat out: each node posts 2-sample reports back to back — the rate the endpoint sustains;
- catch-up: every node posts an hour's buffer (3600 samples, the most one report may carry) at the same moment, as
  when a cluster comes back after an outage, `--catch-up-rounds` times.

Each prints reports/s, samples/s, p50/p95 latency, samples/s over the 64 a second a 64-node cluster sends, the
reports answered later than an agent waits (monitor.agent.Reporter's timeout: it would have sent them again), the web
server's CPU time per report (its processes only, not the database's), and the share of the machine's CPU the clients
used and that was in use at all. The clients run on the machine that runs the server and the database, and so may
anything else: the rates are a floor; the server's CPU per report does not depend on what else runs.
`--explain` then fills the job's table to `--explain-rows` samples (a long run at 1 Hz) and prints how long the job
page's series take (fc2.services.monitoring.job_series) and PostgreSQL's plans, with timings, of their samples' query:
the first load and a poll with a `since` cursor; then it ends the job long ago, compacts its samples
(monitor/retention.py) and times the first load again.

    .venv/bin/python benchmarks/report_ingest.py [--nodes 64] [--seconds 20] [--interval 2] [--workers 3]
        [--conn-max-age 0] [--catch-up-rounds 2] [--phases paced,flat-out,catch-up]
        [--explain [--explain-rows 3000000]]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import inspect
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import dj_database_url
import psutil
import psycopg2

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))
from benchmarks._django import setup_django  # noqa: E402
from monitor.agent import MAX_BUFFERED_SAMPLES, MAX_PROGRESS_LOG, Reporter  # noqa: E402 - the agent's own (stdlib)

BIN = Path(sys.executable).parent
CLUSTER_SAMPLES_PER_S = 64  # a 64-node cluster at 1 Hz: the figure the endpoint must sustain
PHASES = ["paced", "flat-out", "catch-up"]
# How long an agent waits for its report's answer before it gives up and sends the report again.
AGENT_TIMEOUT_S = inspect.signature(Reporter).parameters["timeout"].default


# --- the scratch database and the server ------------------------------------------------------------------------


def admin_sql(url: str, *statements: tuple[str, list]) -> None:
    """Run statements on the database `url` names, outside a transaction (as CREATE and DROP DATABASE must)."""
    db = dj_database_url.parse(url)
    connection = psycopg2.connect(
        dbname=db["NAME"] or "postgres", user=db["USER"], password=db["PASSWORD"], host=db["HOST"], port=db["PORT"]
    )
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
    finally:
        connection.close()


def create_database(server_url: str, name: str) -> str:
    """A new, empty database on the server of `server_url`; its URL."""
    admin_sql(server_url, (f'CREATE DATABASE "{name}"', []))
    return urllib.parse.urlsplit(server_url)._replace(path=f"/{name}").geturl()


def drop_database(server_url: str, name: str) -> None:
    """Drop `name`, whoever is still connected to it."""
    admin_sql(
        server_url,
        ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]),
        (f'DROP DATABASE IF EXISTS "{name}"', []),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(env: dict[str, str], port: int, workers: int, log: Path) -> tuple[subprocess.Popen, str]:
    """The platform's web server on 127.0.0.1:`port`, in a session of its own (stopping its group stops its workers);
    waits until /healthz answers."""
    gunicorn = BIN / "gunicorn"
    if gunicorn.exists():
        command = [
            str(gunicorn), "fc2.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
            "--timeout", "120", "--worker-tmp-dir", "/dev/shm", "--access-logfile", str(log.with_suffix(".access")),
        ]  # fmt: skip
        label = f"gunicorn, {workers} sync workers"
    else:
        command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
        label = "manage.py runserver (no gunicorn in the venv)"
    with log.open("wb") as out:
        server = subprocess.Popen(
            command, cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if request(port, "GET", "/healthz", b"", {})[0] == 200:
                return server, label
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer /healthz within 60 s:\n{log.read_text()[-3000:]}")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def request(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request on a connection of its own, as the agent's urllib makes it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# --- the job and its nodes' reports --------------------------------------------------------------------------------


def seed_job(nodes: int) -> tuple[int, str, list[str]]:
    """A mirrored job running on `nodes` nodes, as bootstrap leaves it: (its id, the agents' token, node names)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from fc2.models import CodeBundle, Dataset, Job, Node

    owner = get_user_model().objects.create_user("bench-researcher", password="!")
    bundle = CodeBundle.objects.create(
        owner=owner, wheel="bundles/bench/bench-1.0-py3-none-any.whl", filename="bench-1.0-py3-none-any.whl",
        distribution="bench", version="1.0", main_script="bench/main.py", size_bytes=1, sha256="0" * 64,
    )  # fmt: skip
    dataset = Dataset.objects.create(owner=owner, name="bench.npz", kind=Dataset.Kind.UPLOAD, path="/data/bench.npz")
    now = timezone.now()
    job = Job.objects.create(
        owner=owner, bundle=bundle, dataset=dataset, strategy=Job.Strategy.MIRRORED, workers=nodes,
        state=Job.State.RUNNING, started_at=now, launched_at=now, epochs=10, steps=1000,
    )  # fmt: skip
    token = job.issue_token()
    job.save()
    names = [f"worker-{i}" for i in range(nodes)]
    Node.objects.bulk_create(
        Node(job=job, name=name, role="worker", index=i, status=Node.Status.RUNNING) for i, name in enumerate(names)
    )
    return job.pk, token, names


class Agent:
    """What one node's agent would send: samples at 1 Hz with growing counters; the chief's progress and losses."""

    def __init__(self, name: str, chief: bool):
        self.name, self.chief = name, chief
        self.sent = self.recv = 0
        self.step = 0

    def sample(self, at: float) -> dict:
        self.sent += 3_000_000 + int(at * 7919) % 1_000_000  # ~28 Mbps each way, varying
        self.recv += 2_900_000 + int(at * 6271) % 1_000_000
        return {
            "at": round(at, 3), "cpu_percent": 180.0 + at % 20, "node_cpu_percent": 190.0 + at % 17,
            "memory_mb": 612.4 + at % 3, "bytes_sent": self.sent, "bytes_recv": self.recv,
        }  # fmt: skip

    def report(self, sample_times: list[float]) -> bytes:
        body = {"node": self.name, "status": "running", "progress": {}, "progress_log": []}
        if self.chief:  # a training step a second, each printed
            lines = []
            for at in sample_times:
                self.step += 1
                lines.append({"at": at, "epoch": 1 + self.step // 1000, "step": self.step, "loss": 2.0 / self.step})
            body["progress_log"] = lines[-MAX_PROGRESS_LOG:]  # the newest, as the agent keeps them
            body["progress"] = {k: v for k, v in (lines[-1] if lines else {}).items() if k != "at"}
        body["samples"] = [self.sample(at) for at in sample_times]
        return json.dumps(body).encode()


@dataclass
class Tally:
    """One phase's reports, every client's together."""

    answered: list[tuple[float, float, int]] = field(default_factory=list)  # (done at, latency s, samples) of 200s
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, port: int, path: str, token: str, body: bytes, samples: int) -> None:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        started = time.perf_counter()
        try:
            status, answer = request(port, "POST", path, body, headers)
        except OSError as exc:
            status, answer = None, str(exc).encode()
        done = time.perf_counter()
        with self.lock:
            if status == 200:
                self.answered.append((done, done - started, samples))
            else:
                self.errors.append(f"{status}: {answer[:200]!r}")


@dataclass(frozen=True)
class Phase:
    """A phase's figures over its measured window."""

    label: str
    reports: int
    samples: int
    seconds: float
    latencies: list[float]
    errors: list[str]
    client_cpu: float  # the clients' CPU over the phase, as a share of the machine's
    machine_busy: float  # the machine's CPU in use over the phase (clients, server, database, anything else)
    server_cpu_per_report: float  # CPU seconds the web server's processes used, per report answered 200
    answered_samples: int  # in every report answered 200, inside the window or not


def run_clients(agents: list[Agent], client) -> float:
    """Run `client(agent, start)` in a thread per agent, all released at once (`start`: unix time); returns the
    perf_counter time they were released at, once every one has ended."""
    barrier = threading.Barrier(len(agents) + 1)

    def released(agent: Agent) -> None:
        barrier.wait()
        client(agent, time.time())

    threads = [threading.Thread(target=released, args=(agent,), daemon=True) for agent in agents]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return started


def paced(agents, port, path, token, seconds: float, interval: float) -> tuple[Tally, float, float]:
    """Every agent reports the samples it took at 1 Hz since its last report, then waits `interval` s; the first
    reports are spread over one interval, as independent agents' are. Measured once every agent has reported once:
    from the first interval's end to the phase's."""
    tally = Tally()

    def client(agent: Agent, start: float) -> None:
        offset = interval * agents.index(agent) / len(agents)
        next_sample = start - interval + offset  # as if it had been running: its first report carries an interval's
        time.sleep(offset)
        while time.time() < start + seconds:
            now = time.time()
            times = []
            while next_sample <= now:
                times.append(next_sample)
                next_sample += 1.0
            tally.post(port, path, token, agent.report(times), len(times))
            time.sleep(interval)

    started = run_clients(agents, client)
    return tally, started + interval, started + seconds


def flat_out(agents, port, path, token, seconds: float) -> tuple[Tally, float, float]:
    """Every agent posts 2-sample reports back to back, for `seconds`."""
    tally = Tally()

    def client(agent: Agent, start: float) -> None:
        while (now := time.time()) < start + seconds:
            tally.post(port, path, token, agent.report([now - 1, now]), 2)

    started = run_clients(agents, client)
    return tally, started, max(done for done, _, _ in tally.answered) if tally.answered else started + seconds


def catch_up(agents, port, path, token, rounds: int) -> tuple[Tally, float, float]:
    """Every agent posts an hour's buffer in one report, all at once, `rounds` times."""
    tally = Tally()
    buffers = {}
    for agent in agents:  # built before the clock starts: the agent has them ready when the platform is back
        now = time.time()
        hour = [now - MAX_BUFFERED_SAMPLES + i for i in range(MAX_BUFFERED_SAMPLES)]
        buffers[agent.name] = [agent.report([at + r / rounds for at in hour]) for r in range(rounds)]

    def client(agent: Agent, start: float) -> None:
        for body in buffers[agent.name]:
            tally.post(port, path, token, body, MAX_BUFFERED_SAMPLES)

    started = run_clients(agents, client)
    return tally, started, max(done for done, _, _ in tally.answered) if tally.answered else time.perf_counter()


def measure(label: str, phase, server_pid: int, *args) -> Phase:
    """Run a phase; its figures over its window (reports answered within it)."""
    process = psutil.Process()
    before, machine_before, wall_before = process.cpu_times(), psutil.cpu_times(), time.perf_counter()
    server_before = tree_cpu(server_pid)
    tally, window_start, window_end = phase(*args)
    after, machine_after, wall = process.cpu_times(), psutil.cpu_times(), time.perf_counter() - wall_before
    server_after = tree_cpu(server_pid)
    used = (after.user - before.user) + (after.system - before.system)
    server_used = sum(seconds - server_before.get(pid, 0.0) for pid, seconds in server_after.items())
    inside = [(latency, samples) for done, latency, samples in tally.answered if window_start <= done <= window_end]
    return Phase(
        label=label,
        reports=len(inside),
        samples=sum(samples for _, samples in inside),
        seconds=window_end - window_start,
        latencies=[latency for latency, _ in inside],
        errors=tally.errors,
        client_cpu=used / wall / (psutil.cpu_count() or 1),
        machine_busy=busy(machine_before, machine_after),
        server_cpu_per_report=server_used / max(1, len(tally.answered)),
        answered_samples=sum(samples for _, _, samples in tally.answered),
    )


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds a process and each of its descendants has used so far, by pid."""
    root = psutil.Process(pid)
    used = {}
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            used[process.pid] = times.user + times.system
    return used


def busy(before, after) -> float:
    """The share of the machine's CPU time that was not idle between two psutil.cpu_times()."""
    spent = {name: getattr(after, name) - getattr(before, name) for name in after._fields}
    idle = spent["idle"] + spent.get("iowait", 0.0)
    return 1 - idle / sum(spent.values()) if sum(spent.values()) else 0.0


def warm_up(agents: list[Agent], port: int, path: str, token: str, workers: int) -> None:
    """A few reports per server worker first: a worker's first requests load what Django loads lazily."""
    tally = Tally()
    for _ in range(4 * workers):
        for agent in agents[:8]:
            now = time.time()
            tally.post(port, path, token, agent.report([now]), 1)
    if tally.errors:
        raise RuntimeError(f"reports refused while warming up: {tally.errors[:3]}")


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def print_phase(phase: Phase) -> None:
    if not phase.reports:
        print(f"{phase.label:<34} no report answered 200: {phase.errors[:3]}")
        return
    rate = phase.samples / phase.seconds
    print(
        f"{phase.label:<34} {phase.reports:>7} {phase.reports / phase.seconds:>9.1f} {rate:>10,.0f} "
        f"{rate / CLUSTER_SAMPLES_PER_S:>7.1f}x {percentile(phase.latencies, 50) * 1000:>8.1f} "
        f"{percentile(phase.latencies, 95) * 1000:>8.1f} {sum(t > AGENT_TIMEOUT_S for t in phase.latencies):>7} "
        f"{len(phase.errors):>6} {phase.server_cpu_per_report * 1000:>9.1f} {phase.client_cpu:>6.0%} "
        f"{phase.machine_busy:>5.0%}"
    )
    for error in phase.errors[:3]:
        print(f"    {error}")


# --- the series query's plans -------------------------------------------------------------------------------------


def fill(job_id: int, rows: int) -> str:
    """Add about `rows` samples to the job's nodes (a run at 1 Hz up to now, reported every 2 s) and ANALYZE; says
    what the table then holds."""
    from django.db import connection

    from fc2.models import Node

    nodes = Node.objects.filter(job_id=job_id).count()
    seconds = rows // nodes
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO monitor_nodesample (node_id, at, measured_at, cpu_percent, node_cpu_percent, memory_mb,
                                            bytes_sent, bytes_recv)
            SELECT n.id, now() - make_interval(secs => %(s)s - s - s %% 2), now() - make_interval(secs => %(s)s - s),
                   100 + random() * 300, 100 + random() * 300, 600 + random() * 100,
                   s::bigint * 3500000, s::bigint * 3400000
            FROM fc2_node n CROSS JOIN generate_series(1, %(s)s) AS s
            WHERE n.job_id = %(job)s
            """,
            {"s": seconds, "job": job_id},
        )
        cursor.execute("ANALYZE")  # every table: the planner must know how many nodes a job has too
        cursor.execute(
            "SELECT count(*), pg_size_pretty(pg_total_relation_size('monitor_nodesample')) FROM monitor_nodesample"
        )
        total, size = cursor.fetchone()
        cursor.execute(
            "SELECT indexrelid::regclass, pg_size_pretty(pg_relation_size(indexrelid)) FROM pg_index "
            "WHERE indrelid = 'monitor_nodesample'::regclass ORDER BY 1"
        )
        indexes = ", ".join(f"{name} {index_size}" for name, index_size in cursor.fetchall())
    return (
        f"{total:,} samples ({size} with indexes: {indexes}) of {nodes} nodes, {seconds / 3600:.1f} h at 1 Hz, "
        f"added in {time.perf_counter() - started:.0f} s"
    )


def plan(sql: str) -> list[str]:
    """PostgreSQL's plan of `sql`, run (EXPLAIN ANALYZE, BUFFERS)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
        return [line for (line,) in cursor.fetchall()]


def explain(job_id: int, rows: int) -> None:
    """Fill the table and print the plans of the series query, and how long the job page's whole series takes in
    this process: the first load, and a poll for what came in during the last 10 s. Then end the job long ago,
    compact its samples (monitor.retention) and time the first load again."""
    from datetime import timedelta

    from django.utils import timezone

    from fc2.models import Job
    from fc2.services import monitoring
    from monitor import retention
    from monitor.models import NodeSample

    print(f"\n--explain: {fill(job_id, rows)}")
    newest = NodeSample.objects.filter(node__job_id=job_id).latest("at").at
    series_plans(job_id, "first load (no cursor)", None)
    series_plans(job_id, "poll: since = 10 s before the newest", newest - timedelta(seconds=10))

    ended = timezone.now() - timedelta(days=retention.full_days() + 1)
    Job.objects.filter(pk=job_id).update(state=Job.State.SUCCEEDED, finished_at=ended)
    started = time.perf_counter()
    result = monitoring.compact_ended_jobs()
    print(
        f"\ncompacted (the job ended {retention.full_days() + 1} days ago): {result.rows_before:,} samples of "
        f"{result.nodes} nodes to {result.rows_after:,} in {time.perf_counter() - started:.0f} s"
    )
    series_plans(job_id, "first load, compacted", None)


def series_plans(job_id: int, label: str, since) -> None:
    """Time the job page's series (fc2.services.monitoring.job_series) and print the plans of its samples' queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fc2.models import Job
    from fc2.services.monitoring import job_series

    job = Job.objects.get(pk=job_id)
    started = time.perf_counter()
    with CaptureQueriesContext(connection) as queries:
        series = job_series(job, since)
    took = time.perf_counter() - started
    points = sum(len(node["points"]) for node in series["nodes"])
    print(f"\n{label}: job_series {took * 1000:,.0f} ms in all ({points:,} points); its samples' queries:")
    for query in [q["sql"] for q in queries.captured_queries if 'FROM "monitor_nodesample"' in q["sql"]]:
        print(f"  {query}\n" + "\n".join(f"    {line}" for line in plan(query)))


# --- main ----------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64, help="nodes of the job, one client thread each (64)")
    parser.add_argument("--seconds", type=float, default=20, help="length of the paced and flat-out phases (20)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between an agent's reports (2)")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn sync workers (3, as the Dockerfile)")
    parser.add_argument(
        "--conn-max-age",
        type=int,
        default=None,
        help="DB_CONN_MAX_AGE of the server (default: as set here, else the settings' 600)",
    )
    parser.add_argument("--catch-up-rounds", type=int, default=2, help="hour-long buffers each node sends (2)")
    parser.add_argument(
        "--phases",
        type=lambda text: [name for name in text.split(",") if name],
        default=PHASES,
        metavar="P,P,…",
        help=f"which load phases, in order (default: {','.join(PHASES)}; empty: none)",
    )
    parser.add_argument("--explain", action="store_true", help="then print the series query's plans on a full table")
    parser.add_argument("--explain-rows", type=int, default=3_000_000, help="samples in the table for --explain")
    args = parser.parse_args()
    if unknown := set(args.phases) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}: choose from {', '.join(PHASES)}")

    server_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = f"fc2_bench_{os.getpid()}"
    if not dj_database_url.parse(server_url)["ENGINE"].endswith("postgresql"):
        sys.exit(f"error: DATABASE_URL must name a PostgreSQL server, not {server_url}")
    server = None
    # SIGTERM too goes through the cleanup below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench_url = create_database(server_url, name)
    var_dir = Path(tempfile.mkdtemp(prefix="fc2-ingestbench-"))
    try:
        # As served: DEBUG off. The server and the migration take this process's environment.
        served = {"DEBUG": "false", "SECRET_KEY": "report-ingest-benchmark-only", "ALLOWED_HOSTS": "127.0.0.1"}
        if args.conn_max_age is not None:
            served["DB_CONN_MAX_AGE"] = str(args.conn_max_age)
        setup_django(var_dir, database_url=bench_url, **served)
        env = dict(os.environ)
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"], cwd=PROJECT_DIR, env=env, check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        from django.db import connection

        from monitor.models import NodeSample

        job_id, token, names = seed_job(args.nodes)
        port = free_port()
        server, label = start_server(env, port, args.workers, var_dir / "server.log")
        path = f"/api/jobs/{job_id}/report"
        agents = [Agent(n, chief=i == 0) for i, n in enumerate(names)]
        version = ".".join(map(str, connection.get_database_version()))
        print(
            f"PostgreSQL {version}, {label}, DB_CONN_MAX_AGE={env.get('DB_CONN_MAX_AGE', '600')}; job of {args.nodes} "
            f"nodes, a client thread each; {psutil.cpu_count()} CPUs shared by clients, server and database "
            f"(load average {os.getloadavg()[0]:.1f} before)"
        )
        print(
            f"{'phase':<34} {'reports':>7} {'reports/s':>9} {'samples/s':>10} {'÷ 64/s':>8} {'p50 ms':>8} "
            f"{'p95 ms':>8} {f'> {AGENT_TIMEOUT_S:g} s':>7} {'errors':>6} {'server ms':>9} {'client':>6} {'busy':>5}"
        )
        phases = {
            "paced": (f"paced (every {args.interval:g} s, 1 Hz)", paced, (args.seconds, args.interval)),
            "flat-out": ("flat out (2 samples a report)", flat_out, (args.seconds,)),
            "catch-up": (f"catch-up ({MAX_BUFFERED_SAMPLES} samples a report)", catch_up, (args.catch_up_rounds,)),
        }
        warm_up(agents, port, path, token, args.workers)
        already, sent = NodeSample.objects.count(), 0
        for label, phase, extra in (phases[name] for name in args.phases):
            measured = measure(label, phase, server.pid, agents, port, path, token, *extra)
            sent += measured.answered_samples
            print_phase(measured)
        stored = NodeSample.objects.count() - already
        print(
            f"stored {stored:,} samples of the {sent:,} in reports answered 200" + (" (all)" if stored == sent else "")
        )
        stop_server(server)
        if args.explain:
            explain(job_id, args.explain_rows)
    finally:
        if server is not None:
            stop_server(server)
        if "django" in sys.modules:
            from django.db import connections

            connections.close_all()
        drop_database(server_url, name)
        shutil.rmtree(var_dir, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: the server is stopped and the scratch database dropped", file=sys.stderr)
        sys.exit(130)
