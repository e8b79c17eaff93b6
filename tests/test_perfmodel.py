"""The performance model: recovery of a known formula, Anwar's Table 4 picks, the `model` algorithm, calibration."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from recommender.perfmodel import calibration_report, fit, predict_fallback, predictor, recommend_model
from recommender.perfmodel.families import COMMON, SERVER, WORKER
from recommender.perfmodel.fitting import _System
from recommender.types import InstanceSpec, PerfRecord, RecommendationError, RecommendRequest

CATALOG = [
    InstanceSpec(**row)
    for row in json.loads((Path(__file__).resolve().parent.parent / "recommender/catalogs/fc2-2018.json").read_text())[
        "types"
    ]
]
PRICES = {spec.name: spec.hourly_price for spec in CATALOG}


def why(answer) -> str:
    """The details behind an answer's one sentence, as one text."""
    return " ".join(answer.extra["why"])


# Ground truth of the anwar-eq5 "pass" form (an epoch is one pass over the data; ring all-reduce), B_ref = 256:
#   t = 10 + κ_t/n + (256/B)·(0.5 + 0.02·l·2(n−1) + 3·2(n−1)/n)
KAPPA = {"c4.xlarge": 400.0, "m4.xlarge": 480.0, "g3.4xlarge": 90.0}
LATENCY_S_PER_MS = 0.02


def truth(worker_type: str, n: int, batch: int, latency_ms: float) -> float:
    steps = 256 / batch
    return (
        10 + KAPPA[worker_type] / n + steps * (0.5 + LATENCY_S_PER_MS * latency_ms * 2 * (n - 1) + 3 * 2 * (n - 1) / n)
    )


def grid(
    sigma: float = 0.05,
    seed: int = 1,
    types=tuple(KAPPA),
    workers=range(1, 7),
    batches=(256, 1024, 4096),
    latencies=(0.0, 25.0, 50.0, 100.0),
) -> list[PerfRecord]:
    rng = np.random.default_rng(seed)
    return [
        PerfRecord(
            workload="truth",
            instance_type=t,
            workers=n,
            batch_size=b,
            latency_ms=lat,
            epoch_time_s=truth(t, n, b, lat) * math.exp(rng.normal(0, sigma)),
            strategy="mirrored",
        )
        for t in types
        for n in workers
        for b in batches
        for lat in latencies
    ]


def without(records, **held_out):
    return [r for r in records if not all(getattr(r, k) == v for k, v in held_out.items())]


# --- fitting a known formula --------------------------------------------------------------------------------------


def test_fit_recovers_the_ground_truth_shape():
    model = fit(grid(), CATALOG)
    assert model.family == "anwar-eq5/ring:pass"  # a ring's 2(n−1) messages, the cluster's batch: the records say so
    assert model.speed == "per-type"  # g3.4xlarge's GPU is far faster than its 47 ECU say
    assert model.cv_mape < 0.06
    assert model.coefficients["latency_s_per_ms"] == pytest.approx(LATENCY_S_PER_MS, rel=0.15)
    assert model.coefficients["compute_s[g3.4xlarge]"] == pytest.approx(KAPPA["g3.4xlarge"], rel=0.15)


def tree_truth(n: int, batch: int, latency_ms: float) -> float:
    """An all-reduce whose latency costs 2·log2 n messages a step (Rabenseifner's), B the batch of each of n workers."""
    steps = 256 / (batch * n)
    return 10 + 400 / n + steps * (0.5 + LATENCY_S_PER_MS * latency_ms * 2 * math.log2(n) + 3 * 2 * (n - 1) / n)


def tree_grid(workers) -> list[PerfRecord]:
    return [
        PerfRecord("tree", "c4.xlarge", "", n, b, lat, tree_truth(n, b, lat), strategy="mirrored")
        for n in workers
        for b in (256, 1024, 4096)
        for lat in (0.0, 25.0, 50.0, 100.0)
    ]


