"""The pages at phone width (375 px): nothing wider than the screen except tables, which scroll on their own."""

from __future__ import annotations

import pytest

from tests.browser.conftest import log_in
from tests.conftest import make_job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("path", ["/", "/jobs/", "/jobs/{job}/", "/jobs/new/", "/recommender/", "/account/tokens/"])
def test_page_fits_a_phone(page, shot, alice, bundle, digits, path):
    job = make_job(alice, bundle, digits)
    page.set_viewport_size({"width": 375, "height": 800})
    log_in(page, "alice", "alice-password-1")

    page.goto(path.format(job=job.pk))

    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"{path} is {overflow} px wider than the phone"
    shot("phone-" + (path.strip("/").replace("/", "-").replace("{job}", "job") or "home"))
