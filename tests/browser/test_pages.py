"""Pages in real Chromium: who sees what, and screenshots of the recommender pages."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from fc2.models import Job, Node
from monitor.models import LossPoint, NodeSample
from tests.browser.conftest import log_in
from tests.conftest import make_job

pytestmark = pytest.mark.django_db(transaction=True)
TABLE_4 = Path(__file__).resolve().parents[2] / "recommender" / "data" / "anwar2021-table4.csv"


def test_second_researcher_cannot_open_the_first_ones_job(page, shot, alice, bob, bundle, digits):
    job = make_job(alice, bundle, digits)
    log_in(page, "bob", "bob-password-1")

    response = page.goto(f"/jobs/{job.pk}/")

    assert response.status == 404
    shot("bob-gets-404")
    page.goto("/jobs/")
    assert page.get_by_text(f"#{job.pk}").count() == 0


def test_anwar_page_answers_from_the_sample_setup_loads(page, shot, alice):
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())  # as on a fresh install
    log_in(page, "alice", "alice-password-1")

    page.goto("/recommender/")
    assert page.get_by_label("Workload").input_value() == "anwar2021-mnist"
    page.get_by_label("Batch size").fill("64000")
    page.get_by_label("Network latency (ms)").fill("0")
    page.get_by_role("button", name="Recommend").click()

    assert page.locator("#answer").get_by_text("Recommended machines: 4").count() == 1
    shot("anwar-64000-at-0ms")
    page.goto("/recommender/catalogs/?catalog=fc2-2018")
    assert page.get_by_text("c4.8xlarge").count() == 1
    shot("catalogue")
    page.goto("/recommender/records/")
    assert page.get_by_label("Workload", exact=True).input_value() == "anwar2021-mnist"
    page.wait_for_function("Chart.getChart('calibration')?.data.datasets[0].data.length > 0")
    # Every held-out record of Table 4 is a point of the calibration chart, and the table lists the shipped rows.
    held_out = page.evaluate("Chart.getChart('calibration').data.datasets[0].data.length")
    assert held_out == int(page.locator("#calibration-pairs").evaluate("e => JSON.parse(e.textContent).length")) > 0
    shipped = [line for line in TABLE_4.read_text().splitlines() if line and not line.startswith("#")]
    expect(page.locator("table:not(.visually-hidden) tbody tr")).to_have_count(len(shipped))
    shot("records-and-calibration")
    page.get_by_label("Batch size", exact=True).select_option(label="64000 (3 records)")
    page.get_by_role("button", name="Show").click()
    # The epoch-time chart's table at 64,000: 4 and 3 machines measured, the single machine's failed run.
    points = page.locator("table.visually-hidden tbody tr")
    expect(points).to_have_count(3)
    assert [row.split("\t") for row in points.all_inner_texts()] == [
        ["latency 0 ms · mirrored", n, time] for n, time in (("1", "failed"), ("3", "503 s"), ("4", "419 s"))
    ]  # fmt: skip


def ended_job_with_chart_data(owner, bundle, dataset, losses: int) -> Job:
    """A finished job whose chief sent one resource sample and printed `losses` losses (hand-built rows)."""
    job = Job.objects.create(owner=owner, bundle=bundle, dataset=dataset, state=Job.State.SUCCEEDED)
    chief = Node.objects.create(job=job, name="chief-0", role="chief", index=0, instance_type="m4.xlarge")
    NodeSample.objects.create(node=chief, cpu_percent=80.0, memory_mb=500.0)
    LossPoint.objects.bulk_create(LossPoint(node=chief, step=step, loss=1 / step) for step in range(1, losses + 1))
    return job


def chart(page, chart_id: str, expression: str):
    """`expression` evaluated on the Chart.js chart of the job page's canvas `chart-<chart_id>`, as `c`."""
    return page.evaluate(f"(() => {{ const c = Chart.getChart('chart-{chart_id}'); return {expression}; }})()")


def test_job_charts_draw_every_loss_a_lone_sample_as_a_dot_and_distinct_time_labels(page, shot, alice, bundle, digits):
    many = ended_job_with_chart_data(alice, bundle, digits, losses=10)
    one = ended_job_with_chart_data(alice, bundle, digits, losses=1)
    log_in(page, "alice", "alice-password-1")

    page.goto(f"/jobs/{many.pk}/")
    page.wait_for_function("Chart.getChart('chart-loss')?.data.datasets[0]?.data.length > 0")
    assert chart(page, "loss", "c.data.datasets[0].data.length") == 10
    shot("ten-losses")

    page.goto(f"/jobs/{one.pk}/")
    page.wait_for_function("Chart.getChart('chart-loss')?.data.datasets[0]?.data.length > 0")
    assert chart(page, "loss", "c.getDatasetMeta(0).data[0].options.radius") > 0
    assert chart(page, "cpu", "c.getDatasetMeta(0).data[0].options.radius") > 0
    assert chart(page, "cpu", "c.scales.x.max - c.scales.x.min") == 60_000  # not the days Chart.js would take
    labels = chart(page, "cpu", "c.scales.x.ticks.map((t) => t.label).filter(Boolean)")
    assert len(labels) == len(set(labels)) >= 2
    shot("one-sample")
