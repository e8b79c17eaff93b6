"""explore's search (recommender/explore.py) on synthetic grids whose answer is known, its stopping rules, failed
trials, history, and the replay benchmark's --json contract (benchmarks/explore.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from recommender import explore
from recommender.explore import Budget, Config, HistoryRecord, Trial
from recommender.types import InstanceSpec

ROOT = Path(__file__).resolve().parent.parent
CATALOG = {
    spec.name: spec
    for spec in (
        InstanceSpec("small", 0.1, "worker", vcpu=2, network_mbps=1000),
        InstanceSpec("big", 0.8, "worker", vcpu=16, network_mbps=10000),
        InstanceSpec("ps-slow", 0.1, "ps", vcpu=2, network_mbps=500),
        InstanceSpec("ps-fast", 0.5, "ps", vcpu=8, network_mbps=5000),
    )
}
COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
CONFIGS = [Config(w, ps, n, "ps", 0.0) for w in ("small", "big") for ps in ("ps-slow", "ps-fast") for n in COUNTS]
ROOMY = Budget(dollars=math.inf, minutes=math.inf, window_minutes=10, job_hours=10)


def epoch_time(config: Config, work: float = 2000.0, gradients: float = 200.0) -> float:
    """A PS roofline: the workers' share of the compute, or the PS link carrying every worker's gradients."""
    worker, ps = CATALOG[config.instance_type], CATALOG[config.ps_type]
    return 1.0 + max(work / (config.workers * worker.vcpu), config.workers * gradients / ps.network_mbps)


def best(alpha: float, beta: float, time=epoch_time) -> tuple[Config, float]:
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    t_ref = min(time(c.config) for c in candidates)
    c_ref = min(time(c.config) * c.hourly_price for c in candidates)
    scores = {
        c.config: explore.objective(time(c.config), c.hourly_price, alpha, beta, t_ref, c_ref) for c in candidates
    }
    pick = min(scores, key=scores.get)
    return pick, scores


@pytest.mark.parametrize("preset", ["fastest", "cheapest", "balanced"])
def test_finds_the_known_best_within_the_budget(preset):
    alpha, beta = explore.PRESETS[preset]
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    result = explore.search(candidates, epoch_time, alpha, beta, ROOMY)
    _, scores = best(alpha, beta)
    assert scores[result.chosen] / min(scores.values()) - 1 <= 0.05
    assert result.reason == "another trial is expected to save less than it costs"  # it stopped before sweeping
    assert len({t.config for t in result.trials}) == len(result.trials)  # never the same configuration twice


def test_a_dollar_budget_caps_the_trials():
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    budget = Budget(dollars=0.2, minutes=math.inf, window_minutes=10, job_hours=1000)
    result = explore.search(candidates, epoch_time, 1.0, 0.0, budget)
    assert result.spent_dollars <= 0.2
    assert result.reason == "the next trial would overrun the search budget"


def test_a_minutes_budget_caps_the_trials():
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    budget = Budget(dollars=math.inf, minutes=30, window_minutes=10, job_hours=1000)
    assert len(explore.search(candidates, epoch_time, 1.0, 0.0, budget).trials) == 3


def test_stops_when_a_trial_is_worth_less_than_it_costs():
    """A job as short as a trial cannot pay for a second trial; a long one makes the search look further."""
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    short = explore.search(candidates, epoch_time, 0.5, 0.5, Budget(math.inf, math.inf, 10, job_hours=10 / 60))
    long = explore.search(candidates, epoch_time, 0.5, 0.5, Budget(math.inf, math.inf, 10, job_hours=100))
    assert short.reason == "another trial is expected to save less than it costs"
    assert len(short.trials) < len(long.trials)


def test_failed_trials_are_not_retried_and_no_success_says_so():
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    broken = {c for c in CONFIGS if c.instance_type == "big"}

    def run(config: Config) -> float | None:
        return None if config in broken else epoch_time(config)

    result = explore.search(candidates, run, 1.0, 0.0, ROOMY)
    tried = [t.config for t in result.trials]
    assert len(tried) == len(set(tried))
    assert result.chosen is not None and result.chosen not in broken
    nothing = explore.search(candidates, lambda c: None, 1.0, 0.0, Budget(math.inf, 40, 10, 10))
    assert nothing.chosen is None and nothing.reason.startswith("no trial succeeded")
    assert len(nothing.trials) == 4  # until the minutes ran out, each configuration once


def test_history_shapes_the_prior_but_is_never_a_measurement():
    """Other workloads' records move the belief before any trial, yet the choice is always among this workload's
    own trials (one at least), even when history holds this very grid's times."""
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    history = [HistoryRecord(name, c, epoch_time(c, work)) for name, work in (("a", 5000.0), ("b", 3000.0))
               for c in CONFIGS]  # fmt: skip
    prior = explore.fit_prior(history, CATALOG)
    assert prior.slopes
    without, with_history = explore.belief(candidates, []), explore.belief(candidates, [], prior)
    assert len(set(without.mean)) == 1 and len(set(with_history.mean)) > 1
    result = explore.search(candidates, epoch_time, 1.0, 0.0, ROOMY, prior)
    assert result.trials and result.chosen in {t.config for t in result.trials if t.epoch_time_s}
    first = explore.next_step(candidates, [], 1.0, 0.0, ROOMY, prior)
    assert first.chosen is None  # nothing measured yet: history chose nothing


