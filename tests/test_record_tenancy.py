"""Performance records are tenant data (issue 41, §2): what bob's jobs measure never changes alice's answers, through
every door she asks at (the API, the Lookup and Records pages, the wizard's plan, the command line), until an admin
promotes it; every answer says whose records it read; and no record value — 1e308, 1e-300, 0, negative, NaN — makes
a door answer 500 or put NaN or infinity in JSON. Real database, real views, real commands."""

from __future__ import annotations

import json
import math

import pytest
from django.db import connection
from django.urls import reverse

from fc2.models import Job, JobRecord
from fc2.services import feedback, jobs, planning
from fc2.services.bundles import store_bundle
from recommender import bounds
from recommender.models import PerformanceRecord
from tests.conftest import call_json
from tests.helpers import job_row, make_bundle, make_dataset, migrate, resource_form, through_data

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fc2_catalog", "table4")]

# Table 4 (the `table4` fixture, the platform's): at batch 6400 and 0 ms, 4 workers are fastest, 57 s an epoch.
LOOKUP = {"algorithm": "lookup", "workload": "mnist", "batch_size": 6400, "latency_ms": 0, "strategy": "mirrored"}
MODEL = {**LOOKUP, "algorithm": "model", "max_workers": 4}


def ask(client, user, params: dict, method: str = "get"):
    client.force_login(user)
    call = client.get if method == "get" else client.post
    return call(reverse("api-recommend"), params, **({"content_type": "application/json"} if method == "post" else {}))


def strict_json(response) -> dict:
    """The body as JSON that holds no NaN nor infinity (a strict parser's view)."""

    def refuse(token: str):
        raise AssertionError(f"{token} in a JSON answer")

    return json.loads(response.content, parse_constant=refuse)


def bobs_job(bob, **metrics) -> Job:
    """A job of bob's that ended on the lab, filed under the platform's workload `mnist`, 2 all-reduce m4.xlarge
    workers at batch 6400 and 0 ms, its code's own metrics as given (in memory only: PostgreSQL's jsonb would refuse
    a NaN before any door saw it): what record_job turns into a record."""
    job = job_row(
        bob,
        provider="lab",
        state=Job.State.SUCCEEDED,
        strategy=Job.Strategy.MIRRORED,
        workers=2,
        worker_type="m4.xlarge",
        latency_ms=0.0,
        workload_name="mnist",
        parameters={"batch_size": "6400"},
    )
    job.metrics = {"batch_size": 6400, **metrics}
    return job


def bob_measures(bob, epoch_time_s: float = 1.0) -> PerformanceRecord:
    """Bob's job that says it trained an epoch in `epoch_time_s`: far faster than anything the platform measured."""
    job = bobs_job(bob, epoch_time_s=epoch_time_s)
    record = feedback.record_job(job)
    assert record is not None
    return record


@pytest.fixture
def alice_answer(client, alice):
    """Alice's lookup before bob measured anything."""
    response = ask(client, alice, LOOKUP)
    assert response.status_code == 200
    answer = strict_json(response)
    assert (answer["workers"], answer["predicted_epoch_time_s"]) == (4, 57)
    return answer


def test_a_jobs_record_is_its_owners(bob):
    record = bob_measures(bob)

    assert record.owner == bob and record.trust == "owner"
    assert JobRecord.objects.get(record=record).job.owner == bob


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize("params", [LOOKUP, MODEL], ids=["lookup", "model"])
def test_bobs_records_never_change_alices_answer_through_the_api(client, alice, bob, method, params, settings):
    settings.FC2_RECOMMEND_MEMO_S = 3600  # an answer kept must be kept for its owner alone
    before = strict_json(ask(client, alice, params, method))
    bob_measures(bob)

    bobs = strict_json(ask(client, bob, params, method))
    alices = strict_json(ask(client, alice, params, method))

    assert alices == before
    assert alices["records"] == {"platform": 10, "own": 0, "unusable": 0, "text": "10 platform records"}
    assert bobs["records"]["own"] == 1 and bobs["records"]["text"] == "10 platform records, 1 of yours"
    if params is LOOKUP:
        assert (bobs["workers"], bobs["predicted_epoch_time_s"]) == (2, 1.0)  # his own run: he sees it


