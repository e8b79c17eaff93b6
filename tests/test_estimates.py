"""Estimates that hold: a whole job's cost is its cluster's $/h over launch → teardown — the provider's start-up and
teardown as this platform measured them (or its defaults, said so) plus epochs × epoch time — one function
(`pricing.estimate`) that the wizard and submit's budget check both call; an epoch time is no other strategy's, and a
missing one says why; Scala-Opt is refused where it can never answer (Local)."""

from __future__ import annotations

import datetime as dt
import io
import re
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

import provisioner
from fc2.models import Job, JobEvent
from fc2.services import jobs, planning, pricing
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests.conftest import make_job
from tests.helpers import Api, resource_form, step_url, through_data

State = Job.State
T0 = timezone.now() - dt.timedelta(days=1)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def fc2_2018(db):
    return load_catalog("fc2-2018")


def finished(job: Job, provider: str, start: float, startup_s: float, training_s: float, teardown_s: float) -> None:
    """Make `job` one that ran on `provider`: launched at `start`, its 10 epochs (of training_s / 10 each, as it
    measured them) done `startup_s` + `training_s` later (the chief's completion: the job goes to collecting), its
    cluster gone `teardown_s` after that."""
    trained = start + startup_s + training_s
    Job.objects.filter(pk=job.pk).update(
        provider=provider, state=State.SUCCEEDED, launched_at=at(start), started_at=at(start + startup_s / 2),
        finished_at=at(trained + 1), torn_down_at=at(trained + teardown_s), epochs=10,
        figures={"epoch_time_s": training_s / 10},
    )  # fmt: skip
    JobEvent.objects.create(job=job, at=at(trained), state=State.COLLECTING, message="the chief finished training")


@pytest.mark.parametrize("provider", list(provisioner.PROVIDERS))
def test_before_any_job_ran_the_overheads_are_the_providers_stated_defaults(db, provider):
    taken = pricing.overheads(provider)

    assert (taken.startup_s, taken.teardown_s) == (
        pricing.DEFAULT_STARTUP_S[provider],
        provisioner.get(provider).teardown_s,
    )
    assert (taken.startups, taken.teardowns) == (0, 0)
    assert taken.source == f"start-up and teardown: the {provider} provider's defaults, until a job of it has run here"


def test_the_overheads_are_the_medians_of_the_providers_finished_jobs(alice, bundle, digits):
    # (start-up, training, teardown) s of three lab jobs; the slow start-up and teardown move no median.
    for number, (startup, training, teardown) in enumerate([(40, 15, 4), (55, 20, 6), (400, 10, 90)]):
        finished(make_job(alice, bundle, digits), "lab", number * 1000, startup, training, teardown)
    finished(make_job(alice, bundle, digits), "aws", 5000, 300, 10, 100)  # another provider's
    failed = make_job(alice, bundle, digits)  # failed while provisioning: no training; its teardown from its end
    Job.objects.filter(pk=failed.pk).update(
        provider="lab", state=State.FAILED, launched_at=at(6000), finished_at=at(6010), torn_down_at=at(6015)
    )

    taken = pricing.overheads("lab")

    assert (taken.startup_s, taken.startups) == (55.0, 3)
    assert (taken.teardown_s, taken.teardowns) == (5.5, 4)  # of 4, 5 (the failed job), 6 and 90
    assert taken.source == (
        "start-up: the median of this platform's latest 3 lab jobs; teardown: the median of this platform's latest 4 "
        "lab jobs"
    )
    assert pricing.teardown_s("lab") == 5.5  # what the budget watchdog looks ahead by, too


def test_only_the_latest_jobs_count(alice, bundle, digits):
    for number in range(pricing.OVERHEADS_MEASURED + 5):
        startup = 500 if number < 5 else 60  # the 5 oldest were slow
        finished(make_job(alice, bundle, digits), "lab", number * 1000, startup, 10, 3)

    taken = pricing.overheads("lab")

    assert (taken.startup_s, taken.startups, taken.teardowns) == (60.0, 20, 20)
    assert taken.source == "start-up and teardown: the medians of this platform's latest 20 lab jobs"


