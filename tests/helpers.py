"""Helpers the test modules share (fixtures live in conftest.py): an API client with a token of its own, node
reports, job and wizard rows, a sandboxed cluster of one's own code. No test module imports another."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

import provisioner
from fc2.models import CodeBundle, Dataset, Job, Node
from fc2.services import tokens
from fc2.services.requests import REQUEST_FIELDS, JobRequest
from harness.wheels import GOOD, make_wheel
from provisioner import ClusterInfo, ClusterSpec, RunSpec, local
from tests.conftest import PROJECT_DIR, _database_url


class Api:
    """A client of the API with a personal token of its own."""

    numbers = itertools.count()

    def __init__(self, client, user):
        self.client = client
        self.user = user
        self.headers = {"Authorization": f"Token {tokens.create(user, f'tests-{next(self.numbers)}')[1]}"}

    def get(self, path: str, **params):
        """The answer; a file's as `.body` (read to its end, which closes it)."""
        response = self.client.get(path, params, headers=self.headers)
        if response.streaming:
            response.body = b"".join(response.streaming_content)
        return response

    def post(self, path: str, body: dict | None = None, **kwargs):
        """JSON by default; `files=` sends multipart with the other fields of `body`."""
        if "files" in kwargs:
            return self.client.post(path, {**(body or {}), **kwargs["files"]}, headers=self.headers)
        return self.client.post(path, json.dumps(body or {}), content_type="application/json", headers=self.headers)

    def delete(self, path: str):
        return self.client.delete(path, headers=self.headers)


def wheel_upload(path: Path) -> SimpleUploadedFile:
    return SimpleUploadedFile(path.name, path.read_bytes(), "application/octet-stream")


