"""One request, one plan, one price on every view: what the wizard's resource step previews for the answers (and
submit's budget check plans, `jobs.planned`) is what the recommend step stores on the job, what the Recommender page,
/api/v1/recommend and `manage.py recommend --json` answer for the same question, and what the job page and the admin
dashboard bill — across the algorithms and the providers' catalogues (no cluster is launched: the recommend step runs
inline, and a cluster's hour is written on the job as its provision step would)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

import provisioner
from fc2.models import Job
from fc2.services import dashboard, jobs, pipeline, planning, pricing
from recommender.models import PerformanceRecord
from recommender.types import RecommendationError
from tests.conftest import call_json
from tests.helpers import resource_form, through_data

GRID = "lab-digits-grid"  # the shipped lab samples: all-reduce and parameter-server runs of examples/digits_cnn
POINT = {"epochs": "2", "batch_size": "32"}

# (case, the JobRequest's fields, the parameters) — each algorithm, each provider's catalogue.
CASES = [
    ("local manual", {"provider": "local", "algorithm": "manual", "strategy": "ps", "workers": 2}, {"epochs": "2"}),
    (
        "local cost-opt",
        {"provider": "local", "algorithm": "cost-opt", "catalog": "fc2-2018", "workers": 3, "strategy": "ps"},
        {"epochs": "2"},
    ),
    (
        "local time-opt, a budget",
        {"provider": "local", "algorithm": "time-opt", "catalog": "fc2-2018", "budget": Decimal("2"), "strategy": "ps"},
        {"epochs": "2"},
    ),
    (
        "lab lookup through a PS",
        {"provider": "lab", "algorithm": "lookup", "workers": 3, "strategy": "ps", "workload_name": GRID},
        POINT,
    ),
    (
        "lab lookup, all-reduce, 20 ms",
        {
            "provider": "lab",
            "algorithm": "lookup",
            "workers": 3,
            "strategy": "mirrored",
            "workload_name": GRID,
            "latency_ms": 20.0,
        },
        POINT,
    ),  # fmt: skip
    (
        "lab model through a PS",
        {"provider": "lab", "algorithm": "model", "workers": 3, "strategy": "ps", "workload_name": GRID},
        POINT,
    ),
    (
        "lab scala-opt, stored bandwidths",
        {"provider": "lab", "algorithm": "scala-opt", "workers": 4, "strategy": "ps", "workload_name": GRID},
        POINT,
    ),
    (
        "lab manual, the workers' type as PS",
        {
            "provider": "lab",
            "algorithm": "manual",
            "workers": 2,
            "strategy": "ps",
            "worker_type": "lab-w-1g",
            "workload_name": GRID,
        },
        POINT,
    ),  # fmt: skip
    (
        "aws cost-opt, a budget",
        {
            "provider": "aws",
            "algorithm": "cost-opt",
            "catalog": "aws-us-east-1",
            "budget": Decimal("1.5"),
            "strategy": "ps",
            "region": "us-east-1",
            "worker_types": ["m5.xlarge", "m5.large", "c5.xlarge"],
        },
        {"epochs": "2"},
    ),  # fmt: skip
    (
        "aws time-opt, a limit",
        {
            "provider": "aws",
            "algorithm": "time-opt",
            "catalog": "fc2-2018",
            "workers": 4,
            "strategy": "mirrored",
            "worker_types": ["c4.xlarge", "m4.xlarge", "t2.xlarge"],
            "region": "ap-southeast-1",
        },
        {"epochs": "2"},
    ),  # fmt: skip
]


@pytest.fixture
def platform(db, monkeypatch, settings):
    """A fresh install's catalogues and samples; AWS credentials and an address its nodes could reach (nothing is
    launched: the provider only has to be usable); for Scala-Opt, each lab worker type's bandwidth, as a profiling
    run would have stored it."""
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings.FC2_PUBLIC_URL = "http://198.51.100.7:8000"
    for worker_type, mbps in {"lab-w-100": 60.0, "lab-w-250": 95.0, "lab-w-1g": 140.0}.items():
        PerformanceRecord.objects.create(
            workload=GRID, instance_type=worker_type, ps_type="lab-ps-1g", workers=1, batch_size=32, latency_ms=0.0,
            bandwidth_mbps=mbps, strategy="ps", source=PerformanceRecord.Source.PROFILED,
        )  # fmt: skip


def api_fields(request: jobs.JobRequest) -> dict:
    """The recommender's question for `request` (`planning.recommend_request`), as /api/v1/recommend takes it."""
    asked = planning.recommend_request(request)
    fields = {
        "algorithm": asked.algorithm,
        "catalog": request.catalog,
        "workload": asked.workload,
        "strategy": "auto" if asked.parameter_server is None else "ps" if asked.parameter_server else "mirrored",
        "budget": asked.budget,
        "max_workers": asked.max_workers,
        "ps_type": asked.ps_type,
        "worker_types": list(asked.worker_types) or None,
        "worker_type": asked.worker_type,
        "batch_size": asked.batch_size,
        "latency_ms": asked.latency_ms,
    }
    return {name: value for name, value in fields.items() if value is not None}


