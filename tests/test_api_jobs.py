"""The jobs API (docs/API.md) with personal tokens: bundles, datasets and jobs — each endpoint's answer and its
refusals, another user's objects as 404s, refused uploads that store nothing, the submit rate limit, admins."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from django.core.cache import caches
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from fc2.bundles import MB
from fc2.models import Artifact, CodeBundle, Dataset, Job, Node
from fc2.services import artifacts, datasets, jobs, pipeline
from fc2.wizard import Wizard
from harness.wheels import FILENAME, GOOD, make_wheel
from recommender.catalog import load_catalog
from tests.conftest import launch_cluster, make_job
from tests.helpers import Api, good_npz, wheel_upload


@pytest.fixture
def api(client, alice) -> Api:
    return Api(client, alice)


@pytest.fixture
def fc2_2018(db):
    return load_catalog("fc2-2018")


@pytest.fixture
def bobs_api(client, bob) -> Api:
    return Api(client, bob)


@pytest.fixture
def admin_api(client, django_user_model) -> Api:
    return Api(client, django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1"))


def media_files(settings) -> list[Path]:
    """Every stored upload or artifact (the materialised built-in datasets aside)."""
    root = Path(settings.MEDIA_ROOT)
    return sorted(p for p in root.rglob("*") if p.is_file() and "builtin" not in p.parts)


BUNDLES, DATASETS, JOBS = "/api/bundles", "/api/datasets", "/api/jobs"


# --- bundles ----------------------------------------------------------------------------------------------------------


def test_upload_a_wheel_then_the_same_again(api, example_wheel):
    made = api.post(BUNDLES, {"name": "my cnn"}, files={"file": wheel_upload(example_wheel)})
    again = api.post(BUNDLES, files={"file": wheel_upload(example_wheel)})

    assert made.status_code == 201, made.json()
    bundle = made.json()
    assert bundle["name"] == "my cnn" and bundle["distribution"] == "fc2-digits-cnn" and bundle["jobs"] == 0
    assert bundle["main"].endswith("main.py") and len(bundle["sha256"]) == 64 and bundle["owner"] == "alice"
    assert again.status_code == 200 and again.json()["id"] == bundle["id"]
    assert api.get(BUNDLES).json() == {"results": [again.json()]}
    assert api.get(f"{BUNDLES}/{bundle['id']}").json() == again.json()


@pytest.mark.parametrize(
    ("members", "main", "reason"),
    [
        (None, "main.py", "not a zip archive"),
        ({**GOOD, "demo/main.py": None}, "main.py", "main.py"),
        (GOOD, "train.py", "train.py"),
        ({**GOOD, "../evil.py": b"x"}, "main.py", "evil.py"),
    ],
)
def test_a_refused_wheel_stores_nothing(api, settings, tmp_path, members, main, reason):
    path = make_wheel(tmp_path, members) if members else tmp_path / FILENAME
    if members is None:
        path.write_bytes(b"not a zip at all")
    before = media_files(settings)

    response = api.post(BUNDLES, {"main": main}, files={"file": wheel_upload(path)})

    assert response.status_code == 400
    assert response.json()["error"] == "invalid request"
    assert reason in response.json()["fields"]["file"][0]
    assert not CodeBundle.objects.exists() and media_files(settings) == before


def test_a_wheel_named_too_long_to_store_is_refused(api, tmp_path):
    name = f"demo-1.0{'.0' * 100}-py3-none-any.whl"

    response = api.post(BUNDLES, files={"file": wheel_upload(make_wheel(tmp_path, GOOD, name))})

    assert response.json()["fields"]["file"] == ["the wheel's file name is longer than 200 characters"]


def test_a_wheel_over_the_limit_is_413_and_stores_nothing(api, settings, tmp_path):
    settings.FC2_MAX_BUNDLE_MB = 1
    big = make_wheel(tmp_path, {**GOOD, "demo/data.bin": np.random.default_rng(0).bytes(2 * MB)})

    response = api.post(BUNDLES, files={"file": wheel_upload(big)})

    assert response.status_code == 413
    assert response.json() == {"error": "the wheel is larger than the 1 MB limit"}
    assert not CodeBundle.objects.exists() and media_files(settings) == []


def test_an_upload_without_a_valid_token_is_held_to_the_anonymous_limit(client, alice, tmp_path, settings):
    big = make_wheel(tmp_path, {**GOOD, "demo/data.bin": np.random.default_rng(0).bytes(6 * MB)})

    response = client.post(BUNDLES, {"file": wheel_upload(big)}, headers={"Authorization": "Token fc2_nonsense"})

    assert response.status_code == 413
    assert "limit for a request from someone not signed in" in response.json()["error"]
    assert media_files(settings) == []


def test_a_json_body_holds_no_file_and_is_held_to_djangos_limit(api, bundle):
    body = json.dumps({"bundle": bundle.pk, "dataset": "digits", "workload_name": "z" * (6 * MB)})

    response = api.client.post(JOBS, body, content_type="application/json", headers=api.headers)

    assert response.status_code == 413
    assert response.json() == {"error": "the request is 6 MB, above the 5 MB limit for this page"}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [({"main": "main.py"}, 400, "file"), ({"file": "not a file"}, 400, "file"), (None, 415, None)],
)
def test_a_bundle_upload_without_a_file_is_refused(api, body, status, field):
    response = api.post(BUNDLES, body, files={}) if body else api.post(BUNDLES, {"file": "x"})

    assert response.status_code == status
    assert response.json()["error"]
    if field:
        assert field in response.json()["fields"]


def test_delete_an_unused_bundle_removes_its_file(api, bundle, settings):
    path = Path(bundle.wheel.path)

    assert api.delete(f"{BUNDLES}/{bundle.pk}").status_code == 204
    assert not CodeBundle.objects.exists() and not path.exists()
    assert api.get(f"{BUNDLES}/{bundle.pk}").status_code == 404


def test_a_used_bundle_is_not_deleted(api, job):
    response = api.delete(f"{BUNDLES}/{job.bundle_id}")

    assert response.status_code == 409
    assert response.json() == {"error": "1 job used it; a job's record keeps what it ran on"}


def test_an_admin_sees_a_bundle_but_does_not_delete_it(admin_api, bundle):
    assert admin_api.get(f"{BUNDLES}/{bundle.pk}").json()["owner"] == "alice"
    assert admin_api.delete(f"{BUNDLES}/{bundle.pk}").status_code == 403


# --- datasets ---------------------------------------------------------------------------------------------------------


def test_datasets_list_the_builtins_and_ones_own(api, bobs_api, digits):
    mine = api.post(DATASETS, files={"file": good_npz()})

    assert mine.status_code == 201
    assert mine.json() | {"id": 0, "created_at": ""} == {
        "id": 0, "name": "points", "kind": "upload", "url": "", "size_mb": mine.json()["size_mb"],
        "features": 64, "rows": 30, "last_error": "", "created_at": "", "owner": "alice",
    }  # fmt: skip
    listed = api.get(DATASETS).json()
    assert {b["name"]: b["ready"] for b in listed["builtin"]} == {"digits": True, "mnist": False, "cifar10": False}
    assert [d["id"] for d in listed["results"]] == [mine.json()["id"]]
    assert bobs_api.get(DATASETS).json()["results"] == []
    assert api.get(f"{DATASETS}/{digits.pk}").json()["kind"] == "builtin"


def test_a_url_dataset_is_registered_once(api, settings):
    settings.FC2_DATASET_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    url = "http://127.0.0.1:9/data/points.npz"

    made = api.post(DATASETS, {"url": url, "name": "points"})
    again = api.post(DATASETS, {"url": url})

    assert made.status_code == 201 and made.json()["kind"] == "url" and made.json()["name"] == "points"
    assert again.status_code == 200 and again.json()["id"] == made.json()["id"]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9/points.npz", "dataset URL refused"),
        ("file:///etc/passwd", "not an http(s) URL"),
        ("https://" + "a" * 1000 + ".org/x.npz", "Ensure this field has no more than 1000 characters."),
    ],
)
def test_a_refused_url_stores_nothing(api, url, reason):
    response = api.post(DATASETS, {"url": url})

    assert response.status_code == 400
    assert reason in response.json()["fields"]["url"][0]
    assert not Dataset.objects.filter(kind=Dataset.Kind.URL).exists()


def test_a_refused_dataset_upload_stores_nothing(api, settings):
    before = media_files(settings)
    no_arrays = SimpleUploadedFile("x.npz", b"PK\x05\x06" + bytes(18))  # an empty zip: a zip, but no x_train

    refused = api.post(DATASETS, files={"file": SimpleUploadedFile("x.npz", b"not a zip")})
    empty = api.post(DATASETS, files={"file": SimpleUploadedFile("x.csv", b"")})

    assert refused.status_code == 400 and "not a zip archive" in refused.json()["fields"]["file"][0]
    assert empty.status_code == 400 and empty.json()["fields"]["file"] == ["The submitted file is empty."]
    assert api.post(DATASETS, files={"file": no_arrays}).status_code == 400  # (test_dataset_contract.py)
    assert api.post(DATASETS, files={"file": good_npz()}).status_code == 201
    assert len(media_files(settings)) == len(before) + 1


def test_a_dataset_over_the_limit_is_413(api, settings):
    settings.FC2_MAX_DATASET_MB = 1

    response = api.post(DATASETS, files={"file": SimpleUploadedFile("big.csv", b"1," * MB)})

    assert response.status_code == 413
    assert response.json() == {"error": "the dataset file is larger than 1 MB"}
    assert media_files(settings) == []


def test_delete_a_dataset_but_not_a_builtin(api, digits):
    mine = api.post(DATASETS, files={"file": good_npz()}).json()

    assert api.delete(f"{DATASETS}/{digits.pk}").json() == {"error": "a built-in dataset cannot be deleted"}
    assert api.delete(f"{DATASETS}/{mine['id']}").status_code == 204
    assert not Dataset.objects.filter(pk=mine["id"]).exists()


# --- jobs -------------------------------------------------------------------------------------------------------------


def test_submit_with_a_bundle_id(api, bundle, digits, django_capture_on_commit_callbacks):
    body = {"bundle": bundle.pk, "dataset": "digits", "parameters": {"epochs": "1"}, "workers": 2}

    with django_capture_on_commit_callbacks() as sent:
        response = api.post(JOBS, body)

    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["state"] == "queued" and job["active"] is True and job["owner"] == "alice"
    assert job["bundle"] == {"id": bundle.pk, "name": bundle.name} and job["dataset"]["name"] == "digits"
    assert job["parameters"] == {"epochs": "1"} and job["request"]["workers"] == 2 and job["provider"] == "local"
    assert job["workers"] is None and job["strategy"] == ""  # the plan: its recommend step's to write
    assert job["workload"] == "fc2-digits-cnn:digits" and job["url"].endswith(f"/jobs/{job['id']}/")
    assert [e["message"] for e in job["events"]] == ["submitted by alice"]
    assert job["cost"]["cost_so_far"] is None and job["progress"]["percent"] is None
    assert len(sent) == 1  # the recommend step, sent to the workers once the job is committed
    assert Job.objects.get(pk=job["id"]).driver == Job.Driver.CELERY


def test_submit_with_an_upload_stores_the_wheel_with_the_job(api, example_wheel):
    form = {"dataset": "digits", "parameters": json.dumps({"epochs": "2"}), "strategy": "mirrored", "workers": "3"}

    response = api.post(JOBS, form, files={"bundle_file": wheel_upload(example_wheel)})

    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.bundle.owner.username == "alice"
    assert (job.request["strategy"], job.request["workers"]) == ("mirrored", 3)
    assert job.parameters == {"epochs": "2"}


def test_submit_with_a_refused_wheel_stores_nothing(api, settings, tmp_path):
    path = make_wheel(tmp_path, {**GOOD, "demo/main.py": None})
    before = media_files(settings)

    response = api.post(JOBS, {"dataset": "digits"}, files={"bundle_file": wheel_upload(path)})

    assert response.status_code == 400 and "bundle_file" in response.json()["fields"]
    assert not CodeBundle.objects.exists() and not Job.objects.exists() and media_files(settings) == before


def test_submit_refused_by_the_service_stores_no_wheel(api, settings, example_wheel):
    """The wheel is valid, the job is not (no such worker type): neither the job nor the wheel is kept."""
    form = {"dataset": "digits", "worker_type": "no.such-type"}

    response = api.post(JOBS, form, files={"bundle_file": wheel_upload(example_wheel)})

    assert response.status_code == 400
    assert "no instance type 'no.such-type'" in response.json()["fields"]["worker_type"][0]
    assert not CodeBundle.objects.exists() and media_files(settings) == []


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"dataset": "nothing-of-that-name"}, "dataset", "no dataset named 'nothing-of-that-name'"),
        ({"dataset": "99999"}, "dataset", "no dataset 99999"),
        ({"provider": "gcp"}, "provider", '"gcp" is not a valid choice.'),
        ({"workers": 0}, "workers", "Ensure this value is greater than or equal to 1."),
        ({"workers": 9}, "workers", "the local provider runs at most 8 workers"),
        ({"parameters": {"bad name": "1"}}, "parameters", "parameter name 'bad name' must be"),
        ({"parameters": ["epochs=1"]}, "parameters", 'Expected a dictionary of items but got type "list".'),
        ({"bundle": 99999}, "bundle", "no bundle 99999"),
        ({"total_budget": "0"}, "total_budget", "a job's total budget must be more than $0"),
        ({"algorithm": "model"}, "algorithm", "No performance records"),
        ({"algorithm": "cost-opt", "strategy": "auto"}, "strategy", "A strategy left open is chosen by the Model"),
        ({"strategy": "ring"}, "strategy", '"ring" is not a valid choice.'),
        ({"latency_ms": 5}, "latency_ms", "the local provider cannot add latency between its nodes"),
    ],
)
def test_a_refused_submission_says_why(api, bundle, digits, fc2_2018, change, field, reason):
    response = api.post(JOBS, {"bundle": bundle.pk, "dataset": "digits", **change})

    assert response.status_code == 400, response.json()
    assert response.json()["error"] == "invalid request"
    assert reason in response.json()["fields"][field][0]
    assert not Job.objects.exists()


def test_a_budget_in_dollars_an_hour_is_asked_and_its_recommend_step_takes_the_count(api, bundle, digits, fc2_2018):
    body = {"bundle": bundle.pk, "dataset": "digits", "algorithm": "cost-opt", "budget": "1.5", "total_budget": 3}
    body |= {"ps_type": "m4.large", "worker_types": "m4.xlarge,c4.xlarge"}

    response = api.post(JOBS, body)

    assert response.status_code == 201, response.json()
    assert "Deprecation" not in response.headers
    answer = response.json()
    assert (answer["request"]["budget"], answer["request"]["total_budget"], answer["workers"]) == (1.5, 3, None)
    assert pipeline.recommend(answer["id"])
    planned = api.get(f"{JOBS}/{answer['id']}").json()
    assert planned["workers"] == 5  # ⌊(1.5 − 0.125) / 0.231⌋ c4.xlarge (FC² Cost-Opt)
    assert planned["request"] == answer["request"]  # what was asked stays as it came
    assert (planned["cost"]["budget"], planned["cost"]["total_budget"]) == (1.5, 3.0)


def test_an_old_clients_hourly_budget_is_read_the_old_way_and_said_to_be_deprecated(api, bundle, digits, fc2_2018):
    """Before, `budget` was the whole job's $: a request with `hourly_budget` is an old client's, its `budget` the
    total — never read as $/h."""
    body = {"bundle": bundle.pk, "dataset": "digits", "algorithm": "cost-opt", "hourly_budget": "1.5", "budget": 9}

    response = api.post(JOBS, body)

    assert response.status_code == 201, response.json()
    assert response.headers["Deprecation"] == "true" and "hourly_budget is deprecated" in response.headers["Warning"]
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.budget, job.total_budget) == (Decimal("1.5"), Decimal("9"))


def test_the_fc2_client_from_before_has_its_budget_read_as_the_whole_jobs(client, api, bundle, digits, fc2_2018):
    """`fc2 submit --total-budget 9` before 0.2 sent `budget: 9`: never read as $9/h."""
    body = {"bundle": bundle.pk, "dataset": "digits", "algorithm": "cost-opt", "budget": 9}
    headers = {**api.headers, "User-Agent": "fc2-client/0.1.0"}

    response = client.post(JOBS, json.dumps(body), content_type="application/json", headers=headers)

    assert response.status_code == 201, response.json()
    assert response.headers["Deprecation"] == "true"
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.budget, job.total_budget, job.request["workers"]) == (None, Decimal("9"), 2)


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"budget": 9}, "budget", "Manual does not take (it runs the workers given); a budget for the whole job, in $, "
         "is total_budget"),
        ({"algorithm": "cost-opt", "hourly_budget": 1, "total_budget": 9}, "hourly_budget",
         "hourly_budget is the deprecated name of budget: not with total_budget"),
    ],
)  # fmt: skip
def test_a_budget_that_could_be_a_total_read_as_dollars_an_hour_is_refused(api, bundle, digits, change, field, reason):
    response = api.post(JOBS, {"bundle": bundle.pk, "dataset": "digits", **change})

    assert response.status_code == 400 and reason in response.json()["fields"][field][0]
    assert not Job.objects.exists()


def test_someone_elses_bundle_or_dataset_cannot_be_submitted(bobs_api, bundle, alice):
    theirs = datasets.store_upload(alice, good_npz())

    by_bundle = bobs_api.post(JOBS, {"bundle": bundle.pk, "dataset": "digits"})
    by_dataset = bobs_api.post(JOBS, {"bundle": bundle.pk, "dataset": str(theirs.pk)})

    assert by_bundle.json()["fields"] == {"bundle": [f"no bundle {bundle.pk}"]}
    assert by_dataset.status_code == 400


def test_jobs_list_pages_and_filters(api, bobs_api, alice, bundle, digits):
    made = [make_job(alice, bundle, digits) for _ in range(3)]
    Job.objects.filter(pk=made[0].pk).update(state=Job.State.FAILED)

    first = api.get(JOBS, page_size=2).json()
    second = api.get(JOBS, page_size=2, page=2).json()
    failed = api.get(JOBS, state="failed").json()

    assert first["count"] == 3 and [j["id"] for j in first["results"]] == [made[2].pk, made[1].pk]
    assert first["next"].endswith("page=2&page_size=2") and first["previous"] is None
    assert [j["id"] for j in second["results"]] == [made[0].pk] and second["next"] is None
    assert [j["id"] for j in failed["results"]] == [made[0].pk] and failed["results"][0]["active"] is False
    assert api.get(JOBS, provider="aws").json()["count"] == 0
    assert bobs_api.get(JOBS).json()["count"] == 0
    assert api.get(JOBS, state="sleeping").json()["fields"]["state"] == ['"sleeping" is not a valid choice.']
    assert api.get(JOBS, page=9).status_code == 404


def test_a_job_with_its_nodes_progress_and_cost(api, job):
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, epoch=1, epochs=2, step=5, steps=10, loss=0.5)
    Node.objects.create(job=job, name="chief-0", role="chief", index=0, status=Node.Status.RUNNING)

    answer = api.get(f"{JOBS}/{job.pk}").json()

    assert answer["progress"] == {"percent": 50, "epoch": 1, "epochs": 2, "step": 5, "steps": 10, "loss": 0.5}
    assert answer["nodes"] == [
        {"name": "chief-0", "role": "chief", "instance_type": "", "address": "", "status": "running",
         "exit_code": None, "last_report_at": None}
    ]  # fmt: skip
    assert set(answer["cost"]) == {
        "hourly_cost", "budget", "total_budget", "cost_so_far", "projected_total", "projected_by", "launched_at",
        "torn_down_at",
    }  # fmt: skip


def test_a_spot_job_fallen_back_to_on_demand_gives_both_markets_as_its_cost_counts_them(api, job):
    launched = timezone.now() - timedelta(hours=3)
    fell_back = launched + timedelta(hours=1)
    # As pricing.bill writes them: a span from the launch on spot, ended by the relaunch on on-demand, still billed.
    start, switch = launched.isoformat(), fell_back.isoformat()
    rates = [
        {"market": "spot", "hourly_cost": 0.0924, "started_at": start, "ended_at": switch},
        {"market": "on-demand", "hourly_cost": 0.462, "started_at": switch, "ended_at": None},
    ]
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.RUNNING, provider="aws", spot=True, launched_at=launched, hourly_cost=Decimal("0.462"),
        rates=rates,
    )  # fmt: skip

    answer = api.get(f"{JOBS}/{job.pk}").json()

    spot, on_demand = answer["rates"]
    assert (spot["market"], spot["hourly_cost"], on_demand["market"], on_demand["hourly_cost"]) == (
        "spot", 0.0924, "on-demand", 0.462
    )  # fmt: skip
    assert [datetime.fromisoformat(spot[at]) for at in ("started_at", "ended_at")] == [launched, fell_back]
    assert datetime.fromisoformat(on_demand["started_at"]) == fell_back and on_demand["ended_at"] is None
    assert answer["cost"]["cost_so_far"] == pytest.approx(0.0924 + 2 * 0.462, rel=1e-3)  # the same spans, billed
    plain = make_job(job.owner, job.bundle, job.dataset)
    assert api.get(f"{JOBS}/{plain.pk}").json()["rates"] == []  # on-demand: billed at hourly_cost throughout


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        ("not a list", []),
        ({"market": "spot"}, []),
        (["not a dict", 7, None], [dict.fromkeys(("market", "hourly_cost", "started_at", "ended_at"))] * 3),
        (
            [{"market": "moon", "hourly_cost": "lots", "started_at": "yesterday", "ended_at": 5}],
            [dict.fromkeys(("market", "hourly_cost", "started_at", "ended_at"))],
        ),
        (
            [{"market": ["spot"], "hourly_cost": [0.1], "started_at": {"at": 1}, "ended_at": True}],
            [dict.fromkeys(("market", "hourly_cost", "started_at", "ended_at"))],
        ),
        (
            [{"market": "spot", "hourly_cost": 0.1, "started_at": "2026-11-03T10:00:00+00:00", "ended_at": "soon"}],
            [{"market": "spot", "hourly_cost": 0.1, "started_at": "2026-11-03T10:00:00Z", "ended_at": None}],
        ),
    ],
)
def test_hand_broken_rates_are_null_fields_not_a_server_error(api, job, broken, expected):
    Job.objects.filter(pk=job.pk).update(rates=broken)

    answer = api.get(f"{JOBS}/{job.pk}")

    assert answer.status_code == 200 and answer.json()["rates"] == expected


@pytest.mark.parametrize("nodes", [1, 4])
def test_a_job_is_shown_in_a_fixed_number_of_queries(api, job, django_assert_num_queries, nodes):
    for index in range(nodes):
        node = Node.objects.create(job=job, name=f"worker-{index}", role="worker", index=index)
        artifacts.store_artifact(job, f"worker-{index}/log.txt", b"x", node=node)
        job.log(f"worker-{index} started")
    api.get(f"{JOBS}/{job.pk}")  # (the token's first use of the minute is written)

    # The token, the job with its bundle, dataset and owner, its events, nodes, and artifacts with their nodes.
    with django_assert_num_queries(5):
        answer = api.get(f"{JOBS}/{job.pk}").json()

    assert len(answer["nodes"]) == nodes and answer["artifacts"][-1]["node"] == f"worker-{nodes - 1}"


def test_cancel_then_cancel_again(api, job):
    cancelled = api.post(f"{JOBS}/{job.pk}/cancel")
    again = api.post(f"{JOBS}/{job.pk}/cancel")

    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["events"][-1]["message"] == "cancelled by alice"
    assert again.status_code == 409 and again.json() == {"error": f"job {job.pk} has already ended (cancelled)"}


def test_a_collecting_job_cannot_be_cancelled(api, job):
    Job.objects.filter(pk=job.pk).update(state=Job.State.COLLECTING)

    response = api.post(f"{JOBS}/{job.pk}/cancel")

    assert response.status_code == 409 and "its results are being collected" in response.json()["error"]


def test_rerun_submits_the_same_request_again(api, alice, bundle, digits):
    job = make_job(alice, bundle, digits, strategy="mirrored", workers=3, parameters={"epochs": "2"})
    assert pipeline.recommend(job.pk)

    response = api.post(f"{JOBS}/{job.pk}/rerun")

    assert response.status_code == 201
    again = Job.objects.get(pk=response.json()["id"])
    assert again.pk != job.pk and again.state == Job.State.QUEUED and not again.planned
    assert again.request == job.request
    for name in ("bundle_id", "dataset_id", "parameters", "provider", "algorithm"):
        assert getattr(again, name) == getattr(job, name)


@pytest.mark.parametrize(
    "fields",
    [
        {"strategy": "mirrored", "workers": 3},
        {"algorithm": "cost-opt", "ps_type": "m4.large", "worker_types": ["m4.xlarge", "c4.xlarge"], "workers": 4},
        {"worker_type": "c4.xlarge", "ps_type": "m4.large", "workers": 2},  # (Scala-Opt-M never runs on Local)
    ],
)
def test_rerun_asks_what_the_wizard_fills_in(rf, alice, bundle, digits, fc2_2018, fields):
    """The API's re-run and the wizard's `?from=<id>` start from the same request."""
    job = make_job(alice, bundle, digits, **fields)
    request = rf.get("/")
    request.user, request.session = alice, {}
    wizard = Wizard(request)

    wizard.prefill(job)

    assert jobs.JobRequest.of(job) == wizard.job_request()


def test_submissions_are_rate_limited_per_user(api, client, alice, bob, bundle, digits, settings):
    """Whatever token (or session) they come with: a user with many tokens does not have many allowances."""
    settings.FC2_API_SUBMIT_RATE = "2/hour"
    other = Api(client, alice)
    body = {"bundle": bundle.pk, "dataset": "digits"}

    statuses = [api.post(JOBS, body).status_code, other.post(JOBS, body).status_code]
    limited = api.post(JOBS, body)
    by_another_token = Api(client, alice).post(JOBS, body)
    rerun = other.post(f"{JOBS}/{Job.objects.first().pk}/rerun")
    client.force_login(alice)
    by_session = client.post(JOBS, json.dumps(body), content_type="application/json")

    assert statuses == [201, 201]
    for refused in (limited, by_another_token, rerun, by_session):
        assert refused.status_code == 429
        assert 3590 <= int(refused["Retry-After"]) <= 3600  # whole seconds
        assert refused.json()["error"].startswith("too many job submissions: 2 an hour per user. Expected available")
    assert api.get(JOBS).status_code == 200  # only submitting is limited
    assert Job.objects.count() == 2
    assert Api(client, bob).post(JOBS, {**body, "bundle": bundle.pk}).status_code == 400  # bob: his own allowance


def test_the_limit_counts_the_jobs_of_the_last_period(api, alice, bundle, digits, settings):
    """A sliding period: Retry-After says when the oldest job counted leaves it, and then one more is taken."""
    settings.FC2_API_SUBMIT_RATE = "2/minute"
    body = {"bundle": bundle.pk, "dataset": "digits"}
    first, second = (api.post(JOBS, body).json()["id"] for _ in range(2))
    now = timezone.now()
    Job.objects.filter(pk=first).update(created_at=now - timedelta(seconds=50))
    Job.objects.filter(pk=second).update(created_at=now - timedelta(seconds=20))

    limited = api.post(JOBS, body)
    assert limited.status_code == 429 and 9 <= int(limited["Retry-After"]) <= 10

    Job.objects.filter(pk=first).update(created_at=now - timedelta(seconds=61))
    assert api.post(JOBS, body).status_code == 201
    assert api.post(JOBS, body).status_code == 429


# --- logs and artifacts -----------------------------------------------------------------------------------------------


def test_logs_are_followed_by_offset_while_the_cluster_is_up(api, job):
    cluster = launch_cluster(job)
    chief = next(node for node in cluster.nodes if node.role == "chief")
    log = Path(chief.workdir) / "node.log"
    log.write_text("epoch 1\n")
    url = f"{JOBS}/{job.pk}/logs"

    first = api.get(url).json()
    log.write_text("epoch 1\népoch 2\n")
    second = api.get(url, since=first["offset"]).json()
    nothing_new = api.get(url, since=second["offset"]).json()

    assert first["node"] == "chief-0" and set(first["nodes"]) == {"ps-0", "chief-0", "worker-0", "worker-1"}
    assert first == first | {"text": "epoch 1\n", "offset": 8, "complete": False}
    assert second["text"] == "époch 2\n" and second["offset"] == 16
    assert nothing_new["text"] == "" and nothing_new["offset"] == 16
    assert api.get(url, node="worker-0").json()["text"] == ""
    log.unlink()  # a log that cannot be read just now: the follower keeps its place
    assert api.get(url, since=16).json() | {"nodes": []} == {
        "node": "chief-0", "nodes": [], "offset": 16, "text": "", "complete": False
    }  # fmt: skip
    assert api.get(url, node="worker-9").json()["fields"]["node"][0].startswith(f"job {job.pk} has no node")


def test_an_ended_jobs_logs_come_from_what_was_kept(api, job):
    Node.objects.create(job=job, name="worker-0", role="worker", index=0)
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED)
    artifacts.store_artifact(job, "logs/worker-0.log", b"all done\n")

    answer = api.get(f"{JOBS}/{job.pk}/logs", since=4).json()

    assert answer == {"node": "worker-0", "nodes": ["worker-0"], "offset": 9, "text": "done\n", "complete": True}


def test_a_job_without_nodes_has_no_log_yet(api, job):
    assert api.get(f"{JOBS}/{job.pk}/logs").json() == {
        "node": None, "nodes": [], "offset": 0, "text": "", "complete": False
    }  # fmt: skip


def test_artifacts_are_listed_and_downloaded(api, job):
    model = artifacts.store_artifact(job, "model.keras", b"weights")

    listed = api.get(f"{JOBS}/{job.pk}/artifacts").json()["results"]
    download = api.get(f"{JOBS}/{job.pk}/artifacts/{model.pk}")

    assert listed == [
        {"id": model.pk, "name": "model.keras", "original_name": "", "size_bytes": 7, "node": None, "not_kept": "",
         "url": f"http://testserver/api/v1/jobs/{job.pk}/artifacts/{model.pk}"}
    ]  # fmt: skip
    assert download.status_code == 200 and download.body == b"weights"
    assert download["Content-Disposition"] == 'attachment; filename="model.keras"'
    assert api.get(f"{JOBS}/{job.pk}/artifacts/{model.pk + 1}").json() == {
        "error": f"job {job.pk} has no artifact {model.pk + 1}"
    }
    assert api.get(f"{JOBS}/{job.pk}").json()["artifacts"] == listed


def test_an_artifact_not_kept_has_no_url_and_its_download_says_why(api, job):
    kept = artifacts.store_artifact(job, "model.keras", b"weights", original_name="out/model.keras")
    reason = "3.0 GB, over the 200 MB limit (FC2_MAX_ARTIFACT_MB)"
    big = artifacts.store_artifact(
        job, "checkpoint.bin", b"", original_name="out/check\\x00point.bin", not_kept=reason, size_bytes=3 * 10**9
    )
    log = artifacts.store_artifact(job, "logs/chief-0.log", b"", not_kept="no log", size_bytes=0)

    listed = {a["name"]: a for a in api.get(f"{JOBS}/{job.pk}/artifacts").json()["results"]}
    download = api.get(f"{JOBS}/{job.pk}/artifacts/{big.pk}")

    assert listed["checkpoint.bin"]["url"] is None and listed["checkpoint.bin"]["not_kept"] == reason
    assert listed["checkpoint.bin"]["original_name"] == "out/check\\x00point.bin"
    assert listed["checkpoint.bin"]["size_bytes"] == 3 * 10**9
    assert listed["model.keras"]["url"].endswith(f"/artifacts/{kept.pk}") and listed["model.keras"]["not_kept"] == ""
    assert download.status_code == 404
    assert download.json() == {"error": f"artifact checkpoint.bin was not kept: {reason}"}
    assert api.get(f"{JOBS}/{job.pk}/artifacts/{log.pk}").status_code == 404
    assert api.get(f"{JOBS}/{job.pk}").json()["artifacts"] == list(listed.values())
    job.state = Job.State.FAILED
    job.save()
    Node.objects.create(job=job, name="chief-0", role="chief", index=0)
    logs = api.get(f"{JOBS}/{job.pk}/logs")  # the node's log is an artifact not kept: none to read
    assert logs.status_code == 200 and logs.json()["text"] == "" and logs.json()["complete"] is True


def test_a_missing_artifact_file_is_404(api, job):
    model = artifacts.store_artifact(job, "model.keras", b"weights")
    Path(model.file.path).unlink()

    assert api.get(f"{JOBS}/{job.pk}/artifacts/{model.pk}").status_code == 404


# --- who sees what ----------------------------------------------------------------------------------------------------


@pytest.fixture
def alices(alice, job) -> dict[str, str]:
    """A path to each of alice's objects."""
    dataset = datasets.store_upload(alice, good_npz())
    model = artifacts.store_artifact(job, "model.keras", b"weights")
    return {
        "job": f"{JOBS}/{job.pk}",
        "logs": f"{JOBS}/{job.pk}/logs",
        "artifacts": f"{JOBS}/{job.pk}/artifacts",
        "artifact": f"{JOBS}/{job.pk}/artifacts/{model.pk}",
        "bundle": f"{BUNDLES}/{job.bundle_id}",
        "dataset": f"{DATASETS}/{dataset.pk}",
    }


