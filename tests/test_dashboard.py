"""The admin dashboard: who may see it, filters/search/sort, the SQL aggregates on hand-built jobs, its query count."""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from fc2.dashboard import PAGE_SIZE
from fc2.models import CodeBundle, Dataset, Job, ReapedCluster
from fc2.services import dashboard
from fc2.templatetags.fc2_ui import ESTIMATE_NOTE

URL = "/dashboard/"
UTC = dt.UTC
MONDAY = dt.datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday: weeks below start on MONDAY's date


@pytest.fixture
def charlie(django_user_model):
    """The platform admin."""
    return django_user_model.objects.create_user("charlie", "charlie@example.com", "charlie-password-1", is_staff=True)


@pytest.fixture
def staff_client(client, charlie):
    client.force_login(charlie)
    return client


@pytest.fixture
def rows(alice):
    """A bundle and a dataset row to hang jobs on (no wheel needed: the dashboard never opens it)."""
    bundle = CodeBundle.objects.create(
        owner=alice,
        wheel="bundles/x/demo-1.0-py3-none-any.whl",
        filename="demo-1.0-py3-none-any.whl",
        distribution="demo",
        version="1.0",
        main_script="demo/train.py",
        size_bytes=1,
        sha256="0" * 64,
    )
    dataset = Dataset.objects.create(name="digits", kind=Dataset.Kind.URL, url="https://example.com/d.csv", path="x")
    return bundle, dataset


@pytest.fixture
def make(rows):
    """make(owner, state, ...) -> a Job row as the pipeline would have left it."""
    bundle, dataset = rows

    def make_row(owner, state=Job.State.SUCCEEDED, *, started=None, hours=None, **fields) -> Job:
        if started is not None and hours is not None:
            fields.setdefault("finished_at", started + dt.timedelta(hours=hours))
        fields.setdefault("created_at", started or MONDAY)
        # Its cluster up for its run: launched as it started, torn down as it ended (unless still recorded).
        fields.setdefault("launched_at", started)
        if started is not None and fields.get("cluster") is None:
            fields.setdefault("torn_down_at", fields.get("finished_at"))
        return Job.objects.create(
            owner=owner, bundle=bundle, dataset=dataset, state=state, started_at=started, **fields
        )

    return make_row


def page_ids(response) -> list[int]:
    return [job.pk for job in response.context["page"]]


def json_script(response, element_id: str):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', response.content.decode())
    assert match, f"no json_script #{element_id}"
    return json.loads(match.group(1))


# --- who may see it ---


def test_anonymous_is_sent_to_login(client):
    response = client.get(URL)

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={URL}"


def test_researcher_is_refused_and_has_no_link(client, alice):
    client.force_login(alice)

    assert client.get(URL).status_code == 403
    assert URL not in client.get(reverse("job-list")).content.decode()


def test_staff_sees_every_users_jobs_and_the_nav_link(staff_client, make, alice, bob):
    mine = make(
        alice,
        started=MONDAY,
        hours=2,
        hourly_cost=Decimal("1.5"),
        workers=4,
        worker_type="c4.xlarge",
        ps_type="m4.large",
    )
    theirs = make(bob, Job.State.FAILED, failure_reason="worker-1 exited with 137 (OOM)")

    response = staff_client.get(URL)

    assert response.status_code == 200
    page = response.content.decode()
    assert f'href="{URL}"' in page
    assert set(page_ids(response)) == {mine.pk, theirs.pk}
    assert "4 × c4.xlarge" in page and "+ PS m4.large" in page
    assert "2 h 00 min" in page and "$3.00" in page  # 1.5 $/h × 2 h
    assert "worker-1 exited with 137 (OOM)" in page


# --- filters, search, sort ---


