"""Costs and the whole-job budget: the cost so far billed from the cluster's launch to its teardown, the projected
total, the budget refused at submit when the plan already exceeds it, and the watchdog (the sweep) stopping a real
local cluster whose cost would cross its budget. The wizard's budget is in test_wizard.py, the CLI's refusals in
test_cli_contract.py."""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

import provisioner
from fc2.celery import app as celery_app
from fc2.models import Job, Node
from fc2.services import inline, jobs, pipeline, pricing, sweep
from fc2.services.bundles import store_bundle
from harness.ec2lab import NOTHING, REGION, everything_tagged
from harness.wheels import sleeper_wheel
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests.conftest import call_json, cluster_processes, make_job

State = Job.State
T0 = dt.datetime(2026, 11, 3, 10, 0, tzinfo=dt.UTC)
CPU = ["m4.xlarge", "t2.xlarge", "c4.xlarge", "c4.8xlarge"]


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def now_is(seconds: float):
    return mock.patch("django.utils.timezone.now", return_value=at(seconds))


# --- cost so far: every node, billed per second from the launch to the end of the teardown ---


# Seconds after T0 (None: not yet), the job's state, its $/h, the time it is looked at, and its cost so far then.
BILLING = [
    # launched  started  finished  torn down  state               $/h     now     cost
    (None,      None,    None,     None,      State.QUEUED,       "3.6",  600,    None),  # never launched
    (0,         None,    None,     None,      State.PROVISIONING, None,   600,    None),  # never priced
    (0,         None,    None,     None,      State.PROVISIONING, "3.6",  1800,   1.8),  # billed while it launches
    (0,         600,     None,     None,      State.RUNNING,      "3.6",  3600,   3.6),  # from the launch, not the run
    (0,         600,     3000,     3600,      State.SUCCEEDED,    "3.6",  99999,  3.6),  # until the teardown ended
    (0,         600,     1800,     None,      State.FAILED,       "3.6",  3600,   3.6),  # ended, still being torn down
    (0,         None,    300,      360,       State.FAILED,       "3.6",  3600,   0.36),  # failed before it ran
    (0,         None,    1,        1,         State.CANCELLED,    "3600", 60,     1.0),  # per second
]  # fmt: skip


@pytest.mark.parametrize(("launched", "started", "finished", "torn_down", "state", "hourly", "now", "cost"), BILLING)
def test_cost_so_far_is_billed_from_the_launch_to_the_teardown(
    launched, started, finished, torn_down, state, hourly, now, cost
):
    job = Job(
        state=state, hourly_cost=Decimal(hourly) if hourly else None, created_at=at(-60),
        **{name: at(s) if s is not None else None for name, s in (
            ("launched_at", launched), ("started_at", started), ("finished_at", finished), ("torn_down_at", torn_down)
        )},
    )  # fmt: skip

    with now_is(now):
        assert job.cost_so_far == (pytest.approx(cost) if cost is not None else None)


def test_spend_in_a_window_counts_the_part_of_the_clusters_life_inside_it(db, alice, bundle, digits):
    job = make_job(alice, bundle, digits)
    Job.objects.filter(pk=job.pk).update(hourly_cost=Decimal("2"), launched_at=at(0), torn_down_at=at(7200))

    assert Job.objects.spend_between(at(3600), at(99_999)) == pytest.approx(2.0)
    assert Job.objects.ran_between(at(7200), at(99_999)).count() == 0


# --- projected total: the cost so far and the training still to come, never past the time limit ---


@pytest.mark.parametrize(
    ("fields", "projection"),
    [
        pytest.param({"hourly_cost": None}, None, id="unpriced"),
        pytest.param(  # 50 s/epoch × 4 epochs, half done: 100 s to come
            {"recommendation": {"predicted_epoch_time_s": 50.0}, "epochs": 4, "epoch": 2}, (0.2, "prediction"),
            id="prediction",
        ),
        pytest.param(  # before the chief reports: the epochs asked for
            {"recommendation": {"predicted_epoch_time_s": 50.0}, "parameters": {"epochs": "3"}}, (0.25, "prediction"),
            id="prediction-before-progress",
        ),
        pytest.param({"step": 25, "steps": 100}, (0.4, "pace"), id="pace"),  # 100 s for a quarter: 300 s to come
        pytest.param({}, (1.0, "time limit"), id="nothing-known"),  # 900 s left of the 1000 s limit
        pytest.param(
            {"recommendation": {"predicted_epoch_time_s": 1000.0}, "epochs": 4, "epoch": 0}, (1.0, "time limit"),
            id="prediction-past-the-limit",
        ),
        pytest.param({"state": State.SUCCEEDED, "torn_down_at": at(150)}, (0.15, "ended"), id="ended"),
    ],
)  # fmt: skip
def test_projected_total(fields, projection, settings):
    settings.FC2_JOB_TIMEOUT_S = 1000
    defaults = {"state": State.RUNNING, "hourly_cost": Decimal("3.6"), "created_at": at(-60), "launched_at": at(0)}
    job = Job(**{**defaults, "started_at": at(0), **fields})

    with now_is(100):  # cost so far: $0.10
        got = job.projection()

    if projection is None:
        assert got is None
    else:
        assert (pytest.approx(got.total), got.basis) == projection