def test_a_memoised_answer_is_never_another_users(client, alice, bob, settings):
    """Bob's answer computed first and kept an hour: alice, asking the same question next, still gets hers."""
    settings.FC2_RECOMMEND_MEMO_S = 3600
    bob_measures(bob)

    assert strict_json(ask(client, bob, LOOKUP))["workers"] == 2
    assert strict_json(ask(client, alice, LOOKUP))["workers"] == 4
    assert strict_json(ask(client, bob, LOOKUP))["workers"] == 2


def test_bobs_records_are_not_on_alices_pages(client, alice, bob, alice_answer):
    bob_measures(bob)
    PerformanceRecord.objects.create(owner=bob, workload="bobs-secret-workload", workers=1, epoch_time_s=2.0)
    client.force_login(alice)

    lookup = client.get(reverse("recommender-anwar"), {**LOOKUP, "catalog": ""}).content.decode()
    records = client.get(reverse("recommender-records"), {"workload": "mnist"}).content.decode()
    secret = client.get(reverse("recommender-records"), {"workload": "bobs-secret-workload"})

    assert "Recommended machines: <strong>4</strong>" in lookup and "From 10 platform records." in lookup
    assert "bobs-secret-workload" not in lookup
    assert "read 10 platform records" in records and "bobs-secret-workload" not in records
    assert '<span class="small muted">10</span>' in records
    assert secret.status_code == 200 and "No records of workload" in secret.content.decode()
    assert "<td>yours</td>" not in secret.content.decode()


def test_bobs_records_never_change_alices_plan(alice, bob):
    bundle, dataset = make_bundle(alice, "anwar-mnist"), make_dataset(alice, "mnist-data")
    request = jobs.JobRequest(
        bundle=bundle,
        dataset=dataset,
        provider="aws",
        catalog="fc2-2018",
        algorithm="lookup",
        strategy=Job.Strategy.MIRRORED,
        workers=4,
        parameters={"batch_size": "6400"},
        workload_name="mnist",
    )
    before = planning.plan(request, alice)
    bob_measures(bob)

    assert planning.plan(request, alice).recommendation == before.recommendation
    assert planning.plan(request, bob).workers == 2


@pytest.mark.parametrize(
    "command",
    [
        ["recommend", "--algorithm", "lookup", "--workload", "mnist", "--batch-size", "6400", "--latency-ms", "0",
         "--strategy", "mirrored"],
        ["model_report", "--workload", "mnist"],
    ],
    ids=["recommend", "model_report"],
)  # fmt: skip
def test_the_command_line_answers_as_the_user_it_names(bob, alice, command):
    platform = call_json(*command)[1]
    bob_measures(bob)

    as_alice, as_bob, alone = (
        call_json(*command, "--user", "alice"),
        call_json(*command, "--user", "bob"),
        call_json(*command),
    )

    assert as_alice[0] == as_bob[0] == alone[0] == 0
    assert as_alice[1] == alone[1] == platform
    assert as_bob[1] != platform
    assert call_json(*command, "--user", "nobody")[1] == {"ok": False, "error": "no user named 'nobody'"}


# --- promotion ------------------------------------------------------------------------------------------------------


def test_a_promoted_record_is_everyones(client, alice, bob, alice_answer):
    record = bob_measures(bob)

    code, summary, _ = call_json("promote_records", "--owner", "bob")

    assert code == 0 and summary == {"ok": True, "promoted": 1, "left": 0, "dry_run": False}
    record.refresh_from_db()
    assert (record.owner, record.promoted_from, record.trust) == (None, bob, "platform")
    answer = strict_json(ask(client, alice, LOOKUP))
    assert (answer["workers"], answer["predicted_epoch_time_s"]) == (2, 1.0)
    assert answer["records"]["text"] == "11 platform records"


def test_an_admin_promotes_from_the_admin(client, alice, bob, django_user_model, alice_answer):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    record = bob_measures(bob)
    out_of_bounds = PerformanceRecord.objects.create(owner=bob, workload="mnist", workers=3, epoch_time_s=1e308)
    client.force_login(root)

    response = client.post(
        reverse("admin:recommender_performancerecord_changelist"),
        {"action": "promote", "_selected_action": [record.pk, out_of_bounds.pk]},
        follow=True,
    )

    assert "1 records promoted" in response.content.decode() and "1 left as they were" in response.content.decode()
    assert strict_json(ask(client, alice, LOOKUP))["workers"] == 2
    assert PerformanceRecord.objects.get(pk=out_of_bounds.pk).owner == bob