def test_a_history_the_trials_contradict_is_dropped():
    """Other code that slowed down with more workers predicts this one wrongly: once three trials show otherwise,
    the belief is the one without history."""
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    history = [HistoryRecord(name, c, level * c.workers) for name, level in (("a", 10.0), ("b", 3.0)) for c in CONFIGS]
    prior = explore.fit_prior(history, CATALOG)
    trials = [Trial(c, epoch_time(c)) for c in CONFIGS if c.instance_type == "small" and c.ps_type == "ps-fast"][:3]
    assert explore.belief(candidates, trials[:2], prior) != explore.belief(candidates, trials[:2])
    assert explore.belief(candidates, trials, prior) == explore.belief(candidates, trials)


@pytest.mark.parametrize(
    ("workloads", "teaches"),
    [
        ({"a": lambda c: epoch_time(c, 5000.0)}, False),  # one workload: whether it transfers cannot be checked
        ({"a": lambda c: epoch_time(c, 5000.0), "b": lambda c: epoch_time(c, 3000.0)}, True),  # alike: it does
        ({"a": lambda c: 10.0 * c.workers, "b": lambda c: 100.0 / c.workers}, False),  # opposite: it does not
    ],
)
def test_history_must_predict_itself_to_count(workloads, teaches):
    history = [HistoryRecord(name, c, time(c)) for name, time in workloads.items() for c in CONFIGS]
    assert bool(explore.fit_prior(history, CATALOG).slopes) is teaches


@pytest.mark.parametrize("made", [3, 4, 6, 8])
def test_history_may_steer_but_never_end_the_search(made):
    """Whenever the search with history stops on value, the belief without history stops there too."""
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    history = [HistoryRecord(name, c, epoch_time(c, work)) for name, work in (("a", 9.0), ("b", 10.0))
               for c in CONFIGS]  # fmt: skip
    prior = explore.fit_prior(history, CATALOG)
    trials = [Trial(c, epoch_time(c)) for c in CONFIGS[::5][:made]]
    stops = "another trial is expected to save less than it costs"
    short = Budget(math.inf, math.inf, 10, job_hours=1)
    steered = explore.next_step(candidates, trials, 0.5, 0.5, short, prior)
    alone = explore.next_step(candidates, trials, 0.5, 0.5, short)
    assert steered.reason != stops or alone.reason == stops


def test_the_whole_configuration_is_chosen_ps_type_included():
    """The issue's case: four types × eight worker counts, each with a PS of its own type, the cheapest asked. One
    worker of the largest type costs 60 % more than a few small ones (the PS's price is spread over the workers):
    the search must choose the cluster whole, not one type's runs."""
    catalog = {
        f"t{size}": InstanceSpec(f"t{size}", 0.05 * size, "any", vcpu=2 * size, network_mbps=500 * size)
        for size in (1, 2, 4, 8)
    }
    configs = [Config(t, t, n, "ps", 0.0) for t in catalog for n in range(1, 9)]

    def time(config: Config) -> float:
        spec = catalog[config.instance_type]
        return 1.0 + 2000.0 / (config.workers * spec.vcpu) + config.workers * 100.0 / spec.network_mbps

    candidates = explore.make_candidates(configs, catalog)
    result = explore.search(candidates, time, *explore.PRESETS["cheapest"], ROOMY)
    cost = {c.config: time(c.config) * c.hourly_price for c in candidates}
    assert result.chosen != Config("t8", "t8", 1, "ps", 0.0)
    assert cost[result.chosen] <= 1.05 * min(cost.values())
    assert cost[Config("t8", "t8", 1, "ps", 0.0)] > 1.4 * min(cost.values())


def test_the_best_measured_is_chosen_by_its_mean_run():
    candidates = explore.make_candidates(CONFIGS[:2], CATALOG)
    a, b = CONFIGS[0], CONFIGS[1]
    trials = [Trial(a, 10.0), Trial(b, 6.0), Trial(b, None)]
    assert explore.best_measured(candidates, trials, 1.0, 0.0)[0].config == b


