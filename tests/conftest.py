"""Shared fixtures: isolated storage, the example wheel built for real, users alice/bob and their first rows."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime
from io import StringIO
from pathlib import Path
from urllib.parse import quote, urlsplit

import psutil
import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.db import connection
from django.test.testcases import QuietWSGIRequestHandler
from django.utils import timezone

import provisioner
from fc2.models import Job, JobEvent, Node
from fc2.services import datasets, inline, jobs, sweep
from fc2.services.bundles import store_bundle
from harness.ec2lab import LOGIN_USER, REGION, Ec2Lab, MotoServer, free_vpc_cidr
from harness.wheels import GOOD, make_wheel
from provisioner import ClusterInfo, ClusterSpec, aws, local
from recommender import service
from recommender.catalog import load_catalog

PROJECT_DIR = Path(__file__).resolve().parent.parent


# The live server stands in for gunicorn (Dockerfile: --timeout 120), which gives up on a client gone silent in the
# middle of a request; Django's test server would wait on it, and hold the request thread's database connection, for
# ever (a lab node torn down while it sends its report leaves no FIN and no RST).
QuietWSGIRequestHandler.timeout = 20
SESSIONS_GONE_WITHIN_S = 2 * QuietWSGIRequestHandler.timeout


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases; before it drops them, every other session on them has ended. A thread that
    ran a query and ended leaves its connection open until the garbage collector frees it (Django's connection
    wrapper is a reference cycle): the heavy tests' database could not be dropped for one such session ("idle", its
    last query a job's SELECT). A request thread of the live server may take the handler's timeout. Sessions still
    there after that are a leak, named in the error with this process's threads."""
    yield
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + SESSIONS_GONE_WITHIN_S
    with django_db_blocker.unblock():
        while True:
            gc.collect()  # the connections of ended threads
            if not (others := _other_sessions()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"sessions still on the test database {SESSIONS_GONE_WITHIN_S} s after the tests: {others}\n"
                    + _threads()
                )
            time.sleep(0.5)
        connection.close()


def _threads() -> str:
    """This process's other threads and where each is: one of them may hold the session."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(
        f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
        if ident != threading.get_ident()
    )


def _other_sessions() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, client_port, backend_start, state_change, state, left(query, 120) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchall()


@pytest.fixture
def runtime_dir(tmp_path) -> Path:
    """Uploads, artifacts and local clusters of one test (never the developer's var/)."""
    return tmp_path / "fc2var"


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Every test starts with empty caches (a running job's figures are cached by its id, which tests reuse; the
    shared cache holds sessions and the API's submit counts; the recommender's memo, answers from rows that the last
    test's rollback took back)."""
    for each in caches.all():
        each.clear()
    service.forget()


@pytest.fixture(autouse=True)
def _isolated_storage(settings, runtime_dir):
    """The test's own storage and cluster directories; whatever clusters it left there are torn down after it (a
    launch makes disks, namespaces and cgroups, which a test that fails half-way must not leave on the machine)."""
    settings.MEDIA_ROOT = runtime_dir / "media"
    settings.FC2_LOCAL_CLUSTER_DIR = runtime_dir / "clusters"
    settings.FC2_LAB_DIR = runtime_dir / "lab"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # users in a blink
    yield
    for provider, directory in (("local", settings.FC2_LOCAL_CLUSTER_DIR), ("lab", settings.FC2_LAB_DIR)):
        if directory.is_dir() and provisioner.unavailable(provider) is None:  # (launch makes the directory first)
            for name in provisioner.list_clusters(provider):
                provisioner.teardown(provider, name)


def build_example(out: Path, name: str) -> Path:
    """examples/<name> built into a wheel in `out`, as `make examples` does: from a copy of its source, since
    setuptools builds in the source folder (build/, *.egg-info) and pytest-xdist's workers each build it at once."""
    source = shutil.copytree(
        PROJECT_DIR / "examples" / name, out / "source", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(source)],
        check=True,
    )  # fmt: skip
    return next(out.glob("*.whl"))


@pytest.fixture(scope="session")
def example_wheel(tmp_path_factory) -> Path:
    """The TensorFlow example, examples/digits_cnn, built."""
    return build_example(tmp_path_factory.mktemp("wheels"), "digits_cnn")


@pytest.fixture(scope="session")
def torch_wheel(tmp_path_factory) -> Path:
    """The PyTorch example, examples/digits_torch, built."""
    return build_example(tmp_path_factory.mktemp("torch-wheels"), "digits_torch")


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.com", "alice-password-1")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", "bob@example.com", "bob-password-1")


