"""The four-step job wizard: Code → Data → Resource → Review/Run, its errors beside their fields, its session state,
re-runs, other users' rows, and the live recommendation."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import socket
from decimal import Decimal
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import DatabaseError
from django.urls import reverse
from django.utils.html import escape

import provisioner
from fc2.bundles import MB
from fc2.celery import app as celery_app
from fc2.management.commands.submit_job import Command as SubmitJob
from fc2.models import CodeBundle, Dataset, Job
from fc2.services import datasets, jobs, pipeline, pricing
from fc2.services.bundles import store_bundle
from fc2.templatetags.fc2_ui import ESTIMATE_NOTE
from fc2.wizard import ALGORITHMS, SESSION_KEY, ResourceForm, planned
from fc2.wizard.forms import SIZED_BY_THE_PS_REASON
from harness.wheels import FILENAME, GOOD, make_wheel
from provisioner import local, sandbox
from recommender.catalog import load_catalog
from recommender.perfdata import import_samples
from tests.conftest import call_json, make_job
from tests.helpers import Api, code_form, resource_form, step_url, through_data

CPU = ("m4.xlarge", "t2.xlarge", "c4.xlarge")  # FC² §8.1's inexpensive CPU worker types


def bundle_files(settings) -> set[Path]:
    """Every file under MEDIA_ROOT/bundles (compare before and after)."""
    root = Path(settings.MEDIA_ROOT) / "bundles"
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def uploaded_files(settings) -> list[Path]:
    """Files under MEDIA_ROOT other than the materialised built-in datasets."""
    return [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file() and "builtin" not in p.parts]


def cost_opt_8_1(**fields) -> dict:
    """FC² §8.1: PS m4.large, the CPU worker types, a limit of 6 workers."""
    inputs = {"algorithm": "cost-opt", "catalog": "fc2-2018", "ps_type": "m4.large", "worker_types": list(CPU)}
    return resource_form(**{**inputs, "max_workers": "6", **fields})


def checked(page: str, name: str, value: str) -> bool:
    """Whether the page's radio button `name` = `value` is the chosen one."""
    return re.search(rf'<input type="radio" name="{name}" value="{value}"[^>]*\bchecked\b', page) is not None


def wizard_state(client) -> dict:
    return client.session.get(SESSION_KEY, {})


def through_resource(client, bundle, **resource) -> None:
    through_data(client, bundle)
    response = client.post(step_url("resource"), resource_form(**resource))
    assert response.status_code == 302, response.context["form"].errors


@pytest.fixture
def fc2_2018(db):
    return load_catalog("fc2-2018")


@pytest.fixture
def bob_bundle(bob, example_wheel):
    with example_wheel.open("rb") as wheel:
        return store_bundle(bob, wheel, example_wheel.name)


