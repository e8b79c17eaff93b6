"""The job page (nodes, charts' series, cost against budget, re-run) and the researcher's home, on hand-built rows."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from io import StringIO
from unittest import mock

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from fc2.home import PER_PAGE, month_bounds, monthly_spend
from fc2.management.commands.submit_job import Command as SubmitJob
from fc2.models import Dataset, Job, JobEvent, Node
from fc2.services import monitoring
from fc2.templatetags.fc2_ui import ESTIMATE_NOTE
from monitor import series
from monitor.models import LossPoint, NodeSample
from monitor.series import Loss, Sample
from tests.helpers import job_row, make_bundle, make_dataset

UTC = dt.UTC
T0 = dt.datetime(2026, 11, 3, 10, 0, tzinfo=UTC)
MB = 1_000_000 / 8  # bytes that make one megabit


def sec(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def rows(alice):
    """A bundle and a dataset of alice's to hang jobs on (no wheel: these pages never open it)."""
    return make_bundle(alice, "digits-cnn"), make_dataset(alice, "mine.npz")


@pytest.fixture
def running(alice, rows) -> Job:
    """A PS job mid-run: a chief, two workers and a PS; progress as the chief last reported it."""
    bundle, dataset = rows
    job = job_row(
        alice, bundle, dataset, state=Job.State.RUNNING, started_at=T0, launched_at=T0, strategy=Job.Strategy.PS,
        workers=2, ps_type="m4.large", worker_type="m4.xlarge", hourly_cost=Decimal("0.625"), budget=Decimal("0.75"),
        epoch=1, epochs=2, step=22, steps=44, loss=1.3,
    )  # fmt: skip
    for index, (name, role) in enumerate([("chief-0", "chief"), ("worker-0", "worker"), ("worker-1", "worker")]):
        Node.objects.create(
            job=job, name=name, role=role, index=0 if role == "chief" else index - 1, instance_type="m4.xlarge",
            address=f"10.0.0.{index + 1}", status=Node.Status.RUNNING, last_report_at=sec(4),
        )  # fmt: skip
    Node.objects.create(job=job, name="ps-0", role="ps", index=0, instance_type="m4.large", address="10.0.0.9")
    return job


def add_samples(node: Node, count: int, *, start: float = 0, every: float = 2, mbps: float = 8) -> None:
    """`count` samples every `every` s whose counters grow by `mbps` in both directions; a chief prints a loss with
    each, at step 10·i."""
    NodeSample.objects.bulk_create(
        [
            NodeSample(
                node=node, at=sec(start + i * every), measured_at=sec(start + i * every), cpu_percent=50.0 + i,
                memory_mb=600.0, gpu_percent=None,
                bytes_sent=int(i * every * mbps * MB), bytes_recv=int(i * every * mbps * MB / 2),
            )
            for i in range(count)
        ]
    )  # fmt: skip
    if node.role == "chief":
        LossPoint.objects.bulk_create(
            LossPoint(node=node, at=sec(start + i * every), step=10 * i, loss=2.0 / (i + 1)) for i in range(count)
        )


def series_url(job: Job, since: str | None = None) -> str:
    url = reverse("job-series", args=[job.pk])
    return f"{url}?since={since}" if since else url


# --- series shaping: pure functions over Samples ---


@pytest.mark.parametrize(
    ("prev_bytes", "prev_s", "now_bytes", "now_s", "expected"),
    [
        pytest.param(0, 0, 2_500_000, 2, 10.0, id="10-mbps"),
        pytest.param(1_000, 0, 1_000, 2, 0.0, id="idle"),
        pytest.param(9_000_000, 0, 100, 2, None, id="counter-reset"),
        pytest.param(None, 0, 100, 2, None, id="no-previous-counter"),
        pytest.param(0, 0, None, 2, None, id="no-counter"),
        pytest.param(0, 2, 1_000, 2, None, id="same-instant"),
        pytest.param(0, 0, 125_000, 0.5, 2.0, id="sub-second"),
    ],
)
def test_rate_mbps(prev_bytes, prev_s, now_bytes, now_s, expected):
    assert series.rate_mbps(prev_bytes, sec(prev_s), now_bytes, sec(now_s)) == expected


