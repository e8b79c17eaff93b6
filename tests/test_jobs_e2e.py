"""Real jobs end to end: TensorFlow training across processes on the local provider, through the CLI and Celery.

These start real clusters (a few TensorFlow processes each, ~15 s per job); keep them few and small.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import zipfile
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import provisioner
from fc2.models import CodeBundle, Job, Node
from fc2.services import inline, pipeline
from provisioner import ClusterSpec, RunSpec, local
from tests.conftest import PROJECT_DIR, cluster_processes, make_job, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

ALL_STATES = ["queued", "recommending", "provisioning", "bootstrapping", "running", "collecting", "succeeded"]


def submit(*args: str) -> dict:
    out = StringIO()
    try:
        call_command("submit_job", *args, "--json", stdout=out)
    except SystemExit as exc:  # --wait exits 1 unless succeeded; the JSON is printed first
        assert exc.code == 1
    return json.loads(out.getvalue())


def assert_cluster_gone(job: Job, runtime_dir: Path) -> None:
    assert cluster_processes() == []
    assert job.cluster_name and not (runtime_dir / "clusters" / job.cluster_name).exists()


@pytest.mark.heavy
@pytest.mark.parametrize("strategy", ["ps", "mirrored"])
def test_inline_job_trains_and_returns_results(strategy, alice, example_wheel, runtime_dir):
    result = submit(
        "--bundle", str(example_wheel), "--dataset", "digits", "--workers", "2", "--strategy", strategy,
        "--param", "epochs=1", "--param", "steps_per_epoch=5", "--user", "alice", "--inline", "--wait",
    )  # fmt: skip

    assert result["status"] == "succeeded", result.get("error")
    job = Job.objects.get(pk=result["id"])
    assert result["workers"] == 2 and result["duration_s"] > 0
    names = {a["name"] for a in result["artifacts"]}
    assert {"model.keras", "metrics.json"} <= names
    assert {f"logs/{n.name}.log" for n in job.nodes.all()} <= names
    assert result["metrics"]["strategy"] == strategy
    assert 0.0 <= result["metrics"]["test_accuracy"] <= 1.0
    # Start-up (the first round of steps: tracing and compiling) apart; the epoch time is the steps' after it.
    assert result["metrics"]["startup_s"] > 0 and result["metrics"]["epoch_time_s"] > 0
    with zipfile.ZipFile(job.artifacts.get(name="model.keras").file.path) as model:
        assert "config.json" in model.namelist()  # a real Keras 3 model file
    roles = sorted(job.nodes.values_list("name", flat=True))
    assert roles == (["chief-0", "ps-0", "worker-0", "worker-1"] if strategy == "ps" else ["worker-0", "worker-1"])
    assert all(n.started_at for n in job.nodes.all()), "every node's agent reported"
    assert list(dict.fromkeys(job.events.values_list("state", flat=True))) == ALL_STATES  # in order, none skipped
    assert job.steps and job.step == job.steps and job.progress_percent == 100
    assert_cluster_gone(job, runtime_dir)


@pytest.mark.heavy
@pytest.mark.parametrize("strategy", ["ps", "mirrored"])
def test_the_example_trains_for_fc2_train_seconds_whatever_its_epochs(strategy, example_wheel, digits):
    """What a profiling run asks of the code (RunSpec.train_seconds, FC2_TRAIN_SECONDS on every node): the example adds
    whole epochs until its loop has run that long — under mirrored every worker alike (they agree by an all-reduce,
    or one would wait in a collective forever) — and its metrics count the epochs it ran."""
    cluster = local.launch(ClusterSpec(f"fc2-train-seconds-{strategy}", "local", strategy, 2))
    args = ("--epochs=1", "--steps_per_epoch=5")
    run = RunSpec(1, str(example_wheel), "fc2_digits.main", args=args, dataset=digits.path, train_seconds=4)
    cluster = provisioner.bootstrap(cluster, run)
    ending = {"chief-0"} if strategy == "ps" else {"worker-0", "worker-1"}  # (ps: its servers serve until teardown)
    deadline = time.monotonic() + 180
    while not ending <= set(results := provisioner.fetch_results(cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    provisioner.teardown("local", cluster.cluster_id)
    assert {name: results[name].report["exit_code"] for name in ending} == dict.fromkeys(ending, 0)
    chief = results["chief-0" if strategy == "ps" else "worker-0"]
    metrics = json.loads(chief.outputs["metrics.json"])
    assert metrics["train_seconds"] == 4 and metrics["duration_s"] >= 4
    assert metrics["epochs"] > 1 and metrics["steps"] == 5 * metrics["epochs"] == len(metrics["epoch_train_losses"]) * 5


@pytest.mark.heavy
def test_failing_training_code_fails_the_job_with_its_log(alice, tmp_path, runtime_dir):
    wheel = tmp_path / "crash-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("crash/__init__.py", "")
        zf.writestr("crash/main.py", "import sys\nprint('loading data')\nsys.exit('boom: the model diverged')\n")
        zf.writestr("crash-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: crash\nVersion: 0.1\n")
        zf.writestr("crash-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("crash-0.1.dist-info/RECORD", "")

    result = submit("--bundle", str(wheel), "--dataset", "digits", "--strategy", "mirrored", "--workers", "1",
                    "--user", "alice", "--inline", "--wait")  # fmt: skip

    assert result["status"] == "failed"
    assert "exit code 1" in result["error"] and "boom: the model diverged" in result["error"]
    job = Job.objects.get(pk=result["id"])
    assert job.nodes.get().status == Node.Status.FAILED
    assert "logs/worker-0.log" in {a["name"] for a in result["artifacts"]}
    assert_cluster_gone(job, runtime_dir)


@pytest.mark.heavy
def test_cancel_while_running_leaves_no_process(alice, bundle, digits, runtime_dir):
    job = make_job(alice, bundle, digits, parameters={"epochs": "500"}, strategy="ps")
    runner = threading.Thread(target=inline.run_inline, args=(job.pk,), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while not Node.objects.filter(job=job, name="chief-0", step__gt=0).exists():
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        assert len(cluster_processes()) >= 4

        assert pipeline.cancel(Job.objects.get(pk=job.pk), by="alice")
    finally:
        pipeline.cancel(Job.objects.get(pk=job.pk), by="test teardown")  # no-op unless an assert failed above
        runner.join(timeout=30)

    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and not runner.is_alive()
    assert job.events.filter(state="cancelled", message="cancelled by alice").exists()
    assert_cluster_gone(job, runtime_dir)


@pytest.mark.heavy
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, None)])
def test_an_inline_job_whose_process_is_stopped_is_cancelled_and_its_cluster_torn_down(
    signum, status, alice, example_wheel, runtime_dir, live_server
):
    """`submit_job --inline` (and `lab_sweep`, the same runner) stopped by `kill` or Ctrl-C while training: the job
    is cancelled and its cluster gone before the process exits — none of its nodes left running."""
    env = worker_env(live_server, runtime_dir, "unused") | {"PYTHONFAULTHANDLER": "1"}  # SIGABRT: every stack
    command = [
        sys.executable, "manage.py", "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--workers",
        "2", "--param", "epochs=500", "--user", "alice", "--inline", "--json",
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=PROJECT_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not Node.objects.filter(name="chief-0", step__gt=0).exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        job = Job.objects.get()
        assert len(cluster_processes()) >= 4

        process.send_signal(signum)
        try:
            out, err = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # where it hangs, said by faulthandler
            pytest.fail(f"still running 90 s after the signal:\n{process.communicate()[1].decode()[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()

    assert process.returncode != 0 and (status is None or process.returncode == status), err.decode()[-2000:]
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED and job.cluster is None
    assert job.events.filter(state="cancelled", message="cancelled by interrupt").exists()
    assert_cluster_gone(job, runtime_dir)


@pytest.mark.heavy
def test_job_runs_through_a_real_celery_worker(alice, example_wheel, celery_worker, runtime_dir):
    result = submit(
        "--bundle", str(example_wheel), "--dataset", "digits", "--workers", "2", "--strategy", "mirrored",
        "--param", "epochs=1", "--param", "steps_per_epoch=3", "--user", "alice", "--wait",
    )  # fmt: skip

    assert result["status"] == "succeeded", (result.get("error"), celery_worker.read_text()[-3000:])
    job = Job.objects.get(pk=result["id"])
    assert job.driver == Job.Driver.CELERY
    assert "model.keras" in {a["name"] for a in result["artifacts"]}
    worker_log = celery_worker.read_text()
    for step in ("recommend", "provision", "bootstrap", "collect"):
        assert f"fc2.tasks.{step}" in worker_log
    assert_cluster_gone(job, runtime_dir)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--dataset", "no-such-set"], "no dataset named 'no-such-set'"),
        (["--dataset", "mnist"], "could not be loaded"),
        (["--dataset", "digits", "--provider", "mars"], "invalid choice: 'mars'"),
        (["--dataset", "digits", "--workers", "0"], "at least 1 worker"),
        (["--dataset", "digits", "--main", "train.py"], "train.py"),
        (["--dataset", "digits", "--param", "epochs"], "not KEY=VALUE"),
        (["--dataset", "digits", "--user", "nobody"], "no user 'nobody'"),
    ],
)
def test_bad_submissions_are_refused_and_store_nothing(args, reason, alice, example_wheel, runtime_dir, monkeypatch):
    monkeypatch.setattr("keras.datasets.mnist.load_data", _offline)
    err = StringIO()
    # argparse's refusals raise CommandError in-process; the command's own exit 1 saying `error: <reason>`.
    with pytest.raises((CommandError, SystemExit)) as refused:
        call_command("submit_job", "--bundle", str(example_wheel), "--user", "alice", *args, stderr=err)
    assert reason in (str(refused.value) if isinstance(refused.value, CommandError) else err.getvalue())
    assert not Job.objects.exists() and not CodeBundle.objects.exists()
    assert not list((runtime_dir / "media" / "bundles").rglob("*.whl"))


def _offline():
    raise OSError("[Errno -3] Temporary failure in name resolution")
