"""Managed jobs at every door (issue 45): `max_restarts` and spot asked through the API, the wizard, `submit_job` and
the `fc2` client, bad values refused with the reason; and spot on aws against moto's EC2 — the request's market
options and shutdown behaviour as EC2 keeps them, spot without capacity falling back as the job chose, the region's
spot price history priced beside on-demand, lost nodes replaced with only the shortfall made — nothing left behind."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from botocore.exceptions import ClientError
from django.utils import timezone

from client.fc2_client import cli
from common import awsapi
from fc2.models import Job
from fc2.services import dashboard, jobs, pipeline, planning, sweep
from fc2.services import pricing as costs
from fc2.services.requests import JobRequest
from harness.ec2lab import NOTHING, REGION, ec2, everything_tagged, live_instances
from provisioner import ClusterSpec, aws
from provisioner.errors import CapacityError
from recommender import pricing
from recommender.catalog import load_catalog
from tests.conftest import call_json
from tests.helpers import Api

JOBS = "/api/jobs"


@pytest.fixture
def api(client, alice) -> Api:
    return Api(client, alice)


# --- the doors ------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_takes_restarts_and_keeps_them_on_the_job_and_its_request(api, bundle, digits):
    body = {"bundle": bundle.pk, "dataset": "digits", "parameters": {"epochs": "1"}, "max_restarts": 3}
    response = api.post(JOBS, body)
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["max_restarts"] == 3 and job["restarts"] == [] and job["spot"] is False
    assert job["request"]["max_restarts"] == 3 and job["request"]["spot_fallback"] == "on-demand"
    assert JobRequest.of(Job.objects.get(pk=job["id"])).max_restarts == 3  # what a re-run submits again


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("asked", "field", "said"),
    [
        ({"max_restarts": -1}, "max_restarts", "greater than or equal to 0"),
        ({"max_restarts": jobs.MAX_RESTARTS + 1}, "max_restarts", f"less than or equal to {jobs.MAX_RESTARTS}"),
        ({"spot": True}, "spot", "the local provider has none"),
        ({"spot_max_price": "0.5"}, "spot_max_price", "it needs spot"),
        ({"spot_fallback": "later"}, "spot_fallback", "is not a valid choice"),
    ],
)
def test_the_api_refuses_bad_managed_values_with_the_reason(api, bundle, digits, asked, field, said):
    response = api.post(JOBS, {"bundle": bundle.pk, "dataset": "digits", **asked})
    assert response.status_code == 400, response.json()
    assert said in " ".join(response.json()["fields"][field]), response.json()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_service_refuses_spot_off_aws_and_a_price_of_nothing(alice, bundle, digits):
    for asked, field in (
        ({"provider": "local", "spot": True}, "spot"),
        ({"provider": "aws", "spot": True, "spot_max_price": Decimal(0)}, "spot_max_price"),
        ({"max_restarts": True}, "max_restarts"),
    ):
        request = JobRequest(bundle=bundle, dataset=digits, **asked)
        with pytest.raises(jobs.SubmitError) as refused:
            jobs.check_managed(request)
        assert refused.value.field == field


@pytest.mark.django_db
def test_submit_job_takes_the_flags_and_refuses_spot_on_the_lab_or_local(alice, example_wheel):
    code, result, _ = call_json(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice",
        "--max-restarts", "2", "--json",
    )  # fmt: skip
    assert code == 0, result
    job = Job.objects.get(pk=result["id"])
    assert job.max_restarts == 2 and not job.spot
    code, result, _ = call_json(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice", "--spot", "--json"
    )
    assert code != 0 and "spot instances are an aws provider's" in result["error"]


def test_the_clients_submit_sends_the_managed_fields():
    parser = cli.build_parser()
    args = parser.parse_args(
        ["submit", "w.whl", "--dataset", "digits", "--max-restarts", "2", "--spot", "--spot-max-price", "0.1"]
        + ["--spot-fallback", "wait", "--provider", "aws"]
    )
    payload = cli.job_payload(args, bundle=1, dataset="digits")
    assert payload["max_restarts"] == 2 and payload["spot"] is True
    assert payload["spot_max_price"] == 0.1 and payload["spot_fallback"] == "wait"
    plain = cli.job_payload(parser.parse_args(["submit", "w.whl", "--dataset", "d"]), bundle=1, dataset="d")
    assert not {"max_restarts", "spot", "spot_max_price", "spot_fallback"} & set(plain)
    with pytest.raises(cli.UsageError, match="--spot-fallback: invalid choice"):
        parser.parse_args(["submit", "w.whl", "--dataset", "d", "--spot-fallback", "never"])


@pytest.mark.django_db
def test_the_wizard_form_refuses_spot_off_aws(alice):
    from fc2.wizard.forms import ResourceForm

    data = {"provider": "local", "strategy": "ps", "algorithm": "manual", "limit": "workers", "max_workers": "1"}
    form = ResourceForm({**data, "spot": "on", "max_restarts": "1"}, user=alice)
    assert not form.is_valid() and "Spot instances are AWS's" in form.errors["spot"][0]
    form = ResourceForm({**data, "max_restarts": "-1"}, user=alice)
    assert not form.is_valid() and "max_restarts" in form.errors


# --- spot on aws (moto) ---------------------------------------------------------------------------------------------


def spec(name: str, **more) -> ClusterSpec:
    return ClusterSpec(name, "aws", "mirrored", 2, worker_type="c4.xlarge", **more)


class RunInstances:
    """Every RunInstances as sent (and every operation's name), at the adaptor's boundary; with `refuse`, EC2's
    answer to a spot request it cannot fill (`SpotMaxPriceTooLow`) in every zone."""

    def __init__(self, monkeypatch, refuse: str = ""):
        self.sent: list[dict] = []
        self.operations: list[str] = []
        send = awsapi._send

        def answer(service, region, operation, params):
            self.operations.append(operation)
            if operation == "run_instances":
                self.sent.append(params)
                if refuse and "InstanceMarketOptions" in params:
                    raise ClientError(
                        {"Error": {"Code": refuse, "Message": "your max price is too low"}}, "RunInstances"
                    )
            return send(service, region, operation, params)

        monkeypatch.setattr(awsapi, "_send", answer)


def shutdown_behaviour(instance_id: str) -> str:
    answer = ec2().describe_instance_attribute(InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")
    return answer["InstanceInitiatedShutdownBehavior"]["Value"]


def test_a_spot_cluster_asks_one_time_spot_at_its_max_price_and_every_node_terminates_on_shutdown(aws_env, monkeypatch):
    calls = RunInstances(monkeypatch)
    cluster = aws.launch(spec("fc2-41-0000000a", spot=True, spot_max_price=0.05))
    instances = live_instances("fc2-41-0000000a")
    assert len(instances) == 2 and {i.get("InstanceLifecycle") for i in instances} == {"spot"}
    assert {shutdown_behaviour(n.instance_id) for n in cluster.nodes} == {"terminate"}
    market = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time", "MaxPrice": "0.0500"}}
    market["SpotOptions"]["InstanceInterruptionBehavior"] = "terminate"
    assert [c["InstanceMarketOptions"] for c in calls.sent] == [market, market]

    on_demand = aws.launch(spec("fc2-42-0000000b"))
    assert {i.get("InstanceLifecycle") for i in live_instances("fc2-42-0000000b")} == {None}
    assert {shutdown_behaviour(n.instance_id) for n in on_demand.nodes} == {"terminate"}  # on-demand too
    for name in ("fc2-41-0000000a", "fc2-42-0000000b"):
        aws.teardown(name, REGION)
        assert everything_tagged(name) == NOTHING


def test_spot_ec2_cannot_fill_in_any_zone_is_a_capacity_error_with_nothing_left(aws_env, monkeypatch):
    RunInstances(monkeypatch, refuse="SpotMaxPriceTooLow")
    with pytest.raises(CapacityError, match="no capacity for c4.xlarge in any zone"):
        aws.launch(spec("fc2-43-0000000c", spot=True, spot_max_price=0.0001))
    assert everything_tagged("fc2-43-0000000c") == NOTHING


def spot_job(job: Job, fallback: str) -> Job:
    load_catalog("fc2-2018")
    Job.objects.filter(pk=job.pk).update(
        provider="aws", region=REGION, catalog="fc2-2018", state=Job.State.RECOMMENDING, strategy="mirrored",
        workers=1, worker_type="c4.xlarge", spot=True, spot_max_price=Decimal("0.0001"), spot_fallback=fallback,
    )  # fmt: skip
    job.refresh_from_db()
    return job


@pytest.mark.django_db
def test_spot_without_capacity_falls_back_to_on_demand_when_the_job_chose_so(aws_env, monkeypatch, job):
    calls = RunInstances(monkeypatch, refuse="InsufficientInstanceCapacity")
    job = spot_job(job, Job.SpotFallback.ON_DEMAND)
    assert pipeline.run_step("provision", job.pk)
    job.refresh_from_db()
    timeline = [e.message for e in job.events.all()]
    assert any(m.startswith("spot prices: c4.xlarge spot $0.0000/h") and "expected saving" in m for m in timeline)
    assert any("on-demand instances instead (spot_fallback on-demand)" in m for m in timeline)
    assert "InstanceMarketOptions" not in calls.sent[-1]
    assert {i.get("InstanceLifecycle") for i in live_instances(job.cluster_name)} == {None}
    aws.teardown(job.cluster_name, REGION)


@pytest.mark.django_db
def test_spot_without_capacity_waits_when_the_job_chose_so_with_nothing_left_meanwhile(aws_env, monkeypatch, job):
    RunInstances(monkeypatch, refuse="InsufficientInstanceCapacity")
    job = spot_job(job, Job.SpotFallback.WAIT)
    with pytest.raises(pipeline.TryAgain) as again:
        pipeline.run_step("provision", job.pk, attempt=7)  # past FC2_STEP_ATTEMPTS: waiting has no limit
    assert again.value.waits and again.value.delay_s == 30
    job.refresh_from_db()
    assert job.state == Job.State.PROVISIONING
    assert everything_tagged(job.cluster_name) == NOTHING


def test_the_spot_price_history_prices_spot_beside_on_demand(aws_env):
    (quote,) = pricing.fetch_spot_quotes(REGION, {"c4.xlarge": 0.2})
    assert quote.instance_type == "c4.xlarge" and quote.zone.startswith(REGION)
    assert quote.expected == pytest.approx(quote.spot_price * 1.1) and quote.saving == pytest.approx(1, abs=0.01)
    assert pricing.fetch_spot_quotes(REGION, {"no.such": None}) == []


def test_the_latest_price_of_the_cheapest_zone_is_a_types_spot_price():
    history = [
        {"InstanceType": "m5.large", "AvailabilityZone": "z-a", "SpotPrice": "0.05", "Timestamp": "2026-01-01T00:00"},
        {"InstanceType": "m5.large", "AvailabilityZone": "z-a", "SpotPrice": "0.03", "Timestamp": "2026-01-02T00:00"},
        {"InstanceType": "m5.large", "AvailabilityZone": "z-b", "SpotPrice": "0.04", "Timestamp": "2026-01-02T00:00"},
    ]
    assert pricing.latest_spot_prices(history) == {"m5.large": (0.03, "z-a")}
    quote = pricing.SpotQuote("m5.large", 0.03, "z-a", 0.1)
    assert quote.saving == pytest.approx(1 - 0.033 / 0.1)
    assert "expected saving 67%" in quote.describe()


def test_a_lost_instance_is_replaced_and_only_the_shortfall_made(aws_env):
    first = aws.launch(spec("fc2-44-0000000d", spot=True))
    victim, survivor = first.nodes[1], first.nodes[0]
    ec2().terminate_instances(InstanceIds=[victim.instance_id])  # EC2 took it back
    assert aws.replace_nodes("fc2-44-0000000d", REGION, [victim]) == []  # already gone
    again = aws.launch(spec("fc2-44-0000000d", spot=True))
    assert again.nodes[0].instance_id == survivor.instance_id
    assert again.nodes[1].instance_id not in (victim.instance_id, survivor.instance_id)
    assert len(live_instances("fc2-44-0000000d")) == 2
    aws.teardown("fc2-44-0000000d", REGION)
    assert everything_tagged("fc2-44-0000000d") == NOTHING


# --- a spot job's money (moto's price history: 0.00001 $/h a node, 0.000011 with the interruptions' 10 %) ----------

SPOT_NODE = Decimal("0.000011")  # moto's spot price of any type, raised by SPOT_INTERRUPTION_OVERHEAD
ON_DEMAND_NODE = Decimal("0.231")  # c4.xlarge in fc2-2018


@pytest.mark.django_db
def test_a_spot_plan_is_priced_at_the_spot_price_and_its_estimate_and_budget_check_follow(aws_env, bundle, digits):
    """The plan of a spot job — what the wizard shows, submit's budget check weighs and the recommend step stores
    on the job — is its cluster (2 workers and the PS, on the workers' type) at the expected spot price; an
    on-demand job's stays the catalogue's."""
    load_catalog("fc2-2018")
    asked = JobRequest(
        bundle=bundle, dataset=digits, provider="aws", region=REGION, catalog="fc2-2018", strategy="ps", workers=2,
        worker_type="c4.xlarge", parameters={"epochs": "10"}, spot=True, total_budget=Decimal("0.01"),
    )  # fmt: skip
    on_spot = planning.plan(asked)
    assert on_spot.hourly_cost == 3 * SPOT_NODE and on_spot.spot and on_spot.spot.billable
    assert on_spot.spot.on_demand == pytest.approx(3 * 0.231)
    on_demand = planning.plan(replace(asked, spot=False))
    assert on_demand.hourly_cost == 3 * ON_DEMAND_NODE and on_demand.spot is None
    # Its estimate at an epoch time: the spot job's fits a cent, the same job on-demand does not
    spot_estimate = replace(on_spot, predicted_epoch_time_s=60.0).estimate(10)
    on_demand_estimate = replace(on_demand, predicted_epoch_time_s=60.0).estimate(10)
    assert spot_estimate.total < Decimal("0.01") < on_demand_estimate.total
    assert spot_estimate.total / on_demand_estimate.total == SPOT_NODE / ON_DEMAND_NODE
    # Over the max price asked there is no spot capacity: the plan is priced on-demand, which bounds it
    capped = planning.plan(replace(asked, spot_max_price=Decimal("0.000001")))
    assert capped.hourly_cost == 3 * ON_DEMAND_NODE and capped.spot.over_max == "c4.xlarge"


def launched_an_hour_ago(job: Job) -> Job:
    """Its billing moved an hour back: from its launch, every rate's span."""
    hour = timedelta(hours=1)
    rates = [
        {**r, **{at: (datetime.fromisoformat(r[at]) - hour).isoformat() for at in ("started_at", "ended_at") if r[at]}}
        for r in job.rates
    ]
    Job.objects.filter(pk=job.pk).update(launched_at=job.launched_at - hour, rates=rates)
    job.refresh_from_db()
    return job


@pytest.mark.django_db
def test_a_spot_jobs_cost_projection_and_budget_are_at_the_spot_price_it_pays(aws_env, job):
    """Launched on spot, the job's $/h is the spot price from its launch: its cost so far (the job page's, the
    dashboard's SQL), its projection and the budget watchdog — which would stop it at on-demand prices."""
    job = spot_job(job, Job.SpotFallback.ON_DEMAND)
    Job.objects.filter(pk=job.pk).update(spot_max_price=None, total_budget=Decimal("0.01"))
    assert pipeline.run_step("provision", job.pk)
    job.refresh_from_db()
    assert {i.get("InstanceLifecycle") for i in live_instances(job.cluster_name)} == {"spot"}
    assert job.hourly_cost == SPOT_NODE
    (rate,) = job.rates
    assert rate["market"] == "spot" and rate["ended_at"] is None
    assert datetime.fromisoformat(rate["started_at"]) == job.launched_at  # billed from the start of its launch
    assert job.events.filter(message__contains="its cluster is billed at $0.000011/h on spot ($0.2310/h").exists()

    job = launched_an_hour_ago(job)
    assert job.cost_so_far == pytest.approx(float(SPOT_NODE), rel=0.01)  # not 0.231
    (row,) = dashboard.with_spend(Job.objects.filter(pk=job.pk), now=timezone.now())
    assert row.cost == pytest.approx(job.cost_so_far, rel=0.01)
    assert costs.projection(job).total < 0.001
    assert sweep._limit_crossed(job) is None  # at on-demand it would have spent $0.231 of its $0.01
    Job.objects.filter(pk=job.pk).update(rates=[], hourly_cost=ON_DEMAND_NODE)
    assert "budget" in sweep._limit_crossed(Job.objects.get(pk=job.pk))
    aws.teardown(job.cluster_name, REGION)


@pytest.mark.django_db
def test_a_spot_job_fallen_back_to_on_demand_is_billed_on_demand_from_then_on(aws_env, monkeypatch, job):
    RunInstances(monkeypatch, refuse="InsufficientInstanceCapacity")
    job = spot_job(job, Job.SpotFallback.ON_DEMAND)
    assert pipeline.run_step("provision", job.pk)
    job.refresh_from_db()
    assert job.hourly_cost == ON_DEMAND_NODE and costs.market(job) == costs.ON_DEMAND
    spot, on_demand = job.rates
    assert (spot["market"], Decimal(str(spot["hourly_cost"]))) == ("spot", SPOT_NODE)  # while spot was asked for
    assert (on_demand["market"], on_demand["ended_at"]) == ("on-demand", None)
    assert spot["ended_at"] == on_demand["started_at"]
    job = launched_an_hour_ago(job)
    fell_back = datetime.fromisoformat(job.rates[1]["started_at"])
    later = fell_back + timedelta(hours=1)
    assert job.cost_between(fell_back, later, now=later) == pytest.approx(0.231)  # on-demand, not spot, from then
    job.refresh_from_db()
    assert costs.bill(job, spot=costs.market(job) == costs.SPOT) == ""  # a relaunch: still on-demand
    aws.teardown(job.cluster_name, REGION)