def test_resource_points_rate_each_sample_from_the_one_before_and_survive_a_counter_reset():
    counters = [0, 2 * MB * 8, 4 * MB * 8, 300, 300 + 2 * MB * 4]  # 8 Mbps, 8 Mbps, reset, then 4 Mbps
    samples = [
        Sample(1, sec(2 * i), cpu_percent=10.0 * i, bytes_sent=int(b), bytes_recv=0) for i, b in enumerate(counters)
    ]

    points = series.resource_points(samples)

    assert [p["sent_mbps"] for p in points] == [None, 8.0, 8.0, None, 4.0]
    assert [p["recv_mbps"] for p in points] == [None, 0.0, 0.0, 0.0, 0.0]
    assert [p["cpu_percent"] for p in points] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert [p["at"] for p in points] == [s.at for s in samples]


def test_downsample_keeps_short_series_and_averages_long_ones_into_buckets():
    short = [{"at": sec(i), "cpu_percent": float(i)} for i in range(500)]
    long = [{"at": sec(i), "cpu_percent": float(i), "gpu_percent": None, "step": i} for i in range(1200)]

    assert series.downsample(short) == short
    out = series.downsample(long)

    assert len(out) == 500
    assert out[-1]["at"] == long[-1]["at"]  # the newest point stays exact: it is the live end of the chart
    assert out[-1]["step"] == 1199  # a count is taken from the bucket's last point, not averaged
    assert out[0] == {"at": sec(1), "cpu_percent": 0.5, "gpu_percent": None, "step": 1}
    assert all(a["at"] < b["at"] for a, b in zip(out, out[1:], strict=False))
    assert sum(p["cpu_percent"] for p in out) / len(out) == pytest.approx(599.5, rel=1e-3)


def test_downsample_averages_known_values_only():
    points = [{"at": sec(i), "cpu_percent": v} for i, v in enumerate([None, 4.0, None, None])]

    assert [p["cpu_percent"] for p in series.downsample(points, 2)] == [4.0, None]


def test_loss_points_one_per_step():
    losses = [
        Loss(sec(2), step=10, loss=2.0),
        Loss(sec(4), step=10, loss=2.0),  # an agent before progress_log repeated the latest progress in each report
        Loss(sec(4.1), step=11, loss=1.9),
        Loss(sec(8), step=30, loss=1.5),
    ]

    assert series.loss_points(losses) == [
        {"at": sec(2), "step": 10, "loss": 2.0},
        {"at": sec(4.1), "step": 11, "loss": 1.9},
        {"at": sec(8), "step": 30, "loss": 1.5},
    ]


def test_shape_groups_per_node_and_sends_only_what_is_new():
    def node(node_id, seconds, counter_step):
        return [Sample(node_id, sec(s), bytes_sent=i * counter_step, bytes_recv=0) for i, s in enumerate(seconds)]

    # Node 2 last reported before `since`: its base sample still gives the first new point its rate.
    samples = node(1, [4, 6], 16 * MB) + node(2, [3, 7], 32 * MB)  # 8 Mbps each

    per_node = series.shape(samples, since=sec(5))

    assert [(p["at"], p["sent_mbps"]) for p in per_node[1]] == [(sec(6), 8.0)]
    assert [(p["at"], p["sent_mbps"]) for p in per_node[2]] == [(sec(7), 8.0)]


# --- the series endpoint ---


def test_series_needs_login_and_hides_other_users_jobs(client, bob, running):
    url = series_url(running)

    assert client.get(url)["Location"] == f"{reverse('login')}?next={url}"
    client.force_login(bob)
    assert client.get(url).status_code == 404