def npz_bytes(rows: int = 30) -> bytes:
    buffer = io.BytesIO()
    x, y = np.zeros((rows, 8, 8, 1), "float32"), np.arange(rows) % 10
    np.savez(buffer, x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    return buffer.getvalue()


# --- getting in ---


@pytest.mark.parametrize(
    "url", [reverse("job-new"), step_url("code"), step_url("review"), reverse("job-new-recommendation")]
)
def test_anonymous_is_sent_to_login(client, db, url):
    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


def test_entry_goes_to_the_first_step(client, alice):
    client.force_login(alice)

    response = client.get(reverse("job-new"))

    assert response.status_code == 302
    assert response["Location"] == step_url("code")


def test_code_step_renders_an_accessible_upload_form(client, alice):
    client.force_login(alice)

    response = client.get(step_url("code"))

    page = response.content.decode()
    assert response.status_code == 200
    assert 'name="wheel"' in page and 'accept=".whl"' in page
    assert 'name="csrfmiddlewaretoken"' in page
    assert 'value="main.py"' in page
    assert "<progress" in page and "data-upload-progress" in page
    assert 'aria-current="step"' in page and "<legend>Parameters</legend>" in page


def test_later_steps_wait_for_earlier_ones(client, alice):
    client.force_login(alice)

    for step in ("data", "resource", "review"):
        response = client.get(step_url(step))
        assert response.status_code == 302
        assert response["Location"] == step_url("code")


def test_unknown_step_is_404(client, alice):
    client.force_login(alice)

    assert client.get(step_url("payment")).status_code == 404


# --- the whole flow ---


def test_whole_flow_queues_the_job_and_sends_its_first_step_on_commit(
    client, alice, example_wheel, settings, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    before = bundle_files(settings)
    upload = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes(), content_type="application/zip")

    code = client.post(step_url("code"), code_form(upload))
    (bundle,) = CodeBundle.objects.all()
    data = client.post(step_url("data"), {"source": "builtin", "builtin": "digits"})
    resource = client.post(step_url("resource"), resource_form(strategy="ps", max_workers="2"))
    review = client.get(step_url("review"))
    with mock.patch.object(celery_app, "send_task") as send_task:
        with django_capture_on_commit_callbacks() as callbacks:
            run = client.post(step_url("review"))
        send_task.assert_not_called()  # not before the job's row is committed...
        for callback in callbacks:
            callback()  # ...but as soon as it is

    assert [r["Location"] for r in (code, data, resource)] == [step_url(s) for s in ("data", "resource", "review")]
    assert review.status_code == 200
    page = review.content.decode()
    assert "<strong>2 workers</strong>" in page and "--epochs=1" in page and "Run job" in page
    (job,) = Job.objects.all()
    digits = Dataset.objects.get(kind="builtin", builtin_name="digits")
    assert run.status_code == 302
    assert run["Location"] == reverse("job-detail", args=[job.pk])
    assert (job.owner, job.bundle, job.dataset) == (alice, bundle, digits)
    assert (job.state, job.driver, job.provider) == ("queued", "celery", "local")
    assert (job.request["strategy"], job.request["workers"], job.workers) == ("ps", 2, None)  # asked; not planned yet
    assert (job.algorithm, job.catalog, job.budget, job.worker_types) == ("manual", "fc2-2018", None, [])
    assert job.parameters == {"epochs": "1", "batch_size": "32"}
    assert (bundle.owner, bundle.filename, bundle.size_bytes) == (alice, example_wheel.name, upload.size)
    assert bundle.main_script.endswith("/main.py")
    assert bundle_files(settings) - before == {Path(bundle.wheel.path)}
    assert len(callbacks) == 1
    (sent,) = send_task.call_args_list
    assert sent.args == ("fc2.tasks.recommend",)
    assert (sent.kwargs["args"], sent.kwargs.get("countdown")) == ([job.pk], None)
    assert SESSION_KEY not in client.session  # a finished wizard starts afresh


def test_upload_is_stored_as_soon_as_the_code_step_is_submitted(client, alice, tmp_path, settings):
    client.force_login(alice)
    upload = SimpleUploadedFile(FILENAME, make_wheel(tmp_path, GOOD).read_bytes())

    response = client.post(step_url("code"), code_form(upload))

    (bundle,) = CodeBundle.objects.all()
    assert response.status_code == 302
    assert not Job.objects.exists()
    assert Path(bundle.wheel.path).is_file()
    assert wizard_state(client)["code"] == {"bundle": bundle.pk, "parameters": {"epochs": "1", "batch_size": "32"}}
    # ... and it is in the library the next time.
    page = client.get(step_url("code")).content.decode()
    assert f'<option value="{bundle.pk}" selected>demo 1.0' in page


def test_htmx_upload_is_sent_on_by_the_browser(client, alice, tmp_path):
    """The upload with a progress bar goes through htmx: success is a client-side redirect, a refusal a 400."""
    client.force_login(alice)
    good = SimpleUploadedFile(FILENAME, make_wheel(tmp_path, GOOD).read_bytes())
    bad = SimpleUploadedFile(FILENAME, b"not a zip")

    refused = client.post(step_url("code"), code_form(bad), headers={"HX-Request": "true"})
    accepted = client.post(step_url("code"), code_form(good), headers={"HX-Request": "true"})

    assert refused.status_code == 400
    assert 'id="wizard"' in refused.content.decode()
    assert (accepted.status_code, accepted["HX-Redirect"]) == (204, step_url("data"))


# --- bad uploads and other bad input ---


@pytest.mark.parametrize(
    ("filename", "content", "reason"),
    [
        pytest.param(FILENAME, b"PK\x03\x04 not really", "not a wheel: the file is not a zip archive", id="not-zip"),
        pytest.param(
            FILENAME,
            {**GOOD, "../evil.py": b""},
            "unsafe path in the wheel: '../evil.py' contains '..'",
            id="zip-slip",
        ),
        pytest.param(
            FILENAME,
            {**GOOD, "demo/zeros.bin": bytes(2 * MB)},
            "the wheel's member demo/zeros.bin looks like a zip bomb: it compresses ",
            id="zip-bomb",
        ),
        pytest.param(
            FILENAME,
            {**GOOD, "demo/main.py": None},
            "main script main.py is not in the wheel (looked at the top level and in packages)",
            id="main-missing",
        ),
        pytest.param(
            FILENAME,
            {k: v for k, v in GOOD.items() if ".dist-info/" not in k},
            "not a wheel: it has no .dist-info directory (build it with `python -m build --wheel`)",
            id="no-dist-info",
        ),
        pytest.param(FILENAME, b"", "The submitted file is empty.", id="empty"),
        pytest.param(
            "demo-1.0-py3-none-any.zip",
            GOOD,
            "demo-1.0-py3-none-any.zip is not a wheel: the file name must end in .whl",
            id="extension",
        ),
    ],
)
def test_bad_upload_is_refused_and_leaves_nothing(client, alice, settings, tmp_path, filename, content, reason):
    data = make_wheel(tmp_path, content).read_bytes() if isinstance(content, dict) else content
    client.force_login(alice)
    before = bundle_files(settings)

    response = client.post(step_url("code"), code_form(SimpleUploadedFile(filename, data)))

    assert response.status_code == 400
    (error,) = response.context["form"].errors["wheel"]
    assert error.startswith(reason)
    assert escape(error) in response.content.decode()
    assert not CodeBundle.objects.exists()
    assert bundle_files(settings) == before
    assert "code" not in wizard_state(client)


def test_failure_after_writing_the_wheel_removes_it(client, alice, example_wheel, settings):
    """The file is written before its row; when the row cannot be, the file goes too."""
    client.force_login(alice)
    client.raise_request_exception = False
    before = bundle_files(settings)
    written = []

    def track(field_file):
        written.append(Path(field_file.path))
        return real_track(field_file)

    from fc2.services import bundles

    real_track = bundles.track
    upload = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes())
    with (
        mock.patch.object(bundles, "track", side_effect=track),
        mock.patch.object(CodeBundle, "save", side_effect=DatabaseError("database is locked")),
    ):
        response = client.post(step_url("code"), code_form(upload))

    assert response.status_code == 500
    assert len(written) == 1  # the file was written...
    assert not written[0].exists()  # ...and removed with the row that failed
    assert not CodeBundle.objects.exists()
    assert bundle_files(settings) == before
    assert "code" not in wizard_state(client)


