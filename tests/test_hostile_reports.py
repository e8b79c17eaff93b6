"""What a job's own code writes and its node reports is untrusted input (issue 41, part 1): each class of hostile value
— non-finite numbers, NUL and lone surrogates, integers no float holds, over-long strings, progress out of bounds —
in a report's fields or in the chief's metrics.json is stored in a form every page shows, with a line on the job's
timeline, or refused with a JSON 4xx; a report is applied wholly or not at all; the pages, series.json, the jobs API
and the admin's lists answer 200 on whatever a job stored. Run on SQLite and on PostgreSQL (DATABASE_URL).

At the end, one hostile bundle run for real on the local provider and on the lab (heavy): real processes, the real
node agent, the real report API."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.urls import reverse

import provisioner
from fc2.models import Artifact, Job, Node
from fc2.services import pipeline, sweep
from harness.wheels import GOOD, make_wheel
from monitor.models import LossPoint, NodeSample
from provisioner import lab
from recommender.catalog import load_catalog
from tests.conftest import call_json, cluster_processes, lab_leftovers, launch_cluster, nothing_left

State = Job.State


@pytest.fixture
def running_job(job) -> Job:
    """A job running on a mirrored chief and worker, and the token its agents report with."""
    for index in (0, 1):
        Node.objects.create(job=job, name=f"worker-{index}", role="worker", index=index, status=Node.Status.RUNNING)
    token = job.issue_token()
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, strategy="mirrored", token_hash=job.token_hash)
    job.refresh_from_db()
    job.agent_token = token
    return job


def report(client, job: Job, body: dict | str | bytes, files: dict[str, bytes] | None = None, **extra):
    """POST a report as the node agent does: JSON, or multipart with the report in `report` and files as
    `artifact` (each named by its wire name, listed in `outputs`)."""
    url = reverse("api-job-report", args=[job.pk])
    headers = {"Authorization": f"Bearer {job.agent_token}"}
    text = body if isinstance(body, str | bytes) else json.dumps(body)  # json.dumps writes NaN, as agents do
    if files is None:
        return client.post(url, text, content_type="application/json", headers=headers, **extra)
    uploads = [SimpleUploadedFile(name, data) for name, data in files.items()]
    return client.post(url, {"report": text, "artifact": uploads}, headers=headers, **extra)


def final(node: str = "worker-0", status: str = "succeeded", **fields) -> dict:
    return {"node": node, "status": status, "exit_code": 0 if status == "succeeded" else 1, **fields}


def strict_json(text: str | bytes):
    """JSON as a browser parses it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda constant: pytest.fail(f"{constant} in JSON"))


def pages_answer(job: Job, owner, admin) -> None:
    """Every page, list and API that shows the job answers 200, and its JSON is JSON."""
    client = Client()
    client.force_login(owner)
    for url in (
        reverse("home"),
        reverse("job-list"),
        reverse("job-detail", args=[job.pk]),
        reverse("job-live", args=[job.pk]),
    ):
        assert client.get(url).status_code == 200, url
    for url in (reverse("job-series", args=[job.pk]), reverse("api-jobs"), reverse("api-job", args=[job.pk])):
        response = client.get(url)
        assert response.status_code == 200, url
        strict_json(response.content)
    client.force_login(admin)
    for url in ("/admin/fc2/job/", f"/admin/fc2/job/{job.pk}/change/", "/admin/fc2/node/", "/admin/fc2/jobevent/"):
        assert client.get(url).status_code == 200, url
    assert client.get(reverse("dashboard")).status_code == 200


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("root", "root@example.com", "root-password-1", is_staff=True,
                                                 is_superuser=True)  # fmt: skip


def as_floats(data):
    """JSON with every number a float: PostgreSQL's jsonb gives 1e308 back as an integer of 309 digits."""
    return json.loads(json.dumps(data), parse_int=float)


def timeline(job: Job) -> str:
    return "\n".join(job.events.values_list("message", flat=True))


# --- the chief's metrics.json -----------------------------------------------------------------------------------------