def test_the_job_page_and_its_json_show_the_cost_the_projection_and_the_budget(client, alice, bundle, digits):
    job = make_job(alice, bundle, digits, total_budget=Decimal("2"))
    Job.objects.filter(pk=job.pk).update(
        state=State.RUNNING, hourly_cost=Decimal("3.6"), launched_at=at(0), started_at=at(0), step=25, steps=100
    )
    client.force_login(alice)

    with now_is(100):
        page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
        cost = client.get(reverse("job-series", args=[job.pk])).json()["cost"]

    assert '<strong id="cost-so-far">≈ $0.10</strong>' in page
    assert "≈ $0.10 of $2.00 for the whole job (5 %) · stopped before it would exceed it" in page
    assert "Projected total <strong>≈ $0.401</strong>" in page and "at the pace of the training so far" in page
    assert "with the start-up and teardown still to come" in page
    assert "every node billed per second from its launch to its teardown" in page
    assert cost == {
        "hourly_cost": 3.6,
        "budget": None,
        "total_budget": 2.0,
        "cost_so_far": 0.1,
        "projected_total": 0.401,
        "projected_by": "pace",
        "launched_at": at(0).isoformat(),
        "torn_down_at": None,
    }  # fmt: skip  (0.401: the local provider's 1 s of teardown still to come)


@pytest.mark.parametrize(
    ("fields", "total"),
    [
        pytest.param(  # not launched: 130 s of start-up, 2 × 50 s of training, 10 s of teardown, at $3.6/h
            {"state": State.QUEUED, "launched_at": None, "started_at": None}, 0.24, id="queued: the estimate",
        ),
        pytest.param({}, 0.1 + 0.14, id="launched 100 s ago, no progress yet: 30 s of start-up left"),
        pytest.param({"epochs": 2, "epoch": 1}, 0.1 + 0.06, id="training: the start-up is over"),
    ],
)  # fmt: skip
def test_the_projection_counts_the_start_up_and_teardown_still_to_come(fields, total, settings):
    """A job's projected total is its estimate before it ran (pricing.estimate's overheads), then the cost so far
    and what is still to be billed."""
    defaults = {"state": State.RUNNING, "hourly_cost": Decimal("3.6"), "created_at": at(-60), "launched_at": at(0)}
    defaults |= {"started_at": at(0), "recommendation": {"predicted_epoch_time_s": 50.0}, "parameters": {"epochs": "2"}}
    job = Job(**{**defaults, **fields})

    with now_is(100):
        got = job.projection(startup_s=130.0, teardown_s=10.0)

    assert (pytest.approx(got.total), got.basis) == (total, "prediction")


# --- submitting with a whole-job budget ---


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        (Decimal("0"), "a job's total budget must be more than $0 (not 0)"),
        (Decimal("-5"), "a job's total budget must be more than $0 (not -5)"),
        (Decimal("NaN"), "a job's total budget must be more than $0 (not NaN)"),
        (Decimal("0.00001"), "a job's total budget of $0.00001: Ensure that there are no more than 4 decimal places."),
    ],
)
def test_a_budget_that_is_no_amount_is_refused(alice, bundle, digits, budget, reason):
    with pytest.raises(jobs.SubmitError) as refused:
        make_job(alice, bundle, digits, total_budget=budget)

    assert (str(refused.value), refused.value.field) == (reason, "total_budget")
    assert not Job.objects.exists()


