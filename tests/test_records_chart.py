"""The records page's epoch time against workers chart: one line per latency (Anwar et al. Figs. 11–15) or per
parameter-server capacity (FC² Figs. 8–11), one batch size at a time, failed runs as gaps."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from recommender.views import chosen_batch_size, epoch_time_series

WORKLOAD = "grid:mnist"
SERIES_DATA = re.compile(r'<script id="epoch-time-series" type="application/json">(.*?)</script>', re.S)


def record(**fields) -> PerformanceRecord:
    common = {"workload": WORKLOAD, "instance_type": "lab-w-100", "ps_type": "lab-ps-450", "strategy": "ps"}
    return PerformanceRecord.objects.create(**{**common, **fields})


@pytest.fixture
def grid(db):
    """Workers 1–3 × latency 0/40 ms at batch 64 (3 at 40 ms failed), and two worker counts at batch 6400."""
    for latency_ms, times in ((0.0, (90.0, 50.0, 40.0)), (40.0, (95.0, 70.0, None))):
        for workers, epoch_time_s in enumerate(times, start=1):
            record(workers=workers, batch_size=64, latency_ms=latency_ms, epoch_time_s=epoch_time_s)
    record(workers=1, batch_size=6400, latency_ms=0.0, epoch_time_s=30.0)
    record(workers=2, batch_size=6400, latency_ms=0.0, epoch_time_s=20.0)


def get_records(client, user, **params):
    client.force_login(user)
    return client.get(reverse("recommender-records"), params)


def chart_of(response) -> dict | None:
    found = SERIES_DATA.search(response.content.decode())
    return json.loads(found.group(1)) if found else None


def lines(chart: dict) -> dict[str, list[tuple[int, float | None]]]:
    return {s["label"]: [(p["workers"], p["epoch_time_s"]) for p in s["points"]] for s in chart["series"]}


# --- the pure function (its docstring examples run in tests/test_doctests.py) ---


R = {"workers": 1, "latency_ms": 0.0, "ps_type": "lab-ps-450", "instance_type": "lab-w-100", "strategy": "ps"}


@pytest.mark.parametrize(
    "rows, expected",
    [
        # one line per latency; points sorted by workers
        (
            [{**R, "workers": 2, "epoch_time_s": 50.0}, {**R, "epoch_time_s": 90.0}, {**R, "latency_ms": 40.0}],
            {"latency 0 ms": [(1, 90.0), (2, 50.0)], "latency 40 ms": [(1, None)]},
        ),
        # one line per parameter-server type (FC²); repeated runs averaged, a failed one among them left out
        (
            [
                {**R, "epoch_time_s": 10.0},
                {**R, "epoch_time_s": 20.0},
                {**R, "epoch_time_s": None},
                {**R, "ps_type": "lab-ps-900", "epoch_time_s": 12.0},
            ],
            {"PS lab-ps-450": [(1, 15.0)], "PS lab-ps-900": [(1, 12.0)]},
        ),
        # two parts differ: both named, in the order latency · PS · worker type · strategy
        (
            [{**R, "epoch_time_s": 1.0}, {**R, "latency_ms": 40.0, "strategy": "ar", "epoch_time_s": 2.0}],
            {"latency 0 ms · ps": [(1, 1.0)], "latency 40 ms · ar": [(1, 2.0)]},
        ),
        # one series: named by everything known of it; blanks are left out
        ([{**R, "ps_type": "", "epoch_time_s": 1.0}], {"latency 0 ms · lab-w-100 · ps": [(1, 1.0)]}),
        ([{"workers": 1, "epoch_time_s": 1.0}], {"epoch time": [(1, 1.0)]}),
        # no worker count, or a bandwidth profiling run (a bandwidth, no epoch time): no point
        ([{**R, "workers": None, "epoch_time_s": 1.0}, {**R, "bandwidth_mbps": 800.0}], {}),
    ],
)
def test_series(rows, expected):
    assert lines(epoch_time_series(rows)) == expected


def test_shared_parts_are_the_charts_caption_and_two_measured_worker_counts_make_it_drawable():
    one_each = epoch_time_series([{**R, "epoch_time_s": 1.0}, {**R, "latency_ms": 40.0, "workers": 2}])
    two = epoch_time_series([{**R, "epoch_time_s": 2.0}, {**R, "workers": 2, "epoch_time_s": 1.0}])

    assert one_each["common"] == "PS lab-ps-450 · lab-w-100 · ps"
    assert (one_each["drawable"], one_each["failed_runs"], two["drawable"], two["common"]) == (False, 1, True, "")


@pytest.mark.parametrize(
    "raw, expected",
    [("64", 64), ("none", None), (None, 6400), ("", 6400), ("abc", 6400), ("128", 6400), ("6.4e3", 6400), ("²", 6400)],
)
def test_chosen_batch_size(raw, expected):
    assert chosen_batch_size(raw, [(64, 2), (6400, 3), (None, 3)]) == expected


# --- the page ---


def test_one_line_per_latency_at_the_batch_size_with_most_records(client, alice, grid):
    response = get_records(client, alice, workload=WORKLOAD)

    chart = chart_of(response)
    assert lines(chart) == {
        "latency 0 ms": [(1, 90.0), (2, 50.0), (3, 40.0)],
        "latency 40 ms": [(1, 95.0), (2, 70.0), (3, None)],
    }
    assert chart["series"][1]["failed_workers"] == [3]
    assert chart["common"] == "PS lab-ps-450 · lab-w-100 · ps"
    page = response.content.decode()
    assert '<option value="64" selected>64 (6 records)</option>' in page
    assert re.search(r'<canvas id="epoch-times"[^>]*aria-label="Epoch time[^"]*latency 0 ms; latency 40 ms', page)
    assert '<tr><th scope="row">latency 40 ms</th><td>3</td><td>failed</td></tr>' in page
    assert '<tr><th scope="row">latency 0 ms</th><td>2</td><td>50 s</td></tr>' in page
    assert "js/records.js" in page


def test_the_calibration_chart_is_still_drawn_beside_it(client, alice, grid):
    load_catalog("fc2-2018")

    page = get_records(client, alice, workload=WORKLOAD).content.decode()

    assert 'class="alert"' not in page
    assert page.count("vendor/chart.umd.min.js") == 1
    assert page.index("vendor/chart.umd.min.js") < page.index('id="calibration"') < page.index('id="epoch-times"')


def test_the_batch_size_filter_switches_the_series(client, alice, grid):
    chart = chart_of(get_records(client, alice, workload=WORKLOAD, batch_size="6400"))

    assert lines(chart) == {"latency 0 ms · PS lab-ps-450 · lab-w-100 · ps": [(1, 30.0), (2, 20.0)]}
    assert chart["common"] == ""


def test_records_without_a_batch_size_are_a_group_of_their_own(client, alice, grid):
    record(workers=1, batch_size=None, latency_ms=0.0, epoch_time_s=9.0)

    response = get_records(client, alice, workload=WORKLOAD, batch_size="none")

    assert '<option value="none" selected>– (1 record)</option>' in response.content.decode()
    assert "No chart: no series at this batch size has epoch times measured at two or more worker counts" in (
        response.content.decode()
    )
    assert chart_of(response) is None


@pytest.mark.parametrize("batch_size", ["abc", "", "-1", "99999999999999999999", "6.4e3"])
def test_bad_batch_size_shows_the_default(client, alice, grid, batch_size):
    response = get_records(client, alice, workload=WORKLOAD, batch_size=batch_size)

    assert response.status_code == 200
    assert set(lines(chart_of(response))) == {"latency 0 ms", "latency 40 ms"}


@pytest.mark.parametrize(
    "params", [{"workload": "nothing-measured"}, {"workload": "nothing-measured", "batch_size": "64"}, {}]
)
def test_a_workload_without_records_still_renders(client, alice, params):
    response = get_records(client, alice, **params)

    assert response.status_code == 200
    assert chart_of(response) is None
