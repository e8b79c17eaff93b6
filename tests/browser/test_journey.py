"""The researcher's journey in real Chromium, against a live server and a real Celery worker: log in, upload the
example wheel, choose digits, take the recommendation, run on the local provider, watch the progress bar reach the
end, download the model. Plus: a bad upload shows its reason; an admin sees everyone's jobs on the dashboard."""

from __future__ import annotations

import ipaddress
import os
import re
import time
import uuid
import zipfile

import pytest
from playwright.sync_api import expect

from fc2.models import CodeBundle, Job
from harness.ec2lab import NOTHING, REGION, everything_tagged
from harness.wheels import FILENAME, GOOD, make_wheel
from recommender.catalog import load_catalog
from tests.browser.conftest import log_in, redrawn, to_resource_step
from tests.conftest import aws_worker_env, cluster_processes, make_job, start_worker, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.heavy
def test_researcher_trains_on_digits_and_downloads_the_model(page, shot, alice, example_wheel, celery_worker, tmp_path):
    load_catalog("fc2-2018")
    log_in(page, "alice", "alice-password-1")
    shot("home")

    page.goto("/jobs/new/")
    page.get_by_label("Wheel bundle (.whl)").set_input_files(str(example_wheel))
    page.get_by_role("textbox", name="Name of parameter 1").fill("epochs")
    page.get_by_role("textbox", name="Value of parameter 1").fill("1")
    shot("wizard-code")
    page.get_by_role("button", name=re.compile("^Next")).click()

    page.wait_for_url(re.compile(r"/jobs/new/data/"))
    shot("wizard-data-empty")
    page.locator("label.wz-card", has_text="Digits").click()
    shot("wizard-data")
    page.get_by_role("button", name=re.compile("^Next")).click()

    page.wait_for_url(re.compile(r"/jobs/new/resource/"))
    page.get_by_label("Resource configuration").select_option("cost-opt")
    page.get_by_label("All-Reduce", exact=True).check()
    page.get_by_role("spinbutton", name="Maximum number of workers").fill("2")
    recommendation = page.locator("[aria-live]").first
    expect(recommendation).to_contain_text("c4.xlarge")  # Cost-Opt's cheapest worker type, live
    shot("wizard-resource")
    page.get_by_role("button", name=re.compile("^Next")).click()

    page.wait_for_url(re.compile(r"/jobs/new/review/"))
    expect(page.get_by_text("c4.xlarge").first).to_be_visible()
    shot("wizard-review")
    page.get_by_role("button", name="Run job").click()

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    progress = page.get_by_role("progressbar", name="Training progress")
    expect(progress).to_have_attribute("aria-valuenow", "100", timeout=180_000)
    expect(page.locator("#job-state, .badge.succeeded").first).to_contain_text("succeeded", timeout=60_000)
    shot("job-succeeded")
    job = Job.objects.get()
    assert (job.algorithm, job.strategy, job.worker_type, job.workers) == ("cost-opt", "mirrored", "c4.xlarge", 2)

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download model.keras").click()
    model = tmp_path / "model.keras"
    download_info.value.save_as(model)
    with zipfile.ZipFile(model) as archive:
        assert "config.json" in archive.namelist()  # a real Keras model file
    deadline = time.monotonic() + 60  # the teardown follows the success (a mirrored job's workers end on their own)
    while Job.objects.get().cluster is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster_processes() == []


@pytest.mark.parametrize(
    ("name", "members", "reason"),
    [
        ("not-a-zip", None, "not a zip"),
        ("zip-slip", {**GOOD, "../evil.py": b"x"}, ".."),
        ("no-main", {**GOOD, "demo/main.py": None}, "main.py"),
    ],
)
def test_bad_upload_shows_its_reason_on_the_form(page, shot, alice, tmp_path, name, members, reason):
    if members is None:
        wheel = tmp_path / FILENAME
        wheel.write_bytes(b"this is not a wheel at all")
    else:
        wheel = make_wheel(tmp_path, members)
    log_in(page, "alice", "alice-password-1")

    page.goto("/jobs/new/")
    page.get_by_label("Wheel bundle (.whl)").set_input_files(str(wheel))
    page.get_by_role("button", name=re.compile("^Next")).click()

    error = page.locator(".errorlist").first
    expect(error).to_contain_text(reason)
    assert "/jobs/new/code/" in page.url
    shot(f"bad-upload-{name}")


def test_a_wheel_over_the_limit_is_cut_off_and_the_reason_shown(page, shot, alice, tmp_path, settings):
    settings.FC2_MAX_BUNDLE_MB = 1
    wheel = make_wheel(tmp_path, {**GOOD, "demo/weights.bin": os.urandom(3 * 2**20)})
    log_in(page, "alice", "alice-password-1")

    page.goto("/jobs/new/")
    page.get_by_label("Wheel bundle (.whl)").set_input_files(str(wheel))
    page.get_by_role("button", name=re.compile("^Next")).click()

    expect(page.get_by_role("alert")).to_contain_text("larger than the 1 MB limit")
    assert "/jobs/new/code/" in page.url and not CodeBundle.objects.exists()
    shot("upload-over-limit")


