"""explore in real Chromium: the wizard's estimate of the search before anything runs, and a job page with a search
— its trials, what it chose and why it stopped. Each saved with the run's test-artifacts/screenshots/; with
FC2_DOCS_SCREENSHOTS=1 also as the docs' docs/screenshots/explore-wizard.png and explore-job.png (looked at by
people before they are committed: a plain test run leaves the checkout as it was)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

import provisioner
from fc2.models import Job
from recommender.catalog import load_catalog
from tests.browser.conftest import SCREENSHOTS, log_in, redrawn, to_resource_step
from tests.conftest import PROJECT_DIR
from tests.helpers import job_row
from tests.test_explore_surfaces import SEARCH, trial

pytestmark = pytest.mark.django_db(transaction=True)

DOCS_SCREENSHOTS = PROJECT_DIR / "docs" / "screenshots"


def docs_screenshot(name: str) -> Path:
    """Where a screenshot for the docs goes: docs/screenshots/ when FC2_DOCS_SCREENSHOTS=1, else beside the run's."""
    folder = DOCS_SCREENSHOTS if os.environ.get("FC2_DOCS_SCREENSHOTS") == "1" else SCREENSHOTS
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


@pytest.fixture(autouse=True)
def lab_catalog():
    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    load_catalog("lab")


def test_the_wizard_shows_what_the_search_will_cost_before_it_runs(page, shot, alice, example_wheel):
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel, {"epochs": "5"})
    with redrawn(page):
        page.get_by_label("Lab").check()
    page.get_by_label("Resource configuration").select_option("explore")
    explore = page.locator("#explore-fields")
    expect(explore).to_be_visible()
    expect(page.get_by_label("Search budget ($)")).to_have_value("5")
    expect(page.get_by_label("Search time (minutes)")).to_have_value("30")
    page.get_by_label("My own weights").check()
    expect(page.get_by_label("α: weight of time")).to_be_visible()
    page.get_by_role("spinbutton", name="Maximum number of workers").fill("3")
    with page.expect_response(re.compile(r"/jobs/new/recommendation")):
        # As a person does: the pill they see is the label's text; its radio is a 1-px input under it, which the
        # panel's redraw beside it can move while Playwright aims at it.
        page.get_by_text("Cheapest: cost counts, not time").click()
    expect(page.get_by_label("Cheapest: cost counts, not time")).to_be_checked()
    expect(page.get_by_label("α: weight of time")).to_be_hidden()
    expect(page.locator("#recommendation")).to_contain_text("Trial runs first")
    expect(page.locator("#search-first-trial")).to_contain_text(re.compile(r"\d × lab-w-"))
    expect(page.locator("#search-dollars")).to_contain_text("at most $5.00")
    expect(page.locator("#search-minutes")).to_contain_text("at most 30 min")
    # For the docs: from the choice of algorithm to the search's fields, the estimate beside them.
    page.set_viewport_size({"width": 1280, "height": 1400})
    page.get_by_label("Resource configuration").evaluate("e => window.scrollBy(0, e.getBoundingClientRect().top - 90)")
    page.screenshot(path=str(docs_screenshot("explore-wizard.png")))
    shot("estimate")

    page.get_by_role("button", name=re.compile("^Next")).click()
    page.wait_for_url(re.compile(r"/jobs/new/review/"))
    expect(page.locator("#review-cluster")).to_have_text("The search for your cluster")
    expect(page.locator("#review-weights")).to_contain_text("Cheapest")
    shot("review")


def test_the_job_page_shows_the_search_its_trials_and_why_it_stopped(page, shot, alice):
    runs = [
        trial(1, "lab-w-100", 2, ended=7, epoch=30.5),
        trial(2, "lab-w-250", 1, ended=4, error="the chief exited with code 1: ValueError: bad shape"),
        trial(3, "lab-w-1g", 3, ended=1, epoch=11.9),
    ]
    done = job_row(
        alice, algorithm="explore", provider="lab", catalog="lab", parameters={"epochs": "4"},
        state=Job.State.SUCCEEDED, profiling_runs=runs, search=SEARCH, strategy="ps", ps_type="lab-ps-450",
        worker_type="lab-w-1g", workers=3, hourly_cost="0.875",
    )  # fmt: skip
    log_in(page, "alice", "alice-password-1")
    page.goto(done.get_absolute_url())
    search = page.locator("#search")
    expect(search.locator("#search-trials tbody tr")).to_have_count(3)
    expect(search.locator('tr[data-trial="2"]')).to_contain_text("failed the chief exited with code 1")
    expect(search.locator("#search-after")).to_contain_text("3 × lab-w-1g")
    expect(search.locator("#search-reason")).to_contain_text("worth less than its cost")
    page.locator("#live").screenshot(path=str(docs_screenshot("explore-job.png")))
    shot("done")

    # While it searches: the page is live, the trial under way said in the progress line and the table.
    searching = job_row(
        alice, algorithm="explore", provider="lab", catalog="lab", parameters={"epochs": "4"},
        state=Job.State.RECOMMENDING, profiling_runs=[*runs[:2], trial(3, "lab-w-1g", 3, ended=None)],
    )  # fmt: skip
    page.goto(searching.get_absolute_url())
    expect(page.locator("#search-status")).to_have_text("trial 3 under way")
    expect(page.locator("#job-trial")).to_contain_text("trial 3")
    Job.objects.filter(pk=searching.pk).update(profiling_runs=[*runs], search=SEARCH)
    expect(page.locator("#search-status")).to_have_text("done", timeout=10_000)
    shot("searching")