BIG = "1" + "0" * 400  # 10**400: valid JSON, no float holds it
HOSTILE_METRICS = [
    # (what metrics.json holds, what the job keeps, what its timeline says)
    (b'{"test_accuracy": NaN, "loss": 0.5}', {"test_accuracy": None, "loss": 0.5}, "NaN or ±Infinity) at test_acc"),
    (b'{"test_loss": Infinity}', {"test_loss": None}, "not a finite number"),
    (b'{"test_loss": -Infinity, "h": [1, NaN]}', {"test_loss": None, "h": [1, None]}, "at test_loss, h[]"),
    (b'{"test_loss": 1e400}', {"test_loss": None}, "not a finite number"),
    (b'{"test_accuracy": %s}' % BIG.encode(), {"test_accuracy": None}, "an integer too large for a float"),
    (b'{"steps": %d, "t": -%s}' % (2**80, BIG.encode()), {"steps": 2**80, "t": None}, "float at t: kept as null"),
    (b'{"note": "a\\u0000b"}', {"note": "a\ufffdb"}, "NUL, a lone surrogate) at note: replaced by U+FFFD"),
    (b'{"k\\u0000": 1}', {"k\ufffd": 1}, "replaced by U+FFFD"),
    (b'{"note": "\\ud800x"}', {"note": "\ufffdx"}, "replaced by U+FFFD"),
    (b'{"note": "%s"}' % (b"x" * 100_000), {"note": "x" * 1000}, "a string over 1,000 characters at note: cut"),
    (b'{"test_accuracy": 0.9, "%s": 1}' % (b"k" * 70_000), {"test_accuracy": 0.9, "k" * 1000: 1}, "cut to 1,000"),
    (b"[NaN]", {"value": [None]}, "not a finite number"),
    # Finite, and past what a float holds once multiplied: the figures computed from them are unknown, not Infinity.
    (
        b'{"duration_s": 1e-300, "epochs": %s, "steps": 1e308, "global_batch_size": 1e308, "test_accuracy": 1e308}'
        % (b"9" * 300),
        {
            "duration_s": 1e-300,
            "epochs": int("9" * 300),
            "steps": 1e308,
            "global_batch_size": 1e308,
            "test_accuracy": 1e308,
        },
        None,
    ),
    (
        b'{"examples_per_s": 1e308, "epoch_time_s": 5e-324, "batch_size": %s, "test_loss": [1, 2]}' % (b"9" * 300),
        {"examples_per_s": 1e308, "epoch_time_s": 5e-324, "batch_size": int("9" * 300), "test_loss": [1, 2]},
        None,
    ),
    (b'{"deep": ' + b"[" * 100 + b"]" * 100 + b"}", {"error": "metrics.json is not valid JSON"}, "nested deeper"),
    (b'{"n": %s}' % (b"9" * 5000), {"error": "metrics.json is not valid JSON"}, "not valid JSON (Exceeds the limit"),
    (b'{"bad": "\xff\xfe"}', {"error": "metrics.json is not valid JSON"}, "not valid JSON ('utf-8' codec"),
]


HOSTILE_METRICS_IDS = [
    "nan", "infinity", "minus-infinity-in-a-list", "1e400", "10**400", "-10**400", "nul", "nul-in-a-key",
    "lone-surrogate", "long-string", "long-key", "top-level-list", "extreme-products", "extreme-figures", "too-deep",
    "5000-digits", "not-utf8",
]  # fmt: skip


@pytest.mark.parametrize(("raw", "kept", "said"), HOSTILE_METRICS, ids=HOSTILE_METRICS_IDS)
def test_hostile_metrics_are_kept_showable_and_said(client, running_job, alice, admin, raw, kept, said):
    outputs = [{"file": "0", "path": "metrics.json", "size": len(raw)}, {"file": "1", "path": "model.keras", "size": 1}]

    response = report(client, running_job, final(outputs=outputs), files={"0": raw, "1": b"m"})

    assert response.status_code == 200, response.content
    running_job.refresh_from_db()
    assert running_job.state == State.COLLECTING
    assert as_floats(running_job.metrics) == as_floats(kept)
    if said:
        assert "metrics.json: " in timeline(running_job) and said in timeline(running_job)
    with Artifact.objects.get(job=running_job, name="metrics.json").file.open("rb") as kept_file:
        assert kept_file.read() == raw  # the file, as it was
    pages_answer(running_job, alice, admin)

    assert pipeline.collect(running_job.pk)  # the job ends: its run figures are kept (PostgreSQL takes no Infinity)

    running_job.refresh_from_db()
    assert running_job.state == State.SUCCEEDED and running_job.figures is not None
    pages_answer(running_job, alice, admin)