def test_admin_sees_every_researchers_jobs_on_the_dashboard(page, shot, admin_user, alice, bob, bundle, digits):
    alices = make_job(alice, bundle, digits)
    bobs = make_job(bob, bundle, digits)
    log_in(page, "admin", "password")

    page.goto("/dashboard/")

    jobs = page.get_by_role("region", name="Jobs of every user")
    expect(jobs).to_contain_text("alice")
    expect(jobs).to_contain_text("bob")
    expect(jobs.get_by_role("link", name=re.compile(rf"^#?{alices.pk}$"))).to_be_visible()
    expect(jobs.get_by_role("link", name=re.compile(rf"^#?{bobs.pk}$"))).to_be_visible()
    shot("admin-dashboard")


@pytest.mark.heavy
def test_the_wizards_lab_choice_trains_on_lab_nodes_through_the_workers(
    page, shot, alice, example_wheel, celery_worker
):
    """Lab from the wizard, through a real Celery worker: nodes bootstrapped over SSH report through their bridge's
    relay to this live server, and the job page shows the nodes' own addresses and the latency between them."""
    import provisioner

    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    load_catalog("lab")
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel, {"epochs": "1"})
    with redrawn(page):  # with the lab's own catalogue chosen
        page.get_by_label("Lab (emulated cloud on this machine)").check()
    expect(page.get_by_label("Instance catalogue")).to_have_value("lab")
    page.get_by_label("Latency between nodes (ms)").fill("10")
    page.get_by_label("All-Reduce", exact=True).check()
    expect(page.locator("#id_worker_type option[value='lab-w-250']")).to_have_count(1)  # the lab's types, live
    page.get_by_label("Worker type", exact=True).select_option("lab-w-250")
    page.get_by_role("spinbutton", name="Maximum number of workers").fill("2")
    expect(page.get_by_label("Worker type", exact=True)).to_have_value("lab-w-250")
    shot("wizard-resource-lab")
    page.get_by_role("button", name=re.compile("^Next")).click()
    page.wait_for_url(re.compile(r"/jobs/new/review/"))
    expect(page.get_by_text("10 ms between nodes")).to_be_visible()
    page.get_by_role("button", name="Run job").click()

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#job-state, .badge.succeeded").first).to_contain_text("succeeded", timeout=180_000)
    shot("job-succeeded-lab")
    job = Job.objects.get()
    assert (job.provider, job.catalog, job.latency_ms, job.worker_type) == ("lab", "lab", 10.0, "lab-w-250")
    for node in job.nodes.all():
        expect(page.get_by_text(node.address).first).to_be_visible()
        assert node.address.startswith("10.") and node.started_at  # its own address; its reports arrived
    expect(page.get_by_text("10 ms between nodes").first).to_be_visible()


@pytest.mark.heavy
def test_the_wizards_aws_choice_trains_on_ec2_instances_through_the_workers(
    page, shot, alice, example_wheel, ec2_hosts, live_server, runtime_dir, settings, tmp_path
):
    """AWS from the wizard once credentials are configured (moto's EC2 here, its instances lab hosts), through a real
    Celery worker: the job runs in the region chosen, on the instances' own addresses, and nothing is left."""
    load_catalog("fc2-2018")
    queue = f"fc2-test-{uuid.uuid4().hex[:8]}"
    settings.CELERY_TASK_DEFAULT_QUEUE = queue
    worker = start_worker(worker_env(live_server, runtime_dir, queue) | aws_worker_env(settings), tmp_path / "w.log")
    try:
        log_in(page, "alice", "alice-password-1")
        to_resource_step(page, example_wheel, {"epochs": "1"})
        expect(page.get_by_label("AWS EC2")).to_be_enabled()
        with redrawn(page):  # for the provider chosen
            page.get_by_label("AWS EC2").check()
        page.get_by_label("AWS region").select_option(REGION)
        page.get_by_label("All-Reduce", exact=True).check()
        page.get_by_role("spinbutton", name="Maximum number of workers").fill("2")
        page.get_by_role("button", name=re.compile("^Next")).click()  # by hand, with no type: EC2 has no default
        expect(page.get_by_text("AWS EC2 has no default machine").first).to_be_visible()
        page.get_by_label("Resource configuration").select_option("cost-opt")
        expect(page.locator("#recommendation")).to_contain_text("2 workers")
        shot("wizard-resource-aws")
        page.get_by_role("button", name=re.compile("^Next")).click()
        page.wait_for_url(re.compile(r"/jobs/new/review/"))
        expect(page.get_by_text(REGION).first).to_be_visible()
        page.get_by_role("button", name="Run job").click()

        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        expect(page.locator("#job-state")).to_contain_text(re.compile("succeeded|failed"), timeout=180_000)
        job = Job.objects.get()
        assert job.state == Job.State.SUCCEEDED, (job.failure_reason, (tmp_path / "w.log").read_text()[-3000:])
        shot("job-succeeded-aws")
        assert (job.provider, job.region, job.workers, job.worker_type) == ("aws", REGION, 2, "c4.xlarge")
        vpc = ipaddress.ip_network(settings.FC2_AWS_VPC_CIDR)
        for node in job.nodes.all():
            expect(page.get_by_text(node.address).first).to_be_visible()
            assert ipaddress.ip_address(node.address.split(":")[0]) in vpc and node.started_at
        deadline = time.monotonic() + 60
        while Job.objects.get(pk=job.pk).cluster is not None:
            assert time.monotonic() < deadline, "the cluster was never released"
            time.sleep(0.5)
        assert everything_tagged(job.cluster_name) == NOTHING
    finally:
        worker.terminate()
        worker.wait(timeout=30)