# $/h, epoch time s, epochs → None, or $ with the local defaults (15 s start-up, 1 s teardown).
ESTIMATES = [
    (Decimal("0.587"), 1.48, 10, Decimal("0.587") * Decimal("30.8") / 3600),
    (Decimal("1.511"), 360.0, 10, Decimal("1.511") * 3616 / 3600),
    (Decimal("0"), 360.0, 10, Decimal("0")),  # a local cluster of no types spends nothing
    (None, 360.0, 10, None),
    (Decimal("1.511"), None, 10, None),
    (Decimal("1.511"), 360.0, None, None),
]


@pytest.mark.parametrize("hourly, epoch_time_s, epochs, total", ESTIMATES)
def test_the_estimate_is_the_hourly_cost_from_launch_to_teardown(db, hourly, epoch_time_s, epochs, total):
    estimate = pricing.estimate(hourly, epoch_time_s, epochs, "local")

    assert (estimate.total if estimate else None) == total
    if estimate:
        assert estimate.basis == (
            f"Billed from launch to teardown: 15 s start-up + {epoch_time_s * epochs:.0f} s training + 1 s teardown "
            "(start-up and teardown: the local provider's defaults, until a job of it has run here)."
        )


def test_the_issue_s_lab_job_is_estimated_within_what_it_cost(alice, bundle, digits, fc2_2018):
    """The issue: a lab job of 10 epochs of 1.48 s on $0.587/h was estimated at $0.00241 and cost $0.0138 to $0.0237,
    billed from launch to teardown. With the lab's start-ups and teardowns measured here, the estimate is the
    median job's cost."""
    for number, (startup, teardown) in enumerate([(65, 4), (110, 8), (80, 5)]):
        finished(make_job(alice, bundle, digits), "lab", number * 1000, startup, 14.8, teardown)
    costs = sorted(float(Decimal("0.587")) * (s + 14.8 + t) / 3600 for s, t in [(65, 4), (110, 8), (80, 5)])

    estimate = pricing.estimate(Decimal("0.587"), 1.48, 10, "lab")

    assert costs[0] <= float(estimate.total) <= costs[-1]
    assert float(estimate.total) == pytest.approx(0.587 * (80 + 14.8 + 5) / 3600)


def cost_opt(**fields) -> dict:
    """FC² §8.1's Cost-Opt cluster: 6 c4.xlarge and an m4.large PS, $1.511/h."""
    return resource_form(algorithm="cost-opt", catalog="fc2-2018", ps_type="m4.large",
                         worker_types=["m4.xlarge", "t2.xlarge", "c4.xlarge"], max_workers="6", **fields)  # fmt: skip


def test_the_wizard_and_submit_s_budget_check_give_the_one_estimate(client, alice, bundle, digits, fc2_2018):
    for number in range(3):
        finished(make_job(alice, bundle, digits), "local", number * 1000, 20 + number, 10, 2)
    PerformanceRecord.objects.create(
        workload=f"{bundle.distribution}:digits", instance_type="c4.xlarge", ps_type="m4.large", workers=6,
        epoch_time_s=360.0, strategy="ps",
    )  # fmt: skip
    expected = Decimal("1.511") * (21 + 3600 + 2) / 3600  # $1.5207
    client.force_login(alice)
    through_data(client, bundle, params=[("epochs", "10")])

    shown = client.get(reverse("job-new-recommendation"), cost_opt()).content.decode()
    refused = client.post(step_url("resource"), cost_opt(total_budget="1.52"))
    with pytest.raises(jobs.SubmitError) as not_submitted:
        make_job(alice, bundle, digits, parameters={"epochs": "10"}, algorithm="cost-opt", catalog="fc2-2018",
                 ps_type="m4.large", worker_types=["c4.xlarge"], workers=6, total_budget=Decimal("1.52"))  # fmt: skip

    assert re.search(r'id="plan-total-cost">≈ \$1.52 <span[^>]*>for 10 epochs, start-up and teardown included', shown)
    basis = (
        "Billed from launch to teardown: 21 s start-up + 3600 s training + 2 s teardown (start-up and teardown: the "
        "medians of this platform's latest 3 local jobs)."
    )
    assert escape(basis) in shown
    assert refused.context["form"].errors["total_budget"] == [
        f"the cluster's projected total cost, $1.52 for 10 epochs, exceeds the job's total budget of $1.52. {basis}"
    ]
    assert str(not_submitted.value).endswith(basis)
    assert pricing.estimate(Decimal("1.511"), 360.0, 10, "local").total == expected > Decimal("1.52")
    assert client.post(step_url("resource"), cost_opt(total_budget="1.53")).status_code == 302