@pytest.mark.parametrize("what", ["job", "logs", "artifacts", "artifact", "bundle", "dataset"])
def test_another_users_token_gets_404(api, bobs_api, alices, what):
    assert api.get(alices[what]).status_code == 200
    response = bobs_api.get(alices[what])

    assert response.status_code == 404
    assert response.json()["error"].startswith("no ")


@pytest.mark.parametrize(("method", "what"), [("post", "cancel"), ("post", "rerun"), ("delete", "bundle")])
def test_another_users_token_cannot_act_on_them(bobs_api, alices, job, method, what):
    path = alices[what] if what in alices else f"{alices['job']}/{what}"

    assert getattr(bobs_api, method)(path).status_code == 404
    assert Job.objects.count() == 1 and Job.objects.get().state == Job.State.QUEUED


def test_an_id_past_64_bits_is_404(api, db):
    assert api.get(f"{JOBS}/{2**64}").status_code == 404
    assert api.get(f"{BUNDLES}/{2**70}").status_code == 404


def test_an_admin_sees_everyones_jobs(admin_api, alices, job):
    assert admin_api.get(alices["artifact"]).status_code == 200
    assert [j["id"] for j in admin_api.get(JOBS).json()["results"]] == [job.pk]
    assert admin_api.get(alices["job"]).json()["owner"] == "alice"


def test_without_a_token_every_endpoint_is_401(client, alices):
    for path in [*alices.values(), JOBS, BUNDLES, DATASETS]:
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.json() == {"error": "Authentication credentials were not provided."}


def test_the_schema_describes_the_jobs_api(api):
    schema = api.get("/api/schema", format="json").json()

    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}/logs", "/api/v1/bundles", "/api/v1/datasets"} <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["apiToken"]["name"] == "Authorization"
    assert "basicAuth" not in schema["components"]["securitySchemes"]
    assert Artifact.objects.count() == 0


def test_the_submit_count_is_shared_by_every_process(api, bundle, digits, settings):
    """Counted in the database, not in one process's memory nor in a cache: another web worker, with its own empty
    memory, still refuses."""
    settings.FC2_API_SUBMIT_RATE = "1/hour"
    body = {"bundle": bundle.pk, "dataset": "digits"}
    assert api.post(JOBS, body).status_code == 201

    for cache in caches.all():
        cache.clear()  # what another process holds of it: nothing

    assert api.post(JOBS, body).status_code == 429
