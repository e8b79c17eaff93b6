"""The lookup served side by side with Anwar et al.'s original lookup app, under the same load, in one run.

Goal (issue 13, part 4): under gunicorn with 2 workers, `/api/recommend` with `algorithm=lookup` answers at no less
than twice the rate of the original, and at no less than 1/1.5 of the rate of `/api/me`, a trivial authenticated JSON
view of ours.

The original is written here from the paper's description (Anwar et al. 2021 §7.1, Figs. 16–18): a Flask page whose
form POSTs a batch size and a latency; per request one SQLAlchemy `filter_by(batch_size=…, latency=…)` query over an
SQLite table of measured rows, the worker count of the smallest time per epoch rendered into a small HTML page. Its
table holds the rows our platform ships (Anwar's Table 4, recommender/data/anwar2021-table4.csv), so both answer from
the same data. Its code goes into a scratch directory under /tmp, never into the project, and runs from a scratch venv
(`pip install flask sqlalchemy gunicorn`, kept between runs in /tmp/fc2-lookup-speed-venv; `--fresh-venv` rebuilds it).
Beside it, the same gunicorn serves a bare WSGI app that answers "ok": what gunicorn itself costs per answer, the floor
under every other row.

Our platform runs from this checkout under gunicorn with 2 workers on a scratch FC2_VAR_DIR (SQLite; with
`--database-url`, a scratch PostgreSQL database `fc2_lookup_<pid>` made beside that URL's and dropped after): migrate,
setup_platform (the shipped catalogues and records), a researcher account and a session cookie for the authenticated
views, and an API token and a queued job of 3 nodes for the jobs API's `GET /api/jobs/<id>` beside `/api/me` by the
same token (issue 14's figure). wrk (`apt-get install -y wrk`; installed here when run as root) loads each URL at
`--connections` connections for `--seconds` seconds, every URL in turn for `--rounds` rounds, everything on
127.0.0.1. The script prints the
medians of requests/s and latency for each, and the server's CPU time per answer (its gunicorn's processes, master and
workers), then the ratios the goals are about. On a machine that runs other work too, requests/s follow that work;
CPU per answer much less. wrk runs on the same CPUs, and the cheaper a server's answers the more of them it takes to
keep up: the ratios of requests/s understate those of CPU per answer. A row with any non-2xx answer or socket error
fails the run.

Our lookup GET and POSTs are a query asked again and again, as a page or a script polling it asks it: after the first
answer, fc2/answer_cache.py gives Django's answer again without Django's request handling (a POST by session after
DRF's CSRF check, made for each one; a POST by token, as the `fc2` client sends it, without). The row "each one new"
adds a field the recommender ignores, different in every request, so that every answer goes through Django's
middleware and DRF's dispatch (the input's validation and the answer itself are still the ones the view and
recommender.service keep): what an answer not given again costs. The caller's checks (session, user, stamps) are
made once and trusted while the database says nothing they read has changed; the row "N writes/s" commits to the
platform's database, to a table of its own, that many times a second meanwhile (`--writes-per-s`, from a thread of
this script), as the node agents' samples and the jobs' events are committed on a busy platform: on SQLite each
commit has the checks made again in every worker, on PostgreSQL none does (only a change to a table they read).

    .venv/bin/python benchmarks/lookup_speed.py [--seconds 5] [--rounds 3] [--warmup 3] [--connections 4] [--threads 2]
        [--database-url postgres://…] [--conn-max-age SECONDS] [--writes-per-s 100] [--keep] [--fresh-venv]
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
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The scratch PostgreSQL database, a free port, a server's stop and CPU time, as the report benchmark (a script beside
# this one) has them.
from report_ingest import create_database, drop_database, free_port, stop_server, tree_cpu

PROJECT_DIR = Path(__file__).resolve().parent.parent
PLATFORM_BIN = Path(sys.executable).parent  # the project's venv: python, gunicorn
TABLE4 = PROJECT_DIR / "recommender" / "data" / "anwar2021-table4.csv"
ORIGINAL_VENV = Path("/tmp/fc2-lookup-speed-venv")
ORIGINAL_PACKAGES = ("flask", "sqlalchemy", "gunicorn")
WORKLOAD = "anwar2021-mnist"  # the workload setup_platform files Table 4 under
HOST = "127.0.0.1"

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

# What gunicorn costs before any application runs: the floor under every row, the original's and ours.
FLOOR_APP = """\
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
"""

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

# Our side's account and session: printed as JSON by `manage.py shell -c` in the platform's environment.
SESSION_SCRIPT = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from fc2.models import Job, Node
from fc2.services import bundles, datasets, jobs, tokens
user = get_user_model().objects.create_user("bench-researcher", password="{password}")
client = Client(HTTP_HOST="127.0.0.1")
client.force_login(user)
_, token = tokens.create(user, "bench")
with open("{wheel}", "rb") as wheel:
    bundle = bundles.store_bundle(user, wheel, "{wheel_name}")
request = jobs.JobRequest(bundle=bundle, dataset=datasets.resolve(None, "digits"), parameters={{"epochs": "1"}})
job = jobs.submit(user, request, driver=Job.Driver.INLINE)
for index, (name, role) in enumerate([("chief-0", "chief"), ("worker-0", "worker"), ("worker-1", "worker")]):
    Node.objects.create(job=job, name=name, role=role, index=max(0, index - 1), instance_type="c4.xlarge")
print(json.dumps({{"sessionid": client.cookies["sessionid"].value, "token": token, "job": job.pk}}))
"""
EXAMPLE_WHEEL = PROJECT_DIR / "examples" / "dist" / "fc2_digits_cnn-0.1.0-py3-none-any.whl"