def test_fit_tells_a_tree_all_reduce_with_the_batch_per_replica_from_a_ring():
    model = fit(tree_grid(range(1, 7)), CATALOG)
    assert model.family == "anwar-eq5/tree:replica"
    assert model.pattern == "all-reduce"
    assert model.predict("c4.xlarge", 12, 512, 40.0) == pytest.approx(tree_truth(12, 512, 40.0), rel=0.02)


def test_where_the_records_cannot_tell_the_message_laws_apart_the_tree_stands():
    """One machine and two: 2·log2 n and 2(n−1) agree at both, so the fit cannot choose, and whichever the rounding
    favoured must not decide. The tree (and the batch per replica) stand: 3 workers under latency then cost what
    TensorFlow's collectives cost on the lab, not a ring's twice-as-many messages."""
    model = fit(tree_grid((1, 2)), CATALOG)
    assert model.family == "anwar-eq5/tree:replica"
    ring = model.alternatives[model.form.label.replace("/tree:", "/ring:")]
    assert ring == pytest.approx(model.alternatives[model.form.label], abs=1e-9)  # the same fit
    assert model.predict("c4.xlarge", 3, 1024, 50.0) == pytest.approx(tree_truth(3, 1024, 50.0), rel=0.02)


def ps_truth(n: int, batch: int, latency_ms: float, *, saturates: bool, server_s: float = 50.0) -> float:
    """A PS workload, B the batch of each of n workers: each worker's own steps (compute and two round trips a step),
    and every worker's steps through one server — the slower of the two bounds the epoch when the server saturates
    (FC² §8), or both add when it does not."""
    steps = 256 / batch
    workers = (100 + steps * (20 + 0.2 * latency_ms * 2)) / n
    server = steps * (server_s + 0.15 * latency_ms)
    return 5 + (max(workers, server) if saturates else workers + server)


def ps_grid(workers, *, saturates: bool, sigma: float = 0.02, ps_type="m4.2xlarge", server_s=50.0) -> list[PerfRecord]:
    rng = np.random.default_rng(3)
    return [
        PerfRecord("ps", "c4.xlarge", ps_type, n, b, lat, ps_truth(n, b, lat, saturates=saturates, server_s=server_s)
                   * math.exp(rng.normal(0, sigma)), strategy="ps")
        for n in workers
        for b in (128, 256, 1024)
        for lat in (0.0, 25.0, 50.0, 100.0)
    ]  # fmt: skip


def test_a_saturated_parameter_server_is_fitted_as_a_roofline_and_its_knee_extrapolated():
    """FC² §8: past 3–4 workers the PS's capacity is saturated and more workers buy nothing. Measured up to 4 workers
    (the knee between 2 and 3 at batch size 256, beyond 8 at 1024), a roofline predicts 6 and 8 workers as no faster
    at 256 and still gaining at 1024; a sum of the two costs would have them gain everywhere."""
    records = ps_grid(range(1, 5), saturates=True)
    model = fit(records, CATALOG)
    assert (model.family, model.pattern) == ("anwar-eq5/roofline:replica", "ps")
    for n in (6, 8):
        for batch, latency in [(128, 25.0), (256, 0.0), (256, 100.0), (512, 50.0), (1024, 25.0)]:
            truth_s = ps_truth(n, batch, latency, saturates=True)
            assert model.predict("c4.xlarge", n, batch, latency) == pytest.approx(truth_s, rel=0.05)
    additive = model.alternatives[model.form.label.replace("/roofline:", ":")]
    assert model.cv_mape < 0.05 < additive

    request = model_request(workload="ps", worker_type="c4.xlarge", max_workers=8, latency_ms=50.0)
    answer = recommend_model(request, CATALOG, records)
    assert answer.workers >= 3 and answer.ps_type
    assert "The parameter server bounds the epoch from 3 workers of c4.xlarge at these conditions" in why(answer)
    times = {c.workers: c.epoch_time_s for c in answer.candidates}
    assert max(times[n] for n in range(3, 9)) / min(times[n] for n in range(3, 9)) < 1.05  # past the knee: flat