@pytest.fixture
def spread(make, alice, bob):
    """Jobs of two users over providers, states and weeks."""
    return {
        "a_ok": make(alice, started=MONDAY, hours=1, provider="local", hourly_cost=Decimal("1")),
        "a_fail": make(
            alice,
            Job.State.FAILED,
            started=MONDAY + dt.timedelta(days=8),
            hours=3,
            provider="aws",
            hourly_cost=Decimal("2"),
            failure_reason="Spot capacity not available",
        ),
        "b_run": make(
            bob,
            Job.State.RUNNING,
            started=MONDAY + dt.timedelta(days=15),
            provider="aws",
            hourly_cost=Decimal("4"),
            cluster={"nodes": []},
        ),
        "b_queued": make(bob, Job.State.QUEUED, created_at=MONDAY + dt.timedelta(days=16), provider="lab"),
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, {"a_ok", "a_fail", "b_run", "b_queued"}),
        ({"state": "failed"}, {"a_fail"}),
        ({"state": "active"}, {"b_run", "b_queued"}),
        ({"provider": "aws"}, {"a_fail", "b_run"}),
        ({"user": "bob"}, {"b_run", "b_queued"}),
        ({"user": "alice", "provider": "aws"}, {"a_fail"}),
        ({"created_from": "2026-03-10"}, {"a_fail", "b_run", "b_queued"}),
        ({"created_to": "2026-03-10"}, {"a_ok", "a_fail"}),  # the whole of the last day counts
        ({"created_from": "2026-03-10", "created_to": "2026-03-17"}, {"a_fail", "b_run"}),
        ({"q": "BOB"}, {"b_run", "b_queued"}),
        ({"q": "capacity"}, {"a_fail"}),
        ({"q": "nothing like this"}, set()),
    ],
)
def test_filters_and_search(staff_client, spread, query, expected):
    response = staff_client.get(URL, query)

    assert response.status_code == 200
    assert set(page_ids(response)) == {spread[name].pk for name in expected}
    assert response.context["totals"]["jobs"] == len(expected)


@pytest.mark.parametrize("form", ["{}", "#{}"])
def test_search_by_job_id(staff_client, spread, form):
    response = staff_client.get(URL, {"q": form.format(spread["b_queued"].pk)})

    assert page_ids(response) == [spread["b_queued"].pk]


def test_a_bad_filter_is_reported_and_ignored(staff_client, spread):
    response = staff_client.get(URL, {"created_from": "2026-03-18", "created_to": "2026-03-01", "state": "nonsense"})

    assert response.status_code == 400
    assert "Must not be before the start date." in response.content.decode()
    assert response.context["form"].errors.keys() == {"state", "created_to"}
    assert page_ids(response) == [spread["b_queued"].pk]  # only the valid created_from applies


@pytest.mark.parametrize("q", ["²", "#²", "9" * 40, "#" + "9" * 19])  # (past a bigint)
def test_a_search_that_is_no_job_id_searches_text_only(staff_client, spread, q):
    response = staff_client.get(URL, {"q": q})

    assert response.status_code == 200 and page_ids(response) == []


def test_a_sort_or_search_holding_nul_is_reported_and_ignored(staff_client, spread):
    response = staff_client.get(URL, {"sort": "\x00", "q": "a\x00"})

    assert response.status_code == 400
    assert response.context["form"].errors.keys() == {"sort", "q"}
    assert page_ids(response) == [spread[name].pk for name in ("b_queued", "b_run", "a_fail", "a_ok")]  # -created


def test_submitted_to_the_last_day_there_is_keeps_every_job(staff_client, spread):
    response = staff_client.get(URL, {"created_from": "0001-01-01", "created_to": "9999-12-31"})

    assert response.status_code == 200 and len(page_ids(response)) == 4


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("-created", ["b_queued", "b_run", "a_fail", "a_ok"]),
        ("created", ["a_ok", "a_fail", "b_run", "b_queued"]),
        # b_run has run since day 15 at 4 $/h: the most expensive; b_queued has no cost and is last both ways.
        ("-cost", ["b_run", "a_fail", "a_ok", "b_queued"]),
        ("cost", ["a_ok", "a_fail", "b_run", "b_queued"]),
        ("-duration", ["b_run", "a_fail", "a_ok", "b_queued"]),
        ("user", ["a_fail", "a_ok", "b_queued", "b_run"]),  # ties: newest id first
        ("-provider", ["a_ok", "b_queued", "b_run", "a_fail"]),
        ("bogus", ["b_queued", "b_run", "a_fail", "a_ok"]),  # unknown sort: the default
    ],
)
def test_sort(staff_client, spread, sort, expected):
    response = staff_client.get(URL, {"sort": sort})

    assert response.status_code == 200
    assert page_ids(response) == [spread[name].pk for name in expected]