def test_promoting_names_the_records(bob):
    code, result, _ = call_json("promote_records")

    assert code == 1 and "--owner" in result["error"]


# --- hostile values -------------------------------------------------------------------------------------------------

HOSTILE = [
    ("epoch_time_s", 1e308),
    ("epoch_time_s", 1e-300),
    ("epoch_time_s", 0.0),
    ("epoch_time_s", -5.0),
    ("epoch_time_s", math.nan),
    ("epoch_time_s", math.inf),
    ("latency_ms", 1e308),
    ("latency_ms", -1.0),
    ("bandwidth_mbps", 1e-300),
    ("bandwidth_mbps", -1.0),
    ("cpu_util", math.nan),
    ("loss", math.inf),
    ("step_time_s", -1.0),
    ("workers", 0),
    ("batch_size", 0),
]


def hostile_row(field: str, value: float, owner=None) -> PerformanceRecord:
    """A platform row (the worst case: everyone reads the platform's) written around every door, as an old row or
    raw SQL may be: on SQLite a NaN comes back as NULL, on PostgreSQL as NaN."""
    row = {"workload": "mnist", "workers": 3, "batch_size": 6400, "latency_ms": 0.0, "strategy": "mirrored"}
    row |= {"epoch_time_s": 30.0, field: value}
    record = PerformanceRecord(owner=owner, **row)
    PerformanceRecord.objects.bulk_create([record])  # (no clean(), as a raw write)
    return PerformanceRecord.objects.filter(workload="mnist").order_by("-pk").first()


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f"{f}={v!r}" for f, v in HOSTILE])
def test_no_record_value_makes_any_door_fail(client, alice, field, value):
    stored = hostile_row(field, value)
    # What the database kept: SQLite keeps a NaN as NULL (an absent figure, or a failed run's time: no longer hostile).
    out_of_bounds = bool(bounds.out_of_bounds({name: getattr(stored, name) for name in bounds.BOUNDS}))
    assert out_of_bounds or (math.isnan(value) and connection.vendor == "sqlite")
    client.force_login(alice)
    scala = {"algorithm": "scala-opt", "workload": "mnist", "ps_type": "m4.large", "max_workers": 4}

    for params in (LOOKUP, MODEL, {**MODEL, "strategy": "auto"}, scala):
        response = ask(client, alice, params)
        assert response.status_code in (200, 400), (params, response.content[:300])
        answer = strict_json(response)
        if response.status_code == 200 and params is LOOKUP and out_of_bounds:
            assert (answer["workers"], answer["predicted_epoch_time_s"]) == (4, 57)  # the row was not read
            assert answer["records"]["unusable"] == 1
    for page, params in (
        (reverse("recommender-anwar"), LOOKUP),
        (reverse("recommender-records"), {"workload": "mnist"}),
    ):
        assert client.get(page, params).status_code == 200
    for command in (
        ["recommend", "--algorithm", "lookup", "--workload", "mnist", "--batch-size", "6400", "--latency-ms", "0",
         "--strategy", "mirrored"],
        ["recommend", "--algorithm", "model", "--workload", "mnist", "--batch-size", "6400", "--latency-ms", "0",
         "--strategy", "mirrored", "--max-workers", "4"],
        ["model_report", "--workload", "mnist"],
    ):  # fmt: skip
        code, result, _ = call_json(*command)
        assert code in (0, 1) and "internal error" not in result.get("error", "")
        json.dumps(result, allow_nan=False)


def test_a_record_page_shows_a_row_it_does_not_read(client, alice):
    hostile_row("epoch_time_s", 1e308, owner=alice)
    client.force_login(alice)

    page = client.get(reverse("recommender-records"), {"workload": "mnist"}).content.decode()

    assert "10 platform records, 1 not read (a figure out of its bound)" in page