def test_a_roofline_is_recovered_exactly_from_noise_free_runs():
    model = fit(ps_grid(range(1, 6), saturates=True, sigma=0.0), CATALOG)
    assert model.family == "anwar-eq5/roofline:replica" and model.cv_mape < 1e-6
    for n, batch, latency in [(7, 192, 10.0), (2, 2048, 75.0), (12, 128, 0.0), (1, 700, 150.0)]:
        truth_s = ps_truth(n, batch, latency, saturates=True)
        assert model.predict("c4.xlarge", n, batch, latency) == pytest.approx(truth_s, rel=1e-6)


@pytest.mark.parametrize("pieces", [None, np.array([COMMON, WORKER, SERVER, WORKER])])
@pytest.mark.parametrize("loss", ["relative", "absolute"])
def test_a_fold_fit_knows_nothing_of_the_records_it_holds_out(pieces, loss):
    """Cross-validation's promise: a held-out record's time and columns change nothing in the fit that predicts it —
    not through the columns' scaling, nor its weight, nor a roofline's starting splits."""
    rng = np.random.default_rng(5)
    matrix, time, workers = rng.uniform(0.1, 1.0, (30, 4)), rng.uniform(1.0, 10.0, 30), rng.integers(1, 5, 30)
    rows = np.arange(29)
    fitted = _System(matrix, time, loss, pieces, workers).solve(rows)
    matrix[29] *= 1000.0
    time[29] *= 50.0
    workers[29] = 9
    assert np.array_equal(_System(matrix, time, loss, pieces, workers).solve(rows), fitted)


def test_a_workload_measured_through_two_ps_types_answers_from_the_chosen_ones_runs():
    """m4.large (450 Mbit/s) saturates at twice the time m4.2xlarge (1 Gbit/s) does: mixed, the two PS types' runs
    would be averaged into one cluster that neither is. Each PS answers from its own runs, and says so."""
    fast = ps_grid(range(1, 4), saturates=True)
    slow = ps_grid(range(1, 4), saturates=True, ps_type="m4.large", server_s=100.0)
    for ps_type, server_s in [("m4.2xlarge", 50.0), ("m4.large", 100.0)]:
        request = model_request(workload="ps", worker_type="c4.xlarge", max_workers=3, ps_type=ps_type, batch_size=192)
        answer = recommend_model(request, CATALOG, fast + slow)
        assert answer.ps_type == ps_type
        assert f"From the runs through {ps_type} only: the 36 through other PS types" in why(answer)
        for c in answer.candidates:
            truth_s = ps_truth(c.workers, 192, 25.0, saturates=True, server_s=server_s)
            assert c.epoch_time_s == pytest.approx(truth_s, rel=0.06), (ps_type, c.workers)
    unmeasured = model_request(workload="ps", worker_type="c4.xlarge", max_workers=3, ps_type="m4.xlarge")
    answer = recommend_model(unmeasured, CATALOG, fast + slow)
    assert answer.ps_type == "m4.xlarge" and "From the runs through" not in why(answer)  # no runs of its own: all


def test_a_parameter_server_that_never_saturates_is_not_fitted_as_a_roofline():
    model = fit(ps_grid(range(1, 7), saturates=False), CATALOG)
    assert model.family == "anwar-eq5:replica"
    assert model.predict("c4.xlarge", 8, 512, 40.0) == pytest.approx(ps_truth(8, 512, 40.0, saturates=False), rel=0.05)


