"""How fast Django answers the recommender's lookup, beside `GET /api/me`, in one short run.

Targets (issue 28, part 1): under gunicorn with 2 sync workers and wrk at 4 connections, with the same API token,
`GET /api/recommend?algorithm=lookup&…` answers at ≥ 0.67× the rate of `GET /api/me` for a cell Table 4 measured
(batch 6400, 0 ms) and at ≥ 0.5× for a cell the performance model predicts (batch 6400, 10 ms). Both go through
Django's whole path: middleware, DRF's token authentication, the input's validation (kept per input by
recommender.api), and recommender.service, whose memo gives an answer again for FC2_RECOMMEND_MEMO_S seconds. The
server's CPU time per answer (gunicorn's master and workers) is printed too: it follows other work on the machine
much less than the rates do.

For reference only, not a target: Anwar et al.'s original lookup app, written here from the paper's description
(§7.1, Figs. 16–18) — a Flask form POST, one SQLAlchemy query over the same Table 4 rows, a small HTML page, and no
credentials checked. Its code goes into a scratch directory under /tmp and runs from a scratch venv (`pip install
flask sqlalchemy gunicorn`, kept in /tmp/fc2-lookup-speed-venv; `--fresh-venv` rebuilds it).

Our platform runs from this checkout on a scratch FC2_VAR_DIR (SQLite; with `--database-url`, a scratch PostgreSQL
database made beside that URL's and dropped after): migrate, setup_platform (the shipped catalogues and Table 4 as
workload anwar2021-mnist), one user and API token. wrk (`apt-get install -y wrk`; installed here when run as root)
loads each URL for `--seconds` seconds, every URL in turn for `--rounds` rounds, on 127.0.0.1; the medians are
printed. wrk shares the machine's CPUs with the servers, so rates follow whatever else runs; the ratios, measured
side by side, much less. A row with any non-2xx answer or socket error fails the run.

    .venv/bin/python benchmarks/lookup_speed.py [--seconds 2] [--rounds 3] [--connections 4]
        [--database-url postgres://…] [--fresh-venv]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import secrets
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# The scratch PostgreSQL database, a free port, a server's stop and CPU time, as the report benchmark has them.
from report_ingest import create_database, drop_database, free_port, stop_server, tree_cpu

PROJECT_DIR = Path(__file__).resolve().parent.parent
PLATFORM_BIN = Path(sys.executable).parent  # the project's venv: python, gunicorn
TABLE4 = PROJECT_DIR / "recommender" / "data" / "anwar2021-table4.csv"
ORIGINAL_VENV = Path("/tmp/fc2-lookup-speed-venv")
ORIGINAL_PACKAGES = ("flask", "sqlalchemy", "gunicorn")
WORKLOAD = "anwar2021-mnist"  # the workload setup_platform files Table 4 under
HOST = "127.0.0.1"
MEASURED_TARGET, PREDICTED_TARGET = 0.67, 0.5  # × the rate of /api/me

# The original, as Anwar et al. §7.1 describes it: "When a user enters latency and Batch Size, our model simply looks
# for all the rows in the database having that latency and batch size, then it filters it by minimum Time per epoch and
# returns the respective number of workers". The form's options are fixed when the app starts (Fig. 16's drop-downs);
# each request runs one query.
ORIGINAL_APP = '''\
"""Anwar et al. 2021's lookup app, rewritten from the paper's description (scratch copy for a benchmark)."""

import os

from flask import Flask, render_template, request
from sqlalchemy import Column, Float, Integer, create_engine, select
from sqlalchemy.orm import declarative_base, sessionmaker

engine = create_engine("sqlite:///" + os.environ["LOOKUP_DB"])
Session = sessionmaker(bind=engine)
Base = declarative_base()


class Record(Base):
    __tablename__ = "records"
    id = Column(Integer, primary_key=True)
    workers = Column(Integer, nullable=False)
    batch_size = Column(Integer, nullable=False)
    latency = Column(Integer, nullable=False)
    time_per_epoch = Column(Float)  # empty: the run failed


with Session() as session:
    BATCH_SIZES = sorted(set(session.scalars(select(Record.batch_size))))
    LATENCIES = sorted(set(session.scalars(select(Record.latency))))

app = Flask(__name__)


@app.route("/", methods=["GET", "POST"])
def index():
    batch_size = latency = machines = None
    if request.method == "POST":
        batch_size = int(request.form["batch_size"])
        latency = int(request.form["latency"])
        with Session() as session:
            rows = session.query(Record).filter_by(batch_size=batch_size, latency=latency).all()
        timed = [row for row in rows if row.time_per_epoch is not None]
        if timed:
            machines = min(timed, key=lambda row: row.time_per_epoch).workers
    options = {"batch_sizes": BATCH_SIZES, "latencies": LATENCIES}
    return render_template("index.html", **options, batch_size=batch_size, latency=latency, machines=machines)
'''

ORIGINAL_PAGE = """<!doctype html>
<html><head><title>Recommendation System for Fast Distributed Deep Learning on Cloud</title></head>
<body>
<h1>Recommendation System for Fast Distributed Deep Learning on Cloud</h1>
<p>A recommendation system that provides optimal cluster size for minimal training time.</p>
<form method="post">
<p>Please Enter the Following Data</p>
<label>Batch Size Options <select name="batch_size">{% for b in batch_sizes %}
<option{% if b == batch_size %} selected{% endif %}>{{ b }}</option>{% endfor %}
</select></label>
<label>Latency Options <select name="latency">{% for l in latencies %}
<option{% if l == latency %} selected{% endif %}>{{ l }}</option>{% endfor %}
</select></label>
<button type="submit">Submit</button>
</form>
{% if machines %}<p>Recommended Machines {{ machines }}</p>{% endif %}
</body></html>
"""

# Our side's user and API token: printed as JSON by `manage.py shell -c` in the platform's environment.
TOKEN_SCRIPT = """
import json
from django.contrib.auth import get_user_model
from fc2.services import tokens
user = get_user_model().objects.create_user("bench-researcher", password="{password}")
print(json.dumps({{"token": tokens.create(user, "bench")[1]}}))
"""

# wrk's request for one row: method, body and headers, through its Lua hook.
WRK_SCRIPT = """
wrk.method = {method}
wrk.body = {body}
wrk.headers = {{{headers}}}
"""


@dataclass(frozen=True)
class Target:
    label: str  # the row's name in the table
    url: str
    expect: str  # a string every answer must contain (checked once before the load)
    method: str = "GET"
    body: str = ""
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Measured:
    requests_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    server_cpu_ms: float  # CPU time of the server's processes per answer, whatever else the machine runs


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk is missing: apt-get install -y wrk", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=False, stdout=subprocess.DEVNULL)
        found = shutil.which("wrk")
        if found:
            return found
    sys.exit("wrk is needed: `apt-get install -y wrk` (Debian/Ubuntu) or build it from https://github.com/wg/wrk")


def ensure_original_venv(fresh: bool) -> Path:
    """The original's venv (Flask, SQLAlchemy, gunicorn), kept between runs."""
    python = ORIGINAL_VENV / "bin" / "python"
    if fresh:
        shutil.rmtree(ORIGINAL_VENV, ignore_errors=True)
    check = [str(python), "-c", "import flask, sqlalchemy, gunicorn"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return ORIGINAL_VENV
    print(f"making the original's venv in {ORIGINAL_VENV}: pip install {' '.join(ORIGINAL_PACKAGES)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(ORIGINAL_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *ORIGINAL_PACKAGES], check=True)
    subprocess.run(check, check=True)
    return ORIGINAL_VENV


def table4_rows() -> list[tuple[int, int, int, float | None]]:
    """(workers, batch_size, latency_ms, epoch_time_s) of the shipped Table 4 file, failed runs with no time."""
    rows = []
    with TABLE4.open() as handle:
        for fields in csv.reader(line for line in handle if line.strip() and not line.startswith("#")):
            workers, batch_size, latency, _, epoch_time, _ = fields
            rows.append((int(workers), int(batch_size), int(float(latency)), float(epoch_time) if epoch_time else None))
    return rows


def write_original(scratch: Path) -> Path:
    folder = scratch / "original"
    (folder / "templates").mkdir(parents=True)
    (folder / "app.py").write_text(ORIGINAL_APP)
    (folder / "templates" / "index.html").write_text(ORIGINAL_PAGE)
    with contextlib.closing(sqlite3.connect(folder / "lookup.sqlite3")) as db, db:
        db.execute(
            "CREATE TABLE records (id INTEGER PRIMARY KEY, workers INTEGER NOT NULL, batch_size INTEGER NOT NULL, "
            "latency INTEGER NOT NULL, time_per_epoch FLOAT)"
        )
        db.executemany(
            "INSERT INTO records (workers, batch_size, latency, time_per_epoch) VALUES (?, ?, ?, ?)", table4_rows()
        )
    return folder


def platform_env(var_dir: Path, database_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(
        FC2_VAR_DIR=str(var_dir),
        DEBUG="0",  # as deployed: no query log, no debug pages
        SECRET_KEY=secrets.token_urlsafe(32),
        SECURE_COOKIES="false",  # plain HTTP on 127.0.0.1
        ALLOWED_HOSTS=HOST,
        LOG_LEVEL="WARNING",
        PYTHONWARNINGS="ignore",
    )
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


def prepare_platform(env: dict[str, str]) -> str:
    """Migrate, load the shipped data, make a user; its API token."""
    manage = [str(PLATFORM_BIN / "python"), str(PROJECT_DIR / "manage.py")]

    def run(*args: str) -> str:
        done = subprocess.run([*manage, *args], env=env, cwd=PROJECT_DIR, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    run("migrate", "--noinput", "-v0")
    run("setup_platform", "--no-demo-accounts")
    script = TOKEN_SCRIPT.format(password=secrets.token_urlsafe(16))
    return json.loads(run("shell", "-c", script).strip().splitlines()[-1])["token"]


@contextlib.contextmanager
def gunicorn(label: str, binary: Path, app: str, port: int, cwd: Path, env: dict[str, str], log: Path):
    """A gunicorn with 2 sync workers on 127.0.0.1:port, stopped (its process group) on the way out."""
    command = [str(binary), app, "--bind", f"{HOST}:{port}", "--workers", "2", "--log-level", "warning"]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{label} did not start; its log ({log}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield process
    finally:
        stop_server(process)


def fetch(target: Target) -> str:
    """One request as wrk will send it: the answer's text (a non-2xx answer fails the run)."""
    data = target.body.encode() if target.body else None
    request = urllib.request.Request(target.url, data=data, method=target.method, headers=dict(target.headers))
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        sys.exit(f"{target.label}: {target.method} {target.url} answered {exc.code}: {exc.read()[:500]!r}")


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def load(wrk: str, target: Target, args, scratch: Path, seconds: int, server_pid: int) -> Measured:
    script = scratch / f"wrk-{re.sub(r'[^a-z0-9]+', '-', target.label.lower())}.lua"
    headers = ", ".join(f"[{json.dumps(k)}] = {json.dumps(v)}" for k, v in target.headers)
    script.write_text(
        WRK_SCRIPT.format(method=json.dumps(target.method), body=json.dumps(target.body), headers=headers)
    )
    command = [wrk, "-t2", f"-c{args.connections}", f"-d{seconds}s", "--latency", "-s", str(script), target.url]
    before = tree_cpu(server_pid)
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    after = tree_cpu(server_pid)
    errors = re.search(r"Socket errors: (.*)", out)
    if "Non-2xx" in out or (errors and re.search(r"[1-9]", errors.group(1))):
        sys.exit(f"{target.label}: failed answers under load:\n{out}")
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return Measured(
        requests_per_s=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        latency_p50_ms=_ms(re.search(r"\s50%\s+(\S+)", out).group(1)),
        latency_p99_ms=_ms(re.search(r"\s99%\s+(\S+)", out).group(1)),
        server_cpu_ms=sum(used - before.get(pid, 0.0) for pid, used in after.items()) * 1000 / requests,
    )


def targets(original_port: int, platform_port: int, token: str) -> list[Target]:
    base = f"http://{HOST}:{platform_port}"
    auth = (("Authorization", f"Token {token}"),)
    lookup = f"{base}/api/recommend?algorithm=lookup&workload={WORKLOAD}&batch_size=6400"
    form = (("Content-Type", "application/x-www-form-urlencoded"),)
    return [
        Target(
            "original lookup (Flask, no auth)",
            f"http://{HOST}:{original_port}/",
            "Recommended Machines 4",
            "POST",
            "batch_size=6400&latency=0",
            form,
        ),
        Target("GET /api/me", f"{base}/api/me", "bench-researcher", headers=auth),
        Target("lookup, measured cell", f"{lookup}&latency_ms=0", '"source":"measured"', headers=auth),
        Target("lookup, predicted cell", f"{lookup}&latency_ms=10", '"source":"predicted"', headers=auth),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=2, help="wrk's duration for each URL in each round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every URL in turn; medians are printed")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--database-url", help="our platform on this database (default: SQLite in the scratch dir)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--fresh-venv", action="store_true", help="rebuild the original's venv")
    args = parser.parse_args()

    wrk = ensure_wrk()
    venv = ensure_original_venv(args.fresh_venv)
    scratch = Path(tempfile.mkdtemp(prefix="fc2-lookup-speed-"))
    scratch_db = f"fc2_lookup_{os.getpid()}"
    database_url = create_database(args.database_url, scratch_db) if args.database_url else None
    try:
        original_dir = write_original(scratch)
        env = platform_env(scratch / "var", database_url)
        token = prepare_platform(env)
        original_env = {"PATH": os.environ.get("PATH", ""), "LOOKUP_DB": str(original_dir / "lookup.sqlite3")}
        original_port, platform_port = free_port(), free_port()
        with (
            gunicorn("the original", venv / "bin" / "gunicorn", "app:app", original_port, original_dir, original_env,
                     scratch / "original.log") as original,
            gunicorn("our platform", PLATFORM_BIN / "gunicorn", "fc2.wsgi:application", platform_port, PROJECT_DIR, env,
                     scratch / "platform.log") as platform,
        ):  # fmt: skip
            rows = targets(original_port, platform_port, token)
            for target in rows:
                answer = fetch(target)
                if target.expect not in answer:
                    sys.exit(f"{target.label}: the answer lacks {target.expect!r}:\n{answer[:1000]}")

            def pid_of(target: Target) -> int:
                return (original if target.label.startswith("original") else platform).pid

            for target in rows:  # every worker's first answers import the views and load what later ones reuse
                load(wrk, target, args, scratch, 1, pid_of(target))
            runs: dict[str, list[Measured]] = {target.label: [] for target in rows}
            for _ in range(args.rounds):  # in turns, so that a burst of other work on the machine hits every row
                for target in rows:
                    runs[target.label].append(load(wrk, target, args, scratch, args.seconds, pid_of(target)))
        database = "PostgreSQL" if args.database_url else "SQLite"
        print(
            f"wrk -t2 -c{args.connections} -d{args.seconds}s per URL and round, median of {args.rounds} rounds; "
            f"gunicorn 2 sync workers; our platform on {database}, token auth; {os.cpu_count()} CPUs"
        )
        columns = f"{'req/s':>7} {'range':>11} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/ans':>10} {'× /api/me':>10}"
        print(f"{'':<34} {columns}  target")
        me = statistics.median(m.requests_per_s for m in runs["GET /api/me"])
        goals = {"lookup, measured cell": MEASURED_TARGET, "lookup, predicted cell": PREDICTED_TARGET}
        missed = []
        for label, measured in runs.items():
            rates = sorted(m.requests_per_s for m in measured)
            rate = statistics.median(rates)
            p50, p99, cpu = (
                statistics.median(getattr(m, name) for m in measured)
                for name in ("latency_p50_ms", "latency_p99_ms", "server_cpu_ms")
            )
            goal = goals.get(label)
            verdict = "" if goal is None else f"≥ {goal:.2f}: {'met' if rate / me >= goal else 'NOT met'}"
            if goal is not None and rate / me < goal:
                missed.append(label)
            print(
                f"{label:<34} {rate:7.0f} {f'{rates[0]:.0f}–{rates[-1]:.0f}':>11} {p50:7.2f} {p99:7.2f} {cpu:10.3f} "
                f"{rate / me:9.2f}×  {verdict or ('reference' if label.startswith('original') else '')}"
            )
        if missed:
            sys.exit(f"target missed: {', '.join(missed)}")
    finally:
        if database_url:
            drop_database(args.database_url, scratch_db)
        if args.keep:
            print(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
