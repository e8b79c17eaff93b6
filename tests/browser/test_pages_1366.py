"""The pages at a laptop's 1366 × 768 in real Chromium: the jobs table inside its box for an admin and a researcher
with long names, no select whose chosen text is cut (the records page's Strategy), and the API reference's way back
to the site."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

from fc2.models import Artifact, Job, Node
from tests.browser.conftest import log_in, to_resource_step
from tests.helpers import job_row, make_bundle, make_dataset

pytestmark = pytest.mark.django_db(transaction=True)
LAPTOP = {"width": 1366, "height": 768}
LONG_USER = "maximiliane-researcher-of-distributed-systems"


@pytest.fixture
def laptop(page):
    page.set_viewport_size(LAPTOP)
    return page


def right_edges(page, table: str) -> tuple[float, float]:
    """The right edges of `table` and of the box that holds it (its .table-wrap), in CSS pixels."""
    return page.locator(table).evaluate(
        "t => [t.getBoundingClientRect().right, t.closest('.table-wrap').getBoundingClientRect().right]"
    )


@pytest.mark.parametrize("who", ["admin", "researcher"])
def test_the_jobs_table_fits_its_box_at_1366(laptop, shot, who):
    users = get_user_model().objects
    owner = users.create_user(LONG_USER, password="long-password-1")
    if who == "admin":
        users.create_user("root-admin", password="admin-password-1", is_staff=True)
    bundle = make_bundle(owner, "convolutional-digits-classifier-with-a-long-name")
    dataset = make_dataset(owner, "handwritten-digits-augmented-with-rotations-v2")
    for state in (Job.State.SUCCEEDED, Job.State.RUNNING, Job.State.FAILED):
        job_row(
            owner, bundle, dataset, state=state, provider="lab", strategy=Job.Strategy.MIRRORED, workers=12,
            worker_type="lab-w-1g", metrics={"test_accuracy": 0.973}, started_at=timezone.now(),
        )  # fmt: skip
    log_in(laptop, *(("root-admin", "admin-password-1") if who == "admin" else (LONG_USER, "long-password-1")))

    laptop.goto("/jobs/")

    table, box = right_edges(laptop, "table.job-table")
    shot(f"jobs-{who}")
    assert table <= box + 0.5, f"the table ends at {table} px, past its box's {box} px"
    submitted = laptop.get_by_role("columnheader", name="Submitted")
    assert submitted.bounding_box()["x"] + submitted.bounding_box()["width"] <= box + 0.5


def test_the_api_reference_leads_back_to_the_site(laptop, shot, alice):
    log_in(laptop, "alice", "alice-password-1")

    laptop.goto("/api/docs")  # the address the API's own prefix suggests leads to the page
    laptop.wait_for_url("**/api-docs/")
    laptop.locator(".swagger-ui .info").wait_for()
    shot("api-reference")
    laptop.get_by_role("link", name="← Back to the site").click()

    laptop.wait_for_url(re.compile(r"^https?://[^/]+/$"))  # the home page
    assert laptop.get_by_role("link", name="API reference").count() == 1  # the site's own bar again


def cut_selects(page) -> list[str]:
    """The visible selects whose chosen option's text is wider than the room the select gives it."""
    return page.evaluate(
        """() => [...document.querySelectorAll('select:not([multiple])')].filter(s => s.offsetParent).filter(s => {
             const style = getComputedStyle(s), ctx = document.createElement('canvas').getContext('2d');
             ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
             const text = ctx.measureText(s.options[s.selectedIndex]?.text ?? '').width;
             const room = s.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 16;
             return text > room;
           }).map(s => `${s.name}: ${s.options[s.selectedIndex].text}`)"""
    )


@pytest.mark.parametrize(
    "path", ["/recommender/", "/recommender/records/?workload=lab-digits-grid", "/recommender/catalogs/", "wizard"]
)
def test_no_select_cuts_its_text(laptop, shot, alice, example_wheel, path):
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())  # the shipped records and catalogues
    log_in(laptop, "alice", "alice-password-1")

    if path == "wizard":
        to_resource_step(laptop, example_wheel)
    else:
        laptop.goto(path)
    shot(re.sub(r"[^a-z]+", "-", path).strip("-"))

    assert cut_selects(laptop) == []


def test_a_profiling_job_and_an_ended_jobs_figures_read_as_people_read_them(laptop, shot, alice, bundle, digits):
    now = timezone.now()
    profiling = job_row(alice, bundle, digits, algorithm="scala-opt", provider="lab", state=Job.State.RECOMMENDING)
    Job.objects.filter(pk=profiling.pk).update(
        profiling_runs=[
            {
                "number": 2,
                "runs": 3,
                "worker_type": "lab-w-100",
                "hourly_cost": 0.1,
                "started_at": now.isoformat(),
                "window_ends_at": (now + timedelta(seconds=95)).isoformat(),
                "ended_at": None,
            },
        ]  # fmt: skip
    )
    metrics = {"examples_per_s": 1143.6, "input_shape": [8, 8, 1], "epoch_time_s": 0.6, "test_accuracy": 0.97}
    ended = job_row(alice, bundle, digits, state=Job.State.SUCCEEDED, metrics=metrics, strategy="ps", workers=1)
    Node.objects.create(job=ended, name="chief-0", role="chief", index=0, status=Node.Status.SUCCEEDED)
    Artifact.objects.create(job=ended, name="metrics.json", size_bytes=10, not_kept="kept nowhere in this test")
    log_in(laptop, "alice", "alice-password-1")

    laptop.goto(profiling.get_absolute_url())
    expect(laptop.locator("#job-profiling")).to_contain_text("profiling 2 of 3")
    expect(laptop.locator("#job-profiling")).to_contain_text(re.compile(r"at most 1 min \d\d s left"))
    shot("profiling")
    laptop.goto(ended.get_absolute_url())

    expect(laptop.locator("#figure-throughput")).to_have_text("1144 examples/s")
    expect(laptop.locator("#figure-epoch-time")).to_have_text("600 ms")
    expect(laptop.locator(".badge", has_text="examples_per_s")).to_have_text("examples_per_s: 1144")
    expect(laptop.locator(".badge", has_text="input_shape")).to_have_text("input_shape: [8, 8, 1]")
    shot("ended")