def test_metrics_past_their_bound_keep_their_first_entries(client, running_job):
    raw = json.dumps({"test_accuracy": 0.9, **{f"m{i}": "v" * 900 for i in range(200)}}).encode()

    report(client, running_job, final(outputs=[{"file": "0", "path": "metrics.json", "size": len(raw)}]), {"0": raw})

    running_job.refresh_from_db()
    assert running_job.metrics["test_accuracy"] == 0.9 and 50 < len(running_job.metrics) < 201
    assert len(json.dumps(running_job.metrics)) <= 64 * 1024
    assert "of 201 entries shown, the file itself is among the results" in timeline(running_job)


# --- a report's own fields --------------------------------------------------------------------------------------------


def test_nul_and_surrogates_in_a_log_tail_are_replaced_and_the_job_fails_with_it(client, running_job, alice, admin):
    body = '{"node": "worker-1", "status": "failed", "exit_code": 3, "log_tail": "boom\\u0000 \\udfff end"}'

    response = report(client, running_job, body)

    assert response.status_code == 200, response.content
    running_job.refresh_from_db()
    assert running_job.state == State.FAILED
    assert running_job.nodes.get(name="worker-1").log_tail == "boom\ufffd \ufffd end"
    assert running_job.failure_reason.endswith("boom\ufffd \ufffd end")
    assert "worker-1's report: a character no database stores (NUL, a lone surrogate) at log_tail" in timeline(
        running_job
    )
    pages_answer(running_job, alice, admin)


@pytest.mark.parametrize("name", ["worker-0\u0000", "\ud800", "worker-0\u0000" * 20])
def test_a_node_name_no_database_stores_is_refused_as_json(client, running_job, name):
    response = report(client, running_job, json.dumps({"node": name, "status": "running"}))

    assert response.status_code == 400
    assert "has no node" in response.json()["error"] or response.json()["error"] == "invalid report"
    assert Node.objects.get(job=running_job, name="worker-0").last_report_at is None


@pytest.mark.parametrize(
    ("progress", "kept", "left_out"),
    [
        ({"step": 10**12, "loss": 0.5}, (None, 0.5), "progress.step left out"),
        ({"step": -1, "loss": 0.5}, (None, 0.5), "progress.step left out"),
        ({"epoch": 1.5, "step": 7, "loss": 0.5}, (7, 0.5), "progress.epoch left out"),
        ({"step": 7, "loss": "low"}, (7, None), "progress.loss left out (input should be a valid number"),
        ({"step": 7, "steps": 10**400, "loss": 0.5}, (7, 0.5), "an integer too large for a float at progress.steps"),
        ({"step": 7, "loss": 0.5, "epochs": float("nan")}, (7, 0.5), "number (NaN or ±Infinity) at progress.epochs"),
    ],
)
def test_progress_out_of_bounds_is_left_out_not_the_report(client, running_job, alice, admin, progress, kept, left_out):
    """The progress is what the node's code prints (FC2_PROGRESS lines): a figure there out of bounds must not cost
    the report, which may be the node's last."""
    line = {**progress, "at": 1_700_000_000}
    body = final("worker-0", progress=progress, progress_log=[line, line], samples=[{"cpu_percent": float("nan")}])

    response = report(client, running_job, body)

    assert response.status_code == 200, response.content
    running_job.refresh_from_db()
    assert running_job.state == State.COLLECTING
    node = running_job.nodes.get(name="worker-0")
    assert (node.status, node.step, node.loss) == (Node.Status.SUCCEEDED, *kept)
    assert LossPoint.objects.filter(node=node).count() == (2 if None not in kept else 0)
    assert NodeSample.objects.get(node=node).cpu_percent is None
    assert left_out in timeline(running_job)
    pages_answer(running_job, alice, admin)


