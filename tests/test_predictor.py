"""The predictor (recommender/perfmodel/predictor.py) on real rows: Anwar et al.'s Table 4 as shipped, and the grid
constructed from it (recommender/data/anwar2021-constructed-grid.csv: not measured, built from Table 4 and §6 — see
benchmarks/model_calibration.py) with latencies held out; the lookup that uses it; failed runs as information."""

from __future__ import annotations

import csv
import doctest
import importlib
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from recommender import service
from recommender.algorithms import recommend
from recommender.perfdata import parse_anwar2021
from recommender.perfmodel import predict_fallback, recommend_model
from recommender.perfmodel.calibration import holdout_report
from recommender.perfmodel.explanation import _saturation
from recommender.perfmodel.predictor import predictor
from recommender.types import InstanceSpec, PerfRecord, RecommendRequest

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
    request = RecommendRequest("lookup", workload=ANWAR, batch_size=batch_size, latency_ms=latency_ms, **fields)
    return recommend(request, (), records, predict=lambda r: predict_fallback(r, (), records))


def test_the_constructed_grid_says_what_it_is_and_holds_table_4_exactly():
    assert (DATA / "anwar2021-constructed-grid.csv").read_text().startswith("# CONSTRUCTED, NOT MEASURED")
    table = {(r.workers, r.batch_size, r.latency_ms): r.epoch_time_s for r in TABLE4}
    grid = {(r.workers, r.batch_size, r.latency_ms): r.epoch_time_s for r in GRID}
    assert all(grid[key] == time_s for key, time_s in table.items())  # the failed 1 × 64,000 run too
    assert len(grid) == 4 * 6 * 6 and sum(t is None for t in grid.values()) == 6  # one machine, 64,000, each latency


# --- on Table 4 as shipped --------------------------------------------------------------------------------------------

# (workers, batch size, latency ms) -> (basis, epoch time s or None, the estimate's detail contains).
TABLE4_ESTIMATES = [
    ((4, 64000, 0), ("measured", 419, "measured here")),
    ((4, 32000, 0), ("measured", 220, "measured here")),
    # One machine sends nothing over the network: its 0 ms runs stand at any latency.
    ((1, 2560, 20), ("measured", 39, "measured at 0 ms: one machine sends nothing over the network")),
    ((1, 6400, 100), ("measured", 96, "measured at 0 ms")),
    # Between two measured batch sizes at the same (workers, latency): linear in B, which predicts Table 4's own
    # interior point (4 workers at 32,000: 217.9 s for 220) better than log-log (229.7 s).
    ((2, 4000, 20), ("interpolated", 41 + (4000 - 2560) / (6400 - 2560) * (90 - 41), "(linear) between 2560 and 6400")),
    ((3, 48000, 0), ("interpolated", (265 + 503) / 2, "between 32000 and 64000")),
    ((4, 48000, 0), ("interpolated", (220 + 419) / 2, "between 32000 and 64000")),
    # Beyond the measurements: the model carried from the nearest one.
    ((3, 64000, 20), ("extrapolated", None, "model carried (multiplicative) from the measured 503 s")),
    # Neither the batch size nor the latency measured for three workers: their 0 ms runs' trend in batch size, then
    # the model carried in latency from there.
    ((3, 2560, 20), ("extrapolated", None, "carried (multiplicative) in latency from")),
    # The one machine only ever failed at 64,000 (§6.2): no estimate, at any latency.
    ((1, 64000, 0), (None, None, None)),
    ((1, 64000, 40), (None, None, None)),
]


@pytest.mark.parametrize(("point", "want"), TABLE4_ESTIMATES)
def test_predictor_on_table_4(point, want):
    model = predictor(TABLE4)
    estimate = model.estimate("", *point)
    basis, time_s, detail = want
    if basis is None:
        assert estimate is None
        return
    assert (estimate.basis, estimate.detail.find(detail) >= 0) == (basis, True), estimate.detail
    if time_s is not None:
        assert estimate.epoch_time_s == pytest.approx(time_s, rel=0.005)
    if detail == "measured here":
        assert estimate.expected_error is None  # measured at this very point
    else:
        assert estimate.expected_error == model.expected_error(basis) > 0


