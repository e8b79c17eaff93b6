"""The pages: who sees which job, the submission form (a refused upload leaves nothing behind), cancel, downloads."""

from __future__ import annotations

import io
import random
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils.html import escape

from fc2.bundles import MB
from fc2.celery import app as celery_app
from fc2.models import CodeBundle, Dataset, Job
from fc2.services import jobs, pipeline
from fc2.services.bundles import store_bundle
from tests.conftest import make_job
from tests.wheels import FILENAME, GOOD, make_wheel


@pytest.fixture
def bob_job(bob, digits, example_wheel) -> Job:
    with example_wheel.open("rb") as wheel:
        bundle = store_bundle(bob, wheel, example_wheel.name)
    return make_job(bob, bundle, digits)


@pytest.fixture
def artifact(job):
    return pipeline.store_artifact(job, "logs/chief-0.log", b"epoch 1 done\n")


def job_urls(job: Job, artifact) -> dict[str, str]:
    return {
        "detail": reverse("job-detail", args=[job.pk]),
        "live": reverse("job-live", args=[job.pk]),
        "download": reverse("artifact-download", args=[job.pk, artifact.pk]),
    }


# --- who sees what ---


@pytest.mark.parametrize("name", ["job-list", "job-new", "job-detail", "job-live"])
def test_anonymous_is_sent_to_login(client, job, name):
    url = reverse(name, args=[job.pk] if name in ("job-detail", "job-live") else [])

    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


def test_anonymous_cannot_cancel_or_download(client, job, artifact):
    cancel = client.post(reverse("job-cancel", args=[job.pk]))
    download = client.get(job_urls(job, artifact)["download"])

    assert (cancel.status_code, download.status_code) == (302, 302)
    assert cancel["Location"].startswith(reverse("login"))
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


@pytest.mark.parametrize("page", ["detail", "live", "download"])
def test_other_users_job_is_404(client, bob, job, artifact, page):
    client.force_login(bob)

    response = client.get(job_urls(job, artifact)[page])

    assert response.status_code == 404


def test_other_user_cannot_cancel(client, bob, job):
    client.force_login(bob)

    response = client.post(reverse("job-cancel", args=[job.pk]))

    assert response.status_code == 404
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


def test_other_users_artifact_is_404_even_through_own_job(client, alice, job, bob_job):
    """An artifact id is looked up within the job in the URL: bob's job id does not open alice's artifact."""
    theirs = pipeline.store_artifact(bob_job, "metrics.json", b"{}")
    client.force_login(alice)

    response = client.get(reverse("artifact-download", args=[job.pk, theirs.pk]))

    assert response.status_code == 404


@pytest.mark.parametrize("page", ["detail", "live", "download"])
def test_owner_sees_own_job(client, alice, job, artifact, page):
    client.force_login(alice)

    response = client.get(job_urls(job, artifact)[page])

    assert response.status_code == 200
    response.close()


def test_researcher_lists_only_own_jobs(client, alice, job, bob_job):
    client.force_login(alice)

    response = client.get(reverse("job-list"))

    assert response.status_code == 200
    assert list(response.context["page"]) == [job]
    assert response.context["show_owner"] is False
    assert reverse("job-detail", args=[bob_job.pk]) not in response.content.decode()


def test_admin_lists_and_opens_every_job(admin_client, job, bob_job):
    response = admin_client.get(reverse("job-list"))

    assert response.status_code == 200
    assert set(response.context["page"]) == {job, bob_job}
    assert response.context["show_owner"] is True
    for shown in (job, bob_job):
        assert admin_client.get(reverse("job-detail", args=[shown.pk])).status_code == 200


def test_job_list_filters_by_state(client, alice, job, bundle, digits):
    other = make_job(alice, bundle, digits)
    Job.objects.filter(pk=other.pk).update(state=Job.State.FAILED)
    client.force_login(alice)

    response = client.get(reverse("job-list"), {"state": "failed"})

    assert [j.pk for j in response.context["page"]] == [other.pk]


# --- the submission form ---


def bundle_files(settings) -> set[Path]:
    """Every file under MEDIA_ROOT/bundles (shared by the session's tests, so compare before and after)."""
    root = Path(settings.MEDIA_ROOT) / "bundles"
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def form_data(upload: SimpleUploadedFile, dataset_row, **fields) -> dict:
    return {
        "wheel": upload,
        "main_script": "main.py",
        "parameters": "epochs=1\nbatch_size=32",
        "dataset": dataset_row.pk,
        "dataset_url": "",
        "provider": "local",
        "strategy": "ps",
        "workers": 2,
        **fields,
    }


def test_form_renders(client, alice, digits):
    client.force_login(alice)

    response = client.get(reverse("job-new"))

    assert response.status_code == 200
    assert 'name="wheel"' in response.content.decode()