@pytest.fixture
def bundle(alice, example_wheel):
    with example_wheel.open("rb") as wheel:
        return store_bundle(alice, wheel, example_wheel.name)


@pytest.fixture
def digits(db):
    return datasets.ready(datasets.resolve(None, "digits"))


def make_job(owner, bundle, dataset, **fields) -> Job:
    request = jobs.JobRequest(bundle=bundle, dataset=dataset, parameters={"epochs": "1"})
    for name, value in fields.items():
        setattr(request, name, value)
    return jobs.submit(owner, request, driver=Job.Driver.INLINE)


# Anwar et al.'s Table 4, imported as workload "mnist" by the `table4` fixture.
TABLE4 = PROJECT_DIR / "recommender" / "data" / "anwar2021-table4.csv"


@pytest.fixture
def fc2_catalog(db):
    """The paper's catalogue (FC² Tables 1–2)."""
    return load_catalog("fc2-2018")


@pytest.fixture
def table4(db):
    call_command("import_perf_data", str(TABLE4), "--format", "anwar2021", "--workload", "mnist", stdout=StringIO())


@pytest.fixture
def job(alice, bundle, digits) -> Job:
    return make_job(alice, bundle, digits)


def cluster_processes() -> list[psutil.Process]:
    """Every live process of the clusters this test's jobs made — found by their cluster names, which are unique to
    this database — and of no other installation that may be running clusters on this machine meanwhile."""
    names = set(Job.objects.exclude(cluster_name="").values_list("cluster_name", flat=True))
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("FC2_CLUSTER_ID") in names and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = quote(db["USER"] or "", safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def worker_env(live_server, runtime_dir: Path, queue: str) -> dict[str, str]:
    """The environment of a test's real `celery worker`: this test's database, storage and queue, and the live server
    as the address the nodes report to."""
    return {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "FC2_MEDIA_ROOT": str(runtime_dir / "media"),
        "FC2_LOCAL_CLUSTER_DIR": str(runtime_dir / "clusters"),
        "FC2_LAB_DIR": str(runtime_dir / "lab"),
        "FC2_PUBLIC_URL": live_server.url,
        "FC2_QUEUE": queue,
    }


def start_worker(env: dict[str, str], log: Path, concurrency: int = 1, hostname: str | None = None) -> subprocess.Popen:
    """A real `celery worker` on env's queue, in a session of its own: killing its process group takes its pool (the
    processes running the tasks) with it. `hostname` names it as a host of its own would be (celery's -n)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "fc2", "worker", "-Q", env["FC2_QUEUE"],
             "--concurrency", str(concurrency), "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "INFO", *(["--hostname", hostname] if hostname else [])],
            cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


@pytest.fixture
def celery_worker(live_server, runtime_dir, settings, tmp_path):
    """A real `celery worker` process on the configured broker (Redis in CI), on a queue of its own."""
    queue = f"fc2-test-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    log = tmp_path / "worker.log"
    worker = start_worker(worker_env(live_server, runtime_dir, queue), log)
    yield log
    worker.terminate()
    worker.wait(timeout=30)


def launch_cluster(job: Job, strategy: str = "ps", workers: int = 2) -> ClusterInfo:
    """A local cluster's directories (no processes), stored on the job with its Node rows as a running job has them."""
    cluster = local.launch(ClusterSpec(f"fc2-test-{job.pk}", "local", strategy, workers))
    Job.objects.filter(pk=job.pk).update(cluster=cluster.to_dict())
    for node in cluster.nodes:
        Path(node.workdir).mkdir(exist_ok=True)  # as starting the node makes it
        Node.objects.create(
            job=job, name=node.name, role=node.role, index=node.index, status=Node.Status.RUNNING,
            last_report_at=timezone.now(),
        )  # fmt: skip
    job.refresh_from_db()
    return cluster


def call_json(command: str, *args: str) -> tuple[int, dict, str]:
    """Run a command of the CLI contract with --json: (exit code, the one JSON object it printed, its stderr)."""
    out, err = StringIO(), StringIO()
    try:
        call_command(command, *args, "--json", stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, json.loads(out.getvalue()), err.getvalue()


# --- aws: moto's EC2 API, and its instances as lab hosts (harness/ec2lab.py) ---------------------------------------


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def aws_env(moto_server, monkeypatch, settings, tmp_path):
    """boto3 pointed at a freshly reset moto; the provider's settings for it. Everything left is torn down after."""
    moto_server.reset()
    for name, value in {
        "AWS_ENDPOINT_URL": moto_server.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.FC2_AWS_DIR = tmp_path / "aws"
    settings.FC2_AWS_REGION = REGION
    settings.FC2_AWS_PLACEMENT_GROUPS = False  # moto has none
    settings.FC2_AWS_SSH_ADDRESS = "private"  # moto's instances have private addresses only
    settings.FC2_AWS_VPC_CIDR = free_vpc_cidr()
    settings.FC2_PUBLIC_URL = "http://fc2-platform.invalid"  # not loopback; no node ever reports to it here
    yield moto_server
    for name in aws.list_clusters(REGION):
        aws.teardown(name, REGION)


@pytest.fixture
def ec2_hosts(aws_env, settings, tmp_path):
    """moto's instances brought up as lab hosts; the platform's report server at each subnet's gateway."""
    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    node_root = tmp_path / "ec2-nodes"
    settings.FC2_AWS_SSH_USER = LOGIN_USER
    settings.FC2_AWS_NODE_DIR = str(node_root)
    settings.FC2_AWS_PYTHON = sys.executable  # the emulated image's Python (with TensorFlow, as a DL AMI has)
    with inline.report_server() as url:
        port = urlsplit(url).port
        with Ec2Lab(aws_env.url, settings.FC2_AWS_VPC_CIDR, port, tmp_path / "ec2-hosts") as hosts:
            settings.FC2_PUBLIC_URL = f"http://{hosts.gateway(0)}:{port}"
            settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, hosts.gateway(0)]
            yield hosts
            assert not hosts.errors


def aws_worker_env(settings) -> dict[str, str]:
    """What a `celery worker` process needs to run the aws provider as this test's settings do (aws_env,
    ec2_hosts): the same EC2 endpoint, credentials, installation tag, network and node layout."""
    settings.FC2_AWS_INSTALLATION = aws.installation()  # the tag the workers' clusters carry, as this process's
    names = ["FC2_AWS_DIR", "FC2_AWS_REGION", "FC2_AWS_SSH_ADDRESS", "FC2_AWS_VPC_CIDR", "FC2_AWS_SSH_USER"]
    names += ["FC2_AWS_NODE_DIR", "FC2_AWS_PYTHON", "FC2_AWS_INSTALLATION", "FC2_PUBLIC_URL"]
    env = {name: str(getattr(settings, name)) for name in names}
    env["FC2_AWS_PLACEMENT_GROUPS"] = "true" if settings.FC2_AWS_PLACEMENT_GROUPS else "false"
    return env | {name: value for name, value in os.environ.items() if name.startswith("AWS_")}  # moto's


class Outage:
    """A TCP proxy in front of the live server that the test can take down (connections refused, open ones cut) and
    bring back on the same port: the platform's web server, as its nodes see it, down for a while."""

    def __init__(self, upstream: str):
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.port = 0
        self.listener: socket.socket | None = None
        self.open: list[socket.socket] = []
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port, self.listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self.listener = self.listener, None
        for sock in [listener, *self.open]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # taken down
            server = socket.create_connection(self.upstream)
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


# --- faults: real Celery workers that a test kills, and the sweep run as beat would ---------------------------------

# Leases and pickup times of the fault tests (the defaults are 30 s and 120 s), and how long a fault may take to end.
FAULT_LEASE_S = 3
FAULT_DEADLINE_S = 180


class Workers:
    """Real `celery worker` processes on a queue of this test's own (tests/conftest.py's start_worker)."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env, self.log_dir = env, log_dir
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, concurrency: int = 1, hostname: str | None = None, **env: str) -> tuple[subprocess.Popen, Path]:
        log = self.log_dir / f"worker-{len(self.started)}.log"
        process = start_worker({**self.env, **env}, log, concurrency, hostname)
        self.started.append((process, log))
        return process, log

    def kill(self, process: subprocess.Popen) -> None:
        os.killpg(process.pid, signal.SIGKILL)  # the worker and its pool: as a machine or a container is lost
        process.wait()

    def stop_all(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.kill(process)

    def logs(self) -> str:
        return "\n".join(log.read_text(errors="replace")[-3000:] for _, log in self.started)


@pytest.fixture
def workers(live_server, runtime_dir, settings, tmp_path):
    """Real workers on a queue of their own, with the short lease and pickup times of the fault tests."""
    queue = f"fc2-faults-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    settings.FC2_LEASE_S = FAULT_LEASE_S
    settings.FC2_STEP_PICKUP_S = FAULT_LEASE_S
    settings.FC2_NODE_SILENCE_S = 5
    env = {
        **worker_env(live_server, runtime_dir, queue),
        "FC2_LEASE_S": str(FAULT_LEASE_S),
        "FC2_STEP_PICKUP_S": str(FAULT_LEASE_S),
    }
    pool = Workers(env, tmp_path)
    yield pool
    pool.stop_all()


def sweeping(job: Job, done: Callable[[Job], bool], what: str, workers: Workers) -> Job:
    """Run the sweep every half second (as beat would) until `done(job)`; fail after FAULT_DEADLINE_S."""
    deadline = time.monotonic() + FAULT_DEADLINE_S
    while not done(job := Job.objects.get(pk=job.pk)):
        assert time.monotonic() < deadline, f"{what}: job {job.pk} still {job.state}\n{workers.logs()}"
        sweep.sweep()
        time.sleep(0.5)
    return job


def wait_for(predicate: Callable[[], bool], what: str, workers: Workers) -> None:
    deadline = time.monotonic() + FAULT_DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}\n{workers.logs()}"
        time.sleep(0.2)


def ended_and_released(job: Job) -> bool:
    return job.is_terminal and job.cluster is None


def seconds_since(moment: datetime, job: Job) -> tuple[float, str]:
    """Seconds from `moment` to the job's first event after it, and that event's message."""
    event = JobEvent.objects.filter(job=job, at__gt=moment).order_by("at", "pk").first()
    return (event.at - moment).total_seconds(), event.message


def lab_leftovers(cluster_id: str, directory: Path, tag: str) -> dict[str, list[str]]:
    """Everything of lab cluster `cluster_id` (installation `tag`, state under `directory`) still on the machine:
    processes (its sshds, agents, relay, delay daemons and job code all name its directory or its hash), namespaces,
    links (veths, bridge), iptables rules and chains, CPU and memory cgroups, mounts and loop devices."""
    from provisioner import sandbox
    from provisioner.lab import net as labnet

    h = labnet.cluster_hash(tag, cluster_id)

    def lines(*argv: str) -> list[str]:
        return subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()

    processes = []
    for process in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error, TypeError):
            line = " ".join(process.info["cmdline"])
            if (str(directory) in line or h in line) and process.info["status"] != psutil.STATUS_ZOMBIE:
                processes.append(f"{process.pid} {line[:160]}")
    prefix = labnet.netns_name(tag, h, 0).removesuffix("0")
    cgroups = [str(p) for p in labnet.CGROUP_ROOT.glob(f"{prefix}*")] if labnet.CGROUP_ROOT.is_dir() else []
    cgroups += [str(p) for p in sandbox.memory_cgroup(prefix).parent.glob(f"{prefix}*")]
    return {
        "processes": processes,
        "namespaces": [line for line in lines("ip", "netns", "list") if h in line],
        "links": [line.split(":")[1].strip() for line in lines("ip", "-o", "link") if h in line],
        "iptables": [line for line in lines("iptables", "-S") if h in line],
        "cgroups": cgroups,
        "mounts": [line for line in Path("/proc/self/mounts").read_text().splitlines() if str(directory) in line],
        "loops": [line for line in lines("losetup", "-a") if str(directory) in line],
        "directory": [str(directory)] if directory.exists() else [],
    }


def nothing_left(found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Only the kinds of which something was found: {} when nothing was."""
    return {kind: items for kind, items in found.items() if items}


# A trainer that costs nothing but its processes (no TensorFlow): every node sleeps `--seconds` in half-second steps,
# the chief reporting each as progress; then the chief writes its metrics.
TRAINER = b"""
import json, os, pathlib, sys, time
seconds = float(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--seconds=")), "60"))
chief = os.environ.get("FC2_IS_CHIEF") == "1"
steps = int(seconds * 2)
for step in range(1, steps + 1):
    time.sleep(0.5)
    print(f"step {step}", flush=True)
    if chief:
        print("FC2_PROGRESS " + json.dumps({"epoch": 1, "step": step, "steps": steps, "loss": 1 / step}), flush=True)
if chief:
    (pathlib.Path(os.environ["FC2_OUTPUT_DIR"]) / "metrics.json").write_text(json.dumps({"steps": steps}))
print("done", flush=True)
"""


def trainer_wheel(directory: Path) -> Path:
    return make_wheel(directory, {**GOOD, "demo/main.py": TRAINER})