def test_run_failure_keeps_the_library_and_makes_no_job(client, alice, bundle):
    client.force_login(alice)
    through_resource(client, bundle)

    with mock.patch.object(jobs, "submit", side_effect=jobs.SubmitError("no capacity left on the local provider")):
        response = client.post(step_url("review"))

    assert response.status_code == 400
    assert response.context["run_error"] == "no capacity left on the local provider"
    assert "no capacity left on the local provider" in response.content.decode()
    assert not Job.objects.exists()
    assert list(CodeBundle.objects.all()) == [bundle]  # a stored bundle stays in the library
    assert wizard_state(client)["code"]["bundle"] == bundle.pk  # and the wizard keeps every entry


def test_the_wizard_the_api_and_submit_job_share_the_users_submission_limit(
    client, alice, bundle, example_wheel, settings
):
    """One door for every submission (fc2.services.submissions): what the user submitted anywhere counts everywhere,
    and the wizard says so on its review step, keeping every entry to run later."""
    settings.FC2_API_SUBMIT_RATE = "2/hour"
    client.force_login(alice)
    api = Api(client, alice)
    first = api.post("/api/jobs", {"bundle": bundle.pk, "dataset": "digits"})
    through_resource(client, bundle)
    second = client.post(step_url("review"))
    through_resource(client, bundle)

    refused = client.post(step_url("review"))
    refused_by_the_api = api.post("/api/jobs", {"bundle": bundle.pk, "dataset": "digits"})
    code, answer, _ = call_json("submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice")

    assert (first.status_code, second.status_code) == (201, 302)
    assert refused.status_code == 400
    assert re.fullmatch(
        r"Not submitted: too many job submissions: 2 an hour per user\. "
        r"You can submit again in (1 h 00 min|59 min \d\d s)\.",
        refused.context["run_error"],
    )
    assert escape(refused.context["run_error"]) in refused.content.decode()
    assert wizard_state(client)["code"]["bundle"] == bundle.pk  # the wizard keeps every entry
    assert refused_by_the_api.status_code == 429
    assert code == 1 and answer["error"].startswith("too many job submissions: 2 an hour per user (try again in 3")
    assert Job.objects.filter(owner=alice).count() == 2


def test_submit_error_is_shown_at_its_field_on_its_step(client, alice, bundle):
    client.force_login(alice)
    through_resource(client, bundle, max_workers="3", strategy="mirrored")

    with mock.patch.object(jobs, "submit", side_effect=jobs.SubmitError("too many workers", "workers")):
        response = client.post(step_url("review"))

    assert response.status_code == 400
    assert [t.name for t in response.templates][0] == "fc2/wizard/resource.html"
    form = response.context["form"]
    assert form.errors["max_workers"] == ["too many workers"]
    page = response.content.decode()
    assert 'name="max_workers" value="3"' in page  # the other entries are kept
    assert checked(page, "strategy", "mirrored")
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        pytest.param([("", "2")], "the parameter with value '2' has no name", id="no-name"),
        pytest.param([("bad key", "2")], "parameter name 'bad key' must be letters, digits, '_' or '-'", id="name"),
        pytest.param([("epochs", "1"), ("epochs", "2")], "parameter 'epochs' is given twice", id="twice"),
    ],
)
def test_bad_parameters_are_refused_beside_them(client, alice, settings, tmp_path, params, reason):
    client.force_login(alice)
    before = bundle_files(settings)
    upload = SimpleUploadedFile(FILENAME, make_wheel(tmp_path, GOOD).read_bytes())

    response = client.post(step_url("code"), code_form(upload, params=params, main_script="demo/main.py"))

    assert response.status_code == 400
    assert response.context["form"].errors["parameters"] == [reason]
    page = response.content.decode()
    assert escape(reason) in page
    assert 'value="demo/main.py"' in page  # the other entries are kept
    for key, value in params:
        assert f'name="parameters_key" value="{key}"' in page and f'name="parameters_value" value="{value}"' in page
    assert not CodeBundle.objects.exists()
    assert bundle_files(settings) == before


@pytest.mark.parametrize(
    ("step", "fields", "field", "reason"),
    [
        pytest.param("code", {"wheel": None}, "wheel", "Choose the wheel to upload.", id="no-wheel"),
        pytest.param("code", {"source": "library"}, "bundle", "Choose one of your bundles.", id="no-bundle"),
        pytest.param("data", {"source": "builtin"}, "builtin", "Pick a built-in dataset.", id="no-dataset"),
        pytest.param("data", {"source": "mine"}, "dataset", "Choose one of your datasets.", id="none-of-mine"),
        pytest.param("data", {"source": "url"}, "url", "Give the dataset's URL.", id="no-url"),
        pytest.param("data", {"source": "url", "url": "http://"}, "url", "Enter a valid URL.", id="bad-url"),
        pytest.param("data", {"source": "upload"}, "file", "Choose the file to upload.", id="no-file"),
        pytest.param(
            "resource", {"max_workers": "0"}, "max_workers", "Ensure this value is greater than or equal to 1.", id="0"
        ),
        pytest.param(
            "resource", {"max_workers": "9"}, "max_workers", "the local provider runs at most 8 workers", id="local-9"
        ),
        pytest.param("resource", {"max_workers": ""}, "max_workers", "Give the number of workers.", id="no-workers"),
        pytest.param(
            "resource",
            {"limit": "budget", "budget": "2"},
            "limit",
            "Manual runs the number of workers you give: choose a maximum number of workers.",
            id="manual-budget",
        ),
        pytest.param(
            "resource",
            {"algorithm": "cost-opt", "limit": "budget", "budget": "0"},
            "budget",
            "The budget must be more than $0/h.",
            id="zero-budget",
        ),
        pytest.param(
            "resource",
            {"algorithm": "scala-opt-m"},
            "worker_type",
            "Scala-Opt-M needs your worker type.",
            id="scala-opt-m-type",
        ),
    ],
)
def test_other_bad_input_is_refused_beside_its_field(client, alice, bundle, settings, step, fields, field, reason):
    client.force_login(alice)
    if step != "code":
        through_data(client, bundle)
    saved = wizard_state(client)
    data = {
        "code": {**code_form(params=[("epochs", "4")]), "source": "upload"},
        "data": {"source": "builtin", "builtin": "", "url": ""},
        "resource": resource_form(),
    }[step]
    data = {key: value for key, value in {**data, **fields}.items() if value is not None}
    before = uploaded_files(settings)

    response = client.post(step_url(step), data)

    assert response.status_code == 400
    assert response.context["form"].errors[field] == [reason]
    assert escape(reason) in response.content.decode()
    assert uploaded_files(settings) == before
    assert {k: v for k, v in wizard_state(client).items() if k != "current"} == {
        k: v for k, v in saved.items() if k != "current"
    }