def test_series_gives_every_node_its_points_and_the_chiefs_loss(client, alice, running):
    chief, worker, _, ps = running.nodes.order_by("pk")
    add_samples(chief, 3, mbps=8)
    add_samples(worker, 3, mbps=40)
    client.force_login(alice)

    data = client.get(series_url(running)).json()

    assert (data["job"], data["state"], data["active"]) == (running.pk, "running", True)
    assert data["until"] == "2026-11-03T10:00:04.000000Z"
    assert data["progress"] == {"percent": 50, "epoch": 1, "epochs": 2, "step": 22, "steps": 44, "loss": 1.3}
    assert [(n["name"], n["role"], len(n["points"])) for n in data["nodes"]] == [
        ("chief-0", "chief", 3),
        ("worker-0", "worker", 3),
        ("worker-1", "worker", 0),
        ("ps-0", "ps", 0),
    ]
    first, second, _ = data["nodes"][0]["points"]
    assert first == {
        "at": "2026-11-03T10:00:00.000Z",
        "cpu_percent": 50.0,
        "memory_mb": 600.0,
        "gpu_percent": None,
        "sent_mbps": None,
        "recv_mbps": None,
    }
    assert (second["sent_mbps"], second["recv_mbps"]) == (8.0, 4.0)
    assert [p["sent_mbps"] for p in data["nodes"][1]["points"]] == [None, 40.0, 40.0]
    assert [(p["step"], p["loss"]) for p in data["loss"]] == [(0, 2.0), (10, 1.0), (20, pytest.approx(2 / 3))]


def test_series_since_sends_only_newer_points_with_their_rates(client, alice, running):
    chief, worker, *_ = running.nodes.order_by("pk")
    add_samples(chief, 5, mbps=8)  # at 0, 2, 4, 6, 8 s
    add_samples(worker, 3, start=1, every=3, mbps=16)  # at 1, 4, 7 s
    client.force_login(alice)

    data = client.get(series_url(running, "2026-11-03T10:00:05Z")).json()

    chief_points, worker_points = data["nodes"][0]["points"], data["nodes"][1]["points"]
    assert [(p["at"], p["sent_mbps"]) for p in chief_points] == [
        ("2026-11-03T10:00:06.000Z", 8.0),
        ("2026-11-03T10:00:08.000Z", 8.0),
    ]
    assert [(p["at"], p["sent_mbps"]) for p in worker_points] == [("2026-11-03T10:00:07.000Z", 16.0)]
    assert [p["step"] for p in data["loss"]] == [30, 40]
    assert data["until"] == "2026-11-03T10:00:08.000000Z"

    again = client.get(series_url(running, data["until"])).json()  # nothing new: nothing sent, cursor stays
    assert [n["points"] for n in again["nodes"]] == [[], [], [], []]
    assert (again["loss"], again["until"]) == ([], data["until"])


def test_series_rejects_a_bad_since(client, alice, running):
    client.force_login(alice)

    response = client.get(series_url(running, "yesterday"))

    assert response.status_code == 400
    assert "since" in response.json()["error"]


def test_series_downsamples_a_long_run(client, alice, running):
    chief = running.nodes.get(name="chief-0")
    add_samples(chief, 1300, every=1)
    client.force_login(alice)

    data = client.get(series_url(running)).json()

    points = data["nodes"][0]["points"]
    assert len(points) == series.MAX_POINTS
    assert len(data["loss"]) == series.MAX_POINTS
    assert points[-1]["at"] == "2026-11-03T10:21:39.000Z"  # the last sample, 1299 s in
    assert {p["sent_mbps"] for p in points[1:]} == {8.0}


def test_a_run_too_long_to_carry_is_merged_into_time_buckets_by_the_database(alice, running):
    """More samples than the points the charts draw (here: limit 10, 4 nodes): each node's are merged per time bucket
    in the database, each bucket at its last time with its readings' mean and its rates over the whole bucket."""
    chief, worker = running.nodes.get(name="chief-0"), running.nodes.get(name="worker-0")
    add_samples(chief, 300, every=1)  # 0..299 s, cpu 50..349
    add_samples(worker, 30, every=10, mbps=4)  # 0..290 s, sparser

    nodes = {node["name"]: node["points"] for node in monitoring.job_series(running, limit=10)["nodes"]}

    chief_points, worker_points = nodes["chief-0"], nodes["worker-0"]
    assert len(chief_points) == len(worker_points) == 10
    assert chief_points[-1]["at"] == "2026-11-03T10:04:59.000Z"  # the last sample, 299 s in
    assert chief_points[0]["cpu_percent"] == pytest.approx(50 + 14.5, abs=0.5)  # the first 30 s: cpu 50..79
    assert {p["sent_mbps"] for p in chief_points[1:]} == {8.0}
    assert {p["recv_mbps"] for p in chief_points[1:]} == {4.0}
    assert {p["sent_mbps"] for p in worker_points[1:]} == {4.0}
    assert nodes["ps-0"] == []