@pytest.mark.parametrize(
    ("held_out", "predict_at"),
    [
        ({"latency_ms": 50.0}, "an unmeasured latency"),
        ({"latency_ms": 100.0}, "a latency beyond the measured ones"),
        ({"workers": 4}, "an unmeasured worker count"),
        ({"workers": 6}, "a worker count beyond the measured ones"),
        ({"batch_size": 1024}, "an unmeasured batch size"),
        ({"batch_size": 4096}, "a batch size beyond the measured ones"),
    ],
)
def test_predicts_configurations_never_measured(held_out, predict_at):
    records = grid()
    model = fit(without(records, **held_out), CATALOG)
    for r in records:
        if all(getattr(r, k) == v for k, v in held_out.items()):
            expected = truth(r.instance_type, r.workers, r.batch_size, r.latency_ms)
            predicted = model.predict(r.instance_type, r.workers, r.batch_size, r.latency_ms)
            assert predicted == pytest.approx(expected, rel=0.12), predict_at


def test_predictions_positive_and_monotone_in_latency():
    model = fit(grid(), CATALOG)
    for worker_type in ("c4.xlarge", "g3.4xlarge", "p2.xlarge"):  # p2: no records, priced from its catalogue speed
        for n in (1, 2, 8, 64):
            for batch in (32, 256, 100_000):
                times = [model.predict(worker_type, n, batch, lat) for lat in (0, 1, 10, 100, 1000)]
                assert all(t > 0 for t in times)
                assert times == sorted(times)
        assert model.predict(worker_type, 4, 256, 200) > model.predict(worker_type, 4, 256, 0)


def test_failed_runs_are_never_fitted_as_times():
    records = grid(sigma=0)
    failed = [PerfRecord("truth", "c4.xlarge", workers=1, batch_size=256, latency_ms=0.0, epoch_time_s=None)] * 20
    assert fit(records + failed, CATALOG).coefficients == fit(records, CATALOG).coefficients


def test_unpriceable_type_is_an_error():
    model = fit(grid(), catalog=())  # no catalogue: only measured types have a speed
    with pytest.raises(RecommendationError, match="p2.xlarge"):
        model.predict("p2.xlarge", 2, 256, 0)


def test_predict_many_is_predict_for_each_configuration():
    model = fit(grid(), catalog=())
    configurations = [("c4.xlarge", 1, 256, 0.0), ("g3.4xlarge", 6, 4096, 100.0), ("m4.xlarge", 3, None, None)]
    times = model.predict_many(*zip(*configurations, strict=True))
    assert times.tolist() == [model.predict(*c) for c in configurations]
    unpriced = model.predict_many(["p2.xlarge", "c4.xlarge"], [2, 2], [256, 256], [0.0, 0.0])
    assert math.isnan(unpriced[0]) and unpriced[1] > 0  # no error: NaN marks the type the model cannot price


@pytest.mark.parametrize("count", [0, 1, 3])
def test_too_few_records(count):
    records = grid()[:count] + [PerfRecord("truth", "c4.xlarge", workers=2, epoch_time_s=None)]
    with pytest.raises(RecommendationError, match=rf"{count} with an epoch time \(1 failed run.*at least 4 needed"):
        fit(records)


def test_leave_one_latency_out_beats_a_lookup_table():
    """A table that only memorises its rows cannot answer an unmeasured latency; the model must, within 10 %."""
    report = calibration_report(grid(), CATALOG, group_by="latency")
    assert report["mape"] < 0.10
    model = fit(grid(), CATALOG, cv="latency")
    assert model.cv.startswith("leave-one-latency-out over 4 groups")
    assert model.cv_mape < 0.10


# --- Anwar et al. 2021, Table 4 -----------------------------------------------------------------------------------