def test_providers_come_from_the_registry_and_an_unusable_one_is_disabled_with_its_reason(
    client, alice, bundle, fc2_2018, settings
):
    """The wizard offers the registered providers (provisioner.PROVIDERS), each with its label; one that cannot make
    a cluster on this machine is shown disabled with the reason and the way to enable it, and refused if posted."""
    client.force_login(alice)
    through_data(client, bundle)
    settings.FC2_UNSANDBOXED_LOCAL_JOBS = False
    with mock.patch.object(sandbox, "unavailable", return_value="bwrap is not installed"):
        reason = local.unavailable()
        shown = client.get(step_url("resource")).content.decode()
        refused = client.post(step_url("resource"), resource_form(provider="local", max_workers="3"))
    unknown = client.post(step_url("resource"), resource_form(provider="nowhere", max_workers="3"))

    for provider in provisioner.PROVIDERS.values():
        assert f'value="{provider.name}"' in shown and provider.label in shown
    # (Drawn unavailable; not disabled, being the choice already made — a disabled choice would not be sent.)
    assert re.search(r'class="wz-unavailable"><input type="radio" name="provider" value="local"', shown)
    assert "bwrap is not installed" in reason and "FC2_UNSANDBOXED_LOCAL_JOBS=1" in reason
    assert f"cannot be chosen: {reason}." in shown
    assert refused.status_code == 400 and refused.context["form"].errors["provider"] == [reason]
    assert 'name="max_workers" value="3"' in refused.content.decode()
    assert unknown.status_code == 400 and "provider" in unknown.context["form"].errors


def test_local_without_the_sandbox_says_why_and_how_to_enable_it(client, alice, bundle, settings):
    client.force_login(alice)
    through_data(client, bundle)
    settings.FC2_UNSANDBOXED_LOCAL_JOBS = False

    with mock.patch("provisioner.sandbox.unavailable", return_value="bubblewrap not installed"):
        page = client.get(step_url("resource")).content.decode()
        refused = client.post(step_url("resource"), resource_form())

    assert checked(page, "provider", "local")  # the choice made stays sendable, to be refused with its reason
    assert "<strong>Local (this machine)</strong> cannot be chosen: local jobs need the sandbox" in page
    assert "the sandbox, which this machine cannot give: bubblewrap not installed" in page
    assert "FC2_UNSANDBOXED_LOCAL_JOBS=1" in page
    (error,) = refused.context["form"].errors["provider"]
    assert error.startswith("local jobs need the sandbox") and "FC2_UNSANDBOXED_LOCAL_JOBS=1" in error


def test_builtin_that_cannot_be_downloaded_is_refused_beside_it(client, alice, bundle):
    def offline():
        raise OSError("[Errno -2] Name or service not known")

    client.force_login(alice)
    through_data(client, bundle)
    mnist = dataclasses.replace(datasets.BUILTINS["mnist"], load=offline)

    with mock.patch.dict(datasets.BUILTINS, {"mnist": mnist}):
        response = client.post(step_url("data"), {"source": "builtin", "builtin": "mnist"})

    assert response.status_code == 400
    (error,) = response.context["form"].errors["builtin"]
    assert error.startswith("the built-in dataset 'mnist' could not be loaded (OSError: [Errno -2] Name or service")
    assert "needs internet access" in error
    page = response.content.decode()
    assert 'id="id_builtin_error"' in page and escape(error) in page
    assert checked(page, "builtin", "mnist")


def test_data_step_shows_the_builtins_as_fig_4_does(client, alice, bundle, digits):
    client.force_login(alice)
    through_data(client, bundle)

    page = client.get(step_url("data")).content.decode()

    assert digits.path not in page and str(Path(digits.path).parent) not in page  # no server path, to anyone
    assert "<dt>Status</dt><dd>ready</dd>" in page and f"{digits.size_mb:.2f} MB" in page
    assert ">64</dd>" in page and ">1797</dd>" in page  # digits: features, rows
    assert ">784</dd>" in page and ">70000</dd>" in page and "downloaded on first use" in page  # mnist
    assert ">3072</dd>" in page and ">60000</dd>" in page  # cifar10


# --- datasets ---


def test_dataset_upload_is_stored_described_and_used(client, alice, bundle, settings):
    client.force_login(alice)
    through_data(client, bundle)

    response = client.post(step_url("data"), {"source": "upload", "file": SimpleUploadedFile("mine.npz", npz_bytes())})
    again = client.get(step_url("data")).content.decode()
    client.post(step_url("resource"), resource_form())
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    assert response.status_code == 302
    dataset = Dataset.objects.get(kind="upload")
    assert (dataset.owner, dataset.name, dataset.rows, dataset.features) == (alice, "mine", 30, 64)
    assert Path(dataset.path).read_bytes() == npz_bytes()
    assert Job.objects.get().dataset == dataset
    # Kept among "my datasets", and chosen when the step is revisited.
    assert f'<option value="{dataset.pk}" selected>mine (Upload' in again


