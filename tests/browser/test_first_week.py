"""What a newcomer meets in the first week (issue 30), in real Chromium, with a screenshot of each page."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from urllib.parse import urlsplit

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.utils import timezone
from playwright.sync_api import expect

import provisioner
from fc2.models import ApiToken, Artifact, CodeBundle, Dataset, Job, Node
from monitor.models import LossPoint, NodeSample
from provisioner.lab import net as labnet
from tests.browser.conftest import SCREENSHOTS, log_in, redrawn, to_resource_step
from tests.conftest import make_job

pytestmark = pytest.mark.django_db(transaction=True)


def test_reloading_the_token_page_makes_no_second_token(page, shot, alice):
    log_in(page, "alice", "alice-password-1")
    page.goto("/account/tokens/")
    page.get_by_label("Name").fill("notebook")
    page.get_by_role("button", name="Create token").click()

    secret = page.locator("#new-token").inner_text()
    assert secret and page.url.endswith("/account/tokens/")
    shot("new-token-shown-once")
    page.reload()  # a GET after the redirect: no "resubmit the form?" and no second token

    expect(page.locator("#new-token")).to_have_count(0)
    assert ApiToken.objects.filter(user=alice).count() == 1
    assert secret not in page.content()
    shot("after-reload")


def test_api_reference_is_a_page_served_by_the_platform_itself(page, shot, live_server, alice):
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc))
    page.goto("/api-docs/")
    assert "/accounts/login/" in page.url  # a page: a visitor signs in first
    log_in(page, "alice", "alice-password-1")
    page.goto("/api-docs/")

    expect(page.get_by_text("FC² platform API").first).to_be_visible()
    expect(page.locator(".opblock-summary-path", has_text="/api/v1/jobs").first).to_be_visible()
    expect(page.locator(".opblock-summary-path", has_text="/api/v1/recommend").first).to_be_visible()
    shot("swagger-ui")
    assert hosts == {urlsplit(live_server.url).netloc}, "every script and style comes from the platform (no CDN)"
    page.goto("/account/tokens/")
    page.get_by_role("link", name="API reference").first.click()
    page.wait_for_url("**/api-docs/")


def test_the_recommender_page_prices_lab_types_from_the_lab_catalogue_and_says_what_it_runs(page, shot, alice):
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())
    log_in(page, "alice", "alice-password-1")
    page.goto("/recommender/")
    expect(page.locator("#other-algorithms")).to_contain_text("This page runs the lookup only")
    page.get_by_label("Workload").select_option("lab-digits-grid")
    page.get_by_label("Batch size").fill("32")
    page.get_by_label("Network latency (ms)").fill("0")
    page.get_by_role("button", name="Recommend").click()

    answer = page.locator("#answer")
    expect(answer).to_contain_text("Prices from the lab catalogue")
    assert "unknown to the catalogue" not in answer.inner_text() and "$0/h" not in answer.inner_text()
    expect(answer.locator("tbody")).to_contain_text(re.compile(r"\$0\.(25|50|75)/h"))  # n × lab-w-1g at $0.25/h
    shot("lab-lookup-priced")
    page.get_by_label("Catalogue").select_option("fc2-2018")  # asked for on purpose: no lab type is priced there
    page.get_by_role("button", name="Recommend").click()
    expect(page.locator("#answer")).to_contain_text("unknown to the catalogue")


def test_records_are_paginated_and_another_workload_brings_its_own_batch_sizes(page, shot, alice):
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())
    log_in(page, "alice", "alice-password-1")
    page.goto("/recommender/records/?workload=lab-digits-grid&strategy=ps")

    rows = page.locator("table:not(.visually-hidden) tbody tr")
    expect(rows).to_have_count(50)
    expect(page.get_by_role("navigation", name="Pages of records")).to_contain_text("records 1–50 of 96")
    expect(page.locator("#predictor-error")).to_contain_text("%")  # the recommender's own figure for these runs
    shot("records-page-1")
    page.get_by_role("link", name="next →").click()
    expect(page.get_by_role("navigation", name="Pages of records")).to_contain_text("records 51–96 of 96")
    assert "workload=lab-digits-grid" in page.url and "strategy=ps" in page.url
    page.get_by_label("Strategy").select_option("mirrored")
    page.get_by_role("button", name="Show").click()
    expect(rows).to_have_count(50)  # the all-reduce runs' first page of two
    expect(page.get_by_role("navigation", name="Pages of records")).to_contain_text("records 1–50 of 72")

    page.get_by_label("Workload", exact=True).select_option("anwar2021-mnist")  # no Show pressed
    page.wait_for_url("**workload=anwar2021-mnist**")
    sizes = page.get_by_label("Batch size", exact=True).locator("option").all_inner_texts()
    assert sizes and not {text.split(" ")[0] for text in sizes} & {"32", "64", "128", "256"}, "no lab batch size left"
    expect(rows).to_have_count(10)  # one page: no pager
    expect(page.get_by_role("navigation", name="Pages of records")).to_have_count(0)
    shot("anwar-records")


def test_staff_find_performance_records_in_the_admin(page, shot, django_user_model):
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())
    django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    log_in(page, "root", "root-password-1")
    page.goto("/admin/")
    page.get_by_role("link", name="Performance records").click()

    expect(page.locator("#result_list tbody tr")).to_have_count(50)
    page.get_by_role("link", name="Measured by a job").count()  # the source filter is offered
    page.locator("#searchbar").fill("lab-w-1g")
    page.locator("#searchbar").press("Enter")
    expect(page.locator("#result_list tbody tr").first).to_contain_text("lab-w-1g")
    shot("admin-records")


def test_the_admins_job_list_fits_a_1366_px_screen(page, shot, django_user_model, alice, bundle, digits):
    for _ in range(3):
        job = make_job(alice, bundle, digits)
    Job.objects.filter(pk=job.pk).update(state=Job.State.FAILED, finished_at=job.created_at)
    django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    page.set_viewport_size({"width": 1366, "height": 768})
    log_in(page, "root", "root-password-1")
    page.goto("/admin/fc2/job/")

    results = page.locator("#changelist .results")
    expect(results.locator("thead")).to_contain_text("Submitted")
    assert results.evaluate("e => e.scrollWidth <= e.clientWidth"), "no column clipped or scrolled away"
    expect(results.locator("tbody tr").first).to_contain_text(job.created_at.strftime("%Y-%m-%d"))
    shot("admin-jobs-1366")


def test_result_chips_show_counts_exactly_and_sum_up_long_lists(page, shot, alice, bundle, digits):
    job = make_job(alice, bundle, digits)
    losses = [round(2 / (i + 1), 4) for i in range(40)]
    metrics = {"test_accuracy": 0.9721, "train_examples": 1437, "losses": losses}
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, metrics=metrics, finished_at=job.created_at)
    Artifact.objects.create(job=job, name="model.keras", size_bytes=0, not_kept="over the 1 MB limit")
    log_in(page, "alice", "alice-password-1")
    page.goto(f"/jobs/{job.pk}/")

    chips = page.locator(".badge", has_text=":")
    expect(chips.filter(has_text="train_examples")).to_have_text("train_examples: 1437")
    expect(chips.filter(has_text="losses")).to_have_text("losses: 40 values, last 0.05 (0.05–2)")
    shot("result-chips")


def test_help_texts_read_as_written_in_the_wizard_and_the_admin(page, shot, django_user_model, alice, example_wheel):
    """No <distribution> swallowed as a tag, no markdown backticks shown as they are."""
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)

    workload_help = page.locator("#id_resource-workload_name_helptext, [id$=workload_name_helptext]").first
    expect(workload_help).to_contain_text("the wheel's distribution name, a colon and the dataset's name")
    assert "`" not in page.locator("main").inner_text()
    shot("wizard-help")

    uploaded = CodeBundle.objects.get(owner=alice)  # the wheel the wizard's Code step took
    job = make_job(alice, uploaded, Dataset.objects.get(name="digits"))
    django_user_model.objects.create_superuser("root", "root@example.com", "root-password-1")
    page.context.clear_cookies()
    log_in(page, "root", "root-password-1")
    page.goto(f"/admin/fc2/job/{job.pk}/change/")
    text = page.locator("#content").inner_text()
    assert "(empty: :)" not in text and "the wheel's distribution name, a colon and the dataset's name" in text
    shot("admin-help")


def test_the_lab_chooses_its_catalogue_and_a_cluster_of_no_type_says_why_it_is_free(page, shot, alice, example_wheel):
    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)
    # A local cluster of no type is this machine's: it costs nothing, as its bill will say, and the page says why.
    expect(page.locator("#plan-cost")).to_contain_text("$0/h this machine's own: choose a worker type")

    with redrawn(page):  # with the lab's own catalogue chosen: a worker type chosen before then is lost
        page.get_by_label("Lab (emulated cloud on this machine)").check()
    expect(page.get_by_label("Instance catalogue")).to_have_value("lab")
    expect(page.get_by_text("its machines are the lab catalogue's types")).to_be_visible()
    page.get_by_label("Worker type", exact=True).select_option("lab-w-1g")
    expect(page.locator("#plan-cost")).to_contain_text("/h")
    assert "$0/h" not in page.locator("#plan-cost").inner_text()
    shot("lab-priced")
    page.get_by_label("Resource configuration").select_option("scala-opt")
    expect(page.locator("#plan-cost")).to_contain_text("unknown until profiled")
    shot("scala-opt-before-profiling")


def test_a_running_local_jobs_figures_and_charts_say_the_real_reason(page, shot, alice, bundle, digits):
    """Local nodes share the machine's network: their network charts say so (not "needs two reports"); before training
    there is no idleness; while training, the epoch time and pace come from the progress lines; 24-hour axes."""
    start = timezone.now() - timedelta(seconds=30)
    job = Job.objects.create(
        owner=alice, bundle=bundle, dataset=digits, provider="local", state=Job.State.RUNNING, started_at=start
    )
    nodes = [
        Node.objects.create(job=job, name=name, role=name[:-2], index=0, instance_type="")
        for name in ("chief-0", "worker-0")
    ]
    for node in nodes:
        for second in range(0, 30, 3):
            at = start + timedelta(seconds=second)
            NodeSample.objects.create(node=node, at=at, measured_at=at, cpu_percent=40.0 + second, memory_mb=500.0)
    log_in(page, "alice", "alice-password-1")
    page.goto(f"/jobs/{job.pk}/")

    unmeasured = "Not measured on Local (this machine): its nodes share this machine's network"
    expect(page.locator("figure", has_text="Network in").get_by_text(unmeasured)).to_be_visible()
    expect(page.locator("#figure-idleness")).to_have_text("once training has begun")
    expect(page.locator("#figure-epoch-time")).to_have_text("after the chief's first progress lines")
    page.wait_for_function("Chart.getChart('chart-cpu')?.data.datasets[0]?.data.length > 0")
    labels = page.evaluate("Chart.getChart('chart-cpu').scales.x.ticks.map((t) => t.label).filter(Boolean)")
    assert labels and not any("AM" in label or "PM" in label for label in labels), labels
    shot("before-training")

    Job.objects.filter(pk=job.pk).update(steps=100, epochs=2)
    for step, second in ((10, 20), (30, 24)):
        at = start + timedelta(seconds=second)
        LossPoint.objects.create(node=nodes[0], step=step, loss=1 / step, at=at, printed_at=at)
    cache.clear()  # the live figures are kept a few seconds
    page.reload()
    expect(page.locator("#figure-epoch-time")).to_have_text("10 s so far")  # 50 steps an epoch at 5 steps/s
    expect(page.locator("#figure-throughput")).to_have_text("5 steps/s so far (no batch size asked)")
    expect(page.locator("#figure-idleness")).not_to_have_text("once training has begun")
    shot("training")


def test_the_wizards_panel_never_keeps_an_old_answer_when_the_new_one_fails(browser, live_server, alice, example_wheel):
    # A page of its own: htmx logs a failed request on the console, which the `page` fixture counts as a fault.
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)
    panel = page.locator("#recommendation")
    workers = page.get_by_role("spinbutton", name="Maximum number of workers")
    expect(panel).to_contain_text("2 workers")

    page.route("**/jobs/new/recommendation/**", lambda route: route.fulfill(status=429, body="slow down"))
    workers.fill("3")
    expect(panel).to_contain_text("No cluster shown. The platform could not answer for these fields (HTTP 429)")
    expect(panel).not_to_contain_text("2 workers")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "test_the_wizards_panel_never_keeps_an_old_answer--refused.png"))

    page.unroute("**/jobs/new/recommendation/**")
    page.route("**/jobs/new/recommendation/**", lambda route: route.abort())
    workers.fill("4")
    expect(panel).to_contain_text("The platform could not be reached")
    page.unroute("**/jobs/new/recommendation/**")
    workers.fill("2")
    expect(panel).to_contain_text("2 workers")
    context.close()


def test_operators_pages_say_what_is_measured_and_how_to_enable_the_lab(
    page, shot, admin_user, alice, bundle, digits, example_wheel, monkeypatch
):
    """The dashboard's cluster time for short jobs (not "0.0 cluster-hours"), an AWS catalogue without an ECU column
    of "variable", and a lab that cannot run here offered disabled with the one command that enables it."""
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())
    job = make_job(alice, bundle, digits)
    started = timezone.now() - timedelta(minutes=3, seconds=5)
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.SUCCEEDED, started_at=started, finished_at=started + timedelta(minutes=3, seconds=5)
    )
    log_in(page, "admin", "password")
    page.goto("/dashboard/")
    expect(page.get_by_text("3 min 05 s of cluster time")).to_be_visible()
    shot("dashboard-cluster-time")

    page.goto("/recommender/catalogs/?catalog=aws-us-east-1")
    expect(page.locator("table thead")).not_to_contain_text("ECU")
    expect(page.get_by_text("AWS no longer publishes EC2 compute units")).to_be_visible()
    assert "variable" not in page.locator("table").inner_text()
    shot("aws-catalogue")

    monkeypatch.setattr(labnet, "unavailable", lambda: "no OpenSSH server (/usr/sbin/sshd)")
    page.context.clear_cookies()
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)
    lab = page.get_by_label("Lab (emulated cloud on this machine)")
    expect(lab).to_be_disabled()
    expect(page.get_by_text("(make lab installs them)")).to_be_visible()
    shot("lab-disabled")