def test_a_plan_with_no_epoch_time_says_why(client, alice, bundle, digits, fc2_2018):
    """A re-run of a local job: nothing is measured of a local cluster, and the job's own run will measure it."""
    client.force_login(alice)
    through_data(client, bundle)

    local = client.get(reverse("job-new-recommendation"), cost_opt()).content.decode()
    plan = planning.plan(jobs.JobRequest(bundle=bundle, dataset=digits, algorithm="cost-opt", catalog="fc2-2018",
                                     provider="aws", worker_types=["c4.xlarge"], workers=2))  # fmt: skip

    assert "not known yet" in local
    assert escape("— a local cluster is no instance type, so no performance record describes it — the job's own run "
                  "will measure this machine") in local  # fmt: skip
    assert "cannot be estimated until the epoch time is known" in local
    assert plan.epoch_time_note == (
        f"no run of {bundle.distribution}:digits on this cluster yet — the job's own run will measure it"
    )


# --- Scala-Opt where it can never answer -----------------------------------------------------------------------------

LOCAL_REASON = (
    "Scala-Opt sizes the cluster by its parameter server's network link, and Local (this machine)'s nodes share the "
    "machine's network, with no link of their own to size by or to measure a worker's bandwidth on: choose Manual, "
    "Cost-Opt, Time-Opt or the model for a local job, or run it on the lab or AWS"
)


@pytest.mark.parametrize("algorithm", ["scala-opt", "scala-opt-m"])
def test_scala_opt_on_local_is_disabled_in_the_wizard_with_its_reason(client, alice, bundle, fc2_2018, algorithm):
    client.force_login(alice)
    through_data(client, bundle)

    page = client.get(step_url("resource")).content.decode()
    posted = client.post(step_url("resource"), {**cost_opt(), "algorithm": algorithm, "worker_type": "c4.xlarge"})

    assert re.search(rf'<option value="{algorithm}"[^>]*\bdisabled\b', page)
    assert f"<strong>Scala-Opt</strong> cannot answer: {escape(LOCAL_REASON)}." in page
    assert posted.status_code == 400 and posted.context["form"].errors["algorithm"] == [f"{LOCAL_REASON}."]


def test_scala_opt_on_local_is_refused_by_the_api_and_the_cli(client, alice, bundle, digits, example_wheel, fc2_2018):
    api = Api(client, alice)

    answered = api.post("/api/jobs", {"bundle": bundle.pk, "dataset": "digits", "algorithm": "scala-opt",
                                      "catalog": "fc2-2018", "workers": 2})  # fmt: skip
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice",
                     "--provider", "local", "--algorithm", "scala-opt", stdout=io.StringIO(), stderr=err)  # fmt: skip

    assert answered.status_code == 400 and LOCAL_REASON in answered.json()["fields"]["algorithm"][0]
    assert exited.value.code != 0 and LOCAL_REASON in err.getvalue()
    assert not Job.objects.filter(algorithm="scala-opt").exists()