# A file over its limit is cut off while it streams in: tests/test_upload_limits.py.
@pytest.mark.parametrize(("content", "max_mb", "reason"), [(b"", 500, "empty")])
def test_bad_dataset_upload_leaves_nothing(client, alice, bundle, settings, content, max_mb, reason):
    settings.FC2_MAX_DATASET_MB = max_mb
    client.force_login(alice)
    through_data(client, bundle)
    before = uploaded_files(settings)

    response = client.post(step_url("data"), {"source": "upload", "file": SimpleUploadedFile("big.csv", content)})

    assert response.status_code == 400
    assert any(reason in e for e in response.context["form"].errors["file"])
    assert not Dataset.objects.filter(kind="upload").exists()
    assert uploaded_files(settings) == before


def test_url_dataset_is_stored_with_the_job(client, alice, bundle, monkeypatch):
    public = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 443))]  # no DNS here: a public answer
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kwargs: public)
    client.force_login(alice)
    through_data(client, bundle)
    url = "https://data.example.com/sets/mine.npz"

    client.post(step_url("data"), {"source": "url", "url": url})
    assert not Dataset.objects.filter(kind="url").exists()  # not until a job uses it
    client.post(step_url("resource"), resource_form())
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    dataset = Job.objects.get().dataset
    assert (dataset.owner, dataset.kind, dataset.url, dataset.name) == (alice, "url", url, "mine.npz")


# --- going back, reloading, re-running ---


def test_revisiting_steps_keeps_every_entry(client, alice, bundle, fc2_2018):
    client.force_login(alice)
    through_data(client, bundle, params=[("epochs", "3"), ("learning_rate", "0.05")])
    client.post(step_url("resource"), cost_opt_8_1(strategy="mirrored"))

    code = client.get(step_url("code")).content.decode()
    data = client.get(step_url("data")).content.decode()
    resource = client.get(step_url("resource")).content.decode()
    review = client.get(step_url("review"))

    assert checked(code, "source", "library")
    assert f'<option value="{bundle.pk}" selected>' in code
    assert 'name="parameters_key" value="learning_rate"' in code and 'name="parameters_value" value="0.05"' in code
    assert checked(data, "source", "builtin") and checked(data, "builtin", "digits")
    assert '<option value="cost-opt" selected>Cost-Opt</option>' in resource
    assert all(f'<option value="{t}" selected>' in resource for t in CPU)
    assert '<option value="m4.large" selected>' in resource and 'name="max_workers" value="6"' in resource
    assert checked(resource, "strategy", "mirrored") and checked(resource, "limit", "workers")
    assert review.status_code == 200
    # The steps are links: done ones marked, the current one announced.
    nav = review.content.decode()
    assert f'href="{step_url("code")}"' in nav and f'href="{step_url("resource")}"' in nav
    assert nav.count("(done)") == 3 and 'aria-current="step"' in nav


def test_state_survives_a_reload_and_holds_ids_never_files(client, alice, bundle):
    client.force_login(alice)
    through_data(client, bundle)

    reload = client.get(reverse("job-new"))
    state = wizard_state(client)

    assert reload["Location"] == step_url("resource")
    digits = Dataset.objects.get(builtin_name="digits")
    assert state["code"] == {"bundle": bundle.pk, "parameters": {"epochs": "1"}}
    assert state["data"] == {"source": "builtin", "dataset": digits.pk}
    assert len(json.dumps(state)) < 300


def test_start_over_forgets_the_wizard(client, alice, bundle):
    client.force_login(alice)
    through_data(client, bundle)

    response = client.post(reverse("job-new"))

    assert response["Location"] == step_url("code")
    assert SESSION_KEY not in client.session
    assert CodeBundle.objects.filter(pk=bundle.pk).exists()  # the library is not the wizard


def test_rerun_prefills_the_wizard_from_a_job(client, alice, bundle, digits, fc2_2018):
    job = make_job(
        alice,
        bundle,
        digits,
        parameters={"epochs": "2", "batch_size": "64"},
        algorithm="cost-opt",
        ps_type="m4.large",
        worker_types=list(CPU),
        workers=6,
        strategy="mirrored",
    )
    client.force_login(alice)

    response = client.get(reverse("job-new"), {"from": job.pk})
    review = client.get(response["Location"])
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    assert response["Location"] == step_url("review")
    assert "6 × c4.xlarge" in review.content.decode()
    rerun = Job.objects.exclude(pk=job.pk).get()
    fields = ("bundle", "dataset", "parameters", "algorithm", "ps_type", "worker_types", "workers", "strategy")
    assert [getattr(rerun, f) for f in fields] == [getattr(job, f) for f in fields]


@pytest.mark.parametrize("given", ["other", "404404", "abc", "²", "9" * 40, "9" * 5000, "-1", "1\x00"])
def test_rerun_of_a_job_one_cannot_see_is_404(client, alice, bob, bob_bundle, digits, given):
    job_id = make_job(bob, bob_bundle, digits).pk if given == "other" else given
    client.force_login(alice)

    response = client.get(reverse("job-new"), {"from": job_id})

    assert response.status_code == 404
    assert SESSION_KEY not in client.session


# --- other users' rows ---


def test_another_users_bundle_is_refused(client, alice, bob_bundle):
    client.force_login(alice)

    response = client.post(step_url("code"), code_form(bundle=bob_bundle))

    assert response.status_code == 400
    assert response.context["form"].errors["bundle"] == [
        "Select a valid choice. That choice is not one of the available choices."
    ]
    assert "code" not in wizard_state(client)
    assert f'<option value="{bob_bundle.pk}"' not in response.content.decode()


