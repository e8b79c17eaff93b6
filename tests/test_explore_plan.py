"""explore in the recommender and the one planner (issue 44 §1, §2), on the real database: the configurations a request
allows (whole: PS type × worker type × count × strategy), the workload's records as its trials and other workloads'
as its prior only, whose records it reads, TrialsNeeded and its estimate, the answer once the records are enough,
`planning.plan`'s search, and the doors (`manage.py recommend`, /api/v1/recommend, submit's checks)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from decimal import Decimal

import pytest
from django.urls import reverse

import provisioner
from fc2.models import Job
from fc2.services import jobs, planning
from fc2.services.requests import JobRequest, SubmitError
from recommender import explore_answer, service
from recommender.catalog import load_catalog
from recommender.explore import weights
from recommender.models import Catalog, InstanceType, PerformanceRecord
from recommender.types import RecommendationError, RecommendRequest, TrialsNeeded
from tests.conftest import call_json

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


def test_the_counts_stop_at_the_providers_limit_and_a_cloud_catalogue_is_narrowed(db):
    lab = load_catalog("lab")
    asked = explore_request(max_workers=None, budget=5.0, worker_types=("lab-w-1g",), workers_cap=8)
    assert max(c.workers for c in explore_answer.configurations(asked, service.catalog_specs(lab.name))) == 8
    # a cloud's hundred types: those another beats on every figure at no more $/h are left out; the counts past 8 on
    # a ladder, so that up to 100 workers are weighed; still too many at thousands, which is said with how to narrow it
    aws = load_catalog("aws-us-east-1")
    specs = service.catalog_specs(aws.name)
    two = explore_answer.configurations(explore_request(max_workers=2), specs)
    workers = {c.instance_type for c in two}
    assert 0 < len(workers) < len([s for s in specs if s.role in ("worker", "any")])
    assert not any(explore_answer.dominates(a, b, "worker") for a in specs for b in specs if b.name in workers)
    hundred = explore_answer.configurations(explore_request(max_workers=100), specs)
    assert {c.workers for c in hundred} == set(explore_answer.worker_counts(100))
    with pytest.raises(RecommendationError, match="name the worker types"):
        explore_answer.configurations(explore_request(max_workers=5000), specs)


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


@pytest.mark.parametrize(
    ("at_once", "cap", "batch"),
    [(1, None, 1), (3, None, 3), (3, 4, None)],  # None: as many as fit the provider's 4 workers, 2 at least
)
def test_trials_at_once_are_a_batch_in_one_window(lab, at_once, cap, batch):
    with pytest.raises(TrialsNeeded) as needed:
        service.recommend(explore_request(trials_at_once=at_once, workers_cap=cap), "lab")
    search = needed.value.search
    assert search.batch[0] == search.next and len(set(search.batch)) == len(search.batch)
    if batch is not None:
        assert len(search.batch) == batch
    else:
        assert len(search.batch) >= 2 and sum(t.workers for t in search.batch) <= cap
    assert (f"{len(search.batch)} trials at once" in search.text) is (len(search.batch) > 1)
    # minutes are wall-clock, a window a batch: the trials overlap; dollars are every trial's
    windows = search.minutes / 4.0
    assert windows == int(windows) and windows <= 7
    assert search.trials_at_most == min(18, 7 * at_once)
    assert sum(t.hourly_cost for t in search.batch) * 4.0 / 60 <= search.dollars <= 5.0


def test_trials_made_are_counted_not_windows(lab):
    """Three trials that overlapped took one window: the search has made three, and says "next"."""
    with pytest.raises(TrialsNeeded) as needed:
        service.recommend(
            explore_request(trials_at_once=3, spent_dollars=0.1, spent_minutes=4.0, spent_trials=3), "lab"
        )
    assert needed.value.search.trials_made == 3 and "next" in needed.value.search.text


@pytest.mark.parametrize("at_once", [0, -1, 1.5])
def test_trials_at_once_are_checked(lab, at_once):
    with pytest.raises(RecommendationError, match="trials at once"):
        service.recommend(explore_request(trials_at_once=at_once), "lab")


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
    # its counts stop at the provider's limit, and the job's epochs weigh what a better cluster saves
    asked = planning.recommend_request(job_request(bundle, digits))
    assert (asked.workers_cap, asked.epochs, asked.alpha, asked.search_dollars) == (8, 5, 0.5, 5.0)
    # what this job's trials spent is its budget's: the whole budget spent, the search cannot go on
    with pytest.raises(RecommendationError, match="cannot make a first trial"):
        planning.plan(job_request(bundle, digits), alice, trials_spent=planning.Spent(5.0, 0.0))


def test_local_refuses_explore(lab, alice, bundle, digits):
    with pytest.raises(SubmitError, match="of no type") as refused:
        planning.plan(job_request(bundle, digits, provider="local"), alice)
    assert refused.value.field == "algorithm"
    with pytest.raises(SubmitError, match="of no type") as refused:
        jobs.validate(job_request(bundle, digits, provider="local"))
    assert refused.value.field == "algorithm"


def test_every_run_failed_and_a_budget_that_buys_no_trial_are_said(lab):
    one = {"worker_type": "lab-w-1g", "ps_type": "lab-ps-450", "max_workers": 1}
    record("fresh-code", "lab-w-1g", "lab-ps-450", 1, None)
    with pytest.raises(RecommendationError, match="every run of it here failed") as failed:
        service.recommend(explore_request(**one), "lab")
    assert not isinstance(failed.value, TrialsNeeded)
    with pytest.raises(RecommendationError, match=r"cannot make a first trial.* the search's budget is \$0.001"):
        service.recommend(explore_request(workload="other-code", search_dollars=0.001), "lab")


@pytest.mark.parametrize(("alpha", "beta"), [(-1.0, 1.0), (0.0, 0.0), (float("nan"), 1.0)])
def test_weights_are_checked(lab, alpha, beta):
    with pytest.raises(RecommendationError, match="(?i)alpha and beta"):
        service.recommend(explore_request(alpha=alpha, beta=beta), "lab")


# --- enough records: no trial ------------------------------------------------------------------------------------


def test_a_workload_measured_everywhere_needs_no_trial(lab):
    full_lab_grid("fresh-code")
    answer = service.recommend(explore_request(parameter_server=None, alpha=1.0, beta=0.0), "lab")
    times = {(w, p, n): lab_time(w, p, n) for w, p, n in itertools.product(LAB_WORKERS, (*LAB_PS, ""), (1, 2, 3))}
    fastest = min(times, key=times.get)
    assert (answer.worker_type, answer.ps_type or "", answer.workers) == fastest
    assert answer.algorithm == "explore" and answer.source == "measured"
    assert answer.predicted_epoch_time_s == pytest.approx(times[fastest])
    assert len(answer.candidates) == 27 and answer.extra["strategy"] == ("ps" if fastest[1] else "mirrored")
    search = answer.extra["search"]
    assert search["trials"] == 54 and search["no_trial_needed"] is True
    low, high = search["interval_s"]
    assert low <= times[fastest] <= high
    assert "No trial is needed" in answer.explanation
    # later, within a search that made trials, it says why the search stopped instead
    later = service.recommend(explore_request(alpha=1.0, beta=0.0, spent_dollars=0.1, spent_minutes=8.0), "lab")
    assert "The search stopped" in later.explanation and not later.extra["search"]["no_trial_needed"]


def test_the_issues_example_picks_the_cheapest_measured_cluster_not_one_of_the_largest(db):
    """Four types × eight counts, each run with a PS of its own type, the cheapest asked: the configuration is chosen
    whole (every PS type with every worker type), and among what was measured the cheapest per epoch wins."""
    catalog = Catalog.objects.create(name="four-types", version="test")
    kinds = {"s": (0.1, 1.0, 300.0), "m": (0.2, 2.0, 600.0), "l": (0.4, 4.0, 1200.0), "xl": (0.8, 8.0, 10000.0)}
    for name, (price, speed, mbps) in kinds.items():
        InstanceType.objects.create(catalog=catalog, name=name, role="any", hourly_price=Decimal(str(price)),
                                    vcpu=int(2 * speed), ecu=speed * 4, network_mbps=mbps)  # fmt: skip

    def seconds(kind: str, n: int) -> float:
        price, speed, mbps = kinds[kind]
        return 5.0 + 100.0 / (n * speed) + 1000.0 * n / mbps  # a fixed part, the compute shared, the PS's link

    per_epoch = {}
    for kind, n in itertools.product(kinds, range(1, 9)):
        record("grid", kind, kind, n, seconds(kind, n))
        per_epoch[(kind, n)] = seconds(kind, n) * (n + 1) * kinds[kind][0]
    cheapest = min(per_epoch, key=per_epoch.get)
    assert cheapest[0] == "s" and cheapest[1] > 1 and per_epoch[("xl", 1)] > per_epoch[cheapest] * 1.4

    asked = explore_request(workload="grid", max_workers=8, alpha=0.0, beta=1.0, parameter_server=True)
    configs = explore_answer.configurations(asked, service.catalog_specs("four-types"))
    assert len(configs) == 4 * 4 * 8  # every PS type with every worker type, not the PS rule's one type
    try:
        answer = service.recommend(asked, "four-types")
    except TrialsNeeded as needed:  # the search may want a PS of another type tried: then its budget is spent
        assert (needed.search.next.worker_type, needed.search.next.ps_type) != ("xl", "xl")
        answer = service.recommend(replace(asked, spent_minutes=30.0), "four-types")
    assert (answer.worker_type, answer.ps_type, answer.workers) == (cheapest[0], cheapest[0], cheapest[1])


# --- whose records: the owner's and the platform's; others' workloads only shape the prior ----------------------


def test_another_users_records_are_never_read(lab, alice, bob):
    full_lab_grid("fresh-code", owner=bob)
    full_lab_grid("bobs-other-code", owner=bob)
    assert service.recommend(explore_request(), "lab", owner=bob).algorithm == "explore"  # bob's own: enough
    with pytest.raises(TrialsNeeded) as needed:
        service.recommend(explore_request(), "lab", owner=alice)
    # nothing of bob's shaped alice's search: no record of hers, no prior from his other workload
    assert needed.value.search.predicted is None and needed.value.search.trials_made == 0


def test_other_workloads_shape_the_prior_only(lab, alice):
    # the platform's: two workloads that scale alike (history must predict itself to count: one cannot show it)
    full_lab_grid("platform-code")
    full_lab_grid("platform-code-b")
    with pytest.raises(TrialsNeeded) as needed:
        service.recommend(explore_request(), "lab", owner=alice)
    search = needed.value.search
    # a belief before any trial (history's trend), yet a trial first: other code's times are not this code's
    assert search.predicted is not None and search.predicted_config is not None
    t, low, high = search.predicted
    assert low < t < high
    # with a few of its own records the answer, once it comes, is measured on this workload alone
    for worker, ps, n in itertools.product(LAB_WORKERS, LAB_PS, (1, 2, 3)):
        record("fresh-code", worker, ps, n, 3 * lab_time(worker, ps, n))
    answer = service.recommend(explore_request(alpha=1.0, beta=0.0), "lab", owner=alice)
    assert answer.predicted_epoch_time_s == pytest.approx(
        3 * lab_time(answer.worker_type, answer.ps_type, answer.workers)
    )
    assert answer.extra["search"]["trials"] == 18


# --- the doors ---------------------------------------------------------------------------------------------------


EXPLORE_ARGS = ["--algorithm", "explore", "--workload", "fresh-code", "--catalog", "lab", "--max-workers", "3"]


def test_recommend_cli_exits_1_with_the_estimate_then_answers_once_measured(lab):
    code, body, err = call_json("recommend", *EXPLORE_ARGS, "--preset", "cheapest", "--search-budget", "2")
    assert code == 1 and body["ok"] is False and err.startswith("error: Explore runs trials")
    assert body["search"]["next"]["worker_type"] in LAB_WORKERS and body["search"]["dollars_at_most"] == 2.0
    assert body["search"]["next"]["worker_type"] in err
    code, body, err = call_json("recommend", *EXPLORE_ARGS, "--preset", "fastest", "--alpha", "1")
    assert code == 1 and "not both" in body["error"]
    full_lab_grid("fresh-code")
    code, body, _ = call_json("recommend", *EXPLORE_ARGS, "--epochs", "10")
    assert code == 0 and body["algorithm"] == "explore" and body["source"] == "measured"
    assert body["extra"]["search"]["no_trial_needed"] is True


def test_recommend_api_400s_with_the_search_then_answers(lab, client, alice):
    client.force_login(alice)
    asked = {"algorithm": "explore", "workload": "fresh-code", "catalog": "lab", "max_workers": 3, "preset": "balanced"}
    refused = client.post(reverse("api-recommend"), asked, content_type="application/json")
    assert refused.status_code == 400 and refused.json()["error"].startswith("Explore runs trials")
    assert refused.json()["search"]["next"]["worker_type"] in LAB_WORKERS
    both = client.post(reverse("api-recommend"), {**asked, "alpha": 1}, content_type="application/json")
    assert both.status_code == 400 and "fields" in both.json()
    full_lab_grid("fresh-code", owner=alice)
    answer = client.post(reverse("api-recommend"), asked, content_type="application/json")
    assert answer.status_code == 200 and answer.json()["algorithm"] == "explore"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"alpha": -0.5}, "alpha"),
        ({"beta": float("inf")}, "beta"),
        ({"alpha": 0.0, "beta": 0.0}, "alpha"),
        ({"search_budget": Decimal("0")}, "search_budget"),
        ({"search_budget": Decimal("NaN")}, "search_budget"),
        ({"search_minutes": 0}, "search_minutes"),
        ({"search_minutes": 2.5}, "search_minutes"),
        ({"total_budget": Decimal("1"), "search_budget": Decimal("2")}, "total_budget"),
    ],
)
def test_submit_refuses_what_explore_cannot_use(lab, bundle, digits, fields, field):
    with pytest.raises(SubmitError) as refused:
        jobs.check_search(job_request(bundle, digits, **fields))
    assert refused.value.field == field


def test_submit_takes_a_whole_job_budget_that_covers_the_search_and_a_strategy_left_open(lab, bundle, digits):
    jobs.check_search(job_request(bundle, digits, total_budget=Decimal("6"), search_budget=Decimal("5")))
    assert jobs.strategy_unavailable("auto", "explore") is None
    assert weights("cheapest", None, None) == (0.0, 1.0)


def test_submit_refuses_a_search_its_budget_cannot_start(lab, alice, bundle, digits):
    if reason := provisioner.unavailable("lab"):
        pytest.skip(reason)
    with pytest.raises(SubmitError, match="cannot make a first trial") as refused:
        jobs.submit(alice, job_request(bundle, digits, search_budget=Decimal("0.0001")), driver=Job.Driver.INLINE)
    assert refused.value.field == "algorithm" and not Job.objects.exists()