def test_weights_must_mean_something():
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    with pytest.raises(ValueError, match="alpha and beta"):
        explore.next_step(candidates, [], 0.0, 0.0, ROOMY)


def test_benchmark_json_is_one_object(tmp_path):
    grid = tmp_path / "grid.csv"
    rows = ["workload,instance_type,ps_type,workers,batch_size,latency_ms,epoch_time_s,strategy"]
    for workload, work in (("a", 2000.0), ("b", 6000.0)):
        for config in CONFIGS[:12]:
            rows.append(f"{workload},{config.instance_type},{config.ps_type},{config.workers},32,0,"
                        f"{epoch_time(config, work):.4f},ps")  # fmt: skip
    rows.append("a,small,ps-slow,3,32,0,,ps")  # a failed run: a configuration that only ever fails
    grid.write_text("\n".join(rows) + "\n")
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"name": "t", "types": [vars(s) for s in CATALOG.values()]}))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "explore.py"), "--grid", str(grid), "--catalog", str(catalog),
         "--seeds", "2", "--transfer", "--at-once", "2", "--json"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    )  # fmt: skip
    result = json.loads(out.stdout)  # one object and nothing else
    assert isinstance(result, dict)
    keys = {"instance_type", "ps_type", "workers", "strategy", "latency_ms"}
    mine = [s for s in result["searches"] if s["method"] == "explore"]
    assert {(s["workload"], s["seed"]) for s in mine} == {("a@B=32", 0), ("a@B=32", 1), ("b@B=32", 0), ("b@B=32", 1)}
    for s in result["searches"]:
        assert set(s["chosen"]) == keys and all(keys <= set(t) for t in s["trials"])
    assert set(result["summary"]) == {"explore", "random", "cherrypick"}
    # two at once: a search's minutes are a window a batch, fewer than a window a trial
    assert result["at_once"] == 2 and all(len(s["trials"]) * 10 >= s["minutes"] > 0 for s in mine)
    assert any(len(s["trials"]) * 10 > s["minutes"] for s in mine)
    assert all(m["median_minutes"] > 0 for m in result["summary"].values())
    assert result["unpriced_types"] == []


@pytest.mark.parametrize(
    ("spent_dollars", "spent_minutes", "stops"),
    [
        (None, None, False),  # the trials' own sum: 1 trial of a 40-minute, $10 budget
        (0.0, 0.0, False),  # earlier jobs' records cost this search nothing
        (10.0, 0.0, True),  # the dollars are spent
        (0.0, 35.0, True),  # the minutes are spent
    ],
)
def test_spent_overrides_the_sum_over_trials(spent_dollars, spent_minutes, stops):
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    trials = [Trial(CONFIGS[0], epoch_time(CONFIGS[0]))]
    step = explore.next_step(
        candidates, trials, 1.0, 0.0, Budget(10.0, 40.0, 10, 1000),
        spent_dollars=spent_dollars, spent_minutes=spent_minutes,
    )  # fmt: skip
    assert (step.reason == "the next trial would overrun the search budget") is stops


def test_search_counts_what_was_spent_before_it():
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    budget = Budget(dollars=math.inf, minutes=30, window_minutes=10, job_hours=1000)
    assert len(explore.search(candidates, epoch_time, 1.0, 0.0, budget, spent_minutes=20).trials) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# a comment\nworkload,instance_type,workers,epoch_time_s\nw,small,1,2.0\n", ("csv", None)),
        ("# a comment\n4,64000,0,,419,\n", ("anwar2021", "grid")),
    ],
)
def test_benchmark_tells_the_grid_formats_apart(tmp_path, text, expected):
    from benchmarks.explore import grid_format

    grid = tmp_path / "grid.csv"
    grid.write_text(text)
    assert grid_format(grid) == expected
    assert grid_format(ROOT / "recommender" / "data" / "anwar2021-table4.csv") == ("anwar2021", "anwar2021-mnist")


# --- trials at once (next_step's width) ---------------------------------------------------------------------------

MEASURED = [Trial(c, epoch_time(c)) for c in CONFIGS[::7]]  # five measured configurations across the grid
FAILED = [Trial(CONFIGS[1], None), Trial(CONFIGS[20], None)]


@pytest.mark.parametrize("trials", [[], MEASURED[:1], MEASURED, MEASURED + FAILED])
def test_a_width_of_one_is_the_search_of_one_trial_at_a_time(trials):
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    one = explore.next_step(candidates, trials, 0.5, 0.5, ROOMY, width=1)
    assert one == explore.next_step(candidates, trials, 0.5, 0.5, ROOMY) and one.also == ()
    assert explore.search(candidates, epoch_time, 0.5, 0.5, ROOMY, width=1).trials == (
        explore.search(candidates, epoch_time, 0.5, 0.5, ROOMY).trials
    )