def test_another_users_dataset_is_refused(client, alice, bob, bundle):
    theirs = datasets.store_upload(bob, SimpleUploadedFile("theirs.npz", npz_bytes()))
    client.force_login(alice)
    through_data(client, bundle)

    response = client.post(step_url("data"), {"source": "mine", "dataset": theirs.pk})

    assert response.status_code == 400
    assert response.context["form"].errors["dataset"] == [
        "Select a valid choice. That choice is not one of the available choices."
    ]
    assert wizard_state(client)["data"]["dataset"] != theirs.pk
    assert "theirs.npz" not in response.content.decode()


# --- the live recommendation ---


def test_recommendation_for_cost_opt_is_6_c4_xlarge_as_in_8_1(client, alice, bundle, fc2_2018):
    client.force_login(alice)
    through_data(client, bundle)

    response = client.get(reverse("job-new-recommendation"), cost_opt_8_1())

    assert response.status_code == 200
    page = response.content.decode()
    assert "<strong>6 × c4.xlarge</strong> workers" in page
    assert "+ PS m4.large" in page and "$1.511/h" in page  # 0.125 + 6 × 0.231
    assert "cannot be estimated" in page  # no epoch time known for this code and data yet
    assert response.context["plan"].recommendation["algorithm"] == "cost-opt"


def test_instance_types_are_offered_with_prices_and_capacities_for_people(client, alice, bundle, db):
    load_catalog("aws-us-east-1")
    client.force_login(alice)
    through_data(client, bundle)

    page = client.get(step_url("resource"), resource_form(catalog="aws-us-east-1")).content.decode()

    assert "c5n.9xlarge · $1.944/h · 96 GiB · 50 Gbps</option>" in page  # the PS list, not 50000 Mbps


@pytest.mark.parametrize(
    ("strategy", "ps_type", "price", "explanation"),
    [
        ("ps", "m4.large", "$0.625/h", "2 m4.xlarge workers and a m4.large PS"),  # 0.125 + 2 × 0.25
        ("ps", "", "$0.75/h", "2 m4.xlarge workers and a m4.xlarge PS"),  # the PS on the workers' type: 3 × 0.25
        ("mirrored", "m4.large", "$0.50/h", "2 m4.xlarge workers you chose"),  # no PS: 2 × 0.25
    ],
)
def test_manual_price_counts_the_ps_of_a_parameter_server_cluster(
    client, alice, bundle, fc2_2018, strategy, ps_type, price, explanation
):
    client.force_login(alice)
    through_data(client, bundle)
    inputs = resource_form(strategy=strategy, catalog="fc2-2018", ps_type=ps_type, worker_type="m4.xlarge")

    response = client.get(reverse("job-new-recommendation"), inputs)

    page = response.content.decode()
    assert price in page
    assert explanation in page
    assert ("+ PS" in page) == (strategy == "ps")  # the PS priced is the PS shown


def test_resource_page_has_a_live_accessible_recommendation(client, alice, bundle, fc2_2018):
    client.force_login(alice)
    through_data(client, bundle)

    page = client.get(step_url("resource"), cost_opt_8_1()).content.decode()  # as the page asks for itself

    assert 'id="recommendation" aria-live="polite"' in page
    assert f'hx-get="{reverse("job-new-recommendation")}"' in page
    assert "<strong>6 × c4.xlarge</strong>" in page


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"limit": "budget", "budget": "0.2"},
            "The budget of $0.2/h cannot buy a PS plus one worker",
            id="infeasible",
        ),
        # On the local provider, whose nodes share the machine's network, Scala-Opt can never answer.
        pytest.param(
            {"algorithm": "scala-opt"},
            "Scala-Opt sizes the cluster by its parameter server's network link",
            id="scala-opt-on-local",
        ),  # fmt: skip
        pytest.param({"max_workers": "12"}, "the local provider runs at most 8 workers", id="too-many"),
    ],
)
def test_recommendation_says_clearly_why_there_is_none(client, alice, bundle, fc2_2018, fields, message):
    client.force_login(alice)
    through_data(client, bundle)
    inputs = cost_opt_8_1(**fields)
    if fields.get("limit") == "budget":
        inputs["ps_type"] = ""

    response = client.get(reverse("job-new-recommendation"), inputs)

    assert response.status_code == 200
    assert escape(message) in response.content.decode()


def test_infeasible_budget_is_refused_beside_the_budget(client, alice, bundle, fc2_2018):
    client.force_login(alice)
    through_data(client, bundle)

    response = client.post(step_url("resource"), cost_opt_8_1(limit="budget", budget="0.3"))

    assert response.status_code == 400
    (error,) = response.context["form"].errors["budget"]
    assert error.startswith("The budget of $0.3/h cannot buy the m4.large PS ($0.125/h) and one c4.xlarge worker")
    assert "resource" not in wizard_state(client)


def test_budget_limited_run_takes_the_recommended_count(client, alice, bundle, fc2_2018):
    client.force_login(alice)
    through_data(client, bundle, params=[("epochs", "3")])
    client.post(step_url("resource"), cost_opt_8_1(limit="budget", budget="1.511"))

    review = client.get(step_url("review"))
    with mock.patch.object(celery_app, "send_task"):
        run = client.post(step_url("review"))

    assert review.context["plan"].workers == 6
    job = Job.objects.get()
    assert run["Location"] == job.get_absolute_url()
    assert (job.algorithm, str(job.budget), job.catalog, job.request["budget"]) == (
        "cost-opt", "1.5110", "fc2-2018", "1.511"
    )  # fmt: skip
    assert pipeline.recommend(job.pk)
    job.refresh_from_db()
    assert (job.workers, job.ps_type, job.worker_type, job.worker_types) == (6, "m4.large", "c4.xlarge", list(CPU))