# Table 4's nine rows: (workers, batch size, latency ms) -> time per epoch (s).
TABLE4 = {
    (4, 64000, 0): 419,
    (4, 32000, 0): 220,
    (4, 6400, 0): 57,
    (3, 64000, 0): 503,
    (3, 32000, 0): 265,
    (2, 6400, 20): 90,
    (2, 2560, 20): 41,
    (1, 6400, 0): 96,
    (1, 2560, 0): 39,
}
# Synthesised, not from the paper: the rest of Figs. 9 and 11 (1–4 machines, 0 and 20 ms). §6.2.2.1's percentages
# fix five cells: at 64,000@20 ms three machines are 4.2 % faster than four and 31 % faster than two (t3 = 640 s is
# our choice; the paper gives no absolute time); at 6,400@20 ms four machines are 14 % and 38 % faster than three and
# two (from Table 4's 90 s for two). One machine fails at 64,000 (§6.2.2.1: "resulted in an error"). Every other cell
# comes from a smooth formula fitted by hand to Table 4:
#   t = 5 + 3(n−1) + B·(0.01575/n + 0.00168·2(n−1)/n + 3.5e-5·l·2(n−1)).
# The paper's narrative is not consistent with any one smooth formula (e.g. 6,400@20 ms favours four machines while
# 64,000@20 ms favours three), so the model cannot match every cell; the two answers §7.1 reports are the test.
NARRATIVE = {
    (3, 64000, 20): 640.0,
    (4, 64000, 20): 640.0 / 0.958,
    (2, 64000, 20): 640.0 / 0.69,
    (4, 6400, 20): 90 * 0.62,
    (3, 6400, 20): 90 * 0.62 / 0.86,
}


def anwar_records() -> list[PerfRecord]:
    def smooth(n, b, lat):
        return round(5 + 3 * (n - 1) + b * (0.01575 / n + 0.00168 * 2 * (n - 1) / n + 3.5e-5 * lat * 2 * (n - 1)))

    return [
        PerfRecord(
            workload="anwar2021-mnist",
            workers=n,
            batch_size=b,
            latency_ms=float(lat),
            epoch_time_s=None if (n, b) == (1, 64000) else TABLE4.get((n, b, lat)) or NARRATIVE.get((n, b, lat)),
        )
        if (n, b, lat) in TABLE4 or (n, b, lat) in NARRATIVE or (n, b) == (1, 64000)
        else PerfRecord(
            workload="anwar2021-mnist", workers=n, batch_size=b, latency_ms=float(lat), epoch_time_s=smooth(n, b, lat)
        )
        for lat in (0, 20)
        for b in (64000, 32000, 6400, 2560, 1280, 192)
        for n in (1, 2, 3, 4)
    ]


def test_anwar_table4_picks():
    """§7.1's two answers from the model alone: four machines at 64,000 and 0 ms; at 20 ms three, 4.2 % faster than
    four in the narrative — closer than any smooth formula fits these cells (its cross-validated error is ~5 %), so
    the model need only put the two within its error of each other, both ahead of two machines. Its pick there is the
    predictor's to make from the measured cells (test_fallback_on_anwar_rows_with_those_cells_removed)."""
    model = fit(anwar_records())
    at_0 = {n: model.predict("", n, 64000, 0) for n in (1, 2, 3, 4)}
    assert min(at_0, key=at_0.get) == 4
    at_20 = {n: model.predict("", n, 64000, 20) for n in (2, 3, 4)}
    assert min(at_20, key=at_20.get) in (3, 4) and at_20[2] > max(at_20[3], at_20[4])
    assert abs(at_20[3] / at_20[4] - 1) < model.cv_mape
    assert model.family.endswith(":samples")  # Table 4: epoch time grows with the batch size at every n


@pytest.mark.parametrize(("batch", "latency", "workers"), [(64000, 0, 4), (64000, 20, 3)])
def test_fallback_on_anwar_rows_with_those_cells_removed(batch, latency, workers):
    """The lookup's fallback: the measured rows of the asked cell are gone, the model still answers from the rest.
    §7.1's answer is its pick, or one it names as not to be told apart from its pick: at 64,000 and 20 ms three
    machines are 4.2 % faster than four in the narrative, which the cells left contradict (at 6,400 and 20 ms four
    are 14 % faster than three; at 64,000 and 0 ms, 17 %)."""
    records = without(anwar_records(), batch_size=batch, latency_ms=float(latency))
    request = RecommendRequest(algorithm="lookup", workload="anwar2021-mnist", batch_size=batch, latency_ms=latency)
    answer = predict_fallback(request, (), records)
    alike = [c["workers"] for c in answer.extra["indistinguishable"]]
    assert answer.workers == workers or workers in alike
    assert answer.source == "predicted"
    assert answer.explanation.startswith("No run matches batch size 64000")
    assert f"{answer.model_error:.1%}" in why(answer)
    assert all(c.workers != 1 for c in answer.candidates)  # one machine only ever failed at 64,000
    assert {c.workers for c in answer.candidates} == {2, 3, 4}  # up to the largest measured n: no limit was given


# --- the `model` algorithm ----------------------------------------------------------------------------------------


def model_request(**kwargs) -> RecommendRequest:
    return RecommendRequest(**{"algorithm": "model", "workload": "truth", "batch_size": 256, "latency_ms": 25} | kwargs)


def test_recommend_model_respects_the_budget():
    answer = recommend_model(model_request(budget=3.0), CATALOG, grid())
    assert answer.source == "predicted"
    assert answer.ps_type is None  # all-reduce records: no PS, cost = n·c_t
    assert answer.candidates and all(c.hourly_cost <= 3.0 for c in answer.candidates)
    assert {c.worker_type for c in answer.candidates} == {s.name for s in CATALOG if s.role == "worker"}
    for c in answer.candidates:
        assert c.hourly_cost == pytest.approx(c.workers * PRICES[c.worker_type])
    assert max(c.workers for c in answer.candidates if c.worker_type == "c4.xlarge") == math.floor(3.0 / 0.231)
    assert 0 < answer.model_error < 0.1
    assert answer.extra["family"] in why(answer)
    assert f"{answer.model_error:.1%}" in why(answer)


@pytest.mark.parametrize(
    ("alpha", "beta", "objective"),
    [(1.0, 0.0, "fastest"), (0.0, 1.0, "cheapest")],
)
def test_alpha_beta_extremes(alpha, beta, objective):
    answer = recommend_model(model_request(budget=4.0, alpha=alpha, beta=beta), CATALOG, grid())
    costs = [c.hourly_cost for c in answer.candidates]
    if objective == "fastest":  # risk-aware: the least judged time (its 80 % interval's upper end, or the estimate)
        pick = next(c for c in answer.candidates if (c.worker_type, c.workers) == (answer.worker_type, answer.workers))
        assert pick.judged_s == min(c.judged_s for c in answer.candidates)
    else:
        assert answer.hourly_cost == min(costs)
        assert (answer.worker_type, answer.workers) == ("c4.xlarge", 1)


def test_pareto_is_non_dominated_and_sorted_by_cost():
    answer = recommend_model(model_request(budget=4.0, alpha=1.0, beta=1.0), CATALOG, grid())
    front = answer.pareto
    assert len(front) >= 2
    assert [c.hourly_cost for c in front] == sorted(c.hourly_cost for c in front)
    for p in front:
        assert not any(
            c.hourly_cost <= p.hourly_cost
            and c.epoch_time_s <= p.epoch_time_s
            and (c.hourly_cost, c.epoch_time_s) != (p.hourly_cost, p.epoch_time_s)
            for c in answer.candidates
        )
    chosen = (answer.worker_type, answer.workers)
    assert chosen in {(c.worker_type, c.workers) for c in front}  # a weighted optimum is never dominated


def test_ps_records_choose_a_ps_as_design_says():
    records = [PerfRecord(**{**r.__dict__, "strategy": "ps", "ps_type": "m4.2xlarge"}) for r in grid()]
    answer = recommend_model(model_request(budget=1.0), CATALOG, records)
    # m4.10xlarge ($2.5) leaves no budget for a worker; m4.2xlarge (1 Gbps) beats m4.large (450 Mbps)
    assert answer.ps_type == "m4.2xlarge"
    assert all(c.hourly_cost <= 1.0 for c in answer.candidates)
    assert all(c.hourly_cost == pytest.approx(0.5 + c.workers * PRICES[c.worker_type]) for c in answer.candidates)


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"budget": 0.2}, "cannot buy"),
        ({"budget": 2.0, "max_workers": 4}, "not both"),
        ({"budget": 2.0, "workload": "nobody"}, "No performance records"),
        ({"max_workers": 4, "alpha": -1.0}, "non-negative"),
    ],
)
def test_recommend_model_errors(request_kwargs, message):
    with pytest.raises(RecommendationError, match=message):
        recommend_model(model_request(**request_kwargs), CATALOG, grid())