def test_series_query_count_does_not_grow_with_nodes_or_samples(client, alice, running, django_assert_max_num_queries):
    for node in running.nodes.all():
        add_samples(node, 40)
    client.force_login(alice)

    # session, user, job, nodes, the samples' count and span, samples, losses; the figures: nodes, their types,
    # samples, losses; the provider's start-up and teardown for the projection (those two then cached)
    with django_assert_max_num_queries(12):
        assert client.get(series_url(running)).status_code == 200
    with django_assert_max_num_queries(6):
        assert client.get(series_url(running, "2026-11-03T10:00:30Z")).status_code == 200


# --- the job page and its live part ---


def test_job_page_shows_nodes_with_their_latest_figures_charts_and_rerun(client, alice, running):
    chief, worker, idle, ps = running.nodes.order_by("pk")
    add_samples(chief, 3, mbps=8)  # latest: 52 % CPU, 8 Mbps out, 4 Mbps in
    add_samples(worker, 2, mbps=400)
    add_samples(idle, 1)  # one sample: no rate yet
    client.force_login(alice)

    page = client.get(reverse("job-detail", args=[running.pk])).content.decode()

    rows = {
        m.group(1): m.group(0) for m in re.finditer(r'<tr>\s*<th scope="row">.*?</span>([\w-]+) .*?</tr>', page, re.S)
    }
    assert set(rows) == {"chief-0", "worker-0", "worker-1", "ps-0"}
    cells = {name: re.findall(r'<td class="amount[^"]*">([^<]*)</td>', row) for name, row in rows.items()}
    # CPU %, memory, Mbps in, Mbps out
    assert cells == {
        "chief-0": ["52", "600 MB", "4.0", "8.0"],
        "worker-0": ["51", "600 MB", "200", "400"],
        "worker-1": ["50", "600 MB", "–", "–"],  # one sample: no rate yet
        "ps-0": ["–", "–", "–", "–"],
    }
    assert all(cell in rows["chief-0"] for cell in ("m4.xlarge", "10.0.0.1", '<span class="badge running">'))
    assert "m4.large" in rows["ps-0"]
    for metric in ("cpu_percent", "memory_mb", "gpu_percent", "recv_mbps", "sent_mbps", "loss"):
        assert re.search(
            rf'<canvas id="chart-\w+" role="img" aria-labelledby="[\w-]+"[^>]*data-metric="{metric}"', page
        )
    assert f'data-series-url="{series_url(running)}"' in page
    assert f'href="{reverse("job-new")}?from={running.pk}"' in page
    assert 'role="progressbar"' in page and 'aria-valuenow="50"' in page
    assert 'aria-valuetext="epoch 1 of 2, step 22 of 44"' in page
    assert "Cancel job" in page


def test_job_page_holds_the_cost_against_the_budget(client, alice, running):
    ended = T0 + dt.timedelta(hours=2)
    Job.objects.filter(pk=running.pk).update(state=Job.State.SUCCEEDED, finished_at=ended, torn_down_at=ended)
    client.force_login(alice)

    page = client.get(reverse("job-detail", args=[running.pk])).content.decode()

    assert '<span class="tile-label">Total cost (estimate)</span>' in page  # it has ended
    assert '<strong id="cost-so-far">≈ $1.25</strong>' in page  # $0.625/h × 2 h
    assert "≈ $1.25 of $1.50 budget (83 %)" in page  # $0.75/h × 2 h
    assert "$0.625/h" in page and "budget $0.75/h" in page
    assert 'role="meter"' in page and 'aria-valuetext="≈ $1.25 of $1.50"' in page
    assert escape(ESTIMATE_NOTE) in page
    assert "Cancel job" not in page
    assert f'href="{reverse("job-new")}?from={running.pk}"' in page  # an ended job can be run again