def test_column_headings_link_to_their_sort_and_keep_the_filters(staff_client, spread):
    response = staff_client.get(URL, {"state": "failed", "sort": "-cost", "page": "1"})
    page = response.content.decode()

    assert 'aria-sort="descending"' in page
    assert 'href="?state=failed&amp;sort=cost"' in page  # the sorted column flips; the page resets
    assert 'href="?state=failed&amp;sort=user"' in page


def test_pagination_keeps_filters(staff_client, make, alice):
    jobs = [make(alice, provider="aws", created_at=MONDAY + dt.timedelta(minutes=i)) for i in range(PAGE_SIZE + 3)]

    first = staff_client.get(URL, {"provider": "aws"})
    second = staff_client.get(URL, {"provider": "aws", "page": 2})

    assert len(page_ids(first)) == PAGE_SIZE
    assert 'href="?provider=aws&amp;page=2"' in first.content.decode()
    assert page_ids(second) == [job.pk for job in jobs[2::-1]]


# --- the numbers, computed in SQL ---


def test_elapsed_and_cost_match_the_model(make, alice):
    start = dt.datetime(2026, 3, 2, 23, 59, 30, 250000, tzinfo=UTC)
    job = make(
        alice,
        started=start,
        finished_at=start + dt.timedelta(hours=1, minutes=30, seconds=30.5),
        hourly_cost=Decimal("2.4"),
    )
    unstarted = make(alice, Job.State.CANCELLED, hourly_cost=Decimal("1"), finished_at=MONDAY)

    annotated = {j.pk: j for j in dashboard.with_spend(Job.objects.all(), now=MONDAY)}

    assert annotated[job.pk].elapsed_s == pytest.approx(5430.5, abs=0.01)
    assert annotated[job.pk].cost == pytest.approx(job.cost_so_far, abs=1e-5)
    assert annotated[unstarted.pk].elapsed_s is None and annotated[unstarted.pk].cost is None


def test_a_running_job_costs_up_to_now(make, alice):
    make(alice, Job.State.RUNNING, started=MONDAY, hourly_cost=Decimal("3"), cluster={"nodes": []})

    (job,) = dashboard.with_spend(Job.objects.all(), now=MONDAY + dt.timedelta(hours=2))

    assert job.cost == pytest.approx(6.0, abs=1e-5)


def test_the_dashboard_counts_a_jobs_profiling_runs_as_its_job_page_does(staff_client, make, alice):
    """One cost rule: the dashboard's cost of a job is its page's (`pricing.cost_summary`), profiling runs included —
    one that ended, one cut off by its job's teardown — and a job that only profiled (it failed before its cluster)
    costs its profiling."""
    from fc2.services import pricing

    ended = MONDAY + dt.timedelta(minutes=6)
    runs = [
        {"cluster": "p1", "hourly_cost": 0.356, "started_at": MONDAY.isoformat(), "ended_at": ended.isoformat()},
        {"cluster": "p2", "hourly_cost": 0.5, "started_at": ended.isoformat(), "ended_at": None},
    ]
    started = MONDAY + dt.timedelta(minutes=10)
    profiled = make(alice, started=started, hours=0.5, hourly_cost=Decimal("0.818"), profiling_runs=runs)
    only = make(alice, Job.State.FAILED, finished_at=ended, torn_down_at=ended, profiling_runs=runs[:1])

    annotated = {j.pk: j for j in dashboard.with_spend(Job.objects.all(), now=MONDAY + dt.timedelta(hours=2))}

    for job in (profiled, only):
        page = pricing.cost_summary(job)["cost_so_far"]
        assert annotated[job.pk].cost == pytest.approx(page, abs=1e-5)
    # 0.356 × 0.1 h + 0.5 × (6 → 40 min, its job's teardown) + 0.818 × 0.5 h
    assert annotated[profiled.pk].cost == pytest.approx(0.0356 + 0.5 * 34 / 60 + 0.409, abs=1e-5)
    totals = staff_client.get(URL).context["totals"]
    assert totals["cost"] == pytest.approx(annotated[profiled.pk].cost + annotated[only.pk].cost, abs=1e-5)


