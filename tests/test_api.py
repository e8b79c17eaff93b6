"""The node reporting API, POST /api/jobs/<id>/report: who may report, what is refused, what a report changes.

The last tests run the real node agent (monitor/agent.py) as a subprocess against a live server, with a tiny command
standing in for TensorFlow, so the agent's reports are checked against the server that reads them.
"""

from __future__ import annotations

import http.server
import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
from django.urls import reverse
from django.utils import timezone

from fc2.celery import app as celery_app
from fc2.models import Artifact, Job, Node
from fc2.services import pipeline
from monitor.agent import MAX_PROGRESS_LOG, NodeRun, Sampler, encode_multipart
from monitor.models import LossPoint, NodeSample
from provisioner import ClusterSpec, local
from tests.conftest import PROJECT_DIR, Outage, make_job
from tests.helpers import post_report, start_running

AGENT = PROJECT_DIR / "monitor" / "agent.py"


@pytest.fixture
def token(job) -> str:
    return start_running(job)


def running(node: str = "chief-0", **progress) -> dict:
    return {"node": node, "status": "running", "progress": progress}


# --- who may report ---


def test_missing_token_is_401(client, job, token):
    response = post_report(client, job.pk, running(), token=None)

    assert response.status_code == 401
    assert response.json() == {"error": "missing bearer token"}


@pytest.mark.parametrize("authorization", ["Basic abc", "Bearer ", "Bearer", "token"])
def test_malformed_authorization_is_401(client, job, token, authorization):
    response = client.post(
        reverse("api-job-report", args=[job.pk]),
        data=json.dumps(running()),
        content_type="application/json",
        headers={"Authorization": authorization},
    )

    assert response.status_code == 401


def test_wrong_token_is_403(client, job, token):
    response = post_report(client, job.pk, running(step=1), token="not-" + token)

    assert response.status_code == 403
    assert response.json() == {"error": "this token does not belong to this job"}
    assert Node.objects.get(job=job, name="chief-0").step is None


def test_another_jobs_token_is_403(client, alice, bundle, digits, job, token):
    other = make_job(alice, bundle, digits)
    other_token = start_running(other)

    response = post_report(client, job.pk, running(step=1), token=other_token)

    assert response.status_code == 403
    assert Node.objects.get(job=job, name="chief-0").step is None


def test_job_without_token_refuses_every_token(client, job):
    """A job not yet bootstrapped has no token hash: nothing may report to it."""
    Node.objects.create(job=job, name="chief-0", role="chief", index=0)

    response = post_report(client, job.pk, running(), token="anything")

    assert response.status_code == 403


def test_unknown_job_is_refused(client, job, token):
    response = post_report(client, job.pk + 1000, running(), token=token)

    assert 400 <= response.status_code < 500
    assert "error" in response.json()


@pytest.mark.parametrize("state", Job.TERMINAL)
def test_finished_job_is_409(client, job, token, state, caplog):
    """A late report is a normal event: refused, but no warning in django.request's log (which an inline job's
    terminal shows as "Conflict: /api/jobs/N/report")."""
    Job.objects.filter(pk=job.pk).update(state=state)

    with caplog.at_level("WARNING", logger="django.request"):
        response = post_report(client, job.pk, running(step=1), token=token)

    assert response.status_code == 409
    assert not [r for r in caplog.records if r.name == "django.request"]
    assert response.json() == {"error": f"job {job.pk} is {state}; no more reports are taken"}
    assert Node.objects.get(job=job, name="chief-0").step is None


def test_get_is_not_allowed(client, job, token):
    response = client.get(reverse("api-job-report", args=[job.pk]), headers={"Authorization": f"Bearer {token}"})

    assert response.status_code == 405