# --- the doors that write records -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "recorded"),
    [
        ({"epoch_time_s": 1e308}, None),
        ({"epoch_time_s": 1e-300}, None),
        ({"epoch_time_s": 10**400}, None),  # valid JSON, no float
        ({"epoch_time_s": 2.0, "final_train_loss": math.nan}, {"epoch_time_s": 2.0, "loss": None}),
        ({"epoch_time_s": 2.0, "final_train_loss": "low"}, {"epoch_time_s": 2.0, "loss": None}),
        ({"epoch_time_s": 2.0, "batch_size": 10**400}, {"epoch_time_s": 2.0, "batch_size": 6400}),
        ({"duration_s": 1e-300, "epochs": 1}, None),
        ({"epoch_time_s": 2.0, "final_train_loss": 0.25}, {"epoch_time_s": 2.0, "loss": 0.25}),
    ],
)
def test_a_jobs_figures_are_bounded_at_the_door(bob, metrics, recorded):
    job = bobs_job(bob, **metrics)

    record = feedback.record_job(job)

    if recorded is None:
        assert record is None and not PerformanceRecord.objects.filter(owner=bob).exists()
        assert job.events.filter(message__startswith="no performance record of this run").exists()
    else:
        assert {name: getattr(record, name) for name in recorded} == recorded


def test_a_jobs_bandwidth_out_of_bounds_is_left_out(bob):
    job = bobs_job(bob, epoch_time_s=2.0)
    job.figures = {"worker_bandwidth_mbps": -4.0, "worker_idleness": 0.25}

    record = feedback.record_job(job)

    assert (record.bandwidth_mbps, record.cpu_util, record.epoch_time_s) == (None, 75.0, 2.0)
    assert job.events.filter(message__contains="bandwidth_mbps -4 is not within").exists()


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("mnist,4,6400,0,1e308", "line 2: epoch_time_s must be at most 604800"),
        ("mnist,4,6400,0,1e-300", "line 2: epoch_time_s must be at least 0.001"),
        ("mnist,4,6400,0,0", "line 2: epoch_time_s must be at least 0.001"),
        ("mnist,4,6400,0,NaN", "line 2: epoch_time_s must be a finite number"),
        ("mnist,4,6400,0,-Infinity", "line 2: epoch_time_s must be a finite number"),
        ("mnist,4,6400,1e-300,1", None),  # a latency of ~0 ms is a latency
        (f"mnist,{'9' * 5000},6400,0,1", "line 2: workers must be a whole number"),
        (f"mnist,4,{'9' * 5000},0,1", "line 2: batch_size must be a whole number"),
        (f"mnist,4,6400,{'9' * 5000},1", "line 2: latency_ms must be a finite number"),
    ],
)
def test_an_import_refuses_a_figure_out_of_bounds_by_line(tmp_path, row, reason):
    path = tmp_path / "runs.csv"
    path.write_text(f"workload,workers,batch_size,latency_ms,epoch_time_s\n{row}\n")

    code, result, _ = call_json("import_perf_data", str(path), "--format", "csv")

    if reason is None:
        assert code == 0 and result["imported"] == 1
    else:
        assert code == 1 and result["error"].startswith(reason) and len(result["error"]) < 300
        assert PerformanceRecord.objects.count() == 10  # Table 4 alone


def test_an_import_for_a_user_is_theirs_and_replaces_only_theirs(tmp_path, client, alice, bob):
    path = tmp_path / "fast.csv"
    path.write_text("workload,workers,batch_size,latency_ms,epoch_time_s,strategy\nmnist,3,6400,0,5,mirrored\n")

    as_bob = call_json("import_perf_data", str(path), "--format", "csv", "--owner", "bob")
    as_platform = call_json("import_perf_data", str(path), "--format", "csv")
    again_as_bob = call_json("import_perf_data", str(path), "--format", "csv", "--owner", "bob")

    assert as_bob[1]["owner"] == "bob" and as_platform[1]["owner"] is None
    assert again_as_bob[1]["replaced"] == 1  # its own earlier import, not the platform's
    assert PerformanceRecord.objects.filter(origin__startswith="fast.csv").count() == 2
    assert strict_json(ask(client, alice, LOOKUP))["records"]["text"] == "11 platform records"