@pytest.fixture
def measured(db, bundle):
    """FC² §8.1's Cost-Opt cluster (6 × c4.xlarge + an m4.large PS, $1.511/h) with a measured epoch time of 360 s."""
    load_catalog("fc2-2018")
    PerformanceRecord.objects.create(
        workload=f"{bundle.distribution}:digits", instance_type="c4.xlarge", ps_type="m4.large", workers=6,
        epoch_time_s=360.0,
    )  # fmt: skip
    return {"algorithm": "cost-opt", "catalog": "fc2-2018", "ps_type": "m4.large", "worker_types": CPU, "workers": 6}


def test_submit_is_refused_when_the_plan_already_exceeds_the_budget(alice, bundle, digits, measured):
    # $1.511/h × (15 s start-up + 360 s × 10 + 1 s teardown, the local provider's defaults) = $1.518.
    cluster = {**measured, "parameters": {"epochs": "10"}}

    with pytest.raises(jobs.SubmitError) as refused:
        make_job(alice, bundle, digits, total_budget=Decimal("1.50"), **cluster)

    assert refused.value.field == "total_budget"
    assert (
        str(refused.value)
        == "the cluster's projected total cost, $1.52 for 10 epochs, exceeds the job's total budget of $1.50. Billed "
        "from launch to teardown: 15 s start-up + 3600 s training + 1 s teardown (start-up and teardown: the local "
        "provider's defaults, until a job of it has run here)."
    )
    assert not Job.objects.exists()
    assert make_job(alice, bundle, digits, total_budget=Decimal("1.53"), **cluster).total_budget == Decimal("1.53")


def test_submit_job_takes_a_budget_for_the_whole_job_and_shows_it(alice, example_wheel):
    args = ("--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice", "--total-budget", "2.50")
    code, result, _ = call_json("submit_job", *args)
    err = StringIO()
    call_command("submit_job", *args, stdout=StringIO(), stderr=err)

    assert code == 0 and result["cost"]["total_budget"] == 2.5 and result["cost"]["cost_so_far"] is None
    assert result["cost"]["budget"] is None
    assert Job.objects.get(pk=result["id"]).total_budget == Decimal("2.5")
    assert err.getvalue().endswith("budget $2.50 for the whole job\n")


def test_submit_jobs_old_budget_total_still_works_and_says_it_is_deprecated(alice, example_wheel):
    args = ("--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice", "--budget-total", "2.50")
    err = StringIO()
    call_command("submit_job", *args, stdout=StringIO(), stderr=err)

    assert Job.objects.get().total_budget == Decimal("2.5")
    assert err.getvalue().startswith("warning: --budget-total is deprecated: use --total-budget\n")
    code, _, error = call_json("submit_job", *args, "--total-budget", "3")
    assert code != 0 and "--budget-total is the deprecated name of --total-budget" in error


# --- the watchdog: the sweep stops a job whose cost would cross its budget before the next sweep ---


@pytest.fixture
def sent():
    """Tasks are sent at once instead of on commit, to nowhere (no worker runs here); their names are kept."""
    names: list[str] = []
    with (
        mock.patch.object(celery_app, "send_task", lambda name, **kwargs: names.append(name)),
        mock.patch.object(transaction, "on_commit", lambda func, *args, **kwargs: func()),
    ):
        yield names


@pytest.mark.parametrize(
    ("budget", "state"),
    [("0.05", State.FAILED), ("0.06", State.PROVISIONING)],  # 46 s at $3.6/h is $0.046; with the next 5 s, $0.051
)
def test_a_step_still_held_by_its_runner_is_stopped_when_its_cluster_would_cross_the_budget(
    job, settings, budget, state
):
    """A launch that hangs renews its lease forever: its job is stopped by the sweep all the same (and released by the
    runner when its step ends)."""
    settings.FC2_SWEEP_INTERVAL_S = 5
    Job.objects.filter(pk=job.pk).update(
        state=State.PROVISIONING, hourly_cost=Decimal("3.6"), total_budget=Decimal(budget),
        launched_at=timezone.now() - dt.timedelta(seconds=46), lease_until=timezone.now() + dt.timedelta(seconds=20),
    )  # fmt: skip

    sweep.sweep()

    job.refresh_from_db()
    assert job.state == state
    if state == State.FAILED:
        assert job.failure_reason.startswith(
            "stopped: the job's cost would exceed its budget of $0.05 (cost so far $0.046"
        ), job.failure_reason