# wrk's request for one row: method, body and headers (cookies, CSRF) through its Lua hook.
WRK_SCRIPT = """
wrk.method = {method}
wrk.body = {body}
wrk.headers = {{{headers}}}
"""
# For a row whose every request must be new to the server: a field the recommender ignores, counted up, makes each
# query string one it has not answered before (fc2/answer_cache.py keys its answers by the query string).
WRK_EACH_NEW = """
local sent = 0
request = function()
    sent = sent + 1
    return wrk.format(nil, {path} .. "&nonce=" .. sent .. "-" .. math.random(1e9))
end
"""


@dataclass(frozen=True)
class Target:
    label: str  # the row's name in the table
    url: str
    method: str = "GET"
    body: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    expect: str = ""  # a string every answer must contain (checked once before the load)
    server: str = "ours"  # which gunicorn serves it: "ours", "original" or "floor"
    each_new: bool = False  # every request's query string one the server has not seen (WRK_EACH_NEW)
    written: bool = False  # the platform's database written meanwhile, --writes-per-s times a second (`writes`)


@dataclass(frozen=True)
class Measured:
    requests_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    requests: int
    server_cpu_ms: float  # CPU time of the server's processes per answer, whatever else the machine runs
    writes_per_s: float  # commits to our database a second meanwhile (`writes`)


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
    folder.mkdir()
    (folder / "app.py").write_text(ORIGINAL_APP)
    (folder / "floor.py").write_text(FLOOR_APP)
    (folder / "templates").mkdir()
    (folder / "templates" / "index.html").write_text(ORIGINAL_PAGE)
    database = folder / "lookup.sqlite3"
    with contextlib.closing(sqlite3.connect(database)) as db, db:
        db.execute(
            "CREATE TABLE records (id INTEGER PRIMARY KEY, workers INTEGER NOT NULL, batch_size INTEGER NOT NULL, "
            "latency INTEGER NOT NULL, time_per_epoch FLOAT)"
        )
        db.executemany(
            "INSERT INTO records (workers, batch_size, latency, time_per_epoch) VALUES (?, ?, ?, ?)", table4_rows()
        )
    return folder