def test_the_admin_refuses_a_figure_out_of_bounds(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    client.force_login(root)
    record = PerformanceRecord.objects.get(workload="mnist", workers=4, batch_size=6400, latency_ms=0)
    url = reverse("admin:recommender_performancerecord_change", args=[record.pk])
    form = {
        "workload": "mnist", "workers": "4", "batch_size": "6400", "latency_ms": "0", "epoch_time_s": "1e308",
        "source": "imported", "strategy": "mirrored",
    }  # fmt: skip

    response = client.post(url, form)

    assert response.status_code == 200 and "is not within 0.001–604800 s" in response.content.decode()
    record.refresh_from_db()
    assert record.epoch_time_s == 57


# --- the migrations -------------------------------------------------------------------------------------------------

BEFORE = [("fc2", "0020_workload_name_help"), ("recommender", "0005_owner_trust_unusable")]


@pytest.mark.django_db(transaction=True)
def test_the_migrations_give_jobs_records_their_owner_and_mark_rows_out_of_bounds(alice, bob):
    measured, profiled = job_row(bob), job_row(alice)
    executor = migrate([("recommender", "0004_remove_performancerecord_job")])
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = migrate(BEFORE).loader.project_state(BEFORE).apps
        Record, Link = old.get_model("recommender", "PerformanceRecord"), old.get_model("fc2", "JobRecord")
        run = Record.objects.create(workload="w", workers=2, epoch_time_s=3.0, source="measured")
        profile = Record.objects.create(workload="w", workers=1, bandwidth_mbps=80.0, source="profiled")
        Link.objects.create(job_id=measured.pk, record_id=run.pk)
        Link.objects.create(job_id=profiled.pk, record_id=profile.pk)
        shipped = Record.objects.create(workload="w", workers=4, epoch_time_s=2.0)
        huge = Record.objects.create(workload="w", workers=4, epoch_time_s=1e308)
        tiny = Record.objects.create(workload="w", workers=4, epoch_time_s=1e-300)
    finally:
        migrate(leaves)

    owners = dict(PerformanceRecord.objects.values_list("pk", "owner_id"))
    assert (owners[run.pk], owners[profile.pk], owners[shipped.pk]) == (bob.pk, alice.pk, None)
    marked = dict(PerformanceRecord.objects.values_list("pk", "unusable"))
    assert marked[huge.pk] == "epoch_time_s 1e+308 is not within 0.001–604800 s"
    assert marked[tiny.pk].startswith("epoch_time_s 1e-300") and marked[shipped.pk] == ""

    migrate(BEFORE)  # reversible: the marks and the owners go back
    try:
        old = migrate(BEFORE).loader.project_state(BEFORE).apps.get_model("recommender", "PerformanceRecord")
        assert set(old.objects.values_list("owner_id", flat=True)) == {None}
    finally:
        migrate(leaves)


# --- the query strings of the recommender's pages and API ----------------------------------------------------------

QUERY_VALUES = [
    "\x00", "1\x00", "²", "١٢", "9" * 5000, "9" * 40, "-1", "0", "", " ", "1e400", "NaN", "inf", "-inf", "6.4e3",
    "none", "x" * 10_000, "<script>", "bobs-secret-workload", "mnist", "6400", "ps", "mirrored",
]  # fmt: skip
PAGES = {
    "recommender-records": ("workload", "strategy", "batch_size", "page"),
    "recommender-anwar": ("workload", "batch_size", "latency_ms", "strategy", "catalog"),
    "recommender-catalogs": ("catalog", "q", "gpu", "page"),
}


@pytest.mark.parametrize("page", PAGES)
def test_a_recommender_page_answers_any_query_string(client, alice, bob, page):
    PerformanceRecord.objects.create(owner=bob, workload="bobs-secret-workload", workers=1, epoch_time_s=2.0)
    client.force_login(alice)
    url = reverse(page)

    for name in PAGES[page]:
        for value in QUERY_VALUES:
            response = client.get(url, {**LOOKUP, name: value} if page == "recommender-anwar" else {name: value})
            assert response.status_code in (200, 400), (name, value[:20], response.status_code)
            assert "bobs-secret-workload</option>" not in response.content.decode()
    everything = "&".join(f"{name}={value}" for name in PAGES[page] for value in ("%00", "9" * 5000, "%C2%B2"))
    assert client.get(f"{url}?{everything}").status_code in (200, 400)


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"batch_size": "9" * 5000}, "Ignored batch_size"),
        ({"workload": "\x00"}, "Ignored workload"),
        ({"page": "9" * 5000}, "Ignored page"),
        ({"strategy": "ring"}, "Ignored strategy"),
        ({"workload": "bobs-secret-workload"}, "No records of workload &#x27;bobs-secret-workload&#x27; that you may"),
        ({"workload": "mnist", "batch_size": "6400"}, None),
    ],
)
def test_the_records_page_says_what_it_ignored(client, alice, bob, params, said):
    PerformanceRecord.objects.create(owner=bob, workload="bobs-secret-workload", workers=1, epoch_time_s=2.0)
    client.force_login(alice)

    response = client.get(reverse("recommender-records"), params)

    assert response.status_code == 200
    page = response.content.decode()
    assert (said in page) if said else ("Ignored" not in page and "No records of workload" not in page)
    assert "read 10 platform records" in page  # the default workload (mnist) is shown, and whose records it read