@pytest.mark.parametrize("records", [TABLE4, without(TABLE4, workers=2)], ids=["table4", "without-2-workers"])
def test_an_estimate_off_both_the_batch_sizes_and_latencies_a_count_ran_at_never_falls_with_latency(records):
    """Three workers of Table 4 ran at 0 ms only, at batch sizes 32,000 and 64,000. At 2,560 their 0 ms estimate
    follows those runs' trend in batch size; at 20 or 60 ms, that estimate carried in latency. (Before, the model was
    carried from the 32,000 run, leaving the trend behind: without two workers, 29.7 s at 20 ms against 42.5 s at 0 ms,
    and two workers, corrected by it, 24 % off their measured 41 s.)"""
    model = predictor(records, cross_validate=False)
    times = [model.estimate("", 3, 2560, latency).epoch_time_s for latency in (0.0, 20.0, 60.0)]
    assert times == sorted(times)
    for workers, batch in [(3, 2560), (4, 2560), (4, 128000)]:  # below and beyond the measured batch sizes
        at_0ms = model.estimate("", workers, batch, 0.0).epoch_time_s
        assert model.estimate("", workers, batch, 10.0).epoch_time_s >= at_0ms


@pytest.mark.parametrize("group_by", ["latency", "batch_size", "workers"])
def test_table_4_held_out_meets_the_goals_it_can_be_asked(group_by):
    """Each latency, batch size or worker count of Table 4 held out: the times answered within 20 % MAPE, and every
    choice answerable (none when a latency is held out: 0 ms leaves two runs of two workers) made within 3 % regret."""
    report = holdout_report(TABLE4, group_by=group_by)
    assert report["mape"] <= 0.20
    if group_by != "latency":
        assert report["cells_answered"] == 1.0 and report["mean_regret"] <= 0.03 and report["best_found"] >= 0.85


def test_expected_errors_come_from_cross_validating_the_whole_predictor():
    model = predictor(TABLE4)
    assert model.cv == "2 latencies, 4 batch sizes, 4 worker counts, each held out in turn: 20 held-out estimates"
    assert model.cv_errors["all"][1] == 20
    assert model.overall_error == pytest.approx(model.cv_errors["all"][0])
    # Not the formula's own cross-validation: the model's leave-one-out error is another figure.
    assert model.overall_error != pytest.approx(model.model.cv_mape)


# --- a grid constructed from Table 4, one latency held out -----------------------------------------------------------

INTERIOR_LATENCIES = [20.0, 40.0, 60.0, 80.0]


@pytest.mark.parametrize("held_out", INTERIOR_LATENCIES)
def test_a_held_out_latency_is_interpolated_from_its_neighbours(held_out):
    model = predictor(without(GRID, latency_ms=held_out))
    errors = []
    for r in GRID:
        if r.latency_ms != held_out or r.epoch_time_s is None:
            continue
        estimate = model.estimate(r.instance_type, r.workers, r.batch_size, r.latency_ms)
        # one machine: measured at the other latencies; the others: between the two neighbouring latencies
        assert estimate.basis == ("measured" if r.workers == 1 else "interpolated"), (r, estimate.detail)
        if r.workers > 1:
            assert f"between {held_out - 20:g} ms and {held_out + 20:g} ms" in estimate.detail
        errors.append(abs(estimate.epoch_time_s / r.epoch_time_s - 1))
    assert np.mean(errors) < 0.06  # the grid carries 3 % noise; the interpolation adds little to it


def _measured(records, workers: int, batch: int, latency: float) -> float | None:
    times = [r.epoch_time_s for r in records if (r.workers, r.batch_size, r.latency_ms) == (workers, batch, latency)]
    return times[0] if times and times[0] is not None else None


# (the grid's records, queries between two measured latencies): the grid with one latency held out, and whole.
BETWEEN = [(without(GRID, latency_ms=held), [held]) for held in INTERIOR_LATENCIES] + [
    (GRID, [10.0, 30.0, 50.0, 70.0, 90.0]),
    (TABLE4, [5.0, 10.0, 15.0]),
]


@pytest.mark.parametrize(("records", "latencies"), BETWEEN)
def test_between_two_latencies_never_a_count_both_neighbours_measured_slower(records, latencies):
    """If at both neighbouring measured latencies some count k was measured faster than m, m is not the answer."""
    measured_latencies = sorted({r.latency_ms for r in records})
    for latency in latencies:
        below = max(x for x in measured_latencies if x < latency)
        above = min(x for x in measured_latencies if x > latency)
        for batch in sorted({r.batch_size for r in records}):
            answer = lookup(records, batch, latency)
            m = answer.workers
            for k in range(1, 5):
                sides = [(_measured(records, m, batch, x), _measured(records, k, batch, x)) for x in (below, above)]
                beaten = all(t_m is not None and t_k is not None and t_k < t_m for t_m, t_k in sides)
                assert not beaten, f"{m} workers at {batch}, {latency} ms: {k} was faster at {below} and {above} ms"


def test_leave_one_latency_out_meets_the_issues_goals_on_the_constructed_grid():
    """Issue 13's goals (regret ≤ 3 %, exact best ≥ 85 %, MAPE ≤ 20 %, every cell answered), held out one latency at
    a time — where plain interpolation answers only the interior latencies."""
    report = holdout_report(GRID, group_by="latency")
    baseline = holdout_report(GRID, group_by="latency", method="baseline")
    assert report["cells_answered"] == 1.0 and baseline["cells_answered"] == pytest.approx(4 / 6)
    assert report["mean_regret"] <= 0.03 and report["best_found"] >= 0.85 and report["mape"] <= 0.20
    interior = [p for p in report["pairs"] if p["basis"] == "interpolated"]
    assert {p["latency_ms"] for p in interior} == set(INTERIOR_LATENCIES)
    json.dumps(report, allow_nan=False)


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


def lab_grid(name: str) -> tuple[PerfRecord, ...]:
    """A grid measured on the lab here (recommender/data/NAME)."""
    return tuple(
        PerfRecord(r["workload"], r["instance_type"], r["ps_type"], int(r["workers"]), int(r["batch_size"]),
                   float(r["latency_ms"]), float(r["epoch_time_s"]), strategy=r["strategy"])
        for r in csv.DictReader(line for line in (DATA / name).read_text().splitlines() if not line.startswith("#"))
    )  # fmt: skip


LAB_GRID = lab_grid("lab-digits-grid.csv")  # all-reduce
LAB_PS_GRID = lab_grid("lab-digits-ps-grid.csv")  # the same workload through a parameter server


@pytest.mark.parametrize("latency", [10.0, 30.0])
def test_one_worker_through_a_ps_pays_the_latency(latency):
    """Through a PS even one worker sends every step over the network (on the lab: 0.54 s an epoch at 0 ms, 12.9 s at
    20 ms): its time between two measured latencies is between theirs, not its 0 ms time as all-reduce's would be."""
    model = predictor(LAB_PS_GRID, cross_validate=False)
    measured = {r.latency_ms: r.epoch_time_s for r in LAB_PS_GRID if (r.workers, r.batch_size) == (1, 32)}
    below, above = latency - 10.0, latency + 10.0

    estimate = model.estimate("lab-w-1g", 1, 32, latency)

    assert measured[below] < estimate.epoch_time_s < measured[above]
    assert estimate.basis == "interpolated"


@pytest.mark.parametrize("records", [without(GRID, workers=1), without(LAB_GRID, workers=1)])
def test_one_machine_never_measured_is_estimated_once_for_every_latency(records):
    """All-reduce runs of 2+ machines only: one machine, which sends nothing, is estimated where the others' runs say
    least about their network (the lowest latency) and is the same at every latency — not the clusters' latency cost
    carried onto a machine that has none (the lab grid's one machine held out was 3–23× too slow before)."""
    model = predictor(records, cross_validate=False)
    worker_type = records[0].instance_type
    for batch in sorted({r.batch_size for r in records}):
        estimates = model.estimate_many([(worker_type, 1, batch, latency) for latency in (0.0, 20.0, 40.0, 100.0)])
        assert len({e.epoch_time_s for e in estimates}) == 1, batch
        assert all(e.basis == "extrapolated" for e in estimates)
        assert "one machine is latency-free" in estimates[-1].detail
    held_out = holdout_report(LAB_GRID, group_by="workers")
    one_machine = [abs(p["predicted_s"] / p["measured_s"] - 1) for p in held_out["pairs"] if p["workers"] == 1]
    assert len(one_machine) == 16 and np.mean(one_machine) < 0.2  # 2.4 (244 %) before


def test_leave_one_worker_count_out_meets_the_mape_goal_on_the_lab_grid():
    """TensorFlow's collectives measured on the lab: each of 1, 2 and 3 workers held out and predicted from the other
    two. A ring's 2(n−1) messages made 3 workers 1.5× too slow under latency (68 %; 40 % over all three counts)."""
    report = holdout_report(LAB_GRID, group_by="workers")
    assert report["cells_answered"] == 1.0 and report["predicted"] == len(LAB_GRID)
    assert report["mape"] <= 0.20 and report["mean_regret"] <= 0.03 and report["best_found"] >= 0.85
    for n in (1, 2, 3):
        errors = [abs(p["predicted_s"] / p["measured_s"] - 1) for p in report["pairs"] if p["workers"] == n]
        assert np.mean(errors) <= 0.20, n


@pytest.mark.parametrize("group_by", ["latency", "batch_size"])
def test_one_latency_or_batch_size_held_out_meets_the_issues_goals_through_a_ps(group_by):
    """The lab's PS runs: the server saturates (3 workers no faster than 2 under latency), which only a roofline
    follows (on its 36 runs of 1–3 workers, leaving one latency out: 3.3 % regret and 16.8 % MAPE with a sum of the
    two costs, 2.4 % and 7.7 % with the roofline). Exact best counts a pick the cell's runs cannot tell from the
    fastest (its 0 ms runs overlap: 0.16–0.60 s epochs spread 29 %)."""
    report = holdout_report(LAB_PS_GRID, group_by=group_by)
    assert report["cells_answered"] == 1.0 and report["predicted"] == len(LAB_PS_GRID)
    assert report["mean_regret"] <= 0.03 and report["mape"] <= 0.20 and report["best_found"] >= 0.85


def test_past_the_largest_batch_size_a_ps_workload_carries_the_model_from_its_two_nearest_runs():
    """The PS grid's own line ends are predicted better from the model's mean error at the next two runs than at the
    next one alone (one run's noise against the model's error moving along the line), so with batch size 256 held out
    one worker at 20 ms is the pick, as measured (2.74 s, two workers 2.84 s); from the nearest run alone two workers
    were (2.856 s against 2.863 s). The all-reduce grids' ends say the nearest run alone."""
    fold = predictor(without(LAB_PS_GRID, batch_size=256), cross_validate=False)
    assert fold.anchor_points == 2
    estimates = {n: fold.estimate("lab-w-1g", n, 256, 20.0) for n in (1, 2, 3, 4)}
    assert min(estimates, key=lambda n: estimates[n].epoch_time_s) == 1
    assert "at batch size 128, 20 ms and " in estimates[1].detail, estimates[1].detail
    assert [predictor(records, cross_validate=False).anchor_points for records in (LAB_GRID, GRID)] == [1, 1]


def test_each_worker_count_held_out_through_a_saturated_ps_is_predicted_under_latency():
    """1, 2, 3 or 4 workers through the PS, predicted from the others: under latency, where the network decides, each
    count within 10 % on average (before the roofline, from two counts: one worker 25 % off, two 19 %, three 35 %;
    four predicted from one to three before they were measured: 31 % off with that form, 6.4 % with the roofline),
    and the fastest
    predicted count 3 % slower than the measured best at most on average (7 % in any cell). At 0 ms the lab's
    workers share this machine's two cores, which no cluster model knows."""
    report = holdout_report(LAB_PS_GRID, group_by="workers")
    under_latency = [p for p in report["pairs"] if p["latency_ms"] > 0]
    for n in (1, 2, 3, 4):
        errors = [abs(p["predicted_s"] / p["measured_s"] - 1) for p in under_latency if p["workers"] == n]
        assert len(errors) == 16 and np.mean(errors) <= 0.10 and max(errors) <= 0.20, n  # 8 cells, 2 runs each
    cells = defaultdict(lambda: defaultdict(list))  # (batch, latency) -> workers -> (measured, predicted) of each run
    for p in under_latency:
        cells[(p["batch_size"], p["latency_ms"])][p["workers"]].append((p["measured_s"], p["predicted_s"]))
    regrets = []
    for runs in cells.values():
        measured, predicted = ({n: np.mean([r[i] for r in pairs]) for n, pairs in runs.items()} for i in (0, 1))
        regrets.append(measured[min(predicted, key=predicted.get)] / min(measured.values()) - 1)
    assert len(regrets) == 8 and np.mean(regrets) <= 0.03 and max(regrets) <= 0.07  # 1.7 %, 6.3 % (2026-11-26)


@pytest.mark.parametrize("records", [LAB_GRID, LAB_PS_GRID, TABLE4], ids=["all-reduce", "ps", "table4"])
def test_a_worker_count_held_out_is_chosen_against_the_others_measurements(records):
    """Leaving one worker count out asks what the recommender asks when nobody measured that count: its prediction
    against the other counts' measurements at the same point — not four predictions, each from a different fold."""
    report = holdout_report(records, group_by="workers")
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


def test_the_answer_names_the_knee_only_where_its_pick_agrees():
    """On the lab's PS runs under latency the model's knee is at 4 workers. At batch size 32 and 40 ms 4 workers were
    measured fastest: the answer picks them and says more train no faster; at batch size 128 it picks 2, below the
    knee, and says where more stop helping. A pick past the knee (its own estimates saying more than the model's
    knee) is not told that fewer would do as well."""
    catalog = [InstanceSpec(**row) for row in json.loads((CATALOGS / "lab.json").read_text())["types"]]
    request = RecommendRequest("model", "lab-digits-grid", max_workers=8, batch_size=32, latency_ms=40.0)
    at = recommend_model(request, catalog, LAB_PS_GRID)
    four = next(c for c in at.candidates if c.workers == 4)
    assert (at.workers, four.basis) == (4, "measured")
    assert "The parameter server bounds the epoch from 4 workers of lab-w-1g at these conditions" in at.explanation
    below = recommend_model(replace(request, batch_size=128), catalog, LAB_PS_GRID)
    assert below.workers == 2
    assert "The parameter server bounds the epoch from 4 workers of lab-w-1g at these conditions" in below.explanation
    model = predictor(LAB_PS_GRID, catalog)
    assert _saturation(model, request, replace(four, workers=5)) == ""
    assert _saturation(model, request, four) != ""


# --- failed runs --------------------------------------------------------------------------------------------------


def test_the_predictor_never_proposes_a_configuration_that_only_failed_and_flags_those_near_a_failure():
    answer = lookup(TABLE4, 64000, 20.0)  # no record at 64,000 and 20 ms: the predictor answers
    assert answer.source == "predicted" and answer.extra["failed_only"] == [["", 1]]
    assert 1 not in {c.workers for c in answer.candidates}
    answer = lookup(TABLE4, 32000, 20.0)
    one = next(c for c in answer.candidates if c.workers == 1)
    assert one.warning == "1 run failed at batch size 64000, 0 ms"  # within a factor 2 of the failure
    assert all(not c.warning for c in answer.candidates if c.workers > 1)


def test_a_predicted_pick_near_a_failed_run_is_answered_with_a_warning():
    failed = PerfRecord(ANWAR, workers=4, batch_size=64000, latency_ms=20.0, epoch_time_s=None, strategy="mirrored")
    answer = lookup((*TABLE4, failed), 48000, 0.0)
    assert (answer.workers, answer.source) == (4, "predicted")
    assert answer.warnings == (
        "runs of 4 workers failed near this point (1 run failed at batch size 64000, 20 ms), so it may fail too; the "
        "fastest configuration with no failed run near it is 3 workers, 383.8 s per epoch (interpolated).",
    )
    assert answer.extra["warnings"] == list(answer.warnings)
    assert answer.explanation.endswith(f" Warning: {answer.warnings[0]}")
    # ...and never at the very point it failed: 4 workers at 64,000 and 20 ms is no candidate.
    assert 4 not in {c.workers for c in lookup((*TABLE4, failed), 64000, 20.0).candidates}


# --- the answer --------------------------------------------------------------------------------------------------


def test_every_candidate_says_its_source_basis_and_expected_error():
    answer = recommend_model(
        RecommendRequest("model", workload=ANWAR, batch_size=2560, latency_ms=50.0, max_workers=4), (), GRID
    )
    assert answer.source == "predicted" and answer.workers == 1
    by_count = {c.workers: c for c in answer.candidates}
    assert (by_count[1].source, by_count[1].basis) == ("measured", "measured")  # at 0–100 ms: latency-free
    assert {by_count[n].basis for n in (2, 3, 4)} == {"interpolated"}  # between 40 and 60 ms
    assert all(c.expected_error is not None and 0 < c.expected_error < 0.2 for c in answer.candidates)
    assert answer.model_error == predictor(GRID).overall_error
    assert "measured at 0 ms, 20 ms, 40 ms, 60 ms, 80 ms, 100 ms: one machine sends nothing" in answer.explanation
    assert answer.extra["predictor"]["cv"].endswith("each held out in turn: 414 held-out estimates")
    shaped = json.loads(json.dumps(service.as_dict(answer), allow_nan=False))  # `recommend --json`, DESIGN's keys kept
    assert {"algorithm", "workers", "predicted_epoch_time_s", "source", "candidates", "explanation"} <= set(shaped)
    assert {"source", "basis", "expected_error", "warning"} <= set(shaped["candidates"][0])


@pytest.mark.parametrize("name", ["recommender.perfmodel.predictor", "recommender.perfmodel.calibration"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