def cli_args(fields: dict) -> list[str]:
    """The same question as `manage.py recommend` options."""
    args = []
    for name, value in fields.items():
        shown = ",".join(value) if isinstance(value, list) else str(value)
        args += [f"--{name.replace('_', '-')}", shown]
    return args


def wizard_preview(client, bundle, fields: dict, parameters: dict) -> planning.Plan:
    """The plan the wizard's resource step shows (its live recommendation) for the same answers."""
    through_data(client, bundle, params=tuple(parameters.items()))
    budget = fields.get("budget")
    form = resource_form(
        provider=fields["provider"],
        strategy=fields["strategy"],
        algorithm=fields["algorithm"],
        catalog=fields.get("catalog", ""),
        worker_type=fields.get("worker_type", ""),
        worker_types=fields.get("worker_types", []),
        limit="workers" if budget is None else "budget",
        max_workers=str(fields.get("workers", "")) if budget is None else "",
        budget="" if budget is None else str(budget),
        latency_ms=str(fields.get("latency_ms", 0)),
        region=fields.get("region", ""),
        workload_name=fields.get("workload_name", ""),
    )
    response = client.get(reverse("job-new-recommendation"), form)
    assert "plan" in response.context, response.context.get("error") or response.context.get("invalid").errors
    return response.context["plan"]


def json_shape(data):
    """`data` as a JSON column gives it back (tuples as lists)."""
    return json.loads(json.dumps(data))


def same_cluster(plan: planning.Plan, answer: dict) -> None:
    """A recommender's answer (its JSON) is the plan's cluster at the plan's price."""
    assert (answer["ps_type"] or "", answer["worker_type"], answer["workers"]) == (
        plan.ps_type,
        plan.worker_type,
        plan.workers,
    )
    assert Decimal(str(answer["hourly_cost"])) == plan.hourly_cost
    assert answer["predicted_epoch_time_s"] == plan.predicted_epoch_time_s


@pytest.mark.parametrize("case, fields, parameters", CASES, ids=[case for case, _, _ in CASES])
def test_the_previewed_plan_is_the_stored_plan_and_every_view_prices_it_alike(
    case, fields, parameters, platform, client, alice, bundle, digits
):
    request = jobs.JobRequest(bundle=bundle, dataset=digits, parameters=dict(parameters), **fields)
    previewed = jobs.planned(request, alice)  # submit's budget check, and the wizard's review
    client.force_login(alice)
    assert wizard_preview(client, bundle, fields, parameters) == previewed
    assert previewed.hourly_cost is not None and previewed.source != "profiling"
    if previewed.strategy == Job.Strategy.PS and provisioner.get(request.provider).typed_nodes:
        assert previewed.ps_type, "a PS cluster's plan names its PS"
        assert previewed.hourly_cost > 0

    job = jobs.submit(alice, request, driver=Job.Driver.INLINE)
    assert pipeline.recommend(job.pk)
    job.refresh_from_db()
    stored = {name: getattr(job, name) for name in previewed.columns()}
    assert stored == {**previewed.columns(), "recommendation": json_shape(previewed.recommendation)}

    if request.algorithm != "manual":
        asked = api_fields(request)
        api = client.post("/api/v1/recommend", asked, content_type="application/json")
        assert api.status_code == 200, api.content
        same_cluster(previewed, api.json())
        code, cli, err = call_json("recommend", *cli_args(asked), "--user", alice.username)
        assert code == 0, err
        same_cluster(previewed, cli)
        if request.algorithm == "lookup":  # the Recommender page answers the lookup alone
            page = {key: asked[key] for key in ("workload", "batch_size", "latency_ms", "strategy", "catalog")}
            shown = client.get(reverse("recommender-anwar"), page).context["answer"]
            same_cluster(previewed, shown)

    # An hour of its cluster: the job page and the admin dashboard bill the plan's $/h for it.
    launched = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
    Job.objects.filter(pk=job.pk).update(launched_at=launched, torn_down_at=launched + dt.timedelta(hours=1))
    job.refresh_from_db()
    page = pricing.cost_summary(job)
    assert Decimal(str(page["hourly_cost"])) == previewed.hourly_cost
    assert page["cost_so_far"] == pytest.approx(float(previewed.hourly_cost))
    (row,) = dashboard.with_spend(Job.objects.filter(pk=job.pk), now=launched + dt.timedelta(hours=2))
    assert row.cost == pytest.approx(page["cost_so_far"], abs=1e-6)


def test_a_relaunch_out_of_capacity_plans_again_without_the_blocked_types(platform, alice, bundle, digits):
    """The failover asks the same planner with the worker types no zone had: the next cheapest, priced as the
    recommender priced it."""
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, provider="aws", algorithm="cost-opt", catalog="fc2-2018", workers=3,
        worker_types=["c4.xlarge", "t2.xlarge", "m4.xlarge"], parameters={"epochs": "2"},
    )  # fmt: skip
    first = planning.plan(request, alice)
    again = planning.plan(request, alice, blocked=[first.worker_type])

    assert (first.worker_type, again.worker_type) == ("c4.xlarge", "t2.xlarge")
    assert again.recommendation["hourly_cost"] == float(again.hourly_cost)
    with pytest.raises(RecommendationError, match="No worker type the job may use has capacity"):
        planning.plan(request, alice, blocked=request.worker_types)
