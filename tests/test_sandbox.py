"""Job code is untrusted: on the local provider it runs sandboxed (provisioner/sandbox.py) and cannot reach anything of
the platform's, and the platform touches nothing of another installation's clusters.

The hostile bundle trains for real (TensorFlow, two mirrored workers) after trying each attack from inside a node.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest
from django.conf import settings

import provisioner
from fc2.models import Job
from fc2.services import datasets, inline, jobs
from harness.wheels import DIST_INFO, GOOD, make_wheel, sleeper_wheel
from monitor import agent
from provisioner import ClusterInfo, ClusterSpec, RunSpec, local, sandbox
from tests.conftest import PROJECT_DIR, cluster_processes, make_job

pytestmark = pytest.mark.skipif(sandbox.unavailable() is not None, reason=f"no sandbox here: {sandbox.unavailable()}")

# Runs on every node before training: each attack records what it got; the test asserts that every one failed.
ATTACKS = r"""
import errno, json, os, socket, sys

targets = json.loads(open(os.path.join(os.path.dirname(__file__), "targets.json")).read())
found = {}


def attempt(name, action):
    try:
        found[name] = {"ok": True, "got": repr(action())[:300]}
    except Exception as exc:  # noqa: BLE001 - any failure is the sandbox holding
        found[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


for path in targets["read"]:
    attempt(f"read {path}", lambda path=path: open(path, "rb").read(64))
for path in targets["list"]:
    attempt(f"list {path}", lambda path=path: os.listdir(path))
for path in targets["write"]:
    attempt(f"write {path}", lambda path=path: open(path, "wb").write(b"pwned"))
attempt("setuid 0", lambda: os.setuid(0))
# Links in the output directory, hoping the agent (which is not sandboxed) follows them when it uploads the outputs.
token = targets["token"].replace("CLUSTER", os.environ["FC2_CLUSTER_ID"])
os.symlink(token, os.path.join(os.environ["FC2_OUTPUT_DIR"], "stolen_token"))
os.symlink("/etc/shadow", os.path.join(os.environ["FC2_OUTPUT_DIR"], "shadow"))
attempt("list the project", lambda: os.listdir(targets["project"]))

# Every process this node can see, and whose environment it can read.
environs = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            environs[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        except OSError:
            environs[pid] = None
open_ports = []
for port in range(1, 65536):
    with socket.socket() as s:
        s.settimeout(0.2)
        # (a connection to itself: its ephemeral source port happened to be the one it tried)
        if s.connect_ex(("127.0.0.1", port)) == 0 and s.getsockname()[1] != port:
            open_ports.append(port)
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
found["identity"] = {
    "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(), "cap_eff": status["CapEff"].strip(),
    "cap_bnd": status["CapBnd"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
}
found["environ"] = dict(os.environ)
found["visible_pids"] = environs
found["open_ports"] = open_ports

out = os.environ["FC2_OUTPUT_DIR"]
with open(os.path.join(out, "attacks.json"), "w") as f:
    json.dump(found, f)

from hostile.train import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
"""


def hostile_wheel(directory: Path, targets: dict) -> Path:
    train = (PROJECT_DIR / "examples" / "digits_cnn" / "fc2_digits" / "main.py").read_bytes()
    members = {
        "hostile/__init__.py": b"",
        "hostile/main.py": ATTACKS.encode(),
        "hostile/train.py": train,
        "hostile/targets.json": json.dumps(targets).encode(),
        "hostile-1.0.dist-info/WHEEL": GOOD[f"{DIST_INFO}/WHEEL"],
        "hostile-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hostile\nVersion: 1.0\n",
        "hostile-1.0.dist-info/RECORD": b"",
    }
    return make_wheel(directory, members, "hostile-1.0-py3-none-any.whl")


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_hostile_bundle_fails_every_attack_and_still_trains(alice, digits, tmp_path, runtime_dir):
    database = settings.DATABASES["default"]["NAME"]
    clusters = settings.FC2_LOCAL_CLUSTER_DIR
    other = clusters / "fc2-other-job"  # another job's cluster on the same machine
    (other / "worker-0").mkdir(parents=True)
    (other / "worker-0" / "token").write_text("another job's token")
    targets = {
        "read": [
            str(database),
            str(PROJECT_DIR / "fc2" / "settings.py"),
            "/etc/shadow",
            str(other / "worker-0" / "token"),
            str(digits.path),  # the platform's copy: the node sees its own read-only one at FC2_DATA
            "/proc/1/environ",
        ],
        "list": [str(settings.MEDIA_ROOT), str(other), "/var/lib/postgresql", "/var/lib/redis", "/home"],
        "write": ["/usr/pwned", f"{os.path.dirname(os.__file__)}/pwned.py", "/pwned", "/etc/passwd"],
        "token": str(clusters / "CLUSTER" / "worker-0" / "token"),  # CLUSTER: the node's FC2_CLUSTER_ID
        "project": str(PROJECT_DIR),
    }
    wheel = hostile_wheel(tmp_path, targets)
    with wheel.open("rb") as upload:
        job = jobs.submit_upload(
            alice, upload, wheel.name, "hostile/main.py", dataset=digits, driver=Job.Driver.INLINE,
            strategy="mirrored", workers=2, parameters={"epochs": "1", "steps_per_epoch": "3"},
        )  # fmt: skip
    job = inline.run_inline(job.pk)

    assert job.state == "succeeded", job.failure_reason
    assert 0.0 <= job.metrics["test_accuracy"] <= 1.0  # it trained
    reports = {
        a.name: json.loads(Path(a.file.path).read_bytes()) for a in job.artifacts.filter(name__endswith="attacks.json")
    }
    assert set(reports) == {"attacks.json", "worker-1/attacks.json"}
    links = {"stolen_token", "shadow", "worker-1/stolen_token", "worker-1/shadow"}
    # Each link is listed as not kept, with why, and has no file: none was followed.
    assert dict(job.artifacts.filter(name__in=links).values_list("name", "not_kept")) == dict.fromkeys(
        links, "a symbolic link: links are not followed"
    ), "links were followed"
    for node, found in reports.items():
        succeeded = {name: r for name, r in found.items() if isinstance(r, dict) and r.get("ok") is True}
        # The project's directory exists in the sandbox only as the way to the read-only runtime inside it.
        project = succeeded.pop("list the project", {"got": "[]"})["got"]
        assert project in ("[]", "['.venv']"), project
        assert succeeded == {}, node
        identity = found["identity"]
        assert identity["uid"] == identity["euid"] and identity["uid"] >= sandbox.UID_RANGE[0]
        assert identity["uid"] != os.getuid() and identity["groups"] == []
        assert identity["cap_eff"] == "0000000000000000" and identity["cap_bnd"] == "0000000000000000"
        assert identity["no_new_privs"] == "1"
        env = found["environ"]
        assert not {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "FC2_AGENT_TOKEN"} & set(env)
        assert job.token_hash not in {hashlib.sha256(v.encode()).hexdigest() for v in env.values()}
        # Its own PID namespace: the sandbox's init and the node's own processes, no environment but its own.
        readable = {pid: e for pid, e in found["visible_pids"].items() if e is not None}
        assert len(found["visible_pids"]) <= 3 and all("FC2_AGENT_TOKEN" not in e for e in readable.values())
        # Its own network: only the cluster's TensorFlow ports, not the platform's web server, database or broker.
        assert set(found["open_ports"]) <= {local.FIRST_PORT, local.FIRST_PORT + 1}, found["open_ports"]
    assert cluster_processes() == []


def start_sleeping_cluster(cluster_dir: Path, wheel: Path, settings) -> ClusterInfo:
    """A one-node cluster whose code sleeps, started as the pipeline would (its agent reports to nowhere)."""
    settings.FC2_LOCAL_CLUSTER_DIR = cluster_dir
    cluster = local.launch(ClusterSpec("fc2-1-samename", "local", "mirrored", 1))
    data = cluster_dir.parent / f"{cluster_dir.name}.npz"
    data.write_bytes(b"data")
    run = RunSpec(1, str(wheel), "demo.main", dataset=str(data), report_url="http://127.0.0.1:9", token="t")
    return provisioner.bootstrap(cluster, run)


def wait_running(cluster: ClusterInfo, timeout: float = 30) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = sandbox.processes(cluster.sandbox_uid)
        if code:
            return code
        time.sleep(0.2)
    raise AssertionError(f"the sandboxed command of {cluster.cluster_id} never started")


def test_teardown_touches_only_its_own_installations_cluster(tmp_path, settings):
    """Two installations (two cluster directories) whose clusters even share a name: tearing one down leaves every
    process of the other running."""
    wheel = sleeper_wheel(tmp_path)
    mine = start_sleeping_cluster(tmp_path / "mine", wheel, settings)
    theirs = start_sleeping_cluster(tmp_path / "theirs", wheel, settings)
    try:
        assert mine.sandbox_uid != theirs.sandbox_uid
        their_code = wait_running(theirs)
        wait_running(mine)
        their_agents = [psutil.Process(n.pid) for n in theirs.nodes]

        settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "mine"  # each installation tears down its own, by name
        local.teardown(mine.cluster_id)

        assert local.cluster_processes(mine) == [] and not Path(mine.workdir).exists()
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in their_code + their_agents)
        assert provisioner.alive(theirs) == {"worker-0": True}
    finally:
        settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "theirs"
        local.teardown(theirs.cluster_id)
    assert local.cluster_processes(theirs) == []
    for cluster in (mine, theirs):  # nothing of the sandbox is left: network namespace, disks, memory cgroup
        name = sandbox.netns_name(Path(cluster.workdir))
        assert not Path("/run/netns", name).exists()
        assert not sandbox.memory_cgroup(name).exists()
    assert sandbox.mounts_under(tmp_path) == []
    local.teardown(theirs.cluster_id)  # again: nothing to do, no error


def test_code_that_detaches_is_still_torn_down(tmp_path, settings):
    """A double fork into a new session escapes a process group, not the sandbox's uid."""
    members = {**GOOD, "demo/main.py": textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
        print('up', flush=True)
        time.sleep(600)
    """).encode()}  # fmt: skip
    cluster = start_sleeping_cluster(tmp_path / "c", make_wheel(tmp_path, members), settings)
    wait_running(cluster)
    time.sleep(1)
    code = sandbox.processes(cluster.sandbox_uid)
    local.teardown(cluster.cluster_id)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in code)


@pytest.mark.django_db
def test_local_jobs_are_refused_without_the_sandbox_unless_the_operator_allows_them(
    alice, bundle, digits, monkeypatch, settings
):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "the platform does not run as root")
    settings.FC2_UNSANDBOXED_LOCAL_JOBS = False
    with pytest.raises(jobs.SubmitError, match="need the sandbox.*does not run as root.*FC2_UNSANDBOXED_LOCAL_JOBS"):
        make_job(alice, bundle, digits)
    assert not Job.objects.exists()

    from fc2.checks import local_sandbox

    (warning,) = local_sandbox(None)
    assert warning.id == "fc2.W001" and "refused" in warning.msg

    settings.FC2_UNSANDBOXED_LOCAL_JOBS = True
    assert make_job(alice, bundle, digits).state == "queued"
    assert local_sandbox(None)[0].id == "fc2.W002"


def test_agent_uploads_no_link_fifo_or_file_outside_the_output(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("platform secret")
    out = tmp_path / "output"
    (out / "saved_model" / "variables").mkdir(parents=True)
    (out / "model.keras").write_bytes(b"model")
    (out / "saved_model" / "variables" / "data").write_bytes(b"weights")
    (out / "link").symlink_to(secret)
    (out / "saved_model" / "link").symlink_to(secret)
    (out / "dirlink").symlink_to(tmp_path)
    os.mkfifo(out / "fifo")

    outputs = agent.collect_outputs(out, 10_000)

    assert [(o["path"], o.get("archive", False)) for o in outputs.listed] == [
        ("model.keras", False),
        ("saved_model", True),
    ]
    archive_file = outputs.listed[1]["file"]
    with zipfile.ZipFile(io.BytesIO(outputs.files[archive_file])) as archive:
        assert archive.namelist() == ["saved_model/variables/data"]
    assert all(b"platform secret" not in data for data in outputs.files.values())
    link = "a symbolic link: links are not followed"
    assert [(o["path"], o["reason"]) for o in outputs.not_kept] == [
        ("dirlink", link),
        ("fifo", "a named pipe (FIFO), not a file"),
        ("link", link),
        ("saved_model/link", link),  # said once the archive is kept
    ]


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_url_dataset_is_fetched_by_the_node_not_the_platform(alice, bundle, digits, tmp_path, settings):
    """The node's agent downloads the URL (checked again there) into the node; the job trains on it."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "digits.npz").write_bytes(Path(digits.path).read_bytes())

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.FC2_DATASET_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # the operator allows this one private address
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/digits.npz"
        job = make_job(alice, bundle, datasets.resolve(alice, url), strategy="mirrored", workers=1)
        job = inline.run_inline(job.pk)
    finally:
        server.shutdown()
        server.server_close()
    assert job.state == "succeeded", job.failure_reason
    assert job.dataset.kind == "url" and 0.0 <= job.metrics["test_accuracy"] <= 1.0