@pytest.mark.parametrize("width", [2, 3, 5])
@pytest.mark.parametrize("trials", [[], MEASURED[:1], MEASURED, MEASURED + FAILED])
def test_a_batch_holds_distinct_untried_configurations(width, trials):
    """Never the same configuration twice, never one tried, failed or under way; the first is the one-trial rule's."""
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    under_way = [CONFIGS[30]]
    step = explore.next_step(candidates, trials, 0.5, 0.5, ROOMY, width=width, pending=under_way)
    assert len(set(step.batch)) == len(step.batch) <= width
    if sum(1 for t in trials if t.epoch_time_s) < explore.FIT_FROM_TRIALS:  # no value rule yet: a full batch
        assert len(step.batch) == width
    assert not set(step.batch) & ({t.config for t in trials} | set(under_way))
    assert explore.next_step(candidates, trials, 0.5, 0.5, ROOMY, width=width).proposal == (
        explore.next_step(candidates, trials, 0.5, 0.5, ROOMY).proposal
    )


@pytest.mark.parametrize(
    ("dollars", "minutes", "width", "batches"),
    [
        (math.inf, 30, 3, 3),  # minutes are wall-clock: three windows, three trials in each
        (math.inf, 30, 1, 3),
        (0.5, math.inf, 3, None),  # dollars are the sum over every trial of every batch
        (2.0, 20, 4, None),  # both: two windows at most, and $2 over every trial
    ],
)
def test_a_batch_fits_the_budget_with_the_others(dollars, minutes, width, batches):
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    budget = Budget(dollars, minutes, window_minutes=10, job_hours=1000)
    result = explore.search(candidates, epoch_time, 1.0, 0.0, budget, width=width)
    priced = {c.config: c for c in candidates}
    assert result.spent_dollars == pytest.approx(
        sum(explore.trial_cost(priced[t.config], budget) for t in result.trials)
    )
    assert result.spent_dollars <= dollars + 1e-9 and result.spent_minutes <= minutes
    if batches is not None:
        assert result.spent_minutes == batches * 10 and len(result.trials) == batches * width


def test_a_batch_stops_where_a_trial_is_not_worth_it():
    """A short job pays for few trials: each extra one must be worth its cost on its own, so a batch may be short."""
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    short = Budget(math.inf, math.inf, 10, job_hours=10 / 60)
    alone = explore.next_step(candidates, MEASURED, 0.5, 0.5, short)
    batch = explore.next_step(candidates, MEASURED, 0.5, 0.5, short, width=4)
    assert alone.proposal is None and batch.batch == ()


@pytest.mark.parametrize("trials", [[], MEASURED[:2], MEASURED])
def test_pending_trials_shrink_the_uncertainty_near_them_and_leave_the_mean(trials):
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    under_way = [CONFIGS[12], CONFIGS[25]]
    before, after = explore.belief(candidates, trials), explore.belief(candidates, trials, pending=under_way)
    assert after.mean == pytest.approx(before.mean, abs=1e-6)
    assert all(a <= b + 1e-9 for a, b in zip(after.sd, before.sd, strict=True))
    index = {c.config: i for i, c in enumerate(candidates)}
    for config in under_way:
        assert after.sd[index[config]] < before.sd[index[config]]


def test_a_batch_search_takes_fewer_windows():
    candidates = explore.make_candidates(CONFIGS, CATALOG)
    one = explore.search(candidates, epoch_time, 0.5, 0.5, ROOMY)
    three = explore.search(candidates, epoch_time, 0.5, 0.5, ROOMY, width=3)
    _, scores = best(0.5, 0.5)
    assert scores[three.chosen] / min(scores.values()) - 1 <= 0.05
    assert three.spent_minutes < one.spent_minutes
    with pytest.raises(ValueError, match="at least one trial"):
        explore.next_step(candidates, [], 0.5, 0.5, ROOMY, width=0)


@pytest.mark.parametrize(("cap", "under_way"), [(40, []), (40, [CONFIGS[4]]), (16, []), (130, [CONFIGS[7]])])
def test_a_batch_keeps_its_workers_within_the_providers_limit(cap, under_way):
    """The trials under way hold workers too: the batch's and theirs together stay within the cap."""
    candidates = explore.make_candidates([c for c in CONFIGS if c.workers <= cap], CATALOG)
    trials = [Trial(c, epoch_time(c)) for c in (CONFIGS[0], CONFIGS[10])]
    step = explore.next_step(candidates, trials, 0.5, 0.5, ROOMY, width=4, pending=under_way, max_workers=cap)
    assert step.batch and sum(c.workers for c in (*step.batch, *under_way)) <= cap