@pytest.mark.parametrize(
    ("state", "label"),
    [
        (Job.State.RUNNING, "Cost so far"),
        (Job.State.COLLECTING, "Cost so far"),
        (Job.State.SUCCEEDED, "Total cost"),
        (Job.State.FAILED, "Total cost"),
        (Job.State.CANCELLED, "Total cost"),
    ],
)
def test_cost_is_so_far_while_it_runs_and_total_once_ended(client, alice, running, state, label):
    Job.objects.filter(pk=running.pk).update(state=state)
    client.force_login(alice)

    page = client.get(reverse("job-detail", args=[running.pk])).content.decode()

    assert f'<span class="tile-label">{label} (estimate)</span>' in page


def test_job_page_shows_what_was_asked_beside_what_was_chosen(client, alice, rows):
    queued = job_row(alice, *rows, algorithm="model", strategy=Job.Strategy.AUTO, workers=4)
    Job.objects.filter(pk=queued.pk).update(strategy="", workers=None)  # asked, not yet planned
    chosen = job_row(
        alice, *rows, algorithm="model", request=queued.request, strategy=Job.Strategy.MIRRORED, workers=3,
        worker_type="c4.xlarge",
    )  # fmt: skip
    client.force_login(alice)

    before = client.get(reverse("job-detail", args=[queued.pk])).content.decode()
    after = client.get(reverse("job-detail", args=[chosen.pk])).content.decode()

    assert '<dd id="job-asked">model · strategy left open · at most 4 workers</dd>' in before
    assert "chosen by its recommend step" in before
    assert '<dd id="job-asked">model · strategy left open · at most 4 workers</dd>' in after
    assert """All-Reduce (mirrored) <span class="muted">(left open: the model's choice)</span>""" in after
    assert "3 workers of c4.xlarge" in after


def test_job_page_without_budget_or_price_yet(client, alice, rows):
    job = job_row(alice, *rows)
    client.force_login(alice)

    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()

    assert "The price is known once the cluster is chosen." in page
    assert 'role="meter"' not in page
    assert "waiting for the first progress report" in page


def test_live_part_polls_while_active_and_brings_results_out_of_band(client, alice, running):
    JobEvent.objects.create(job=running, state="running", message="4 nodes started")
    client.force_login(alice)
    url = reverse("job-live", args=[running.pk])

    active = client.get(url).content.decode()
    Job.objects.filter(pk=running.pk).update(state=Job.State.FAILED, finished_at=sec(60), failure_reason="boom")
    ended = client.get(url).content.decode()

    assert 'hx-trigger="every 2s"' in active and 'hx-trigger="every 2s"' not in ended
    assert '<div id="job-results" hx-swap-oob="true">' in active
    assert "4 nodes started" in active
    assert '<p id="failure-summary">boom</p>' in ended


def test_live_part_query_count_does_not_grow_with_nodes_or_samples(client, alice, running, rows):
    JobEvent.objects.create(job=running, state="running", message="started")
    for node in running.nodes.all():
        add_samples(node, 30)
    small = job_row(alice, *rows, state=Job.State.RUNNING, started_at=T0, hourly_cost=Decimal("0.1"))
    add_samples(Node.objects.create(job=small, name="chief-0", role="chief", index=0), 2)
    client.force_login(alice)

    def queries(job: Job) -> int:
        cache.clear()  # a running job's figures are cached for a few seconds: count polls that compute them
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("job-live", args=[job.pk])).status_code == 200
        return len(captured)

    # session, user, job, events, nodes, their latest two samples each, artifacts; the figures: the nodes, their
    # types' capacities, the samples, the chief's losses; the projection: the provider's start-up and teardown
    assert queries(running) == queries(small) <= 13


# --- monthly spend ---