def test_a_change_is_said_once_however_many_reports_carry_it(client, running_job):
    for _ in range(3):
        body = {"node": "worker-1", "status": "running", "progress": {"step": 1, "loss": float("nan")}}
        assert report(client, running_job, body).status_code == 200

    said = running_job.events.filter(message__contains="at progress.loss: kept as null")
    assert said.count() == 1


def test_output_names_and_reasons_no_database_stores_are_replaced(client, running_job, alice, admin):
    body = final(
        "worker-1",
        outputs=[{"file": "0", "path": "model\u0000.keras", "size": 1}],
        not_kept=[{"path": "big\ud800.bin", "size": 9, "reason": "too big\u0000"}],
    )

    response = report(client, running_job, body, files={"0": b"m", "weird\u0000name": b"x"})

    assert response.status_code == 200, response.content
    names = set(Artifact.objects.filter(job=running_job).values_list("original_name", "not_kept"))
    assert all("\x00" not in name + why and "\ud800" not in name + why for name, why in names)
    pages_answer(running_job, alice, admin)


# --- one transaction; the sweep moves on a job its report did not ----------------------------------------------------


@pytest.fixture
def metrics_refused():
    """The database refuses to write a job's metrics, as a failing disk or a constraint would: a failure after the
    node's status is written, in the middle of a report."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION fc2_test_refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'disk full'; END $$ "
                "LANGUAGE plpgsql"
            )
            cursor.execute(
                "CREATE TRIGGER fc2_test_refuse BEFORE UPDATE OF metrics ON fc2_job FOR EACH ROW "
                "EXECUTE FUNCTION fc2_test_refuse()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER fc2_test_refuse BEFORE UPDATE OF metrics ON fc2_job "
                "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
            )
    yield  # the test's transaction, rolled back, takes the trigger with it


def test_a_report_failing_part_way_leaves_nothing(running_job, metrics_refused):
    client = Client(raise_request_exception=False)
    raw = b'{"test_accuracy": 0.9}'
    body = final(outputs=[{"file": "0", "path": "metrics.json", "size": len(raw)}], samples=[{"cpu_percent": 5.0}])

    response = report(client, running_job, body, files={"0": raw})

    assert response.status_code == 500
    running_job.refresh_from_db()
    node = running_job.nodes.get(name="worker-0")
    assert (running_job.state, node.status, node.last_report_at) == (State.RUNNING, Node.Status.RUNNING, None)
    assert not Artifact.objects.filter(job=running_job).exists() and not NodeSample.objects.exists()


@pytest.mark.parametrize(("status", "ends"), [("succeeded", State.COLLECTING), ("failed", State.FAILED)])
def test_the_sweep_moves_on_a_job_left_running_under_a_finished_node(job, status, ends):
    """A node recorded finished while its job runs on — what a report failing after the node's status was written
    left before reports were applied in one transaction — is not left to the job's time limit."""
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, strategy="mirrored")
    launch_cluster(job, strategy="mirrored", workers=2)
    Node.objects.filter(job=job, name="worker-0").update(status=status, exit_code=0 if status == "succeeded" else 2)
    job.refresh_from_db()

    sweep.check_running(job)

    job.refresh_from_db()
    assert job.state == ends
    assert f"worker-0 had {status} while the job was still running: moved on by the sweep" in timeline(job)


# --- rows stored before the door: the data migration ------------------------------------------------------------------


def test_metrics_stored_before_the_door_are_cleaned_by_the_migration(running_job, alice, admin):
    from django.apps import apps

    Job.objects.filter(pk=running_job.pk).update(metrics={"test_accuracy": 10**400, "note": "x" * 5000, "ok": 1})
    migration = importlib.import_module("fc2.migrations.0022_clean_job_metrics")

    migration.clean_metrics(apps, None)

    running_job.refresh_from_db()
    assert running_job.metrics == {"test_accuracy": None, "note": "x" * 1000, "ok": 1}
    pages_answer(running_job, alice, admin)