def test_burn_counts_only_clusters_that_are_up(staff_client, make, alice, bob):
    make(alice, Job.State.RUNNING, started=MONDAY, hourly_cost=Decimal("2.5"), cluster={"nodes": []})
    make(bob, Job.State.BOOTSTRAPPING, hourly_cost=Decimal("0.75"), cluster={"nodes": []})
    make(bob, Job.State.RECOMMENDING, hourly_cost=Decimal("9"))  # no cluster yet
    make(alice, Job.State.SUCCEEDED, started=MONDAY, hours=1, hourly_cost=Decimal("9"), cluster={"nodes": []})

    response = staff_client.get(URL)

    assert response.context["burn"] == {"clusters": 2, "hourly_cost": 3.25}
    assert [job.hourly_cost for job in response.context["running"]] == [Decimal("2.5"), Decimal("0.75")]
    assert "$3.25" in response.content.decode()


def test_recent_failures_newest_first_with_reasons(staff_client, make, alice, bob):
    old = make(alice, Job.State.FAILED, finished_at=MONDAY, failure_reason="bundle import failed")
    new = make(bob, Job.State.FAILED, finished_at=MONDAY + dt.timedelta(days=1), failure_reason="PS unreachable")
    make(bob, Job.State.SUCCEEDED, finished_at=MONDAY + dt.timedelta(days=2))

    response = staff_client.get(URL)

    assert response.context["failures"] == [new, old]
    page = response.content.decode()
    assert "PS unreachable" in page and new.get_absolute_url() in page


def test_removed_leftovers_newest_first_with_what_each_had(staff_client, admin_client):
    assert "No leftover cluster has been found." in staff_client.get(URL).content.decode()
    old = ReapedCluster.objects.create(
        provider="lab", cluster_name="fc2-7-0a1b2c3d", job_number=7, resources=["host n0"], by="command",
        reaped_at=MONDAY,
    )  # fmt: skip
    new = ReapedCluster.objects.create(
        provider="aws", region="ap-southeast-1", cluster_name="fc2-9-deadbeef", job_number=9,
        resources=["instance i-0abc", "vpc vpc-0def"], by="sweep", reaped_at=MONDAY + dt.timedelta(hours=1),
    )  # fmt: skip

    response = staff_client.get(URL)

    assert response.context["reapings"] == [new, old]
    page = response.content.decode()
    assert page.index("fc2-9-deadbeef") < page.index("fc2-7-0a1b2c3d")
    assert "2 resources removed" in page and "<li>instance i-0abc</li>" in page and "by cluster reap" in page
    assert "All removed leftovers" not in page, "a staff user without the admin's view permission has no link"
    assert "All removed leftovers" in admin_client.get(URL).content.decode()
    admin_page = admin_client.get(reverse("admin:fc2_reapedcluster_change", args=[new.pk]))
    assert admin_page.status_code == 200 and "vpc-0def" in admin_page.content.decode()


def test_a_failure_reads_as_its_last_meaningful_log_line(staff_client, make, alice):
    log = "Traceback (most recent call last):\nKeyError: 'label'\nW0000 00:00:1.5 7 cpu_feature_guard.cc:1] noise"
    make(
        alice,
        Job.State.FAILED,
        finished_at=MONDAY,
        failure_reason=f"chief-0 failed with exit code 1; its log ends:\n{log}",
    )

    page = staff_client.get(URL).content.decode()

    assert "chief-0 failed with exit code 1: KeyError: &#x27;label&#x27;<" in page
    assert "cpu_feature_guard.cc:1] noise<" not in page


def test_spend_totals_by_user_and_week(staff_client, make, alice, bob):
    week = dt.timedelta(weeks=1)
    make(alice, started=MONDAY, hours=2, hourly_cost=Decimal("1.25"))  # $2.50 in week 1
    make(alice, Job.State.FAILED, started=MONDAY + 2 * week, hours=1, hourly_cost=Decimal("3"))  # $3 in week 3
    # $10 counted in the week it started (Sunday night), though it ran into the next one.
    make(bob, started=MONDAY + week - dt.timedelta(hours=10), hours=5, hourly_cost=Decimal("2"))
    make(bob, Job.State.FAILED, hourly_cost=Decimal("2"))  # never started: no cost

    response = staff_client.get(URL)

    assert response.context["totals"] == {
        "jobs": 4,
        "failed": 2,
        "seconds": pytest.approx(8 * 3600),
        "cost": pytest.approx(15.5),
    }
    assert json_script(response, "spend-by-user") == [{"user": "bob", "cost": 10.0}, {"user": "alice", "cost": 5.5}]
    assert json_script(response, "spend-by-week") == [
        {"week": "2026-03-02", "cost": 12.5},
        {"week": "2026-03-09", "cost": 0.0},  # a week without spend still has its bar
        {"week": "2026-03-16", "cost": 3.0},
    ]
    filtered = staff_client.get(URL, {"user": "alice"})
    assert json_script(filtered, "spend-by-user") == [{"user": "alice", "cost": 5.5}]
    assert [row["cost"] for row in json_script(filtered, "spend-by-week")] == [2.5, 0.0, 3.0]