# --- what is refused ---


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        pytest.param(b"{not json", "application/json", id="not-json"),
        pytest.param(b"", "application/json", id="empty"),
        pytest.param(b"\xff\xfe\x00garbage", "application/json", id="not-utf8"),
        pytest.param(b"[1, 2]", "application/json", id="json-list"),
        pytest.param(b'"running"', "application/json", id="json-string"),
        pytest.param({"status": "running"}, "application/json", id="missing-node"),
        pytest.param({"node": "", "status": "running"}, "application/json", id="empty-node"),
        pytest.param({"node": "chief-0"}, "application/json", id="missing-status"),
        pytest.param({"node": "chief-0", "status": "exploded"}, "application/json", id="unknown-status"),
        pytest.param({**running(), "progress": [1]}, "application/json", id="progress-not-object"),
        pytest.param({**running(), "sample": {"cpu_percent": -5}}, "application/json", id="negative-cpu"),
        pytest.param({**running(), "sample": {"gpu_percent": 101}}, "application/json", id="gpu-over-100"),
        pytest.param({**running(), "log_tail": "x" * 100_001}, "application/json", id="huge-log-tail"),
        pytest.param(b"[" * 100_000, "application/json", id="deeply-nested"),
        # (a progress figure out of bounds is left out, not the report: tests/test_hostile_reports.py)
    ],
)
def test_invalid_body_is_400(client, job, token, body, content_type):
    response = post_report(client, job.pk, body, token=token, content_type=content_type)

    assert response.status_code == 400
    assert response.json()["error"] == "invalid report"
    assert response.json()["detail"]
    assert Node.objects.get(job=job, name="chief-0").last_report_at is None


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"node": "chief-0", "status": "failed", "exit_code": 2**70}, id="huge-exit-code"),
        pytest.param({**running(), "sample": {"bytes_sent": 2**64}}, id="huge-byte-count"),
    ],
)
def test_out_of_range_integer_is_400(client, job, token, body):
    response = post_report(client, job.pk, body, token=token)

    assert response.status_code == 400


def test_unknown_node_is_400(client, job, token):
    response = post_report(client, job.pk, running("worker-9"), token=token)

    assert response.status_code == 400
    assert response.json() == {"error": f"job {job.pk} has no node 'worker-9'"}


def test_multipart_without_report_is_400(client, job, token):
    body = b'--b\r\nContent-Disposition: form-data; name="artifact"; filename="model.keras"\r\n\r\nweights\r\n--b--\r\n'

    response = post_report(client, job.pk, body, token=token, content_type="multipart/form-data; boundary=b")

    assert response.status_code == 400
    assert response.json()["error"] == "invalid report"
    assert not Artifact.objects.exists()


def test_multipart_with_bad_report_is_400(client, job, token):
    body, content_type = encode_multipart({"node": "chief-0", "status": "nope"}, {"metrics.json": b"{}"})

    response = post_report(client, job.pk, body, token=token, content_type=content_type)

    assert response.status_code == 400
    assert not Artifact.objects.exists()


# --- what a report changes ---


def test_running_report_from_chief_moves_node_and_job(client, job, token):
    sample = {"cpu_percent": 180.5, "memory_mb": 612.0, "bytes_sent": 1000, "bytes_recv": 2000, "gpu_percent": None}
    body = {**running(epoch=1, epochs=2, step=30, steps=60, loss=0.75), "sample": sample}

    response = post_report(client, job.pk, body, token=token)

    assert response.status_code == 200
    assert response.json() == {"ok": True, "state": "running"}
    node = Node.objects.get(job=job, name="chief-0")
    assert (node.status, node.epoch, node.step, node.loss) == ("running", 1, 30, 0.75)
    assert node.last_report_at is not None
    job.refresh_from_db()
    assert (job.epoch, job.epochs, job.step, job.steps, job.loss) == (1, 2, 30, 60, 0.75)
    assert job.progress_percent == 50
    (stored,) = NodeSample.objects.filter(node=node)
    assert (stored.cpu_percent, stored.memory_mb, stored.bytes_sent, stored.bytes_recv) == (180.5, 612.0, 1000, 2000)
    assert stored.gpu_percent is None
    assert list(LossPoint.objects.filter(node=node).values_list("epoch", "step", "loss")) == [(1, 30, 0.75)]