def test_an_old_resource_post_with_hourly_budget_is_read_the_old_way_and_said_to_be_deprecated(
    client, alice, bundle, fc2_2018
):
    """Before, `budget` was the whole job's $ and `hourly_budget` the $/h: such a post is taken in today's names."""
    client.force_login(alice)
    through_data(client, bundle)

    response = client.post(step_url("resource"), cost_opt_8_1(limit="budget", hourly_budget="1.511", budget="20"))

    assert response.status_code == 302 and response["Deprecation"] == "true"
    assert "hourly_budget is deprecated" in response["Warning"]
    saved = wizard_state(client)["resource"]
    assert (saved["budget"], saved["total_budget"]) == ("1.511", "20")


def test_planned_leaves_the_request_as_it_was(alice, bundle, fc2_2018):
    """A budget-limited request's plan has the recommended count; the request asked about is left as it was."""
    asked = jobs.JobRequest(
        bundle=bundle,
        dataset=datasets.resolve(alice, "digits"),
        algorithm="cost-opt",
        catalog="fc2-2018",
        ps_type="m4.large",
        worker_types=list(CPU),
        workers=1,
        budget=Decimal("1.511"),
    )
    before = dataclasses.replace(asked)

    plan = planned(asked)

    assert (plan.workers, asked.workers) == (6, 1)
    assert asked == before


def test_review_estimates_the_total_cost_when_the_epoch_time_is_known(client, alice, bundle, fc2_2018):
    """$/h × (start-up + predicted epoch time × epochs + teardown) / 3600, with a measured epoch time for this code
    and data."""
    from recommender.models import PerformanceRecord

    client.force_login(alice)
    through_data(client, bundle, params=[("epochs", "10")])
    client.post(step_url("resource"), cost_opt_8_1())
    workload = f"{bundle.distribution}:digits"
    PerformanceRecord.objects.create(
        workload=workload, instance_type="c4.xlarge", ps_type="m4.large", workers=6, epoch_time_s=360.0
    )

    response = client.get(step_url("review"))

    assert response.context["plan"].predicted_epoch_time_s == 360.0
    # Billed from launch to teardown: the local provider's start-up and teardown (its defaults: no job ran yet) too.
    overheads = pricing.overheads("local")
    assert overheads.startups == 0 and overheads.startup_s == pricing.DEFAULT_STARTUP_S["local"]
    billed_s = overheads.startup_s + 360 * 10 + overheads.teardown_s
    assert float(response.context["estimate"].total) == pytest.approx(1.511 * billed_s / 3600)
    assert "≈ $1.52" in response.content.decode() and "for 10 epochs" in response.content.decode()
    assert escape(ESTIMATE_NOTE) in response.content.decode()  # what the ≈ means, in the words of every other page


def test_a_whole_job_budget_is_kept_shown_on_review_given_to_the_job_and_to_its_rerun(client, alice, bundle):
    client.force_login(alice)
    through_resource(client, bundle, total_budget="2.5")

    review = client.get(step_url("review")).content.decode()
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    assert '<dd id="review-budget">$2.50 for the whole job</dd>' in review
    job = Job.objects.get()
    assert job.total_budget == Decimal("2.5")
    client.get(reverse("job-new"), {"from": job.pk})
    assert wizard_state(client)["resource"]["total_budget"] == "2.5"


@pytest.mark.parametrize(
    ("budget", "reason"),
    [("0", "The budget must be more than $0."), ("-3", "The budget must be more than $0."), ("ten", "Enter a number.")],
)
def test_a_bad_whole_job_budget_is_refused_beside_it(client, alice, bundle, budget, reason):
    client.force_login(alice)
    through_data(client, bundle)

    response = client.post(step_url("resource"), resource_form(total_budget=budget))

    assert response.status_code == 400
    assert response.context["form"].errors["total_budget"] == [reason]
    assert "resource" not in wizard_state(client)


def test_a_cluster_whose_projected_total_exceeds_the_budget_is_refused_beside_it(client, alice, bundle, fc2_2018):
    from recommender.models import PerformanceRecord

    client.force_login(alice)
    through_data(client, bundle, params=[("epochs", "10")])
    PerformanceRecord.objects.create(
        workload=f"{bundle.distribution}:digits", instance_type="c4.xlarge", ps_type="m4.large", workers=6,
        epoch_time_s=360.0,
    )  # fmt: skip

    response = client.post(step_url("resource"), cost_opt_8_1(total_budget="1"))

    assert response.status_code == 400
    # $1.511/h × (15 s start-up + 3,600 s training + 1 s teardown, the local provider's defaults) = $1.518.
    assert response.context["form"].errors["total_budget"] == [
        "the cluster's projected total cost, $1.52 for 10 epochs, exceeds the job's total budget of $1.00. Billed "
        "from launch to teardown: 15 s start-up + 3600 s training + 1 s teardown (start-up and teardown: the local "
        "provider's defaults, until a job of it has run here)."
    ]
    assert client.post(step_url("resource"), cost_opt_8_1(total_budget="1.51")).status_code == 400
    assert client.post(step_url("resource"), cost_opt_8_1(total_budget="1.52")).status_code == 302


def algorithm_disabled(page: str, value: str) -> bool:
    return re.search(rf'<option value="{value}"[^>]*\bdisabled\b', page) is not None


