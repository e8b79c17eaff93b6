"""Pages in real Chromium: who sees what, and screenshots of the recommender pages."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from tests.browser.conftest import log_in
from tests.conftest import make_job

pytestmark = pytest.mark.django_db(transaction=True)


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
    page.wait_for_function("document.querySelector('#calibration') && document.querySelector('#calibration').width > 0")
    shot("records-and-calibration")
