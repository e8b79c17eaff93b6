"""A managed job in real Chromium: its page's Restarts section live while a restart is under way and once its nodes
run again — each restart's nodes, reason, work lost and checkpoint, the spot choice, the checkpoints to download —
and the wizard's expected spot saving on AWS (moto).
Saved with the run's test-artifacts/screenshots/; with FC2_DOCS_SCREENSHOTS=1 also as docs/screenshots/managed-job.png
(looked at by people before it is committed)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from fc2.models import Job, Node
from harness.ec2lab import REGION
from recommender.catalog import load_catalog
from tests.browser.conftest import log_in, redrawn, to_resource_step
from tests.browser.test_explore_pages import docs_screenshot
from tests.helpers import job_row
from tests.test_managed_surfaces import RESTART, T0, checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

# A spot instance taken back, as the sweep says it.
TAKEN_BACK = {
    **RESTART,
    "reason": "worker-1 is lost: its machine does not answer and it has not reported for 41 s "
    "(FC2_NODE_UNREACHABLE_S is 40 s): its host is gone or cut off",
}


def test_the_job_page_shows_a_restart_live_and_its_checkpoints(page, shot, alice):
    job = job_row(
        alice, provider="aws", catalog="fc2-2018", region="us-east-1", parameters={"epochs": "20"},
        state=Job.State.PROVISIONING, started_at=T0, launched_at=T0, strategy="ps", workers=2, ps_type="m4.large",
        worker_type="c4.xlarge", hourly_cost=Decimal("0.498"), epoch=7, epochs=20, step=1540, steps=4400, loss=0.31,
        max_restarts=3, spot=True, spot_max_price=Decimal("0.12"), restarts=[{**TAKEN_BACK, "resumed_at": None}],
    )  # fmt: skip
    for index, (name, role) in enumerate([("ps-0", "ps"), ("worker-0", "worker"), ("worker-1", "worker")]):
        Node.objects.create(
            job=job, name=name, role=role, index=max(0, index - 1), address=f"10.0.1.{index + 10}",
            instance_type="m4.large" if role == "ps" else "c4.xlarge",
        )  # fmt: skip
    for number, seconds in ((1, 250), (2, 500)):
        checkpoint(job, number, seconds, bytes(2_400_000))  # a small model's variables and optimizer
    log_in(page, "alice", "alice-password-1")
    page.goto(job.get_absolute_url())
    restarts = page.locator("#restarts")
    expect(restarts.locator("#restarts-status")).to_have_text("restart 1 under way: its cluster is being made again")
    expect(restarts.locator('tr[data-restart="1"]')).to_contain_text("under way")
    shot("under-way")

    # Its nodes run again from the checkpoint: the page, polling, says so without a reload.
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, restarts=[TAKEN_BACK])
    expect(restarts.locator("#restarts-status")).to_have_text("1 of 3 made", timeout=10_000)
    row = restarts.locator('tr[data-restart="1"]')
    expect(row).to_contain_text("worker-1")
    expect(row).to_contain_text("4 steps")
    expect(row).to_contain_text("18 s after the loss")
    expect(row.get_by_role("link", name="Download checkpoint 000002.tar.gz")).to_be_visible()
    expect(restarts.locator("#restarts-spot")).to_contain_text("spot instances at most $0.12/h")
    expect(restarts.locator("#checkpoints li")).to_have_count(2)
    with page.expect_download() as download:
        restarts.get_by_role("link", name="Download checkpoint checkpoints/000002.tar.gz").click()
    assert download.value.suggested_filename == "checkpoints_000002.tar.gz"
    page.set_viewport_size({"width": 1280, "height": 1000})
    restarts.screenshot(path=str(docs_screenshot("managed-job.png")))
    shot("resumed")


def test_the_wizard_shows_spots_expected_saving_on_aws(page, shot, alice, example_wheel, aws_env):
    """Spot ticked on AWS: the cluster panel gives its expected spot price beside on-demand, from moto's spot price
    history; unticked, it is gone."""
    load_catalog("fc2-2018")
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel, {"epochs": "2"})
    with redrawn(page):
        page.get_by_label("AWS EC2").check()
    page.get_by_label("AWS region").select_option(REGION)
    page.get_by_label("All-Reduce", exact=True).check()
    page.get_by_role("spinbutton", name="Maximum number of workers").fill("2")
    with page.expect_response(re.compile(r"/jobs/new/recommendation")):
        page.get_by_label("Worker type", exact=True).select_option("c4.xlarge")
    expect(page.locator("#plan-cost")).to_be_visible()
    expect(page.locator("#plan-spot")).to_have_count(0)
    with page.expect_response(re.compile(r"/jobs/new/recommendation")):
        page.get_by_label("Spot instances (AWS)").check()
    spot = page.locator("#plan-spot")
    expect(spot).to_contain_text("on-demand: expected saving")
    expect(spot).to_contain_text(re.compile(rf"c4\.xlarge .+/h in {REGION}[a-z]: the region.s latest spot prices"))
    shot("spot")
    with page.expect_response(re.compile(r"/jobs/new/recommendation")):
        page.get_by_label("Spot instances (AWS)").uncheck()
    expect(page.locator("#plan-spot")).to_have_count(0)