def test_progress_log_stores_every_line_as_a_loss_point(client, job, token):
    lines = [{"epoch": 1, "step": step, "loss": 1 / step, "at": 1_794_000_000 + step / 10} for step in range(1, 7)]
    lines.append({"step": 7, "loss": math.nan})  # a diverged step has no loss to draw
    body = {**running(step=7, loss=None), "progress_log": lines}

    response = post_report(client, job.pk, body, token=token)

    assert response.status_code == 200
    points = LossPoint.objects.filter(node__name="chief-0").order_by("pk")
    assert [(p.step, p.loss) for p in points] == [(step, 1 / step) for step in range(1, 7)]
    assert points[0].printed_at.timestamp() == pytest.approx(1_794_000_000.1)


def test_progress_log_is_bounded(client, job, token):
    lines = [{"step": step, "loss": 0.5} for step in range(1001)]

    response = post_report(client, job.pk, {**running(), "progress_log": lines}, token=token)

    assert response.status_code == 400
    assert not LossPoint.objects.exists()


def test_mirrored_chief_is_worker_0(client, alice, bundle, digits):
    job = make_job(alice, bundle, digits, strategy=Job.Strategy.MIRRORED)
    token = start_running(job)

    post_report(client, job.pk, running("worker-1", step=5, steps=10), token=token)
    job.refresh_from_db()
    assert job.step is None

    post_report(client, job.pk, running("worker-0", step=7, steps=10), token=token)
    job.refresh_from_db()
    assert (job.step, job.steps) == (7, 10)


@pytest.mark.parametrize("node", ["ps-0", "worker-0", "worker-1"])
def test_non_chief_progress_leaves_job_progress(client, job, token, node):
    post_report(client, job.pk, running(step=10, steps=60, loss=0.5), token=token)

    response = post_report(
        client, job.pk, {**running(node, step=55, steps=60, loss=0.1), "sample": {"cpu_percent": 50}}, token=token
    )

    assert response.status_code == 200
    job.refresh_from_db()
    assert (job.step, job.loss) == (10, 0.5)
    reporter = Node.objects.get(job=job, name=node)
    assert (reporter.step, reporter.loss) == (55, 0.1)
    assert NodeSample.objects.filter(node=reporter).count() == 1


def test_started_report_sets_started_at(client, job, token):
    response = post_report(client, job.pk, {"node": "worker-1", "status": "started", "pid": 42}, token=token)

    assert response.status_code == 200
    node = Node.objects.get(job=job, name="worker-1")
    assert node.status == "started"
    assert node.started_at is not None