def test_month_bounds():
    assert month_bounds(dt.datetime(2026, 2, 10, 6, tzinfo=UTC)) == (
        dt.datetime(2026, 2, 1, tzinfo=UTC),
        dt.datetime(2026, 3, 1, tzinfo=UTC),
    )
    assert month_bounds(dt.datetime(2026, 12, 31, 23, 59, tzinfo=UTC))[1] == dt.datetime(2027, 1, 1, tzinfo=UTC)


@pytest.fixture
def spanning(alice, bob, rows):
    """Jobs around February 2026, seen from Feb 10 06:00; `expected` is alice's February spend per job."""
    bundle, dataset = rows
    feb = dt.datetime(2026, 2, 1, tzinfo=UTC)
    hours = dt.timedelta(hours=1)

    def job(owner=alice, started=None, finished=None, cost="1", **fields) -> Job:
        return job_row(
            owner, bundle, dataset, started_at=started, finished_at=finished, launched_at=started,
            torn_down_at=finished, hourly_cost=Decimal(cost) if cost is not None else None, **fields,
        )  # fmt: skip

    expected = {
        job(started=feb - hours, finished=feb + hours): 1.0,  # over the boundary: only its February hour
        job(started=feb + 9 * 24 * hours, cost="2", state=Job.State.RUNNING): 12.0,  # still running: 6 h so far
        job(started=feb + 2 * hours, finished=feb + 3.5 * hours, cost="0.5"): 0.75,
        job(started=feb - 48 * hours, finished=feb - 24 * hours): 0.0,  # January only
        job(started=feb + hours, finished=feb + 2 * hours, cost=None): 0.0,  # never priced (it still ran)
        job(): 0.0,  # never started
    }
    job(owner=bob, started=feb, finished=feb + 10 * hours)  # bob's, not alice's
    return feb + 9 * 24 * hours + 6 * hours, expected


def test_spend_between_counts_each_job_inside_the_month_only(alice, spanning):
    now, expected = spanning
    start, end = month_bounds(now)

    assert Job.objects.filter(owner=alice).spend_between(start, end, now) == pytest.approx(sum(expected.values()))
    for job, dollars in expected.items():
        assert job.cost_between(start, end, now) == pytest.approx(dollars)
    january = month_bounds(start - dt.timedelta(days=1))
    assert Job.objects.filter(owner=alice).spend_between(*january, now) == pytest.approx(1.0 + 24.0)


def test_monthly_spend(alice, spanning):
    now, expected = spanning

    spend = monthly_spend(alice, now)

    assert spend == {"total": pytest.approx(13.75), "jobs": 4, "month": dt.datetime(2026, 2, 1, tzinfo=UTC)}


def test_home_shows_the_monthly_spend(client, alice, spanning):
    now, _ = spanning
    client.force_login(alice)

    with mock.patch("django.utils.timezone.now", return_value=now):
        page = client.get("/").content.decode()

    assert "Estimated spend in February 2026" in page
    assert '<strong class="tile-value" id="monthly-spend">≈ $13.75</strong>' in page
    assert "catalogue prices, not a bill" in page
    assert "4 jobs ran this month" in page


# --- the researcher's home ---


@pytest.fixture
def homes(alice, bob, rows):
    """alice: 12 jobs (3 failed), 3 bundles, 3 datasets of two kinds; bob: one of each."""
    bundle, dataset = rows
    for i in range(12):
        state = Job.State.FAILED if i % 4 == 0 else Job.State.SUCCEEDED
        job_row(alice, bundle, dataset, state=state, created_at=T0 + dt.timedelta(minutes=i))
    make_bundle(alice, "resnet-cifar")
    make_bundle(alice, "resnet-imagenet")
    make_dataset(alice, "cifar-url", kind=Dataset.Kind.URL, url="https://example.com/cifar.npz")
    make_dataset(alice, "imagenet-url", kind=Dataset.Kind.URL, url="https://example.com/imagenet.npz")
    bobs = job_row(bob)
    return bobs


def test_root_is_the_home_and_needs_login(client, alice):
    assert client.get("/")["Location"] == f"{reverse('login')}?next=/"
    client.force_login(alice)

    response = client.get("/")

    assert response.status_code == 200
    assert '<a href="/">Home</a>' in response.content.decode()