def good_npz() -> SimpleUploadedFile:
    buffer = io.BytesIO()
    x, y = np.zeros((30, 8, 8, 1), "float32"), np.arange(30) % 10
    np.savez(buffer, x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    return SimpleUploadedFile("points.npz", buffer.getvalue())


PS_NODES = [("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1)]


MIRRORED_NODES = [("worker", 0), ("worker", 1)]


def start_running(job: Job) -> str:
    """Put `job` in `running` with its nodes, as bootstrap would leave it (planned as asked, if its recommend step has
    not run); returns the agents' token."""
    for name, value in plan_as_asked(job).items():
        setattr(job, name, value)
    token = job.issue_token()
    job.save()
    layout = PS_NODES if job.strategy == Job.Strategy.PS else MIRRORED_NODES
    for role, index in layout:
        Node.objects.create(job=job, name=f"{role}-{index}", role=role, index=index, status=Node.Status.RUNNING)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)
    job.refresh_from_db()
    return token


def post_report(client, job_id: int, body, token: str | None, content_type: str = "application/json"):
    """POST a report; `body` is sent as is when bytes/str, else JSON-encoded."""
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = reverse("api-job-report", args=[job_id])
    return client.post(url, data=data, content_type=content_type, headers=headers)


def make_bundle(owner, distribution: str, **fields) -> CodeBundle:
    return CodeBundle.objects.create(
        owner=owner, wheel=f"bundles/x/{distribution}-1.0-py3-none-any.whl",
        filename=f"{distribution}-1.0-py3-none-any.whl", distribution=distribution, version="1.0",
        main_script=f"{distribution}/main.py", size_bytes=2048, sha256="0" * 64, **fields,
    )  # fmt: skip


def make_dataset(owner, name: str, kind: str = Dataset.Kind.UPLOAD, **fields) -> Dataset:
    return Dataset.objects.create(owner=owner, name=name, kind=kind, path=f"/data/{name}", **fields)


def plan_as_asked(job: Job) -> dict:
    """The plan columns a submitted manual job's recommend step would write (its request's cluster), for a test that
    puts the job past that step without running it; {} once it is planned."""
    if job.planned:
        return {}
    asked = job.request
    return {name: asked[name] for name in ("strategy", "ps_type", "worker_type", "workers")}


def job_row(owner, bundle=None, dataset=None, **fields) -> Job:
    """A job's row as given, made by hand (no submission, no pipeline), its request the fields it names."""
    if bundle is None:
        bundle, dataset = make_bundle(owner, f"code-of-{owner}"), make_dataset(owner, f"data-of-{owner}")
    asked = {name: fields[name] for name in REQUEST_FIELDS if name in fields}
    fields.setdefault("request", JobRequest(bundle=bundle, dataset=dataset, **asked).as_json())
    return Job.objects.create(owner=owner, bundle=bundle, dataset=dataset, **fields)


def step_url(step: str) -> str:
    return reverse("job-new-step", args=[step])


def code_form(upload=None, *, bundle=None, params=(("epochs", "1"), ("batch_size", "32")), **fields) -> dict:
    data = {
        "source": "library" if bundle else "upload",
        "main_script": "main.py",
        "parameters_key": [key for key, _ in params],
        "parameters_value": [value for _, value in params],
    }
    if upload is not None:
        data["wheel"] = upload
    if bundle is not None:
        data["bundle"] = bundle.pk
    return {**data, **fields}


def resource_form(**fields) -> dict:
    return {
        "provider": "local",
        "strategy": "ps",
        "algorithm": "manual",
        "catalog": "",
        "ps_type": "",
        "worker_type": "",
        "limit": "workers",
        "max_workers": "2",
        "budget": "",
        **fields,
    }


def through_data(client, bundle, builtin: str = "digits", params=(("epochs", "1"),)) -> None:
    """Code (a bundle from the library) and Data (a built-in) done."""
    assert client.post(step_url("code"), code_form(bundle=bundle, params=params)).status_code == 302
    assert client.post(step_url("data"), {"source": "builtin", "builtin": builtin}).status_code == 302


def in_another_process(code: str) -> None:
    """Run `code` after `django.setup()` in a process of its own, on this test's database (as another gunicorn worker,
    a Celery worker or `manage.py` would change it)."""
    env = {**os.environ, "DATABASE_URL": _database_url(), "DJANGO_SETTINGS_MODULE": "fc2.settings_test"}
    done = subprocess.run(
        [sys.executable, "-c", f"import django\ndjango.setup()\n{code}"],
        env=env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def start_cluster(cluster_dir: Path, wheel: Path, settings, workers: int = 1) -> ClusterInfo:
    """A mirrored cluster of `workers` nodes running demo.main, started as the pipeline would (its agents report to
    nowhere: the final result is only kept on the node)."""
    settings.FC2_LOCAL_CLUSTER_DIR = cluster_dir
    cluster = local.launch(ClusterSpec(f"fc2-attack-{cluster_dir.name}", "local", "mirrored", workers))
    data = cluster_dir.parent / f"{cluster_dir.name}.npz"
    data.write_bytes(b"data")
    run = RunSpec(1, str(wheel), "demo.main", dataset=str(data), report_url="http://127.0.0.1:9", token="t")
    return provisioner.bootstrap(cluster, run)


def code_wheel(directory: Path, code: str, **extra: bytes) -> Path:
    return make_wheel(directory, {**GOOD, "demo/main.py": textwrap.dedent(code).encode(), **extra})


def wait_result(cluster: ClusterInfo, node: str = "worker-0", timeout: float = 60) -> Path:
    """The node's kept final report (the agent keeps it before trying to deliver it to nowhere)."""
    result = Path(next(n.workdir for n in cluster.nodes if n.name == node)) / "result"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (result / "report.json").exists():
            return result
        time.sleep(0.2)
    raise AssertionError(f"{node} kept no result; agent.log: {(result.parent / 'agent.log').read_text()[-2000:]}")


def migrate(targets) -> MigrationExecutor:
    """The database migrated to `targets` (forward or back), for a test of a migration; the executor that did it."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor
