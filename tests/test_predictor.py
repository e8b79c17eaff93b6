"""The predictor (recommender/perfmodel/predictor.py: the fitted family as the mean, scikit-learn's Gaussian process
on its log residuals, a split-conformal interval) on the shipped grids — Anwar et al.'s Table 4, the grid constructed
from it (not measured: see benchmarks/model_calibration.py) and the lab's two — and on sparse or odd records; the one
rule that chooses; the lookup that uses it; failed runs as information; the answer's sentence and its why."""

from __future__ import annotations

import csv
import doctest
import importlib
import json
import math
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from recommender import service
from recommender.algorithms import recommend
from recommender.perfdata import parse_anwar2021
from recommender.perfmodel import predict_fallback, recommend_model
from recommender.perfmodel.calibration import holdout_report
from recommender.perfmodel.choice import _alike, choose
from recommender.perfmodel.predictor import predictor
from recommender.types import Candidate, InstanceSpec, PerfRecord, RecommendationError, RecommendRequest

DATA = Path(__file__).resolve().parent.parent / "recommender" / "data"
CATALOGS = DATA.parent / "catalogs"
ANWAR = "anwar2021-mnist"


def read(name: str) -> tuple[PerfRecord, ...]:
    """A shipped anwar2021 file as the service layer hands records to the algorithms."""
    rows = parse_anwar2021((DATA / name).read_text(), ANWAR)
    return tuple(PerfRecord(**{f: getattr(row, f) for f in PerfRecord.__dataclass_fields__}) for row in rows)


TABLE4 = read("anwar2021-table4.csv")
GRID = read("anwar2021-constructed-grid.csv")


def without(records, **held_out) -> tuple[PerfRecord, ...]:
    return tuple(r for r in records if not all(getattr(r, k) == v for k, v in held_out.items()))


def lookup(records, batch_size: int, latency_ms: float, **fields):
    """`recommend --algorithm lookup` as the service runs it: the predictor answers where nothing matches."""
    request = RecommendRequest("lookup", workload=ANWAR, batch_size=batch_size, latency_ms=latency_ms,
                               parameter_server=False, **fields)  # fmt: skip
    return recommend(request, (), records, predict=lambda r: predict_fallback(r, (), records))


def test_the_constructed_grid_says_what_it_is_and_holds_table_4_exactly():
    assert (DATA / "anwar2021-constructed-grid.csv").read_text().startswith("# CONSTRUCTED, NOT MEASURED")
    table = {(r.workers, r.batch_size, r.latency_ms): r.epoch_time_s for r in TABLE4}
    grid = {(r.workers, r.batch_size, r.latency_ms): r.epoch_time_s for r in GRID}
    assert all(grid[key] == time_s for key, time_s in table.items())  # the failed 1 × 64,000 run too
    assert len(grid) == 4 * 6 * 6 and sum(t is None for t in grid.values()) == 6  # one machine, 64,000, each latency


def lab_grid(name: str) -> tuple[PerfRecord, ...]:
    """A grid measured on the lab here (recommender/data/NAME)."""
    return tuple(
        PerfRecord(r["workload"], r["instance_type"], r["ps_type"], int(r["workers"]), int(r["batch_size"]),
                   float(r["latency_ms"]), float(r["epoch_time_s"]), strategy=r["strategy"])
        for r in csv.DictReader(line for line in (DATA / name).read_text().splitlines() if not line.startswith("#"))
    )  # fmt: skip


LAB_GRID = lab_grid("lab-digits-grid.csv")  # all-reduce
LAB_PS_GRID = lab_grid("lab-digits-ps-grid.csv")  # the same workload through a parameter server


# --- what an estimate is ----------------------------------------------------------------------------------------------


def test_where_a_configuration_ran_the_estimate_is_its_runs_and_elsewhere_a_median_with_an_interval():
    model = predictor(TABLE4, cross_validate=False)
    queries = [("", 4, 64000, 0.0), ("", 1, 2560, 100.0), ("", 3, 48000, 0.0), ("", 1, 64000, 40.0), ("", 3, 6400, 20)]
    measured, latency_free, between, failed, off = model.estimate_many(queries)
    assert (measured.basis, measured.epoch_time_s, measured.detail) == ("measured", 419, "measured here (1 run)")
    # One machine sends nothing over the network: its 0 ms run stands at any latency.
    assert (latency_free.basis, latency_free.epoch_time_s) == ("measured", 39)
    assert failed is None  # the one machine only ever failed at 64,000 (§6.2): no estimate, at any latency
    assert model.refusal("", 1, 64000, 40.0) == "a run of it failed at this point"  # one machine's latency is none
    for estimate in (between, off):
        assert estimate.basis == "predicted" and "Gaussian process" in estimate.detail
        low, high = estimate.interval
        assert low < estimate.epoch_time_s < high and estimate.expected_error == pytest.approx(
            high / estimate.epoch_time_s - 1
        )
    assert 265 < between.epoch_time_s < 503  # between three workers' runs at 32,000 and 64,000


def test_near_the_runs_the_process_follows_them_and_far_from_them_the_mean():
    """On the lab's PS grid: at a measured point the estimate is the runs' and its uncertainty a fraction of what it
    is at 64 workers (16 × the largest count measured), where the process has come back to its prior."""
    model = predictor(LAB_PS_GRID, cross_validate=False)
    near, far = model.estimate_many([("lab-w-1g", 3, 64, 20.0), ("lab-w-1g", 64, 64, 20.0)])
    assert near.basis == "measured" and far.basis == "predicted"
    assert near.std_log < far.std_log


def test_far_from_every_run_an_estimate_is_as_unsure_as_the_residuals_are_wide():
    """A cliff the runs show (the fourth worker's link collapses): between three measured counts and the cliff, an
    estimate carries the residuals' spread; on the same runs without the cliff it is as sure as the runs. The choice
    by the interval's upper end then keeps the measured count rather than trust the estimate."""

    def runs(cliff: float) -> tuple[PerfRecord, ...]:
        return tuple(
            PerfRecord("w", "t", "p", n, b, lat, (20 + 120 / n + lat * n / 4) * (cliff if n >= 4 else 1.0) * f,
                       strategy="ps")
            for n in (1, 2, 4, 5) for b in (32, 64) for lat in (0.0, 20.0) for f in (0.97, 1.03)
        )  # fmt: skip

    smooth, cliff = predictor(runs(1.0)), predictor(runs(2.5))
    for b, lat in ((32, 0.0), (64, 20.0)):
        calm, steep = smooth.estimate("t", 3, b, lat), cliff.estimate("t", 3, b, lat)
        assert steep.interval[1] / steep.interval[0] > 1.5 * calm.interval[1] / calm.interval[0]


def test_without_a_run_of_one_machine_an_all_reduce_workload_has_no_one_machine_candidate_and_says_why():
    """The lab's all-reduce runs of 2 and 3 machines only: every one of them pays the collectives on each step, so
    nothing tells one machine's computing apart from them. One machine is no candidate, and the answer says why; with
    one run of it, it is one again."""
    several = without(LAB_GRID, workers=1)
    model = predictor(several)
    assert model.one_machine_unknown
    assert model.estimate("lab-w-1g", 1, 64, 20.0) is None
    assert model.estimate("lab-w-1g", 2, 64, 25.0) is not None
    request = RecommendRequest("model", workload="lab-digits-grid", batch_size=64, latency_ms=20.0, max_workers=3,
                               parameter_server=False)  # fmt: skip
    answer = recommend_model(request, (InstanceSpec("lab-w-1g", 0.01, vcpu=1),), several)
    assert answer.workers in (2, 3) and {c.workers for c in answer.candidates} == {2, 3}
    assert any("one machine is no candidate: no run measured one" in line for line in answer.extra["why"])
    one = next(r for r in LAB_GRID if r.workers == 1)
    assert not predictor((*several, one)).one_machine_unknown
    assert not predictor(without(LAB_PS_GRID, workers=1)).one_machine_unknown  # through a PS it pays the latency


def test_repeats_set_the_noise():
    """Four runs of each cell of a smooth grid, each × exp(N(0, 0.1²)): a run's noise is their spread about their
    cells' means — pooled for a run's interval, each cell's own for its alpha — not the residuals' shape."""
    rng = np.random.default_rng(5)
    runs = [
        PerfRecord("w", "t", workers=n, batch_size=b, latency_ms=lat, strategy="mirrored",
                   epoch_time_s=(10 + 200 / n + 4000 / b * (1 + 0.01 * lat * np.log2(n))) * np.exp(rng.normal(0, 0.1)))
        for n in (1, 2, 4) for b in (64, 256) for lat in (0.0, 20.0, 40.0) for _ in range(4)
    ]  # fmt: skip
    cells = defaultdict(list)
    for r in runs:
        cells[(r.workers, r.batch_size, r.latency_ms)].append(math.log(r.epoch_time_s))
    spread = math.sqrt(np.mean([np.var(times, ddof=1) for times in cells.values()]))  # the runs' own: 0.088
    model = predictor(runs, cross_validate=False)
    assert model.noise_log == pytest.approx(spread, rel=0.05)  # pooled: weighted by each cell's degrees of freedom
    own = {row: float(np.std(np.log(t), ddof=1)) for row, t in model.runs.items()}  # each cell's own repeats
    alpha = sorted(v**2 / len(model.runs[row]) + 1e-10 for row, v in own.items())  # each cell's mean's
    assert sorted(model.gp.alpha) == pytest.approx(alpha)


# --- the intervals on the shipped grids -------------------------------------------------------------------------------


@pytest.mark.parametrize("records", [GRID, LAB_GRID, LAB_PS_GRID], ids=["constructed", "lab", "lab-ps"])
def test_the_80_percent_interval_holds_about_80_percent_of_held_out_runs(records):
    """Each latency, batch size and worker count of a shipped grid held out in turn and predicted from the rest, the
    predictor rebuilt as the recommender builds it (mean, process and its own conformal calibration refitted): the
    80 % intervals hold 65–95 % of the held-out runs, counted over the three axes together (the runs of one held-out
    value err together; benchmarks/model_calibration.py prints each grid and axis)."""
    inside = timed = 0
    for group_by in ("latency", "batch_size", "workers"):
        report = holdout_report(records, group_by=group_by)
        inside += round(report["coverage"] * report["predicted"])
        timed += report["predicted"]
    assert 0.65 <= inside / timed <= 0.95


def test_the_predictors_own_cross_validation_says_what_it_is_worth():
    model = predictor(TABLE4)
    assert model.cv.startswith("2 latencies, 4 batch sizes, 4 worker counts, each held out in turn: ")
    assert model.overall_error == model.cv_mape and 0 < model.cv_mape < 0.5
    assert 0 <= model.cv_coverage <= 1 and model.q > 0
    # Two latencies: either held out leaves runs at one latency, which price no other (the guards), so neither scores.
    assert "latency" not in {axis for _, _, axis in model.cv_pairs}


def test_one_step_past_the_measured_latencies_the_family_carries_the_trend():
    """The lab's PS grid without its 40 ms runs, asked for batch size 256 at 40 ms: the roofline's latency terms carry
    the runs' trend one step on, and the choice keeps three workers (measured there: three 1.1 s, four 1.3 s)."""
    request = RecommendRequest("lookup", workload=LAB_PS_GRID[0].workload, batch_size=256, latency_ms=40.0)
    answer = predict_fallback(request, (), without(LAB_PS_GRID, latency_ms=40.0))
    assert answer.workers == 3 and answer.source == "predicted"
    low, high = answer.extra["interval_s"]
    assert high / low < 2  # one step past the runs: unsure, not unbounded


def test_table_4_held_out_chooses_within_3_percent():
    """Each batch size of Table 4 held out: every choice answered, each the measured best."""
    report = holdout_report(TABLE4, group_by="batch_size")
    assert report["cells_answered"] == 1.0 and report["mean_regret"] <= 0.03 and report["best_found"] >= 0.85


@pytest.mark.parametrize("records", [LAB_GRID, TABLE4], ids=["all-reduce", "table4"])
def test_a_worker_count_held_out_is_chosen_against_the_others_measurements(records):
    """Leaving one worker count out asks what the recommender asks when nobody measured that count: the model's
    prediction of it against the other counts' measurements at the same point."""
    report = holdout_report(records, group_by="workers", method="model")
    measured = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.epoch_time_s is not None:
            measured[(r.batch_size, r.latency_ms)][r.workers].append(r.epoch_time_s)
    cells = {key: {n: np.mean(t) for n, t in counts.items()} for key, counts in measured.items() if len(counts) > 1}
    predicted = defaultdict(list)  # (batch, latency, workers) -> the held-out runs' predictions
    for p in report["pairs"]:
        predicted[(p["batch_size"], p["latency_ms"], p["workers"])].append(p["predicted_s"])
    regrets, found = [], []
    for (batch, latency, workers), times in predicted.items():
        key = (batch, latency)
        if key not in cells:
            continue
        cell, runs = cells[key], measured[key]
        candidates = cell | {workers: np.mean(times)}
        pick = min(candidates, key=lambda n: (candidates[n], n))
        regrets.append(cell[pick] / min(cell.values()) - 1)
        found.append(min(runs[pick]) <= max(runs[min(cell, key=cell.get)]))  # as fast as the best, by its runs
    assert report["cells"] == sum(len(cell) for cell in cells.values()) == len(regrets)
    assert report["mean_regret"] == pytest.approx(np.mean(regrets))
    assert report["best_found"] == pytest.approx(np.mean(found))


# --- sparse and odd records: an answer or a refusal with its reason, never another exception -------------------------


def runs(*rows, strategy="mirrored", workload=ANWAR) -> tuple[PerfRecord, ...]:
    """(workers, batch size, latency ms, epoch time s or None) rows as records."""
    return tuple(PerfRecord(workload, "", workers=n, batch_size=b, latency_ms=lat, epoch_time_s=t, strategy=strategy)
                 for n, b, lat, t in rows)  # fmt: skip


SPARSE = {
    "one run": runs((2, 64, 0.0, 10.0)),
    "two runs": runs((1, 64, 0.0, 12.0), (2, 64, 0.0, 8.0)),
    "three runs": runs((1, 64, 0.0, 12.0), (2, 64, 0.0, 8.0), (2, 128, 0.0, 6.0)),
    "duplicates": runs(*[(2, 64, 0.0, 10.0)] * 5),
    "one cluster shape": runs(*[(3, b, lat, 5 + b / 100 + lat / 10) for b in (32, 64, 128) for lat in (0.0, 20.0)]),
    "one latency": runs(*[(n, b, 20.0, 5 + 100 / n + b / 50) for n in (1, 2, 4) for b in (32, 64)]),
    "ties": runs(*[(n, b, lat, 10.0) for n in (1, 2) for b in (32, 64) for lat in (0.0, 10.0)]),
    "failed runs only": runs((1, 64, 0.0, None), (2, 64, 0.0, None)),
    "no batch size": runs((1, None, 0.0, 12.0), (2, None, 0.0, 8.0), (4, None, 0.0, 7.0), (4, None, 20.0, 9.0)),
    "through a PS": runs(*[(n, 64, lat, 3 + 10 / n + lat / 5) for n in (1, 2) for lat in (0.0, 20.0)], strategy="ps"),
}
ASKED = [
    {"batch_size": 64, "latency_ms": 0.0},
    {"batch_size": 64, "latency_ms": 10.0},
    {"batch_size": 4096, "latency_ms": 100.0, "max_workers": 8},
    {},
]


@pytest.mark.parametrize("asked", ASKED, ids=["measured", "between", "far", "defaults"])
@pytest.mark.parametrize("name", SPARSE)
def test_sparse_records_give_an_answer_or_a_refusal_with_its_reason(name, asked):
    records = SPARSE[name]
    for algorithm, answer in (("model", recommend_model), ("lookup", predict_fallback)):
        request = RecommendRequest(algorithm, workload=ANWAR, parameter_server=name == "through a PS", **asked)
        try:
            got = answer(request, (), records)
        except RecommendationError as refusal:
            assert str(refusal), (name, algorithm)
            continue
        assert got.workers >= 1 and got.predicted_epoch_time_s > 0 and got.explanation
        json.dumps(service.as_dict(got), allow_nan=False)
        for c in got.candidates:
            assert c.epoch_time_s > 0 and c.interval_s[0] <= c.epoch_time_s <= c.interval_s[1]


def _records():
    """Any few records a workload may hold: one or two worker types, a PS or not, odd and missing values, failed
    runs, repeats, times from a millisecond to a day."""
    row = st.tuples(
        st.sampled_from(["", "a", "b"]),
        st.sampled_from([1, 2, 3, 4, 8]),
        st.sampled_from([None, 16, 64, 256]),
        st.sampled_from([None, 0.0, 10.0, 40.0]),
        st.one_of(st.none(), st.floats(1e-3, 1e5)),
    )
    strategy = st.sampled_from(["mirrored", "ps", ""])

    def records(rows, strategy):
        ps_type = "p" if strategy == "ps" else ""
        return tuple(PerfRecord(ANWAR, t, ps_type, n, b, lat, time, strategy=strategy) for t, n, b, lat, time in rows)

    return st.builds(records, st.lists(row, min_size=1, max_size=12), strategy)


ANY_CATALOG = (InstanceSpec("a", 0.5), InstanceSpec("b", 2.0, gpus=1), InstanceSpec("p", 1.0, role="ps"))


# The same examples on every run (derandomize): CI's answer does not depend on the draw. Searched further by hand
# with max_examples in the thousands.
@hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
@hypothesis.given(
    records=_records(),
    batch=st.sampled_from([None, 16, 100, 4096]),
    latency=st.sampled_from([None, 0.0, 25.0, 400.0]),
    limit=st.sampled_from([{"max_workers": 1}, {"max_workers": 6}, {"budget": 0.4}, {"budget": 5.0}]),
    weights=st.sampled_from([(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)]),
    parameter_server=st.sampled_from([True, False, None]),
    types=st.sampled_from([{}, {"worker_type": "b"}, {"worker_types": ("a", "z")}, {"ps_type": "p"}]),
)
def test_any_records_give_an_answer_or_a_refusal_with_its_reason(
    records, batch, latency, limit, weights, parameter_server, types
):
    """What the fixed sparse cases above do not reach: records drawn at random (hypothesis) through both doors. It
    found an interval rounded to microseconds: a time a model extrapolated to 1e-9 s had the interval (0, 0), and the
    choice divided by it."""
    alpha, beta = weights
    for algorithm, answer in (("model", recommend_model), ("lookup", predict_fallback)):
        request = RecommendRequest(algorithm, workload=ANWAR, batch_size=batch, latency_ms=latency, alpha=alpha,
                                   beta=beta, parameter_server=parameter_server, **limit, **types)  # fmt: skip
        try:
            got = answer(request, ANY_CATALOG, records)
        except RecommendationError as refusal:
            assert str(refusal)
            continue
        assert 1 <= got.workers <= limit.get("max_workers", 256) and got.predicted_epoch_time_s > 0
        assert got.explanation and not re.search(r"\b(nan|inf|None)\b", got.explanation, re.IGNORECASE)
        json.dumps(service.as_dict(got), allow_nan=False)
        for c in got.candidates:
            assert 0 < c.interval_s[0] <= c.epoch_time_s <= c.interval_s[1] < math.inf


def test_without_a_model_the_predictor_answers_only_within_the_runs():
    model = predictor(SPARSE["three runs"], cross_validate=False)
    assert model.model is None and "Too few performance records" in model.model_error
    inside, beyond = model.estimate_many([("", 2, 96, 0.0), ("", 8, 64, 0.0)])
    assert inside is not None and beyond is None
    with pytest.raises(RecommendationError, match="No performance record with an epoch time"):
        predictor(SPARSE["failed runs only"])


def test_an_axis_measured_at_one_value_prices_no_other():
    """Runs of one worker count cannot tell a cluster's computing from its fixed costs, nor runs at one latency what
    latency costs. Such configurations are no candidates, and the answer says so; with none left, a refusal says
    what to measure."""
    answer = recommend_model(
        RecommendRequest("model", workload=ANWAR, batch_size=64, latency_ms=0.0, max_workers=8),
        (),
        SPARSE["one cluster shape"],
    )
    assert answer.workers == 3 and [c.workers for c in answer.candidates] == [3]
    one = "no run measured one machine, and the runs of several cannot tell its computing from their collectives"
    assert answer.extra["not_estimated"] == {"the runs measured only 3 workers": 6, one: 1}
    assert f"Not estimated: 1 because {one}; 6 because the runs measured only 3 workers (measure a run" in " ".join(
        answer.extra["why"]
    )
    # All-reduce runs at 20 ms only, asked at 0 ms: one machine, which sends nothing, is the only estimate.
    request = RecommendRequest("model", workload=ANWAR, batch_size=64, latency_ms=0.0)
    answer = recommend_model(request, (), SPARSE["one latency"])
    assert answer.workers == 1 and [c.workers for c in answer.candidates] == [1]
    # Through a PS one worker pays the latency too: nothing left to answer with.
    at_20_ms = tuple(replace(r, latency_ms=20.0) for r in SPARSE["one latency"] if r.workers > 1)
    ps = tuple(replace(r, strategy="ps") for r in at_20_ms + runs((3, 32, 20.0, 40.0), (3, 64, 20.0, 39.0)))
    with pytest.raises(RecommendationError, match="the runs measured only 20 ms latency.*measure a run there"):
        predict_fallback(replace(request, algorithm="lookup"), (), ps)
    # Table 4 without its 20 ms runs prices no 20 ms cluster.
    assert predictor(without(TABLE4, latency_ms=20.0)).estimate("", 2, 6400, 20.0) is None


def test_duplicates_are_repeats_of_one_measurement():
    estimate = predictor(SPARSE["duplicates"], cross_validate=False).estimate("", 2, 64, 0.0)
    assert (estimate.basis, estimate.epoch_time_s, estimate.detail) == ("measured", 10.0, "measured here (5 runs)")


# --- the one rule -----------------------------------------------------------------------------------------------------


def test_the_choice_is_the_least_upper_bound_then_the_cheaper_then_the_name():
    sure = Candidate("a", 2, 10.0, 1.0, "measured", interval_s=(9.8, 10.2), judged_s=10.2)
    unsure = Candidate("a", 4, 9.5, 2.0, "predicted", interval_s=(7.0, 12.9), judged_s=12.9)
    slow = Candidate("a", 1, 20.0, 0.5, "measured", interval_s=(19.5, 20.5), judged_s=20.5)
    assert choose([sure, unsure, slow], 1.0, 0.0) is sure  # faster on its median, but not by its uncertainty
    assert _alike([sure, unsure, slow], sure) == [unsure]
    assert choose([sure, unsure, slow], 0.0, 1.0) is slow
    # The same estimate through three PS types: the cheaper PS, then the first name, whatever the order.
    through = [
        replace(sure, ps_type="ps-b", hourly_cost=1.5),
        replace(sure, ps_type="ps-c"),
        replace(sure, ps_type="ps-a"),
    ]
    assert choose(through, 1.0, 0.0).ps_type == choose(through[::-1], 1.0, 0.0).ps_type == "ps-a"


def test_the_same_estimate_gets_the_same_ps_with_or_without_a_worker_limit():
    """The issue's bug: the model chose lab-ps-1g without a worker limit and lab-ps-450 with one, for the same time.
    One rule: the PS types the runs went through, the cheaper of those estimated alike, limit or none."""
    catalog = [InstanceSpec(**row) for row in json.loads((CATALOGS / "lab.json").read_text())["types"]]
    records = tuple(replace(r, ps_type="lab-ps-1g") for r in LAB_PS_GRID)
    asked = RecommendRequest("model", "lab-digits-grid", batch_size=64, latency_ms=20.0, worker_type="lab-w-1g")
    free, limited = (recommend_model(replace(asked, **limit), catalog, records) for limit in ({}, {"max_workers": 4}))
    assert free.ps_type == limited.ps_type == "lab-ps-1g"  # the PS the runs went through: nothing tells another's
    anywhere = tuple(replace(r, ps_type="") for r in records)  # runs that name no PS: every PS alike, the cheapest
    cheapest = min((s for s in catalog if s.role in ("ps", "any")), key=lambda s: (s.hourly_price, s.name))
    picked = {recommend_model(replace(asked, **limit), catalog, anywhere).ps_type for limit in ({}, {"max_workers": 4})}
    assert picked == {cheapest.name}
    assert free.predicted_epoch_time_s == pytest.approx(limited.predicted_epoch_time_s)


def test_an_answer_names_the_configurations_it_cannot_tell_apart():
    answer = recommend_model(RecommendRequest("model", workload=ANWAR, batch_size=2560, latency_ms=50.0), (), GRID)
    alike = answer.extra["indistinguishable"]
    assert all(entry["workers"] != answer.workers for entry in alike)
    assert bool(alike) == any(line.startswith("The data cannot tell it from") for line in answer.extra["why"])


# --- one machine under latency ----------------------------------------------------------------------------------------

ONE_MACHINE_ONLY_AT_0_MS = tuple(r for r in GRID if not (r.workers == 1 and r.latency_ms > 0))

# (records, batch size, latency) where the data at 0 ms says one machine is fastest: one machine under latency too.
ONE_MACHINE = [
    (TABLE4, 2560, 20.0),  # measured: one machine 39 s at 0 ms, two machines 41 s at 20 ms (the lookup's own match)
    (TABLE4, 2560, 40.0),  # no record at 40 ms: the predictor
    (TABLE4, 2560, 100.0),
] + [(ONE_MACHINE_ONLY_AT_0_MS, batch, latency) for batch in (192, 1280) for latency in (10.0, 20.0, 50.0, 100.0)]


@pytest.mark.parametrize(("records", "batch", "latency"), ONE_MACHINE)
def test_one_machine_beats_a_cluster_under_latency_when_it_did_at_0_ms(records, batch, latency):
    at_zero = {r.workers: r.epoch_time_s for r in records if (r.batch_size, r.latency_ms) == (batch, 0.0)}
    assert min(at_zero, key=at_zero.get) == 1  # what the data says at 0 ms
    answer = lookup(records, batch, latency)
    assert answer.workers == 1
    assert answer.predicted_epoch_time_s == at_zero[1]  # latency does not reach one machine
    pick = next(c for c in answer.candidates if c.workers == 1)
    assert (pick.basis, pick.source) == ("measured", "measured")


@pytest.mark.parametrize("latency", [10.0, 30.0])
def test_one_worker_through_a_ps_pays_the_latency(latency):
    """Through a PS even one worker sends every step over the network (on the lab: 0.2 s an epoch at 0 ms, 11.5 s at
    20 ms): its time between two measured latencies is between theirs, not its 0 ms time as all-reduce's would be."""
    model = predictor(LAB_PS_GRID, cross_validate=False)
    measured = {r.latency_ms: r.epoch_time_s for r in LAB_PS_GRID if (r.workers, r.batch_size) == (1, 32)}
    estimate = model.estimate("lab-w-1g", 1, 32, latency)
    assert measured[latency - 10.0] < estimate.epoch_time_s < measured[latency + 10.0]
    assert estimate.basis == "predicted"


# --- failed runs --------------------------------------------------------------------------------------------------


def test_the_predictor_never_proposes_a_configuration_that_only_failed_and_flags_those_near_a_failure():
    answer = lookup(TABLE4, 64000, 20.0)  # no record at 64,000 and 20 ms: the predictor answers
    assert answer.source == "predicted" and answer.extra["not_estimated"] == {
        "a run of it failed at this point": 1  # one machine: latency-free, it failed at 64,000 at 0 ms
    }
    assert 1 not in {c.workers for c in answer.candidates}
    answer = lookup(TABLE4, 32000, 20.0)
    one = next(c for c in answer.candidates if c.workers == 1)
    assert one.warning == "1 run failed at batch size 64000, 0 ms"  # within a factor 2 of the failure
    assert all(not c.warning for c in answer.candidates if c.workers > 1)


def test_a_predicted_pick_near_a_failed_run_is_answered_with_a_warning():
    failed = PerfRecord(ANWAR, workers=4, batch_size=64000, latency_ms=20.0, epoch_time_s=None, strategy="mirrored")
    answer = lookup((*TABLE4, failed), 48000, 0.0)
    assert answer.source == "predicted"
    four = next(c for c in answer.candidates if c.workers == 4)
    assert four.warning == "1 run failed at batch size 64000, 20 ms"
    if answer.workers == 4:
        (warning,) = answer.warnings
        assert warning.startswith("runs of 4 workers failed near this point (1 run failed at batch size 64000, 20 ms)")
        assert answer.explanation.endswith(f" Warning: {warning}")
    # ...and never at the very point it failed: 4 workers at 64,000 and 20 ms is no candidate.
    assert 4 not in {c.workers for c in lookup((*TABLE4, failed), 64000, 20.0).candidates}


# --- the answer --------------------------------------------------------------------------------------------------


def test_the_answer_is_one_sentence_with_one_error_figure_and_its_why_apart():
    answer = recommend_model(
        RecommendRequest("model", workload=ANWAR, batch_size=2560, latency_ms=50.0, max_workers=4), (), GRID
    )
    assert answer.source == "predicted" and answer.workers == 1
    low, high = answer.extra["interval_s"]
    assert answer.explanation == (
        f"1 worker and no PS: {answer.predicted_epoch_time_s:.3g} s per epoch (measured; 80 %: {low:.3g}–{high:.3g} "
        "s), hourly cost unknown (the records name no worker type)."
    )
    assert answer.explanation.count("%") == 1 and "error" not in answer.explanation
    why = answer.extra["why"]
    assert why[0].startswith("Chosen among 4 configurations of at most 4 workers at batch size 2560 and 50 ms")
    assert sum("cross-validated error is" in line for line in why) == 1
    by_count = {c.workers: c for c in answer.candidates}
    assert (by_count[1].source, by_count[1].basis) == ("measured", "measured")  # at 0–100 ms: latency-free
    assert {by_count[n].basis for n in (2, 3, 4)} == {"predicted"}  # between 40 and 60 ms
    assert all(c.interval_s[0] < c.epoch_time_s < c.interval_s[1] for c in answer.candidates)
    assert answer.model_error == predictor(GRID).overall_error
    shaped = json.loads(json.dumps(service.as_dict(answer), allow_nan=False))  # `recommend --json`, DESIGN's keys kept
    assert {"algorithm", "ps_type", "worker_type", "workers", "hourly_cost", "predicted_epoch_time_s", "source",
            "candidates", "explanation"} <= set(shaped)  # fmt: skip
    assert {"source", "basis", "expected_error", "interval_s", "warning"} <= set(shaped["candidates"][0])


@pytest.mark.parametrize(
    "name",
    [f"recommender.perfmodel.{name}" for name in ("predictor", "process", "calibration", "conformal")],
)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