def test_home_lists_only_the_users_own_rows(client, alice, homes):
    client.force_login(alice)

    response = client.get(reverse("home"))

    context = response.context
    assert {j.owner for j in context["jobs"].paginator.object_list} == {alice}
    assert context["jobs"].paginator.count == 12
    assert sorted(b.distribution for b in context["bundles"]) == ["digits-cnn", "resnet-cifar", "resnet-imagenet"]
    assert sorted(d.name for d in context["datasets"]) == ["cifar-url", "imagenet-url", "mine.npz"]
    page = response.content.decode()
    assert reverse("job-detail", args=[homes.pk]) not in page
    assert homes.bundle.distribution not in page and homes.dataset.name not in page


def test_home_jobs_are_recent_first_and_paged(client, alice, homes):
    client.force_login(alice)
    newest_first = list(Job.objects.filter(owner=alice).order_by("-created_at").values_list("pk", flat=True))

    first = client.get(reverse("home"), {"q": "resnet"})
    second = client.get(reverse("home"), {"q": "resnet", "jobs_page": 2})

    assert [j.pk for j in first.context["jobs"]] == newest_first[:PER_PAGE]
    assert [j.pk for j in second.context["jobs"]] == newest_first[PER_PAGE:]
    # The pager moves the jobs list only: the bundle search stays.
    assert 'href="?q=resnet&amp;jobs_page=2#jobs"' in first.content.decode()
    assert len(second.context["bundles"]) == 2


def test_home_filters(client, alice, homes):
    client.force_login(alice)

    failed = client.get(reverse("home"), {"state": "failed"}).context["jobs"]
    bundles = client.get(reverse("home"), {"q": "IMAGENET"}).context["bundles"]
    urls = client.get(reverse("home"), {"kind": "url"}).context["datasets"]
    nonsense = client.get(reverse("home"), {"state": "nope", "kind": "nope"}).context

    assert {j.state for j in failed} == {"failed"} and failed.paginator.count == 3
    assert [b.distribution for b in bundles] == ["resnet-imagenet"]
    assert sorted(d.name for d in urls) == ["cifar-url", "imagenet-url"]
    assert (nonsense["jobs"].paginator.count, nonsense["datasets"].paginator.count) == (12, 3)


def test_home_filter_links_keep_the_other_lists_and_restart_their_own(client, alice, homes):
    client.force_login(alice)

    page = client.get(reverse("home"), {"q": "resnet", "state": "failed", "jobs_page": 2}).content.decode()

    assert 'href="?q=resnet&amp;state=succeeded#jobs" class="chip"' in page
    assert 'href="?q=resnet#jobs" class="chip"' in page  # "all" states
    assert 'class="chip on" aria-current="true">failed<' in page
    assert 'href="?q=resnet&amp;state=failed&amp;jobs_page=2&amp;kind=url#datasets"' in page


def test_home_pages_bundles_and_datasets_on_their_own(client, alice, rows):
    for i in range(PER_PAGE + 2):
        make_bundle(alice, f"extra-{i:02d}")
        make_dataset(alice, f"extra-{i:02d}")
    client.force_login(alice)

    response = client.get(reverse("home"), {"bundles_page": 2})

    assert len(response.context["bundles"]) == 3  # 13 bundles: 10, then 3
    assert len(response.context["datasets"]) == PER_PAGE  # datasets stay on their first page
    assert 'href="?bundles_page=2&amp;datasets_page=2#datasets"' in response.content.decode()


def test_admin_home_shows_their_own_rows_only(admin_client, admin_user, homes):
    response = admin_client.get(reverse("home"))

    assert response.status_code == 200
    assert response.context["jobs"].paginator.count == 0
    assert response.context["bundles"].paginator.count == 0
    job_row(admin_user)
    assert admin_client.get(reverse("home")).context["jobs"].paginator.count == 1


# --- results you can compare ---


def job_list_columns(html: str) -> list[str]:
    thead = re.search(r'<table class="job-table">.*?<thead>(.*?)</thead>', html, re.S).group(1)
    return re.findall(r"<th[^>]*>(.*?)</th>", thead)