def test_recommend_model_without_a_limit_stays_within_the_measured_worker_counts():
    answer = recommend_model(model_request(), CATALOG, grid())
    assert max(c.workers for c in answer.candidates) == 6
    assert "no budget or limit given" in why(answer)


def test_a_type_without_runs_carries_the_catalogues_uncertainty():
    """c4.8xlarge has no runs: priced through its catalogue speed, its interval adds how far the measured types' speeds
    stray from the catalogue's (g3.4xlarge's GPU far faster than its ECU say), so it is not chosen on faith."""
    model = predictor(grid(), CATALOG, cross_validate=False)
    measured, unmeasured = model.estimate_many([("c4.xlarge", 4, 256, 25.0), ("c4.8xlarge", 4, 256, 25.0)])
    assert model.bridge_error > 0.1 and unmeasured.std_log > max(measured.std_log, model.bridge_error * 0.99)


def test_recommend_model_says_where_it_extrapolates():
    answer = recommend_model(model_request(max_workers=8, latency_ms=300), CATALOG, grid())
    assert "Extrapolated:" in why(answer)
    assert "latency 300 ms lies outside the measured 0–100 ms" in why(answer)


def test_recommend_model_with_too_few_records_to_fit_answers_from_the_measurements_only():
    records = grid()[:3]  # one c4.xlarge at batch size 256 and 0, 25 and 50 ms: too few to fit a model
    answer = recommend_model(model_request(budget=2.0), CATALOG, records)
    assert (answer.worker_type, answer.workers, answer.candidates[0].basis) == ("c4.xlarge", 1, "measured")
    assert len(answer.candidates) == 1 and "Too few performance records" in why(answer)
    with pytest.raises(RecommendationError, match="too few runs fit a model to extrapolate with"):
        recommend_model(model_request(budget=2.0, batch_size=4096), CATALOG, records)


# --- calibration --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_by", ["latency", "workers", "batch_size", "type"])
def test_calibration_report_figures(group_by):
    report = calibration_report(grid(), CATALOG, group_by=group_by)
    json.dumps(report, allow_nan=False)
    for figure in ("mape", "median_ape", "mean_regret", "max_regret", "best_found"):
        assert math.isfinite(report[figure]), figure
    assert report["predicted"] == report["records"] == len(grid())
    assert report["cells"] > 0
    assert {"measured_s", "predicted_s", "workers", "latency_ms"} <= set(report["pairs"][0])


def test_calibration_with_a_single_group_skips_it():
    report = calibration_report(grid(latencies=(0.0,)), CATALOG, group_by="latency")
    assert report["groups"] == [0.0] and report["predicted"] == 0
    assert report["mape"] is None and report["mean_regret"] is None
    assert report["skipped"] == [
        {
            "group": 0.0,
            "records": len(grid(latencies=(0.0,))),
            "reason": "Too few performance records to fit a model: 0 with an epoch time, at least 4 needed",
        }
    ]


def test_calibration_mape_is_the_mean_of_the_pairs_errors():
    report = calibration_report(grid(), CATALOG, group_by="workers")
    errors = [abs(p["predicted_s"] - p["measured_s"]) / p["measured_s"] for p in report["pairs"]]
    assert report["groups"] == [1, 2, 3, 4, 5, 6]
    assert report["mape"] == pytest.approx(np.mean(errors)) and report["median_ape"] == pytest.approx(np.median(errors))