def test_good_upload_creates_bundle_and_job(client, alice, digits, example_wheel, settings):
    client.force_login(alice)
    before = bundle_files(settings)
    upload = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes(), content_type="application/zip")

    with mock.patch.object(celery_app, "send_task") as send_task:
        response = client.post(reverse("job-new"), form_data(upload, digits))

    (job,) = Job.objects.all()
    (bundle,) = CodeBundle.objects.all()
    assert response.status_code == 302
    assert response["Location"] == reverse("job-detail", args=[job.pk])
    assert (job.owner, job.bundle, job.dataset) == (alice, bundle, digits)
    assert (job.state, job.driver, job.strategy, job.workers) == ("queued", "celery", "ps", 2)
    assert job.parameters == {"epochs": "1", "batch_size": "32"}
    assert (bundle.owner, bundle.filename, bundle.size_bytes) == (alice, example_wheel.name, upload.size)
    assert bundle.main_script.endswith("/main.py")
    assert bundle_files(settings) - before == {Path(bundle.wheel.path)}
    # The first step is sent on commit; the test's transaction never commits, so no task went out.
    send_task.assert_not_called()


def test_good_upload_sends_first_step_on_commit(client, alice, digits, tmp_path, django_capture_on_commit_callbacks):
    client.force_login(alice)
    upload = SimpleUploadedFile(FILENAME, make_wheel(tmp_path, GOOD).read_bytes(), content_type="application/zip")

    with (
        mock.patch.object(celery_app, "send_task") as send_task,
        django_capture_on_commit_callbacks(execute=True) as callbacks,
    ):
        response = client.post(reverse("job-new"), form_data(upload, digits))

    assert response.status_code == 302
    assert len(callbacks) == 1
    (sent,) = send_task.call_args_list
    assert sent.args == ("fc2.tasks.profile",)
    assert (sent.kwargs["args"], sent.kwargs.get("countdown")) == ([Job.objects.get().pk], None)


@pytest.mark.parametrize(
    ("filename", "content", "limit_mb", "reason"),
    [
        pytest.param(
            FILENAME, b"PK\x03\x04 not really", None, "not a wheel: the file is not a zip archive", id="not-zip"
        ),
        pytest.param(
            FILENAME,
            {**GOOD, "../evil.py": b""},
            None,
            "unsafe path in the wheel: '../evil.py' contains '..'",
            id="zip-slip",
        ),
        pytest.param(
            FILENAME,
            {**GOOD, "demo/zeros.bin": bytes(2 * MB)},
            None,
            "the wheel's member demo/zeros.bin looks like a zip bomb: it compresses ",
            id="zip-bomb",
        ),
        pytest.param(
            FILENAME,
            {**GOOD, "demo/main.py": None},
            None,
            "main script main.py is not in the wheel (looked at the top level and in packages)",
            id="main-missing",
        ),
        pytest.param(
            FILENAME,
            {k: v for k, v in GOOD.items() if ".dist-info/" not in k},
            None,
            "not a wheel: it has no .dist-info directory (build it with `python -m build --wheel`)",
            id="no-dist-info",
        ),
        pytest.param(FILENAME, b"", None, "The submitted file is empty.", id="empty"),
        pytest.param(
            FILENAME,
            {**GOOD, "demo/weights.bin": random.Random(0).randbytes(MB + 1)},
            1,
            "the wheel is larger than the 1 MB limit",
            id="over-limit",
        ),
        pytest.param(
            "demo-1.0-py3-none-any.zip",
            GOOD,
            None,
            "demo-1.0-py3-none-any.zip is not a wheel: the file name must end in .whl",
            id="extension",
        ),
    ],
)
def test_bad_upload_is_refused_and_leaves_nothing(
    client, alice, digits, settings, tmp_path, filename, content, limit_mb, reason
):
    if limit_mb is not None:
        settings.FC2_MAX_BUNDLE_MB = limit_mb
    data = make_wheel(tmp_path, content).read_bytes() if isinstance(content, dict) else content
    client.force_login(alice)
    before = bundle_files(settings)

    response = client.post(reverse("job-new"), form_data(SimpleUploadedFile(filename, data), digits))

    assert response.status_code == 400
    (error,) = response.context["form"].errors["wheel"]
    assert error.startswith(reason)
    assert escape(error) in response.content.decode()
    assert not CodeBundle.objects.exists()
    assert not Job.objects.exists()
    assert bundle_files(settings) == before


def test_failure_after_storing_rolls_back_row_and_file(client, alice, digits, example_wheel, settings):
    client.force_login(alice)
    before = bundle_files(settings)
    stored = []

    def store_then_remember(*args, **kwargs):
        bundle = store_bundle(*args, **kwargs)
        stored.append(Path(bundle.wheel.path))
        return bundle

    upload = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes())
    with (
        mock.patch("fc2.services.jobs.store_bundle", side_effect=store_then_remember),
        mock.patch.object(jobs, "submit", side_effect=jobs.SubmitError("no capacity left on the local provider")),
    ):
        response = client.post(reverse("job-new"), form_data(upload, digits))

    assert response.status_code == 400
    assert response.context["form"].errors["wheel"] == ["no capacity left on the local provider"]
    assert len(stored) == 1  # the file was written...
    assert not stored[0].exists()  # ...and removed with the rolled-back row
    assert not CodeBundle.objects.exists()
    assert not Job.objects.exists()
    assert bundle_files(settings) == before