def state_chips(html: str) -> list[str]:
    nav = re.search(r'<nav class="chips small" aria-label="Filter jobs by state">(.*?)</nav>', html, re.S).group(1)
    return re.findall(r">([a-z]+)</a>", nav)


def test_both_job_lists_show_the_same_columns_filters_and_headline(client, alice, homes):
    scored = Job.objects.filter(owner=alice, state=Job.State.SUCCEEDED).first()
    Job.objects.filter(pk=scored.pk).update(metrics={"test_accuracy": 0.97345, "test_loss": 0.0834567})
    client.force_login(alice)

    home = client.get(reverse("home")).content.decode()
    listed = client.get(reverse("job-list")).content.decode()

    columns = job_list_columns(home)
    assert columns == job_list_columns(listed)
    assert columns[:4] == ["Job", "State", "Result", "Progress"]
    assert state_chips(home) == state_chips(listed) == ["all", *Job.State.values]
    for html in (home, listed):
        assert '<strong>97.3 %</strong> <span class="small muted">test accuracy</span>' in html


def test_both_job_lists_filter_alike(client, alice, homes):
    client.force_login(alice)

    for url, page_key in ((reverse("home"), "jobs"), (reverse("job-list"), "page")):
        failed = client.get(url, {"state": "failed"}).context[page_key]
        stale = client.get(url, {"state": "nope"}).context
        assert ({j.state for j in failed}, failed.paginator.count) == ({"failed"}, 3), url
        assert (stale["state"], stale[page_key].paginator.count) == ("", 12), url


def test_job_page_shows_the_headline_and_rounded_metrics(client, alice, running):
    metrics = {"test_accuracy": 0.973456, "test_loss": 0.08345678, "final_train_loss": 0.1234567, "optimizer": "adam"}
    Job.objects.filter(pk=running.pk).update(state=Job.State.SUCCEEDED, metrics=metrics, finished_at=sec(60))
    running.artifacts.create(name="metrics.json", size_bytes=10)
    client.force_login(alice)

    page = client.get(running.get_absolute_url()).content.decode()

    assert '<span class="small" id="job-headline">test accuracy <strong>97.3 %</strong></span>' in page
    for badge in ("test_accuracy: 0.973", "test_loss: 0.0835", "final_train_loss: 0.123", "optimizer: adam"):
        assert f'<span class="badge">{badge}</span>' in page
    assert "0.08345678" not in page


NOISY_FAILURE_LOG = (
    "2026-11-23 12:00:01.1: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on.\n"
    'Traceback (most recent call last):\n  File "main.py", line 3\nValueError: bad shape\n'
    "E0000 00:00:1763899201.5 1 cuda_executor.cc:1228] failed call to cuInit\n"
)


def test_job_page_sums_up_a_failure_by_its_last_meaningful_line(client, alice, running):
    reason = f"chief-0 failed with exit code 1; its log ends:\n{NOISY_FAILURE_LOG}"
    Job.objects.filter(pk=running.pk).update(state=Job.State.FAILED, failure_reason=reason, finished_at=sec(60))
    client.force_login(alice)

    page = client.get(running.get_absolute_url()).content.decode()

    assert '<p id="failure-summary">chief-0 failed with exit code 1: ValueError: bad shape</p>' in page
    assert re.search(r"<summary>The whole reason</summary><pre[^>]*>[^<]*failed call to cuInit", page)  # one click away


def test_cli_sums_up_a_failure_alike(alice, running):
    reason = f"chief-0 failed with exit code 1; its log ends:\n{NOISY_FAILURE_LOG}"
    Job.objects.filter(pk=running.pk).update(state=Job.State.FAILED, failure_reason=reason, finished_at=sec(60))
    running.refresh_from_db()
    out = StringIO()

    SubmitJob(stdout=out)._print(running, as_json=False)

    assert (
        out.getvalue().splitlines()[0]
        == f"job {running.pk}: failed — chief-0 failed with exit code 1: ValueError: bad shape"
    )