def test_regret_is_zero_when_the_model_is_perfect():
    report = calibration_report(grid(sigma=0.0), CATALOG, group_by="latency")
    assert report["mape"] < 1e-6
    assert report["mean_regret"] == 0.0
    assert report["best_found"] == 1.0


# --- the strategy left open: a parameter server or all-reduce (Shi et al.), chosen per job -------------------------


def strategy_records(ps_times: dict[int, float], ring_times: dict[int, float]) -> list[PerfRecord]:
    """c4.xlarge runs of workload "w" at batch 256 and 0 ms: through an m4.large PS, and all-reduce."""
    through_ps = [PerfRecord("w", "c4.xlarge", "m4.large", n, 256, 0.0, t, strategy="ps") for n, t in ps_times.items()]
    ring = [PerfRecord("w", "c4.xlarge", "", n, 256, 0.0, t, strategy="mirrored") for n, t in ring_times.items()]
    return through_ps + ring


def open_strategy(**fields) -> RecommendRequest:
    return RecommendRequest(
        "model", workload="w", worker_types=("c4.xlarge",), batch_size=256, latency_ms=0.0, parameter_server=None,
        **{"max_workers": 4, **fields},
    )  # fmt: skip


STRATEGY_CASES = [
    # PS times, all-reduce times, α, β → strategy, workers, PS. A PS cluster pays for its PS too: runs that name no PS
    # estimate every PS alike, so the cheapest, m4.large, wins the tie.
    ({1: 100, 2: 60, 3: 45, 4: 40}, {1: 100, 2: 70, 3: 62, 4: 60}, 1, 0, "ps", 4, "m4.large"),  # the PS scales
    ({1: 100, 2: 80, 3: 85, 4: 95}, {1: 100, 2: 55, 3: 40, 4: 32}, 1, 0, "mirrored", 4, None),  # the PS saturates
    # Equal times: by cost, all-reduce saves the PS.
    ({1: 100, 2: 60, 3: 45, 4: 40}, {1: 100, 2: 60, 3: 45, 4: 40}, 0, 1, "mirrored", 1, None),
]


@pytest.mark.parametrize(("ps", "ring", "alpha", "beta", "strategy", "workers", "ps_type"), STRATEGY_CASES)
def test_the_model_chooses_the_strategy_left_open_from_each_strategys_records(
    ps, ring, alpha, beta, strategy, workers, ps_type
):
    answer = recommend_model(open_strategy(alpha=alpha, beta=beta), CATALOG, strategy_records(ps, ring))

    assert (answer.extra["strategy"], answer.workers, answer.ps_type) == (strategy, workers, ps_type)
    assert {c.strategy for c in answer.candidates} == {"ps", "mirrored"}
    ps_price = PRICES[ps_type] if ps_type else 0.0
    assert answer.hourly_cost == pytest.approx(workers * PRICES["c4.xlarge"] + ps_price)
    assert answer.explanation.startswith("Strategy left open, ")
    assert set(answer.extra["strategies"]) == {"ps", "mirrored"} and answer.extra["strategies_not_compared"] == []


def test_a_strategy_without_records_is_not_guessed_at_and_the_answer_says_so():
    records = [r for r in strategy_records({}, {1: 100, 2: 55, 3: 40, 4: 32})]

    answer = recommend_model(open_strategy(), CATALOG, records)

    assert (answer.extra["strategy"], answer.ps_type, answer.workers) == ("mirrored", None, 4)
    assert answer.extra["strategies_not_compared"] == ["a parameter server has no records of this workload"]
    assert "not compared: a parameter server has no records of this workload (run it once to compare)" in (why(answer))


def test_only_the_model_takes_an_open_strategy():
    from recommender import algorithms

    request = RecommendRequest("cost-opt", workload="w", max_workers=2, parameter_server=None)
    with pytest.raises(RecommendationError, match="Only the model chooses between a parameter server and all-reduce"):
        algorithms.recommend(request, CATALOG, [])