# --- the report endpoint's body limits --------------------------------------------------------------------------------


def test_a_json_report_over_its_limit_is_a_json_413(client, running_job, settings):
    body = json.dumps({"node": "worker-0", "status": "running", "log_tail": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE})

    response = report(client, running_job, body)

    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert "above the 5 MB limit for a node report without files" in response.json()["error"]


def test_a_multipart_report_field_over_its_limit_is_a_json_413(client, running_job, settings):
    body = json.dumps({"node": "worker-0", "status": "running", "log_tail": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE})

    response = report(client, running_job, body, files={"0": b"m"})

    assert response.status_code == 413
    assert response["Content-Type"] == "application/json"
    assert "error" in response.json()


def test_a_report_with_as_many_outputs_as_an_agent_sends_is_taken(client, running_job):
    files = {str(i): b"x" for i in range(300)}
    outputs = [{"file": wire, "path": f"out-{wire}.txt", "size": 1} for wire in files]

    response = report(client, running_job, final("worker-1", outputs=outputs), files=files)

    assert response.status_code == 200, response.content
    assert Artifact.objects.filter(job=running_job).count() == 300


# --- one hostile bundle, run for real ---------------------------------------------------------------------------------

# No TensorFlow: what matters is what the code writes. Its metrics.json is what Python's json.dump writes of a diverged
# run and worse; its log and its progress lines hold NUL, bytes that are not UTF-8 and figures out of bounds.
HOSTILE_MAIN = b"""
import json, os, pathlib, sys, time
print("FC2_PROGRESS " + json.dumps({"epoch": 1, "epochs": 1, "step": 10**12, "steps": 2, "loss": float("nan")}))
print("FC2_PROGRESS " + json.dumps({"epoch": 1, "epochs": 1, "step": 2, "steps": 2, "loss": 1e400}), flush=True)
sys.stdout.buffer.write(b"a NUL \\x00 and a byte \\xff in the log\\n")
sys.stdout.flush()
time.sleep(2)
output = pathlib.Path(os.environ["FC2_OUTPUT_DIR"])
(output / "model.keras").write_bytes(b"weights")
metrics = {
    "test_accuracy": float("nan"), "test_loss": float("inf"), "final_train_loss": -float("inf"), "epochs": 10**400,
    "note": "\\x00", "lone": "\\ud800", "blob": "x" * 2**20, "ended_at": time.time(),
}
(output / "metrics.json").write_text(json.dumps(metrics))
print("done", flush=True)
"""


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("provider", ["local", "lab"])
def test_a_hostile_bundle_succeeds_showably_and_leaves_nothing(provider, alice, admin, tmp_path, runtime_dir):
    if provider == "lab" and (why := provisioner.unavailable("lab")):
        pytest.skip(why)
    load_catalog("lab")
    wheel = make_wheel(tmp_path, {**GOOD, "demo/main.py": HOSTILE_MAIN})
    on_lab = ("--worker-type", "lab-w-250") if provider == "lab" else ()

    _, result, _ = call_json(  # --wait exits 1 unless the job succeeded, after the JSON
        "submit_job", "--bundle", str(wheel), "--dataset", "digits", "--provider", provider, *on_lab,
        "--workers", "1", "--strategy", "mirrored", "--user", "alice", "--inline", "--wait",
    )  # fmt: skip

    assert result["status"] == "succeeded", result.get("error")
    job = Job.objects.get(pk=result["id"])
    ended_s = job.finished_at.timestamp() - job.metrics["ended_at"]
    print(f"\nFIGURE hostile bundle ({provider}): {job.state} {ended_s:.1f} s after its training ended")
    assert ended_s < 60
    ended_at = job.metrics.pop("ended_at")
    assert job.metrics == {
        "test_accuracy": None, "test_loss": None, "final_train_loss": None, "epochs": None,
        "note": "\ufffd", "lone": "\ufffd", "blob": "x" * 1000,
    }  # fmt: skip
    assert ended_at > 0 and job.headline is None  # no figure to head the result with, and no exception
    said = timeline(job)
    for line in (
        "metrics.json: not a finite number (NaN or ±Infinity) at test_accuracy, test_loss, final_train_loss: kept as",
        "metrics.json: an integer too large for a float at epochs: kept as null",
        "metrics.json: a character no database stores (NUL, a lone surrogate) at note, lone: replaced by U+FFFD",
        "metrics.json: a string over 1,000 characters at blob: cut to 1,000",
        "worker-0's report: a character no database stores (NUL, a lone surrogate) at log_tail",
        "worker-0's report: progress_log[].step left out",
    ):
        assert line in said, said
    node = job.nodes.get()
    assert "a NUL \ufffd and a byte" in node.log_tail and node.step == 2
    assert {"model.keras", "metrics.json"} <= set(job.artifacts.values_list("name", flat=True))
    if provider == "local":
        assert cluster_processes() == [] and not (runtime_dir / "clusters" / job.cluster_name).exists()
    else:
        assert nothing_left(lab_leftovers(job.cluster_name, lab._cluster_dir(job.cluster_name), lab.tag())) == {}
    pages_answer(job, alice, admin)