def test_resource_step_shows_the_workload_and_disables_algorithms_without_its_records(client, alice, bundle, fc2_2018):
    client.force_login(alice)
    through_data(client, bundle)
    workload = f"{bundle.distribution}:digits"

    response = client.get(step_url("resource"))

    page = response.content.decode()
    assert f'name="workload_name" value="{workload}"' in page
    # Scala-Opt measures the bandwidth it lacks in a profiling run first, and explore runs trials: never disabled for
    # want of records, only on Local, where they can never answer (tests/test_estimates.py).
    disabled = ["scala-opt", "scala-opt-m", "model", "lookup", "explore"]
    assert [value for value, _ in ALGORITHMS if algorithm_disabled(page, value)] == disabled
    how = (
        f"add them with: manage.py import_perf_data PATH --workload {workload} and --format anwar2021 for headerless "
        "rows of this one workload (as Anwar et al. give them), or --format csv for rows under a header naming their "
        "columns (types, workload…)"
    )
    model_reason = f"no performance records with an epoch time for workload {workload!r}: {how}"
    assert f"<strong>Model</strong> cannot answer: {escape(model_reason)}." in page
    assert "<strong>Scala-Opt</strong> cannot answer: Scala-Opt sizes the cluster by its parameter server" in page
    lab = client.get(step_url("resource"), {"provider": "lab"}).content.decode()
    assert [value for value, _ in ALGORITHMS if algorithm_disabled(lab, value)] == ["model", "lookup"]


@pytest.mark.parametrize("strategy", ["mirrored", "ddp"])
@pytest.mark.parametrize("algorithm", ["scala-opt", "scala-opt-m"])
def test_scala_opt_with_all_reduce_is_refused_beside_the_algorithm(
    client, alice, bundle, fc2_2018, algorithm, strategy
):
    client.force_login(alice)
    through_data(client, bundle)
    form = resource_form(algorithm=algorithm, strategy=strategy, provider="lab", worker_type="lab-w-1g")

    response = client.post(step_url("resource"), form)

    assert response.status_code == 400
    assert response.context["form"].errors["algorithm"] == [SIZED_BY_THE_PS_REASON]
    with_a_ps = client.post(step_url("resource"), {**form, "strategy": "ps"})
    assert SIZED_BY_THE_PS_REASON not in with_a_ps.context["form"].errors.get("algorithm", [])


def test_a_workload_with_records_makes_model_available_and_is_what_the_job_is_filed_under(
    client, alice, bundle, fc2_2018
):
    client.force_login(alice)
    through_data(client, bundle)
    import_samples()
    model = resource_form(algorithm="model", catalog="fc2-2018", max_workers="4", workload_name="anwar2021-mnist")

    shown = client.get(step_url("resource"), {"workload_name": "anwar2021-mnist"}).content.decode()
    recommendation = client.get(reverse("job-new-recommendation"), model)
    saved = client.post(step_url("resource"), model)
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    assert not algorithm_disabled(shown, "model") and not algorithm_disabled(shown, "lookup")
    assert "no performance records" not in recommendation.content.decode()
    assert recommendation.context["plan"].source == "predicted"
    assert saved.status_code == 302 and wizard_state(client) == {}
    job = Job.objects.get()
    assert (job.workload_name, job.workload) == ("anwar2021-mnist", "anwar2021-mnist")
    job_page = client.get(job.get_absolute_url()).content.decode()
    assert "<dt>Workload</dt><dd><code>anwar2021-mnist</code></dd>" in job_page


def test_the_default_workload_name_follows_the_code_and_data(client, alice, bundle):
    client.force_login(alice)
    through_data(client, bundle)
    client.post(step_url("resource"), resource_form(workload_name=f"{bundle.distribution}:digits"))
    client.post(step_url("data"), {"source": "upload", "file": SimpleUploadedFile("small.npz", npz_bytes())})
    small = Dataset.objects.get(owner=alice)

    page = client.get(step_url("resource")).content.decode()
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    assert f'name="workload_name" value="{bundle.distribution}:{small.name}"' in page
    job = Job.objects.get()
    assert (job.workload_name, job.workload) == ("", f"{bundle.distribution}:{small.name}")


def test_submit_job_takes_the_workload_and_its_help_says_what_the_wizard_says(alice, example_wheel):
    out = io.StringIO()
    call_command(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice",
        "--workload", "anwar2021-mnist", "--json", stdout=out,
    )  # fmt: skip
    help_text = " ".join(SubmitJob().create_parser("manage.py", "submit_job").format_help().split())

    assert Job.objects.get(pk=json.loads(out.getvalue())["id"]).workload == "anwar2021-mnist"
    assert "--workload NAME" in help_text and " ".join(jobs.WORKLOAD_NAME_HELP.split()) in help_text
    assert ResourceForm.base_fields["workload_name"].help_text == jobs.WORKLOAD_NAME_HELP


def test_a_lab_job_is_priced_and_typed_from_the_lab_catalogue(client, alice, bundle, fc2_2018):
    """The lab's nodes are its own catalogue's types: choosing the lab chooses its catalogue (whatever the page sent),
    another catalogue's type is refused beside the field, and the lab's latency between nodes goes into the request."""
    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    load_catalog("lab")
    client.force_login(alice)
    through_data(client, bundle)
    shown = client.get(step_url("resource"), resource_form(provider="lab", catalog="fc2-2018"))
    wrong = client.post(
        step_url("resource"), resource_form(provider="lab", catalog="fc2-2018", worker_type="m4.xlarge")
    )
    right = client.post(
        step_url("resource"),
        resource_form(provider="lab", catalog="fc2-2018", worker_type="lab-w-100", latency_ms="40"),
    )

    assert re.search(r'<option value="lab"[^>]*selected', shown.content.decode())
    assert "Lab (emulated cloud on this machine): its machines are the lab catalogue" in shown.content.decode()
    assert wrong.status_code == 400 and "worker_type" in wrong.context["form"].errors
    assert right.status_code == 302
    assert wizard_state(client)["resource"]["latency_ms"] == 40.0
    assert wizard_state(client)["resource"]["catalog"] == "lab"