def test_submit_error_is_shown_at_its_field(client, alice, digits, example_wheel, settings):
    client.force_login(alice)
    before = bundle_files(settings)
    upload = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes())

    with mock.patch.object(jobs, "submit", side_effect=jobs.SubmitError("too many workers", "workers")):
        response = client.post(reverse("job-new"), form_data(upload, digits))

    assert response.status_code == 400
    assert response.context["form"].errors["workers"] == ["too many workers"]
    assert not CodeBundle.objects.exists()
    assert bundle_files(settings) == before


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        pytest.param({"dataset": ""}, "dataset", "Pick a dataset, give its URL or upload it.", id="no-dataset"),
        pytest.param(
            {"dataset_url": "https://example.com/d.npz"},
            "dataset_url",
            "Give one dataset: a choice, a URL or a file.",
            id="both",
        ),
        pytest.param({"parameters": "epochs"}, "parameters", "parameter 'epochs' is not KEY=VALUE", id="bad-param"),
        pytest.param({"workers": 0}, "workers", "Ensure this value is greater than or equal to 1.", id="no-workers"),
    ],
)
def test_other_bad_input_is_refused(client, alice, digits, settings, tmp_path, fields, field, reason):
    client.force_login(alice)
    before = bundle_files(settings)
    upload = SimpleUploadedFile(FILENAME, make_wheel(tmp_path, GOOD).read_bytes())

    response = client.post(reverse("job-new"), form_data(upload, digits, **fields))

    assert response.status_code == 400
    assert response.context["form"].errors[field] == [reason]
    assert not CodeBundle.objects.exists()
    assert bundle_files(settings) == before


def npz_bytes(rows: int = 30) -> bytes:
    buffer = io.BytesIO()
    x, y = np.zeros((rows, 8, 8, 1), "float32"), np.arange(rows) % 10
    np.savez(buffer, x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    return buffer.getvalue()


def test_dataset_upload_is_stored_and_described(client, alice, digits, example_wheel, settings):
    client.force_login(alice)
    wheel = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes())
    data = SimpleUploadedFile("mine.npz", npz_bytes())

    response = client.post(reverse("job-new"), form_data(wheel, digits, dataset="", dataset_file=data))

    assert response.status_code == 302
    dataset = Job.objects.get().dataset
    assert (dataset.owner, dataset.kind, dataset.name, dataset.rows, dataset.features) == (
        alice,
        "upload",
        "mine.npz",
        30,
        64,
    )
    assert Path(dataset.path).read_bytes() == npz_bytes()


@pytest.mark.parametrize(
    ("content", "max_mb", "reason"),
    [(b"", 500, "empty"), (b"x" * (2 * 2**20), 1, "larger than 1 MB")],
)
def test_bad_dataset_upload_leaves_nothing(client, alice, digits, example_wheel, settings, content, max_mb, reason):
    settings.FC2_MAX_DATASET_MB = max_mb
    client.force_login(alice)
    wheel = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes())
    data = SimpleUploadedFile("big.csv", content)

    response = client.post(reverse("job-new"), form_data(wheel, digits, dataset="", dataset_file=data))

    assert response.status_code == 400
    assert any(reason in e for e in response.context["form"].errors["dataset_file"])
    assert not CodeBundle.objects.exists() and not Dataset.objects.filter(kind="upload").exists()
    assert not [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file() and "builtin" not in p.parts]


# --- cancel, health, results ---


def test_owner_cancels_queued_job_once(client, alice, job):
    client.force_login(alice)
    url = reverse("job-cancel", args=[job.pk])

    first = client.post(url)
    second = client.post(url, follow=True)

    assert first.status_code == 302
    assert first["Location"] == reverse("job-detail", args=[job.pk])
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert job.finished_at is not None
    assert list(job.events.filter(state="cancelled").values_list("message", flat=True)) == ["cancelled by alice"]
    assert second.status_code == 200
    assert f"Job {job.pk} had already ended (cancelled)." in second.content.decode()


def test_cancel_needs_post(client, alice, job):
    client.force_login(alice)

    response = client.get(reverse("job-cancel", args=[job.pk]))

    assert response.status_code == 405


def test_healthz(client, db):
    response = client.get(reverse("healthz"))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"ok": True}


def test_succeeded_job_page_offers_downloads(client, alice, job):
    files = {"model.keras": b"\x00weights\xff" * 50, "logs/chief-0.log": b"epoch 1/1 loss 0.3\n"}
    artifacts = {name: pipeline.store_artifact(job, name, data) for name, data in files.items()}
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, metrics={"accuracy": 0.93})
    client.force_login(alice)

    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()

    assert "Cancel job" not in page
    assert "accuracy: 0.93" in page
    for name, artifact in artifacts.items():
        assert name in page
        assert reverse("artifact-download", args=[job.pk, artifact.pk]) in page
    for name, data in files.items():
        response = client.get(reverse("artifact-download", args=[job.pk, artifacts[name].pk]))
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == data
        expected_name = name.replace("/", "_")
        assert response["Content-Disposition"] == f'attachment; filename="{expected_name}"'
