"""A job whose strategy is left open (issue 13, part 6): the model compares a parameter server with all-reduce from
the workload's records of each, the job runs the one it chose, and says it was chosen — through the service layer,
the pipeline's recommend step, the wizard, the API and `submit_job`, and once for real on the local provider."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils.html import escape

from fc2.celery import app as celery_app
from fc2.models import Job
from fc2.services import jobs, pipeline, planning
from fc2.services.jobs import STRATEGY_LEFT_OPEN_REASON
from recommender import service
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from recommender.types import RecommendRequest
from tests.conftest import cluster_processes, make_job
from tests.helpers import resource_form, step_url, through_data

pytestmark = pytest.mark.django_db

WORKLOAD = "w"
BATCH = 32
PRICES = {"c4.xlarge": Decimal("0.231"), "m4.large": Decimal("0.125")}


@pytest.fixture(autouse=True)
def fc2_2018(db):
    return load_catalog("fc2-2018")


def records(ps: dict[int, float], ring: dict[int, float]) -> None:
    """c4.xlarge runs of WORKLOAD at batch size BATCH: through an m4.large PS, and all-reduce (no PS)."""
    for strategy, ps_type, times in (("ps", "m4.large", ps), ("mirrored", "", ring)):
        PerformanceRecord.objects.bulk_create(
            PerformanceRecord(
                workload=WORKLOAD, instance_type="c4.xlarge", ps_type=ps_type, workers=n, batch_size=BATCH,
                latency_ms=0.0, epoch_time_s=t, strategy=strategy, source="measured",
            )
            for n, t in times.items()
        )  # fmt: skip


def left_open(**fields) -> dict:
    """A Model job of WORKLOAD on c4.xlarge workers, at most 2 of them, its strategy left open."""
    return {
        "algorithm": "model", "strategy": Job.Strategy.AUTO, "catalog": "fc2-2018", "worker_types": ["c4.xlarge"],
        "workload_name": WORKLOAD, "workers": 2, "parameters": {"epochs": "1", "batch_size": str(BATCH)}, **fields,
    }  # fmt: skip


# The PS scales, or it saturates: (PS epoch times, all-reduce epoch times) by worker count -> what runs.
CASES = [
    ({1: 100, 2: 50, 3: 34, 4: 26}, {1: 100, 2: 75, 3: 66, 4: 62}, "ps", "m4.large"),
    ({1: 100, 2: 90, 3: 95, 4: 99}, {1: 100, 2: 52, 3: 36, 4: 28}, "mirrored", ""),
]


@pytest.mark.parametrize(("ps", "ring", "strategy", "ps_type"), CASES)
def test_the_plan_runs_the_strategy_the_model_chose_and_pays_for_a_ps_only_when_it_has_one(
    alice, bundle, digits, ps, ring, strategy, ps_type
):
    records(ps, ring)
    request = jobs.JobRequest(bundle=bundle, dataset=digits, **left_open())

    plan = planning.plan(request)

    assert (plan.strategy, plan.ps_type, plan.worker_type, plan.workers) == (strategy, ps_type, "c4.xlarge", 2)
    assert plan.hourly_cost == 2 * PRICES["c4.xlarge"] + PRICES.get(ps_type, 0)
    assert plan.predicted_epoch_time_s == pytest.approx((ps if strategy == "ps" else ring)[2])
    assert plan.recommendation["extra"]["strategy"] == strategy
    assert plan.explanation.startswith("Strategy left open, ")


@pytest.mark.parametrize(("ps", "ring", "strategy", "ps_type"), CASES)
def test_the_recommend_step_puts_the_chosen_strategy_in_place_and_a_rerun_leaves_it_open_again(
    alice, bundle, digits, ps, ring, strategy, ps_type
):
    records(ps, ring)
    with mock.patch.object(pipeline, "enqueue"):
        job = make_job(alice, bundle, digits, **left_open())
    assert (job.requested_strategy, job.strategy, job.strategy_chosen) == (Job.Strategy.AUTO, "", False)

    assert pipeline.recommend(job.pk)

    job.refresh_from_db()
    assert (job.strategy, job.ps_type, job.worker_type, job.workers) == (strategy, ps_type, "c4.xlarge", 2)
    assert job.strategy_chosen and job.requested_strategy == Job.Strategy.AUTO
    assert job.hourly_cost == 2 * PRICES["c4.xlarge"] + PRICES.get(ps_type, 0)
    assert any("(left open: the model's choice)" in m for m in job.events.values_list("message", flat=True))
    assert jobs.JobRequest.of(job).strategy == Job.Strategy.AUTO  # asked as it came, never rewritten


def test_a_resumed_recommend_step_chooses_again_and_keeps_saying_the_model_chose(alice, bundle, digits):
    records(*CASES[1][:2])
    with mock.patch.object(pipeline, "enqueue"):
        job = make_job(alice, bundle, digits, **left_open())
    pipeline.recommend(job.pk)

    assert pipeline.recommend(job.pk, resume=True)  # its worker was lost after the choice: the step runs again

    job.refresh_from_db()
    assert (job.strategy, job.strategy_chosen) == ("mirrored", True)


@pytest.mark.parametrize("algorithm", ["manual", "cost-opt", "time-opt", "scala-opt", "lookup"])
def test_only_the_model_takes_a_strategy_left_open(alice, bundle, digits, algorithm):
    with pytest.raises(jobs.SubmitError) as refused:
        make_job(alice, bundle, digits, **left_open(algorithm=algorithm, ps_type="m4.large"))

    assert (str(refused.value), refused.value.field) == (STRATEGY_LEFT_OPEN_REASON, "strategy")
    assert not Job.objects.exists()


def test_left_open_with_records_of_neither_strategy_is_refused_with_the_reason(alice, bundle, digits):
    PerformanceRecord.objects.create(workload=WORKLOAD, instance_type="c4.xlarge", workers=1, epoch_time_s=None)

    with pytest.raises(jobs.SubmitError, match="Neither strategy can be estimated") as refused:
        jobs.submit(alice, jobs.JobRequest(bundle=bundle, dataset=digits, **left_open()), plan_first=True)

    assert refused.value.field == "algorithm" and not Job.objects.exists()


# --- a workload measured both ways, its strategy named ------------------------------------------------------------

STRATEGY_NAMED = [
    # (algorithm, parameter_server, what answers): each strategy from its own runs, whichever would win the other's
    ("lookup", True, 4, 26.0),  # the PS's 26 s at 4, not all-reduce's 62 s
    ("lookup", False, 4, 62.0),
    ("model", True, 4, 26.0),
    ("model", False, 4, 62.0),
]


@pytest.mark.parametrize(("algorithm", "parameter_server", "workers", "epoch_time_s"), STRATEGY_NAMED)
def test_a_strategy_named_answers_from_that_strategy_s_runs_alone(algorithm, parameter_server, workers, epoch_time_s):
    records(*CASES[0][:2])
    request = RecommendRequest(
        algorithm=algorithm, workload=WORKLOAD, batch_size=BATCH, latency_ms=0.0, parameter_server=parameter_server,
        worker_types=("c4.xlarge",), max_workers=4,
    )  # fmt: skip

    answer = service.recommend(request, "fc2-2018")

    assert (answer.workers, answer.predicted_epoch_time_s) == (workers, epoch_time_s)
    assert {c.epoch_time_s for c in answer.candidates} == set(CASES[0][0 if parameter_server else 1].values())
    other = "all-reduce" if parameter_server else "a PS"
    assert f"its 4 runs with {other} say nothing of this strategy" in answer.explanation


def test_a_workload_measured_one_way_answers_any_strategy_from_its_runs():
    """An all-reduce workload asked with the default strategy (ps) as before: its runs are what there is."""
    records({}, CASES[0][1])
    request = RecommendRequest(algorithm="lookup", workload=WORKLOAD, batch_size=BATCH, latency_ms=0.0)

    answer = service.recommend(request, "fc2-2018")

    assert (answer.workers, answer.predicted_epoch_time_s) == (4, 62.0)
    assert "say nothing of this strategy" not in answer.explanation


def test_a_job_with_its_strategy_named_is_planned_from_that_strategy_s_runs(alice, bundle, digits):
    records(*CASES[1][:2])  # all-reduce scales, the PS saturates
    plan = planning.plan(jobs.JobRequest(bundle=bundle, dataset=digits, **left_open(strategy="ps", ps_type="m4.large")))
    assert plan.predicted_epoch_time_s == pytest.approx(90.0)  # the PS's 2 workers, not all-reduce's 52 s


def test_the_lookup_page_asks_which_strategy_of_a_workload_measured_both_ways(client, alice):
    records(*CASES[0][:2])
    client.force_login(alice)
    query = {"workload": WORKLOAD, "batch_size": BATCH, "latency_ms": 0}

    mirrored = client.get(reverse("recommender-anwar"), query)  # all-reduce, Anwar's strategy, unless asked
    ps = client.get(reverse("recommender-anwar"), {**query, "strategy": "ps"})

    assert mirrored.context["answer"]["predicted_epoch_time_s"] == 62.0
    assert ps.context["answer"]["predicted_epoch_time_s"] == 26.0
    assert b'name="strategy"' in ps.content


def test_the_wizard_offers_it_with_the_model_says_what_was_chosen_and_files_the_job_left_open(client, alice, bundle):
    records(*CASES[1][:2])
    client.force_login(alice)
    through_data(client, bundle, params=(("epochs", "1"), ("batch_size", str(BATCH))))
    form = resource_form(
        strategy="auto", algorithm="model", catalog="fc2-2018", worker_types="c4.xlarge", workload_name=WORKLOAD
    )

    page = client.get(step_url("resource")).content.decode()
    refused = client.post(step_url("resource"), {**form, "algorithm": "cost-opt"})
    live = client.get(reverse("job-new-recommendation"), form).content.decode()
    saved = client.post(step_url("resource"), form)
    review = client.get(step_url("review")).content.decode()
    with mock.patch.object(celery_app, "send_task"):
        client.post(step_url("review"))

    assert 'value="auto"' in page and escape(STRATEGY_LEFT_OPEN_REASON) in page  # the reason, shown before it is sent
    assert refused.status_code == 400 and refused.context["form"].errors["strategy"] == [STRATEGY_LEFT_OPEN_REASON]
    assert "all-reduce chosen</span>" in live and "+ PS" not in live
    assert saved.status_code == 302
    assert "Left open: the model compares both when the job starts" in review
    job = Job.objects.get()
    assert (job.request["strategy"], job.algorithm) == (Job.Strategy.AUTO, "model")


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_job_left_open_trains_on_the_strategy_the_model_chose(alice, client, example_wheel, runtime_dir):
    """For real, on the local provider: all-reduce measured faster, so its 2 workers run with no PS node."""
    records(*CASES[1][:2])
    out = StringIO()
    call_command(
        "submit_job", "--bundle", str(example_wheel), "--dataset", "digits", "--algorithm", "model", "--strategy",
        "auto", "--workload", WORKLOAD, "--workers", "2", "--param", "epochs=1", "--param", "steps_per_epoch=3",
        "--param", f"batch_size={BATCH}", "--user", "alice", "--inline", "--wait", "--json", stdout=out,
    )  # fmt: skip

    result = json.loads(out.getvalue())
    assert result["status"] == "succeeded", result.get("error")
    job = Job.objects.get(pk=result["id"])
    assert job.strategy == "mirrored" and job.strategy_chosen
    assert sorted(job.nodes.values_list("name", flat=True)) == ["worker-0", "worker-1"]
    assert result["metrics"]["strategy"] == "mirrored"  # what the training code itself ran
    client.force_login(alice)
    detail = client.get(f"/api/jobs/{job.pk}").json()
    assert (detail["strategy"], detail["requested_strategy"]) == ("mirrored", "auto")
    assert "(left open: the model's choice)" in client.get(job.get_absolute_url()).content.decode()
    assert cluster_processes() == []