def platform_env(var_dir: Path, database_url: str | None, conn_max_age: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(
        FC2_VAR_DIR=str(var_dir),
        DEBUG="0",  # as deployed: DEBUG off, so no query log and no debug pages
        SECRET_KEY=secrets.token_urlsafe(32),
        SECURE_COOKIES="false",  # plain HTTP on 127.0.0.1
        ALLOWED_HOSTS=HOST,
        LOG_LEVEL="WARNING",
        PYTHONWARNINGS="ignore",
    )
    if database_url:
        env["DATABASE_URL"] = database_url
    if conn_max_age is not None:
        env["DB_CONN_MAX_AGE"] = str(conn_max_age)
    else:
        env.pop("DB_CONN_MAX_AGE", None)  # as deployed: the settings' default
    return env


def prepare_platform(env: dict[str, str], var_dir: Path) -> dict:
    """Migrate, load the shipped data, collect the static files, make the researcher with a session, an API token and
    a job of 3 nodes (the example wheel on digits); {"sessionid", "token", "job"}."""
    manage = [str(PLATFORM_BIN / "python"), str(PROJECT_DIR / "manage.py")]

    def run(*args: str) -> str:
        done = subprocess.run([*manage, *args], env=env, cwd=PROJECT_DIR, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    run("migrate", "--noinput", "-v0")
    run("setup_platform", "--no-demo-accounts")
    run("collectstatic", "--noinput", "-v0")  # with DEBUG off, the pages need the static files' manifest
    script = SESSION_SCRIPT.format(
        password=secrets.token_urlsafe(16), wheel=EXAMPLE_WHEEL, wheel_name=EXAMPLE_WHEEL.name
    )
    return json.loads(run("shell", "-c", script).strip().splitlines()[-1])


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
    request = urllib.request.Request(
        target.url,
        data=target.body.encode() if target.body else None,
        method=target.method,
        headers=dict(target.headers),
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        sys.exit(f"{target.label}: {target.method} {target.url} answered {exc.code}: {exc.read()[:500]!r}")


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def connect_to(database_url: str | None, scratch: Path) -> Callable[[], contextlib.closing]:
    """How `writes` connects to the platform's database (autocommit): its scratch PostgreSQL database, or its SQLite
    file."""
    if database_url:

        def postgresql():
            import psycopg2

            db = psycopg2.connect(database_url)
            db.autocommit = True
            return contextlib.closing(db)

        return postgresql
    return lambda: contextlib.closing(sqlite3.connect(scratch / "var" / "db.sqlite3", timeout=30, isolation_level=None))


@contextlib.contextmanager
def writes(connect: Callable[[], contextlib.closing], per_s: float):
    """A commit to the platform's database `per_s` times a second meanwhile (to a table of its own), as a busy
    platform's other processes commit theirs (the node agents' samples, a job's events). On SQLite each one makes the
    answer cache's checks again in every process; on PostgreSQL only a change to a table the checks read does. Yields
    a list that holds, on the way out, the commits made a second (fewer than asked when a commit takes longer)."""
    stop, failed = threading.Event(), []
    made = 0

    def write() -> None:
        nonlocal made
        try:
            with connect() as db:
                cursor = db.cursor()
                cursor.execute("CREATE TABLE IF NOT EXISTS lookup_speed_writes (n INTEGER)")
                start = time.monotonic()
                while not stop.wait(max(0.0, start + (made + 1) / per_s - time.monotonic())):
                    cursor.execute("INSERT INTO lookup_speed_writes (n) VALUES (1)")
                    made += 1
        except BaseException as error:
            failed.append(error)

    rate = []
    writer = threading.Thread(target=write, daemon=True)
    began = time.monotonic()
    writer.start()
    try:
        yield rate
    finally:
        stop.set()
        writer.join()
        rate.append(made / (time.monotonic() - began))
    if failed:
        raise failed[0]


def load(wrk: str, target: Target, args, scratch: Path, seconds: int, server_pid: int) -> Measured:
    script = scratch / f"wrk-{re.sub(r'[^a-z0-9]+', '-', target.label.lower())}.lua"
    headers = ", ".join(f"[{json.dumps(k)}] = {json.dumps(v)}" for k, v in target.headers)
    lua = WRK_SCRIPT.format(method=json.dumps(target.method), body=json.dumps(target.body), headers=headers)
    if target.each_new:
        url = urllib.parse.urlsplit(target.url)
        lua += WRK_EACH_NEW.format(path=json.dumps(f"{url.path}?{url.query}"))
    script.write_text(lua)
    command = [
        wrk,
        f"-t{args.threads}",
        f"-c{args.connections}",
        f"-d{seconds}s",
        "--latency",
        "-s",
        str(script),
        target.url,
    ]
    writing = writes(connect_to(args.scratch_database_url, scratch), args.writes_per_s)
    with writing if target.written else contextlib.nullcontext([0.0]) as written:
        before = tree_cpu(server_pid)
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        after = tree_cpu(server_pid)
    failures = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    if failures or (errors and re.search(r"[1-9]", errors.group(1))):
        sys.exit(f"{target.label}: failed answers under load:\n{out}")
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    cpu_s = sum(used - before.get(pid, 0.0) for pid, used in after.items())
    return Measured(
        requests_per_s=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        latency_p50_ms=_ms(re.search(r"\s50%\s+(\S+)", out).group(1)),
        latency_p99_ms=_ms(re.search(r"\s99%\s+(\S+)", out).group(1)),
        requests=requests,
        server_cpu_ms=cpu_s * 1000 / requests,
        writes_per_s=written[-1],
    )


def median_run(runs: list[Measured]) -> Measured:
    """Each figure's median over the rounds."""
    return Measured(*(statistics.median(getattr(m, name) for m in runs) for name in Measured.__dataclass_fields__))


def targets(original_port: int, floor_port: int, platform_port: int, researcher: dict, args) -> list[Target]:
    base = f"http://{HOST}:{platform_port}"
    csrf = secrets.token_hex(16)  # any 32-character secret: Django compares the header with the cookie
    cookie = (("Cookie", f"sessionid={researcher['sessionid']}; csrftoken={csrf}"),)
    token = (("Authorization", f"Token {researcher['token']}"),)
    lookup = {"algorithm": "lookup", "workload": WORKLOAD, "batch_size": 6400, "latency_ms": 0}
    query = "&".join(f"{k}={v}" for k, v in lookup.items())
    json_post = (*cookie, ("X-CSRFToken", csrf), ("Content-Type", "application/json"))
    form = "application/x-www-form-urlencoded"
    return [
        Target(
            "original lookup (Flask form POST)",
            f"http://{HOST}:{original_port}/",
            "POST",
            "batch_size=6400&latency=0",
            (("Content-Type", form),),
            expect="Recommended Machines 4",
            server="original",
        ),
        Target("gunicorn alone (a bare WSGI app)", f"http://{HOST}:{floor_port}/", expect="ok", server="floor"),
        Target("our /healthz", f"{base}/healthz", expect='"ok": true'),
        Target("our /api/me (session)", f"{base}/api/me", headers=cookie, expect="bench-researcher"),
        Target("our /api/me (token)", f"{base}/api/me", headers=token, expect="bench-researcher"),
        Target(
            "our GET /api/jobs/<id> (token)", f"{base}/api/jobs/{researcher['job']}", headers=token, expect="chief-0"
        ),
        Target(
            "our /api/recommend lookup POST",
            f"{base}/api/recommend",
            "POST",
            json.dumps(lookup),
            json_post,
            expect='"workers":4',
        ),
        Target(
            "our /api/recommend lookup POST (token)",
            f"{base}/api/recommend",
            "POST",
            json.dumps(lookup),
            (*token, ("Content-Type", "application/json")),
            expect='"workers":4',
        ),
        Target("our /api/recommend lookup GET", f"{base}/api/recommend?{query}", headers=cookie, expect='"workers":4'),
        *(
            [
                Target(
                    f"our lookup GET, {args.writes_per_s:g} writes/s",
                    f"{base}/api/recommend?{query}",
                    headers=cookie,
                    expect='"workers":4',
                    written=True,
                )
            ]
            if args.writes_per_s
            else []
        ),
        Target(  # what the first answer to a query costs, through Django's whole path
            "our lookup GET, each one new",
            f"{base}/api/recommend?{query}",
            headers=cookie,
            expect='"workers":4',
            each_new=True,
        ),
        Target(  # no record at 10 ms: the performance model answers
            "our /api/recommend predicted GET",
            f"{base}/api/recommend?{query.replace('latency_ms=0', 'latency_ms=10')}",
            headers=cookie,
            expect='"source":"predicted"',
        ),
        Target(
            "our recommender page (lookup)",
            f"{base}/recommender/?workload={WORKLOAD}&batch_size=6400&latency_ms=0",
            headers=cookie,
            expect="4",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="wrk's duration for each URL in each round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every URL in turn; medians are printed")
    parser.add_argument("--warmup", type=int, default=3, help="seconds of load before each row's, not counted")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="wrk's threads")
    parser.add_argument("--database-url", help="our platform on this database (default: SQLite in the scratch dir)")
    parser.add_argument(
        "--conn-max-age", type=int, help="our DB_CONN_MAX_AGE (default: the settings' own, connections kept 600 s)"
    )
    parser.add_argument(
        "--writes-per-s",
        type=float,
        default=100,
        help="commits a second to our database (to a table of the benchmark's) during the row that measures the lookup "
        "GET under writes (0: no such row)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--fresh-venv", action="store_true", help="rebuild the original's venv")
    args = parser.parse_args()
    if args.writes_per_s < 0:
        parser.error("--writes-per-s must be 0 or more")

    wrk = ensure_wrk()
    venv = ensure_original_venv(args.fresh_venv)
    scratch = Path(tempfile.mkdtemp(prefix="fc2-lookup-speed-"))
    scratch_db = f"fc2_lookup_{os.getpid()}"
    database_url = create_database(args.database_url, scratch_db) if args.database_url else None
    args.scratch_database_url = database_url  # (where `writes` writes)
    try:
        original_dir = write_original(scratch)
        var_dir = scratch / "var"
        env = platform_env(var_dir, database_url, args.conn_max_age)
        researcher = prepare_platform(env, var_dir)
        original_env = {"PATH": os.environ.get("PATH", ""), "LOOKUP_DB": str(original_dir / "lookup.sqlite3")}
        original_port, floor_port, platform_port = free_port(), free_port(), free_port()
        with (
            gunicorn("the original", venv / "bin" / "gunicorn", "app:app", original_port, original_dir, original_env,
                     scratch / "original.log") as original_server,
            gunicorn("the bare WSGI app", venv / "bin" / "gunicorn", "floor:app", floor_port, original_dir,
                     original_env, scratch / "floor.log") as floor,
            gunicorn("our platform", PLATFORM_BIN / "gunicorn", "fc2.wsgi:application", platform_port, PROJECT_DIR, env,
                     scratch / "platform.log") as platform,
        ):  # fmt: skip
            rows = targets(original_port, floor_port, platform_port, researcher, args)
            for target in rows:
                answer = fetch(target)
                if target.expect not in answer:
                    sys.exit(f"{target.label}: the answer lacks {target.expect!r}:\n{answer[:1000]}")
            database = "PostgreSQL" if args.database_url else "SQLite"
            kept = "the settings' default" if args.conn_max_age is None else args.conn_max_age
            print(
                f"wrk -t{args.threads} -c{args.connections} -d{args.seconds}s per row and round; "
                "gunicorn 2 sync workers each; "
                f"our platform on {database}, DB_CONN_MAX_AGE={kept}; "
                f"{os.cpu_count()} CPUs",
                flush=True,
            )
            print(
                f"median of {args.rounds} rounds; server CPU: the server's processes' CPU time per answer, whatever "
                "else the machine runs",
                flush=True,
            )
            print(
                f"{'':<40} {'req/s':>8} {'req/s range':>11} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/ans':>11}", flush=True
            )

            def pid_of(target: Target) -> int:
                return {"original": original_server, "floor": floor, "ours": platform}[target.server].pid

            for target in rows:  # every worker's first answers import the views and load what later ones reuse
                load(wrk, target, args, scratch, args.warmup, pid_of(target))
            runs: dict[str, list[Measured]] = {target.label: [] for target in rows}
            for _ in range(args.rounds):  # in turns, so that a burst of other work on the machine hits every row
                for target in rows:
                    runs[target.label].append(load(wrk, target, args, scratch, args.seconds, pid_of(target)))
        results = {label: median_run(measured) for label, measured in runs.items()}
        for label, result in results.items():
            rates = sorted(m.requests_per_s for m in runs[label])
            print(
                f"{label:<40} {result.requests_per_s:8.0f} {f'{rates[0]:.0f}–{rates[-1]:.0f}':>11} "
                f"{result.latency_p50_ms:7.2f} {result.latency_p99_ms:7.2f} {result.server_cpu_ms:11.3f}",
                flush=True,
            )
        original, me = results[rows[0].label], results["our /api/me (session)"]
        print()
        compared = [r.label for r in rows if r.label.startswith(("our /api/recommend lookup", "our lookup GET"))]
        for label in compared:
            ours = results[label]
            versus_original = ours.requests_per_s / original.requests_per_s
            versus_me = me.requests_per_s / ours.requests_per_s
            print(
                f"{label}: {versus_original:.2f}× the original's rate (goal ≥ 2: "
                f"{'met' if versus_original >= 2 else 'NOT met'}); /api/me answers {versus_me:.2f}× its rate "
                f"(goal ≤ 1.5: {'met' if versus_me <= 1.5 else 'NOT met'}); server CPU per answer "
                f"{ours.server_cpu_ms / original.server_cpu_ms:.2f}× the original's, "
                f"{ours.server_cpu_ms / me.server_cpu_ms:.2f}× /api/me's; the server kept "
                f"{ours.requests_per_s * ours.server_cpu_ms / 1000:.2f} CPUs busy (the original's "
                f"{original.requests_per_s * original.server_cpu_ms / 1000:.2f}), wrk the rest"
            )
        for label in (r.label for r in rows if r.written):
            print(f"{label}: {results[label].writes_per_s:.0f} commits a second reached")
        healthz, bare = results["our /healthz"], results["gunicorn alone (a bare WSGI app)"]
        print(
            f"our /healthz (one SELECT 1, no session, no DRF): {healthz.requests_per_s / original.requests_per_s:.2f}× "
            "the original's rate: what our cheapest view that reads the database reaches on this machine"
        )
        print(
            f"gunicorn alone: {bare.requests_per_s / original.requests_per_s:.2f}× the original's rate, "
            f"{bare.server_cpu_ms:.3f} ms of server CPU per answer before any application code runs; twice the "
            f"original's rate leaves {original.server_cpu_ms / 2:.3f} ms per answer in all, "
            f"{original.server_cpu_ms / 2 - bare.server_cpu_ms:.3f} ms for the application"
        )
        job, trivial = results["our GET /api/jobs/<id> (token)"], results["our /api/me (token)"]
        print(
            f"GET /api/jobs/<id> with a token (issue 14): {job.requests_per_s:.0f} req/s, /api/me with a token "
            f"{trivial.requests_per_s:.0f} ({trivial.requests_per_s / job.requests_per_s:.2f}× it); server CPU per "
            f"answer {job.server_cpu_ms:.2f} ms against {trivial.server_cpu_ms:.2f} ms"
        )
    finally:
        if database_url:
            drop_database(args.database_url, scratch_db)
        if args.keep:
            print(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