def test_extreme_finite_readings_keep_the_pages_and_the_run_figures(client, running_job, alice, admin):
    """Figures a float holds, but whose sums and products it does not: the charts and the run's figures stay JSON."""
    for at in (1_700_000_000, 1_700_000_001):
        body = {
            "node": "worker-0",
            "status": "running",
            "progress": {"step": 3, "loss": 1e308},
            "progress_log": [{"step": 3, "loss": 1e308, "at": at}, {"step": 4, "loss": -1e308, "at": at + 0.5}],
            "samples": [
                {
                    "at": at,
                    "cpu_percent": 1e308,
                    "node_cpu_percent": 1e308,
                    "memory_mb": 1e308,
                    "gpu_memory_mb": 1e308,
                    "bytes_sent": 2**63 - 1,
                    "bytes_recv": 2**63 - 1,
                }
            ],
        }
        assert report(client, running_job, body).status_code == 200
    pages_answer(running_job, alice, admin)
    Job.objects.filter(pk=running_job.pk).update(state=State.COLLECTING)
    assert pipeline.collect(running_job.pk)
    running_job.refresh_from_db()
    assert running_job.figures is not None
    pages_answer(running_job, alice, admin)


def test_an_output_left_deep_down_is_listed_shortened_not_a_refused_report(client, running_job, alice, admin):
    """The agent lists what it left behind at any depth of the output directory (a link in a folder 128 deep): the
    path may be far past one name's length."""
    deep = "/".join(["d" * 255] * 20) + "/link"
    body = final(not_kept=[{"path": deep, "size": 0, "reason": "a symbolic link: links are not followed " * 20}])

    response = report(client, running_job, body)

    assert response.status_code == 200, response.content
    running_job.refresh_from_db()
    assert running_job.state == State.COLLECTING
    (left,) = Artifact.objects.filter(job=running_job, not_kept__startswith="a symbolic link")
    assert left.original_name.startswith("d" * 255 + "/") and left.original_name.endswith("/link")
    pages_answer(running_job, alice, admin)


def test_a_node_gone_with_nul_in_its_log_fails_the_job_with_its_log(job, settings):
    """The end of a node's log is its failure reason when it left no result: what its code printed, NUL included."""
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, strategy="mirrored")
    cluster = launch_cluster(job, strategy="mirrored", workers=1)
    (node,) = cluster.nodes
    (Path(node.workdir) / "node.log").write_bytes(b"epoch 1\nnul \x00 here\nKilled\n")
    settings.FC2_NODE_SILENCE_S = 0
    job.refresh_from_db()

    sweep.check_running(job)  # its machine has no process of it: gone, and no result kept

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert (
        job.failure_reason
        == "worker-0 stopped without reporting a result; its log ends:\nepoch 1\nnul \ufffd here\nKilled\n"
    )