def test_a_local_run_costing_fractions_of_a_cent_is_charted_and_marked_as_an_estimate(staff_client, make, alice):
    # 0.05 $/h for 3 minutes: $0.0025, which whole cents would chart (and list) as $0.
    make(alice, started=MONDAY, hours=0.05, hourly_cost=Decimal("0.05"))

    response = staff_client.get(URL)

    page = response.content.decode()
    assert json_script(response, "spend-by-week") == [{"week": "2026-03-02", "cost": 0.0025}]
    assert json_script(response, "spend-by-user") == [{"user": "alice", "cost": 0.0025}]
    assert "Estimated spend" in page and "≈ $0.0025" in page
    assert escape(ESTIMATE_NOTE) in page


def test_spend_by_user_groups_the_rest_as_others(make, django_user_model):
    for i in range(4):
        user = django_user_model.objects.create_user(f"user{i}")
        make(user, started=MONDAY, hours=1, hourly_cost=Decimal(i + 1))
    jobs = dashboard.filtered_jobs(dashboard.JobFilters(), now=MONDAY)

    spend = dashboard.spend_by_user(jobs, total=dashboard.totals(jobs)["cost"], top=2)

    assert spend == [{"user": "user3", "cost": 4.0}, {"user": "user2", "cost": 3.0}, {"user": "others", "cost": 3.0}]


def test_the_charts_have_their_data_and_script(staff_client, make, alice):
    make(alice, started=MONDAY, hours=1, hourly_cost=Decimal("1"))

    response = staff_client.get(URL)

    page = response.content.decode()
    assert json_script(response, "spend-by-week") == [{"week": "2026-03-02", "cost": 1.0}]
    assert json_script(response, "spend-by-user") == [{"user": "alice", "cost": 1.0}]
    assert "vendor/chart.umd.min.js" in page and "js/dashboard.js" in page
    assert 'id="spend-by-week-chart"' in page and 'id="spend-by-user-chart"' in page


# --- it stays fast ---


def populate(make, users, count: int) -> None:
    """`count` jobs in every kind of state, spread over the users, half of them with a running or failed story."""
    states = [Job.State.SUCCEEDED, Job.State.FAILED, Job.State.RUNNING, Job.State.QUEUED, Job.State.CANCELLED]
    for i in range(count):
        state = states[i % len(states)]
        started = MONDAY + dt.timedelta(days=i % 30) if state != Job.State.QUEUED else None
        make(
            users[i % len(users)],
            state,
            started=started,
            provider=("local", "aws")[i % 2],
            hourly_cost=Decimal("1.5"),
            cluster={"nodes": []} if state == Job.State.RUNNING else None,
            finished_at=started + dt.timedelta(hours=1) if started and state != Job.State.RUNNING else None,
            failure_reason="worker lost" if state == Job.State.FAILED else "",
        )


@pytest.mark.parametrize("query", [{}, {"state": "active", "sort": "-cost"}, {"q": "lost", "provider": "aws"}])
def test_query_count_does_not_grow_with_jobs(staff_client, make, alice, bob, query):
    counts = []
    for total in (5, 50):
        Job.objects.all().delete()
        populate(make, [alice, bob], total)
        cache.clear()  # the workers' status (the banner) is cached for a few seconds: count pages that read it
        with CaptureQueriesContext(connection) as queries:
            response = staff_client.get(URL, query)
        assert response.status_code == 200
        assert page_ids(response)
        counts.append(len(queries))

    assert counts[0] == counts[1], counts