def test_the_watchdog_looks_ahead_by_what_the_providers_teardowns_take(job, settings):
    """A cluster costs until its teardown has ended: the job is stopped that much earlier — the median of the
    provider's latest teardowns here, or the provider's own figure before any was measured."""
    settings.FC2_SWEEP_INTERVAL_S = 5
    assert pricing.teardown_s("aws") == provisioner.get("aws").teardown_s == 90.0
    for number, taken in enumerate([30, 40, 200]):
        ended = make_job(job.owner, job.bundle, job.dataset)
        Job.objects.filter(pk=ended.pk).update(
            provider="aws", state=State.SUCCEEDED, finished_at=at(number * 1000), torn_down_at=at(number * 1000 + taken)
        )
    assert pricing.teardown_s("aws") == 40.0
    assert pricing.teardown_s("lab") == 3.0

    # $3.6/h is $0.001 a second: $0.046 spent; the next look in 5 s, a teardown of 40 s: $0.091 by its end.
    Job.objects.filter(pk=job.pk).update(
        provider="aws", state=State.RUNNING, hourly_cost=Decimal("3.6"), total_budget=Decimal("0.09"),
        launched_at=timezone.now() - dt.timedelta(seconds=46), started_at=timezone.now(),
    )  # fmt: skip
    job.refresh_from_db()
    assert sweep._limit_crossed(job).startswith("stopped: the job's cost would exceed its budget of $0.09")
    Job.objects.filter(pk=job.pk).update(total_budget=Decimal("0.095"))
    job.refresh_from_db()
    assert sweep._limit_crossed(job) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("provider", ["local", pytest.param("aws", marks=pytest.mark.heavy)])  # aws: the lab's network
def test_a_running_job_about_to_exceed_its_budget_is_stopped_and_its_cluster_torn_down(
    provider, alice, digits, tmp_path, sent, request
):
    """On aws: moto's EC2, its instances as lab hosts (harness/ec2lab.py); the instances are terminated."""
    region = ""
    if provider == "aws":
        request.getfixturevalue("ec2_hosts")
        region = REGION
    load_catalog("fc2-2018")
    with sleeper_wheel(tmp_path).open("rb") as wheel:
        bundle = store_bundle(alice, wheel, "demo-1.0-py3-none-any.whl")
    job = make_job(
        alice, bundle, digits, provider=provider, region=region, strategy="mirrored", workers=2,
        worker_type="c4.xlarge", catalog="fc2-2018", total_budget=Decimal("1"),
    )  # fmt: skip
    with inline.report_server() as url:
        for step in ("recommend", "provision", "bootstrap"):
            assert pipeline.run_step(step, job.pk, report_url=url), Job.objects.get(pk=job.pk).failure_reason
        # A running job driven by the workers: nobody holds it between its nodes' reports, the sweep watches it.
        Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY, lease_until=None)
        deadline = time.monotonic() + 60
        while Node.objects.filter(job=job, status=Node.Status.RUNNING).count() < 2:
            assert time.monotonic() < deadline, "the nodes never reported running"
            time.sleep(0.2)

        sweep.sweep()  # $0.462/h for a few seconds: far under $1

        job.refresh_from_db()
        assert job.state == State.RUNNING and len(cluster_processes()) >= 2

        # $0.462/h × 5 s = $0.00064 to the next sweep
        Job.objects.filter(pk=job.pk).update(total_budget=Decimal("0.0001"))
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.FAILED
    reason = job.failure_reason
    assert reason.startswith("stopped: the job's cost would exceed its budget of $0.0001 (cost so far $0.00"), reason
    assert job.events.filter(state=State.FAILED, message=reason).exists()
    assert job.cluster is None and job.cluster_name not in provisioner.list_clusters(provider, region)
    if provider == "aws":
        assert everything_tagged(job.cluster_name) == NOTHING
        # The instances are terminated; their hosts go when the emulated hypervisor next looks (every 0.2 s).
        deadline = time.monotonic() + 15
        while cluster_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert cluster_processes() == []
    assert job.events.last().message == f"cluster {job.cluster_name} torn down"
    # Billed from the launch (before the run started) to the end of the teardown (after the job ended), then no more.
    assert job.launched_at < job.started_at < job.finished_at < job.torn_down_at
    billed = (job.torn_down_at - job.launched_at).total_seconds()
    assert job.cost_so_far == pytest.approx(0.462 * billed / 3600)
    time.sleep(0.1)
    assert Job.objects.get(pk=job.pk).cost_so_far == job.cost_so_far