@pytest.mark.parametrize(("value", "raw"), [(math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")])
def test_non_finite_loss_is_stored_as_null(client, job, token, value, raw):
    """A diverging run reports NaN: the loss becomes unknown, not the last finite value, and the report is taken."""
    post_report(client, job.pk, {**running(step=1, loss=0.5), "sample": {"cpu_percent": 1}}, token=token)
    body = json.dumps({**running(step=2, loss=value), "sample": {}})  # bare NaN, as the agent's json.dumps writes it
    assert f'"loss": {raw}' in body

    response = post_report(client, job.pk, body, token=token)

    assert response.status_code == 200
    node = Node.objects.get(job=job, name="chief-0")
    assert (node.step, node.loss) == (2, None)
    job.refresh_from_db()
    assert (job.step, job.loss) == (2, None)
    assert list(LossPoint.objects.filter(node=node).values_list("step", flat=True)) == [1]


def test_chief_success_with_files_stores_artifacts_and_moves_to_collecting(client, job, token):
    metrics = {"accuracy": 0.97, "loss": 0.08}
    report = {"node": "chief-0", "status": "succeeded", "exit_code": 0, "progress": {"step": 60, "steps": 60}}
    files = {"model.keras": b"\x89keras-weights\x00" * 100, "metrics.json": json.dumps(metrics).encode()}
    body, content_type = encode_multipart(report, files)

    response = post_report(client, job.pk, body, token=token, content_type=content_type)

    assert response.status_code == 200
    assert response.json() == {"ok": True, "state": "collecting"}
    job.refresh_from_db()
    assert job.state == Job.State.COLLECTING
    assert job.metrics == metrics
    assert job.step == 60
    chief = Node.objects.get(job=job, name="chief-0")
    assert (chief.status, chief.exit_code) == ("succeeded", 0)
    stored = {a.name: a for a in job.artifacts.all()}
    assert set(stored) == {"model.keras", "metrics.json"}
    for name, data in files.items():
        assert stored[name].size_bytes == len(data)
        assert stored[name].node == chief
        with stored[name].file.open("rb") as f:
            assert f.read() == data
    assert job.events.filter(state="collecting", message="the chief finished training").count() == 1


def test_worker_success_stores_artifacts_under_its_name_and_does_not_end_job(client, job, token):
    body, content_type = encode_multipart(
        {"node": "worker-1", "status": "succeeded", "exit_code": 0}, {"metrics.json": b'{"accuracy": 0.1}'}
    )

    response = post_report(client, job.pk, body, token=token, content_type=content_type)

    assert response.json() == {"ok": True, "state": "running"}
    job.refresh_from_db()
    assert job.metrics == {}
    assert list(job.artifacts.values_list("name", flat=True)) == ["worker-1/metrics.json"]


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        pytest.param(b"not json", {"error": "metrics.json is not valid JSON"}, id="not-json"),
        pytest.param(b"[0.5, 0.6]", {"value": [0.5, 0.6]}, id="list"),
    ],
)
def test_odd_metrics_file_does_not_fail_the_report(client, job, token, metrics, expected):
    body, content_type = encode_multipart(
        {"node": "chief-0", "status": "succeeded", "exit_code": 0}, {"metrics.json": metrics}
    )

    response = post_report(client, job.pk, body, token=token, content_type=content_type)

    assert response.status_code == 200
    job.refresh_from_db()
    assert (job.state, job.metrics) == ("collecting", expected)


@pytest.mark.parametrize("node", ["chief-0", "worker-1", "ps-0"])
def test_failed_report_fails_the_job(client, job, token, node):
    tail = "Traceback (most recent call last):\n  ...\nValueError: shapes do not match"
    body = {"node": node, "status": "failed", "exit_code": 2, "log_tail": tail}

    response = post_report(client, job.pk, body, token=token)

    assert response.status_code == 200
    assert response.json() == {"ok": True, "state": "failed"}
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert job.failure_reason == f"{node} failed with exit code 2; its log ends:\n{tail}"
    assert job.finished_at is not None
    failed = Node.objects.get(job=job, name=node)
    assert (failed.status, failed.exit_code, failed.log_tail) == ("failed", 2, tail)


def test_failed_report_leaves_the_teardown_to_a_step_of_its_own(
    client, job, token, tmp_path, settings, django_capture_on_commit_callbacks
):
    """The failing node's own request must not wait for its cluster's teardown: a `release` task does that."""
    settings.FC2_LOCAL_CLUSTER_DIR = tmp_path
    cluster = local.launch(ClusterSpec(f"fc2-job-{job.pk}", "local", "ps", 2))
    Job.objects.filter(pk=job.pk).update(cluster=cluster.to_dict(), driver=Job.Driver.CELERY)

    with (
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = post_report(client, job.pk, {"node": "worker-0", "status": "failed", "exit_code": 1}, token=token)

    assert response.json() == {"ok": True, "state": "failed"}
    (sent,) = send_task.call_args_list
    assert sent.args == ("fc2.tasks.release",)
    assert (sent.kwargs["args"], sent.kwargs.get("countdown")) == ([job.pk], None)
    assert Path(cluster.workdir).is_dir()
    assert pipeline.release(job.pk) is True
    assert not Path(cluster.workdir).exists()


def test_failed_report_without_log_names_the_exit_code(client, job, token):
    post_report(client, job.pk, {"node": "worker-0", "status": "failed", "exit_code": -9}, token=token)

    job.refresh_from_db()
    assert job.failure_reason == "worker-0 failed with exit code -9"


def test_reports_after_failure_are_409(client, job, token):
    post_report(client, job.pk, {"node": "worker-0", "status": "failed", "exit_code": 1}, token=token)

    response = post_report(client, job.pk, {"node": "chief-0", "status": "succeeded", "exit_code": 0}, token=token)

    assert response.status_code == 409
    job.refresh_from_db()
    assert job.state == Job.State.FAILED


def test_artifacts_over_the_limit_are_413(client, job, token, settings):
    settings.FC2_MAX_ARTIFACT_MB = 0
    body, content_type = encode_multipart(
        {"node": "chief-0", "status": "succeeded", "exit_code": 0}, {"model.keras": b"w"}
    )

    response = post_report(client, job.pk, body, token=token, content_type=content_type)

    assert response.status_code == 413
    assert response.json() == {"error": "artifacts exceed 0 MB"}
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    assert not job.artifacts.exists()


# --- the real agent against a live server ---

PRINT_AND_WRITE = textwrap.dedent(
    """
    import json, os
    print("token visible:", "FC2_AGENT_TOKEN" in os.environ, flush=True)
    print("FC2_PROGRESS " + json.dumps({"step": 3, "steps": 3, "loss": 0.5}), flush=True)
    with open(os.path.join(os.environ["OUT"], "metrics.json"), "w") as f:
        json.dump({"acc": 1}, f)
    """
)


def run_agent(live_server, job: Job, token: str, node: str, code: str, tmp_path) -> subprocess.CompletedProcess:
    out = tmp_path / "output"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    command = [
        sys.executable,
        str(AGENT),
        *("--url", live_server.url, "--job", str(job.pk), "--node", node),
        *("--token-file", str(token_file), "--deadline", str(time.time() + 30)),
        *("--log", str(tmp_path / "node.log"), "--output", str(out), "--result", str(tmp_path / "result")),
        *("--interval", "0.2"),
        "--",
        sys.executable,
        "-c",
        code,
    ]
    out.mkdir()
    env = {**os.environ, "OUT": str(out)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.django_db(transaction=True)
def test_agent_reports_success_to_the_server(live_server, job, tmp_path):
    token = start_running(job)

    result = run_agent(live_server, job, token, "chief-0", PRINT_AND_WRITE, tmp_path)

    assert result.returncode == 0, result.stderr
    assert "report refused" not in result.stderr
    job.refresh_from_db()
    assert job.state == Job.State.COLLECTING
    assert job.metrics == {"acc": 1}
    assert (job.step, job.steps, job.loss) == (3, 3, 0.5)
    (artifact,) = job.artifacts.all()
    assert artifact.name == "metrics.json"
    with artifact.file.open("rb") as f:
        assert json.loads(f.read()) == {"acc": 1}
    chief = Node.objects.get(job=job, name="chief-0")
    assert (chief.status, chief.exit_code, chief.step) == ("succeeded", 0, 3)
    assert chief.started_at is not None
    # The agent reads the token from its file: it is in no environment the user's code can read.
    assert "token visible: False" in chief.log_tail
    assert (tmp_path / "node.log").read_text().startswith("token visible: False\n")
    # ... and it kept the final report and its files on the node, for the platform to fetch had it not arrived.
    kept = json.loads((tmp_path / "result" / "report.json").read_text())
    assert (kept["status"], kept["exit_code"]) == ("succeeded", 0)
    assert kept["outputs"] == [{"file": "0", "path": "metrics.json", "size": len(b'{"acc": 1}')}]
    assert json.loads((tmp_path / "result" / "files" / "0").read_text()) == {"acc": 1}


def print_losses(count: int, then_sleep_s: float) -> str:
    """A chief that prints `count` progress lines at once, then trains on quietly for `then_sleep_s`."""
    return textwrap.dedent(
        f"""
        import json, time
        for step in range(1, {count} + 1):
            print("FC2_PROGRESS " + json.dumps({{"step": step, "steps": {count}, "loss": 1 / step}}), flush=True)
        time.sleep({then_sleep_s})
        """
    )


def test_agent_hands_each_progress_line_over_once_and_keeps_the_newest_when_too_many(tmp_path):
    count = MAX_PROGRESS_LOG + 5
    code = f"import json\nfor i in range({count}): print('FC2_PROGRESS ' + json.dumps({{'step': i, 'loss': 0.5}}))"
    run = NodeRun([sys.executable, "-c", code], tmp_path / "node.log", dict(os.environ), cwd=None)
    run.process.wait()
    run.reader.join(timeout=10)
    run.process.stdout.close()

    lines = run.take_progress_log()

    assert [line["step"] for line in lines] == list(range(5, count))
    assert all(isinstance(line["at"], float) for line in lines)
    assert run.take_progress_log() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("count", "then_sleep_s"),
    [
        pytest.param(10, 2.0, id="10-lines-within-one-report-interval"),
        pytest.param(6, 0, id="6-line-bundle-that-ends-at-once"),
    ],
)
def test_every_loss_the_chief_prints_reaches_the_chart(live_server, client, alice, job, tmp_path, count, then_sleep_s):
    token = start_running(job)

    result = run_agent(live_server, job, token, "chief-0", print_losses(count, then_sleep_s), tmp_path)

    assert result.returncode == 0, result.stderr
    client.force_login(alice)
    loss = client.get(reverse("job-series", args=[job.pk])).json()["loss"]
    assert [(p["step"], p["loss"]) for p in loss] == [(step, pytest.approx(1 / step)) for step in range(1, count + 1)]


@pytest.mark.django_db(transaction=True)
def test_agent_reports_failure_to_the_server(live_server, job, tmp_path):
    token = start_running(job)
    code = "import sys; print('about to fail', flush=True); sys.exit(3)"

    result = run_agent(live_server, job, token, "worker-1", code, tmp_path)

    assert result.returncode == 3, result.stderr
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert "worker-1 failed with exit code 3" in job.failure_reason
    assert job.failure_reason.endswith("about to fail")
    node = Node.objects.get(job=job, name="worker-1")
    assert (node.status, node.exit_code) == ("failed", 3)
    assert not job.artifacts.exists()


@pytest.mark.django_db(transaction=True)
def test_agent_samples_every_second_and_keeps_them_while_the_platform_is_down(live_server, job, tmp_path):
    """The platform is unreachable for the first seconds of the run: the samples taken meanwhile arrive once it is
    back, each with the time it was taken; a node that shares the machine's network has no bytes, never the
    machine's."""
    token = start_running(job)
    outage = Outage(live_server.url)
    outage.down()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    (tmp_path / "output").mkdir()
    agent = subprocess.Popen(
        [
            sys.executable, str(AGENT), "--url", outage.url, "--job", str(job.pk), "--node", "worker-0",
            "--token-file", str(token_file), "--deadline", str(time.time() + 60), "--log", str(tmp_path / "node.log"),
            "--output", str(tmp_path / "output"), "--result", str(tmp_path / "result"),
            "--interval", "0.5", "--sample-interval", "0.25", "--", sys.executable, "-c", "import time; time.sleep(5)",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not (tmp_path / "node.log").exists():  # the command has started (after the undelivered `started`)
        assert time.monotonic() < deadline and agent.poll() is None, agent.stderr.read()
        time.sleep(0.05)
    time.sleep(2)
    back = timezone.now()
    outage.up()
    _, stderr = agent.communicate(timeout=60)

    assert agent.returncode == 0, stderr
    samples = list(NodeSample.objects.filter(node__name="worker-0").order_by("measured_at"))
    taken_while_down = [s for s in samples if s.measured_at < back]
    assert len(samples) >= 14, len(samples)  # 5 s at 4 a second, less the first and the start-up
    assert len(taken_while_down) >= 6, "what was sampled while the platform was down was kept"
    assert all(s.at >= back for s in taken_while_down), "... and received once it was back"
    gaps = [(b.measured_at - a.measured_at).total_seconds() for a, b in itertools.pairwise(samples)]
    assert max(gaps) < 0.75, gaps  # none lost
    assert all(s.bytes_sent is None and s.bytes_recv is None for s in samples)
    assert [(s.memory_mb, s.cpu_percent) for s in samples if not s.memory_mb or s.cpu_percent is None] == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("answer", "stored"),
    [
        # What an H100's nvidia-smi answered while torch multiplied matrices on it (a device check of this agent).
        pytest.param("99, 1395\n", (99.0, 1395.0), id="one-gpu"),
        pytest.param("100, 1395\n50, 605\n", (75.0, 2000.0), id="two-gpus-mean-use-total-memory"),
        pytest.param("[N/A], 4120\n", (None, 4120.0), id="mig-slice-without-utilisation"),
        pytest.param(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            (None, None),
            id="no-driver",
        ),
    ],
)
def test_agent_reports_the_gpus_use_where_nvidia_smi_answers(live_server, job, tmp_path, monkeypatch, answer, stored):
    """A node with GPUs: each sample carries their mean utilisation and total memory as nvidia-smi gives them (a
    script on the PATH stands in for the driver's tool), and a figure a GPU cannot tell is left unknown, never the
    other figure with it nor a made-up 0."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "answer").write_text(answer)
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\ncat '{tools / 'answer'}'\n")
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    token = start_running(job)

    result = run_agent(live_server, job, token, "chief-0", "import time; time.sleep(1.5)", tmp_path)

    assert result.returncode == 0, result.stderr
    samples = list(NodeSample.objects.filter(node__name="chief-0"))
    assert samples and {(s.gpu_percent, s.gpu_memory_mb) for s in samples} == {stored}


def test_sampler_buffer_gives_back_undelivered_samples_first_and_drops_the_oldest_when_full():
    sampler = Sampler(os.getpid(), buffered=5, own_network=True)
    first = [sampler.sample() for _ in range(3)]
    sampler.buffer.extend(first)
    taken = sampler.take()
    later = [sampler.sample() for _ in range(3)]
    sampler.buffer.extend(later)

    sampler.give_back(taken)  # the report that took them was not delivered

    kept = sampler.take()
    assert kept == [*first, *later][-5:]  # in the order taken; the oldest went when the buffer was full
    assert all(s["bytes_sent"] >= 0 and s["bytes_recv"] >= 0 for s in kept)  # its own network: counted


def test_samples_of_a_refused_report_are_not_sent_again(tmp_path):
    """A report the platform refuses as it is (a 4xx) would be refused again: its samples are dropped, and the
    reports after it carry only newer ones."""
    bodies: list[dict] = []

    class Platform(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            refuse = body["status"] == "running" and len([b for b in bodies if b["status"] == "running"]) == 1
            self.send_response(400 if refuse else 200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Platform)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "token").write_text("t")
    (tmp_path / "out").mkdir()
    try:
        result = subprocess.run(
            [
                sys.executable, str(AGENT), "--url", f"http://127.0.0.1:{server.server_address[1]}", "--job", "1",
                "--node", "worker-0", "--token-file", str(tmp_path / "token"), "--log", str(tmp_path / "node.log"),
                "--output", str(tmp_path / "out"), "--result", str(tmp_path / "result"), "--interval", "0.5",
                "--sample-interval", "0.2", "--", sys.executable, "-c", "import time; time.sleep(3)",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()

    assert result.returncode == 0, result.stderr
    running_reports = [b for b in bodies if b["status"] == "running"]
    assert len(running_reports) >= 2 and "report refused (400)" in result.stderr
    refused = {sample["at"] for sample in running_reports[0]["samples"]}
    later = [sample["at"] for b in bodies[bodies.index(running_reports[0]) + 1 :] for sample in b.get("samples", [])]
    assert refused and later and not refused & set(later) and min(later) > max(refused)
