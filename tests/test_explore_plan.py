"""explore in the recommender and the one planner (issue 44 §1, §2), on the real database: the configurations a request
allows (whole: PS type × worker type × count × strategy), the workload's records as its trials and other workloads'
as its prior only, whose records it reads, TrialsNeeded and its estimate, the answer once the records are enough,
`planning.plan`'s search, and the doors (`manage.py recommend`, /api/v1/recommend, submit's checks)."""

from __future__ import annotations

import itertools

import pytest

from fc2.services import jobs, planning
from fc2.services.requests import JobRequest, SubmitError
from recommender import explore_answer, service
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from recommender.types import RecommendationError, RecommendRequest, TrialsNeeded

LAB_WORKERS = ("lab-w-100", "lab-w-250", "lab-w-1g")
LAB_PS = ("lab-ps-450", "lab-ps-1g")


@pytest.fixture
def lab(db):
    return load_catalog("lab")


def explore_request(**fields) -> RecommendRequest:
    asked = {
        "algorithm": "explore",
        "workload": "fresh-code",
        "max_workers": 3,
        "search_dollars": 5.0,
        "search_minutes": 30.0,
        "trial_minutes": 4.0,
        "alpha": 0.5,
        "beta": 0.5,
        **fields,
    }
    return RecommendRequest(**asked)


def record(workload: str, worker: str, ps: str, n: int, seconds: float | None, **fields) -> PerformanceRecord:
    strategy = "ps" if ps else "mirrored"
    return PerformanceRecord.objects.create(
        workload=workload, instance_type=worker, ps_type=ps, workers=n, batch_size=32, latency_ms=0.0,
        epoch_time_s=seconds, strategy=strategy, **fields,
    )  # fmt: skip


def lab_time(worker: str, ps: str, n: int) -> float:
    """A workload whose epochs shrink with workers and faster types, a slow PS link making more of them cost."""
    speed = {"lab-w-100": 1.0, "lab-w-250": 1.3, "lab-w-1g": 2.0}[worker]
    link = {"lab-ps-450": 3.0, "lab-ps-1g": 1.0, "": 2.0}[ps]
    return 2.0 + 60.0 / (n * speed) + link * n


def full_lab_grid(workload: str, owner=None) -> None:
    for worker, ps, n in itertools.product(LAB_WORKERS, (*LAB_PS, ""), (1, 2, 3)):
        for _ in range(2):
            record(workload, worker, ps, n, lab_time(worker, ps, n), owner=owner)


# --- the configurations a request allows -------------------------------------------------------------------------


def test_the_candidates_are_whole_clusters(lab):
    configs = explore_answer.configurations(explore_request(parameter_server=None), service.catalog_specs("lab"))
    expected = {(w, p, n, "ps") for w, p, n in itertools.product(LAB_WORKERS, LAB_PS, (1, 2, 3))}
    expected |= {(w, "", n, "mirrored") for w, n in itertools.product(LAB_WORKERS, (1, 2, 3))}
    assert {(c.instance_type, c.ps_type, c.workers, c.strategy) for c in configs} == expected
    # the request's own choices narrow it: one worker type, one PS type, a strategy
    narrowed = explore_request(worker_type="lab-w-1g", ps_type="lab-ps-450", parameter_server=True)
    assert {
        (c.instance_type, c.ps_type) for c in explore_answer.configurations(narrowed, service.catalog_specs("lab"))
    } == {("lab-w-1g", "lab-ps-450")}


def test_a_budget_counts_each_clusters_workers(lab):
    # $1/h: with the $0.5/h PS, ⌊0.5 / 0.25⌋ = 2 lab-w-1g workers; with the $0.125/h one, ⌊0.875 / 0.25⌋ = 3
    asked = explore_request(max_workers=None, budget=1.0, worker_types=("lab-w-1g",))
    counts = {}
    for c in explore_answer.configurations(asked, service.catalog_specs("lab")):
        counts[c.ps_type] = max(counts.get(c.ps_type, 0), c.workers)
    assert counts == {"lab-ps-1g": 2, "lab-ps-450": 3}
    with pytest.raises(RecommendationError, match="cannot buy"):
        explore_answer.configurations(explore_request(max_workers=None, budget=0.1), service.catalog_specs("lab"))


# --- no records: trials first ------------------------------------------------------------------------------------


def test_a_workload_with_no_records_needs_a_trial_with_a_sane_estimate(lab):
    with pytest.raises(TrialsNeeded) as needed:
        service.recommend(explore_request(), "lab")
    search = needed.value.search
    assert search.next.worker_type in LAB_WORKERS and 1 <= search.next.workers <= 3
    assert search.next.hourly_cost > 0 and search.candidates == 3 * 2 * 3
    assert search.trials_made == 0 and search.trial_minutes == 4.0
    # at most: what the budget buys, the minutes binding here (30 / 4)
    assert search.trials_at_most == 7 and search.dollars_at_most == 5.0 and search.minutes_at_most == 30.0
    assert 1 <= search.minutes / 4.0 <= 7 and 0 < search.dollars <= 5.0
    assert search.predicted is None  # nothing of this workload's times is known, and no other workload's either
    assert "first" in search.text and str(search.next.workers) in search.text


# --- the one planner ---------------------------------------------------------------------------------------------


def job_request(bundle, dataset, **fields) -> JobRequest:
    asked = {"provider": "lab", "algorithm": "explore", "workers": 3, "parameters": {"epochs": "5", "batch_size": "32"},
             "workload_name": "fresh-code", **fields}  # fmt: skip
    return JobRequest(bundle=bundle, dataset=dataset, **asked)


def test_the_plan_of_a_search_is_its_next_trial(lab, alice, bundle, digits):
    found = planning.plan(job_request(bundle, digits), alice)
    assert found.source == "explore" and found.search is not None
    assert found.hourly_cost is None and found.predicted_epoch_time_s is None and found.recommendation is None
    trial = found.search.next
    assert (found.worker_type, found.workers, found.ps_type, found.strategy) == (
        trial.worker_type, trial.workers, trial.ps_type, trial.strategy)  # fmt: skip
    assert found.explanation == found.search.text and found.estimate(5) is None
    # one trial's length: FC2_EXPLORE_TRIAL_S plus the lab's start-up and teardown
    assert found.search.trial_minutes == pytest.approx(planning.trial_minutes("lab"))
    assert found.search.trial_minutes > 2
    # what this job's trials spent is its budget's: the whole budget spent, the search cannot go on
    with pytest.raises(RecommendationError, match="cannot make a first trial"):
        planning.plan(job_request(bundle, digits), alice, trials_spent=(5.0, 0.0))


def test_local_refuses_explore(lab, alice, bundle, digits):
    with pytest.raises(SubmitError, match="of no type") as refused:
        planning.plan(job_request(bundle, digits, provider="local"), alice)
    assert refused.value.field == "algorithm"
    with pytest.raises(SubmitError, match="of no type") as refused:
        jobs.validate(job_request(bundle, digits, provider="local"))
    assert refused.value.field == "algorithm"