@pytest.mark.parametrize("name", ["batch_size", "latency_ms", "budget", "max_workers", "alpha", "workload", "catalog"])
def test_the_api_answers_any_query_value(client, alice, name):
    for value in QUERY_VALUES:
        params = {**MODEL, name: value} if name != "budget" else {**MODEL, "max_workers": "", name: value}
        response = ask(client, alice, {k: v for k, v in params.items() if v != ""})
        assert response.status_code in (200, 400), (name, value[:20], response.content[:200])
        strict_json(response)


EXTREMES = [
    ("epoch_time_s", 1e-3),
    ("epoch_time_s", bounds.WEEK_S),
    ("latency_ms", bounds.MAX_LATENCY_MS),
    ("batch_size", bounds.MAX_BATCH_SIZE),
    ("workers", bounds.MAX_WORKERS),
    ("bandwidth_mbps", 1e-3),
    ("bandwidth_mbps", 1e6),
]


@pytest.mark.parametrize(("field", "value"), EXTREMES, ids=[f"{f}={v!r}" for f, v in EXTREMES])
def test_records_at_their_bounds_get_an_answer_or_a_reason(client, alice, field, value):
    """Within the bounds, and read: each algorithm answers, or refuses with a 400 and why, never a 500 or a NaN."""
    for workers in (1, 2, 3):  # a few, so that the model has something odd to fit
        hostile_row(field, value if field != "workers" else value - workers)
    PerformanceRecord.objects.create(workload="mnist", instance_type="c4.xlarge", ps_type="m4.large", batch_size=6400,
                                     bandwidth_mbps=value if field == "bandwidth_mbps" else 100.0)  # fmt: skip
    scala = {"algorithm": "scala-opt", "workload": "mnist", "ps_type": "m4.large", "worker_types": "c4.xlarge"}

    for params in (LOOKUP, MODEL, {**MODEL, "strategy": "auto", "max_workers": 10_000}, {**scala, "max_workers": 8}):
        response = ask(client, alice, params)
        assert response.status_code in (200, 400), (params, response.content[:300])
        strict_json(response)
    assert client.get(reverse("recommender-records"), {"workload": "mnist"}).status_code == 200
    code, result, _ = call_json("model_report", "--workload", "mnist")
    assert code in (0, 1) and "internal error" not in result.get("error", "")


def test_bobs_records_never_change_alices_plan_in_the_wizard(client, alice, bob, bundle, digits, example_wheel):
    """The wizard's live recommendation (its Resource step): each one's own code filed under the platform's `mnist`."""
    with example_wheel.open("rb") as wheel:
        bobs_bundle = store_bundle(bob, wheel, example_wheel.name)
    client.force_login(alice)
    through_data(client, bundle, params=(("epochs", "1"), ("batch_size", "6400")))
    inputs = resource_form(
        algorithm="lookup", strategy="mirrored", catalog="fc2-2018", workload_name="mnist", max_workers="4"
    )
    before = client.get(reverse("job-new-recommendation"), inputs).context["plan"]
    bob_measures(bob)

    after = client.get(reverse("job-new-recommendation"), inputs).context["plan"]
    client.force_login(bob)
    through_data(client, bobs_bundle, params=(("epochs", "1"), ("batch_size", "6400")))
    bobs = client.get(reverse("job-new-recommendation"), inputs).context["plan"]

    assert (before.workers, before.predicted_epoch_time_s) == (4, 57)
    assert after.recommendation == before.recommendation
    assert after.recommendation["records"]["text"] == "10 platform records"
    assert (bobs.workers, bobs.predicted_epoch_time_s) == (2, 1.0)
