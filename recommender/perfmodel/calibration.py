"""Calibration: how well a workload's model (`calibration_report`: the Records page, `manage.py model_report`) and its
whole predictor beside the model alone and plain interpolation (`holdout_report`: benchmarks/model_calibration.py)
predict records they were not built from."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.metrics import mean_absolute_percentage_error
from sklearn.model_selection import LeaveOneGroupOut

from recommender.perfmodel.choice import choose
from recommender.perfmodel.fitting import GROUPINGS, _pattern, _usable, fit
from recommender.perfmodel.predictor import predictor
from recommender.types import Candidate, InstanceSpec, PerfRecord, RecommendationError


def calibration_report(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, group_by: str = "latency"
) -> dict:
    """Leave-one-group-out figures on the workload's own records (JSON-serialisable).

    Each group (a latency, worker count, batch size or worker type) is predicted by a model fitted on the others
    (its family chosen by the same leave-one-group-out on them, or leave-one-out when fewer than 3 groups remain).
    mape: of every held-out epoch time. Regret, per (worker type, batch size, latency) cell with at least two
    measured worker counts: measured time of the model's fastest n among the measured ones ÷ measured best − 1.
    """
    if group_by not in GROUPINGS:
        raise ValueError(f"unknown grouping {group_by!r}: use one of {', '.join(GROUPINGS)}")
    usable = _usable(records)
    full = fit(usable, catalog)  # raises when there are too few records
    key = GROUPINGS[group_by]
    labels = [str(key(r)) for r in usable]  # one type per grouping; None (no batch size) is a group of its own
    if len(set(labels)) > 1:
        folds = LeaveOneGroupOut().split(np.zeros(len(usable)), groups=labels)  # groups in sorted order of their labels
    else:  # LeaveOneGroupOut refuses a single group: holding it out leaves nothing to fit, a skip like any other
        folds = [(np.arange(0), np.arange(len(usable)))]
    groups, pairs, skipped, families = [], [], [], {}
    for train_rows, test_rows in folds:
        train = [usable[i] for i in train_rows]
        held_out = [usable[i] for i in test_rows]
        group = key(held_out[0])
        groups.append(group)
        try:
            model = fit(train, catalog, cv=group_by)
        except RecommendationError as error:
            skipped.append({"group": _json(group), "records": len(held_out), "reason": str(error)})
            continue
        families[str(_json(group))] = model.family
        priced = [r for r in held_out if model.can_price(r.instance_type)]
        if len(priced) < len(held_out):
            skipped.append({"group": _json(group), "records": len(held_out) - len(priced), "reason": "type unpriced"})
        if not priced:
            continue
        predicted = model.predict_many(
            [r.instance_type for r in priced],
            [r.workers for r in priced],
            [r.batch_size for r in priced],
            [r.latency_ms or 0.0 for r in priced],
        )
        pairs += [_pair(group, r, p) for r, p in zip(priced, predicted, strict=True)]
    measured = np.array([p["measured_s"] for p in pairs])
    predicted = np.array([p["predicted_s"] for p in pairs])
    regrets = _regrets(pairs)
    return {
        "group_by": group_by,
        "groups": [_json(g) for g in groups],
        "records": len(usable),
        "failed_runs": sum(1 for r in records if r.epoch_time_s is None),
        "predicted": len(pairs),
        "mape": float(mean_absolute_percentage_error(measured, predicted)) if pairs else None,
        "median_ape": float(np.median(np.abs(predicted - measured) / measured)) if pairs else None,
        "cells": len(regrets),
        "mean_regret": float(np.mean(regrets)) if regrets else None,
        "max_regret": float(np.max(regrets)) if regrets else None,
        "best_found": float(np.mean([r == 0 for r in regrets])) if regrets else None,
        "families": families,
        "full_model": {
            "family": full.family,
            "speed": full.speed,
            "loss": full.loss,
            "cv": full.cv,
            "cv_mape": full.cv_mape,
            "coefficients": full.coefficients,
        },
        "skipped": skipped,
        "pairs": pairs,
    }


def _pair(group: object, record: PerfRecord, predicted_s: float) -> dict:
    """A held-out record beside its prediction, as the reports list them."""
    return {
        "group": _json(group),
        "worker_type": record.instance_type,
        "workers": record.workers,
        "batch_size": record.batch_size,
        "latency_ms": float(record.latency_ms or 0.0),
        "measured_s": float(record.epoch_time_s or 0.0),  # (a held-out run has a time)
        "predicted_s": float(predicted_s),
    }


def _regrets(pairs: list[dict]) -> list[float]:
    cells = defaultdict(list)
    for p in pairs:
        cells[(p["worker_type"], p["batch_size"], p["latency_ms"])].append(p)
    regrets = []
    for cell in cells.values():
        if len({p["workers"] for p in cell}) < 2:
            continue
        best = min(p["measured_s"] for p in cell)
        pick = min(cell, key=lambda p: (p["predicted_s"], p["workers"]))
        regrets.append(pick["measured_s"] / best - 1.0)
    return regrets


def _json(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


# --- the whole predictor against the model alone and plain interpolation (benchmarks/model_calibration.py) ----------

METHODS = ("predictor", "model", "baseline")


def holdout_report(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, group_by: str, method: str = "predictor"
) -> dict:
    """One latency, batch size or worker count held out at a time and predicted from the rest (JSON-serialisable).

    method: ``predictor`` (recommender.perfmodel.predictor, rebuilt on each fold's records as the recommender builds
    it: model and process refitted, its conformal interval from its own cross-validation of the fold's records),
    ``model`` (the fitted family alone, `fit` on each fold's records) or ``baseline`` — plain interpolation along the
    held-out axis with nothing fitted: linear between the two neighbouring measured values of that axis
    (latencies, batch sizes or worker counts) at the same worker type and other two coordinates; one machine of an
    all-reduce workload taken as latency-independent (its runs at the same batch size, any latency).

    Figures: mape over every held-out time answered; coverage (predictor only): the share of held-out runs inside
    their 80 % interval. The choice is scored as the recommender makes it from the fold's records: per (worker type,
    batch size, latency) cell with at least two measured worker counts, and per fold that holds out runs of it. The
    predictor chooses as `recommend --algorithm lookup` would from the fold (every measured count of the cell
    estimated, the fold's runs measured, by choice.choose: each time judged by the upper end of its interval); the
    model and the baseline take the held-out counts' predicted times against the other counts' measured times in the
    fold.
    The cell is answered when every measured count is a candidate, and then regret = measured time of the chosen
    count ÷ the measured best − 1 and best = whether that count is the measured best or one the runs cannot tell
    from it (`_as_fast`: a run of it at least as fast as the best's slowest run; measured once, only an equal time
    ties); `cells` counts these choices (a cell once per worker count when worker counts are held out),
    cells_answered = answered ÷ cells; each of `choices` names its fold, cell, regret, best and the count it picked.
    """
    if group_by not in GROUPINGS:
        raise ValueError(f"unknown grouping {group_by!r}: use one of {', '.join(GROUPINGS)}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    usable = _usable(records)
    key = GROUPINGS[group_by]
    groups = sorted({key(r) for r in usable}, key=lambda g: (g is None, g))
    cells = _cells(usable)
    pairs: list[dict] = []
    skipped: list[dict] = []
    choices: list[tuple[object, tuple, tuple[float, bool, int] | None]] = []
    for group in groups:
        train = [r for r in records if r.epoch_time_s is None or key(r) != group]
        held_out = [r for r in usable if key(r) == group]
        try:
            times, chooser = _fold_times(method, group_by, train, held_out, catalog)
        except RecommendationError as error:
            skipped.append({"group": _json(group), "records": len(held_out), "reason": str(error)})
            choices += [(_json(group), key, None) for key in {_cell_key(r) for r in held_out} & set(cells)]
            continue
        fold = [
            _pair(group, r, time_s) | {"basis": basis, "interval_s": interval}
            for r, (time_s, basis, interval) in zip(held_out, times, strict=True)
            if time_s is not None
        ]
        pairs += fold
        choices += [(_json(group), key, c) for key, c in _fold_choices(cells, train, held_out, fold, chooser).items()]
    answered = [choice for _, _, choice in choices if choice is not None]
    regrets = [regret for regret, _, _ in answered]
    errors = defaultdict(list)
    for p in pairs:
        errors[p["basis"]].append(abs(p["predicted_s"] / p["measured_s"] - 1))
    every = [e for values in errors.values() for e in values]
    inside = [p["interval_s"][0] <= p["measured_s"] <= p["interval_s"][1] for p in pairs if p["interval_s"]]
    return {
        "group_by": group_by,
        "method": method,
        "groups": [_json(g) for g in groups],
        "records": len(usable),
        "failed_runs": sum(1 for r in records if r.epoch_time_s is None),
        "predicted": len(pairs),
        "mape": float(np.mean(every)) if every else None,
        "coverage": float(np.mean(inside)) if inside else None,
        "by_basis": {basis: {"mape": float(np.mean(v)), "count": len(v)} for basis, v in sorted(errors.items())},
        "cells": len(choices),
        "cells_answered": len(answered) / len(choices) if choices else None,
        "mean_regret": float(np.mean(regrets)) if regrets else None,
        "max_regret": float(np.max(regrets)) if regrets else None,
        "best_found": float(np.mean([best for _, best, _ in answered])) if answered else None,
        "skipped": skipped,
        "pairs": pairs,
        "choices": [
            {
                "group": group,
                "cell": list(key),
                "regret": None if c is None else c[0],
                "best": None if c is None else c[1],
                "pick": None if c is None else c[2],
            }
            for group, key, c in choices
        ],
    }


def _fold_times(
    method: str, group_by: str, train: list[PerfRecord], held_out: list[PerfRecord], catalog: Sequence[InstanceSpec]
) -> tuple[list[tuple], Callable | None]:
    """Each held-out run's (predicted time or None, basis, its 80 % run interval or None), and how the method chooses
    in a cell (None: the held-out counts' times against the fold's measured ones)."""
    points = [(r.instance_type, r.workers or 1, r.batch_size, float(r.latency_ms or 0.0)) for r in held_out]
    if method == "predictor":
        fold = predictor(train, catalog)  # cross-validated on the fold's own runs, as the recommender's is
        times = [
            (None, "", None) if e is None else (e.epoch_time_s, e.basis, list(e.interval))
            for e in fold.estimate_many(points)
        ]

        def chooser(cell: tuple, counts: Sequence[int]) -> int | None:
            worker_type, batch, latency = cell
            estimates = fold.estimate_many([(worker_type, n, batch, latency) for n in counts])
            known = [e for e in estimates if e is not None]
            if len(known) < len(estimates):
                return None
            candidates = [
                Candidate(worker_type, n, e.epoch_time_s, 0.0, e.basis, interval_s=e.interval, judged_s=fold.judged(e))
                for n, e in zip(counts, known, strict=True)
            ]
            return choose(candidates, 1.0, 0.0).workers

        return times, chooser
    if method == "model":
        model = fit(_usable(train), catalog)
        predicted = model.predict_many(*zip(*points, strict=True))  # NaN where the model cannot price the type
        return [(None, "", None) if np.isnan(t) else (float(t), "model", None) for t in predicted], None
    return [(*interpolation_baseline(train, r, group_by), None) for r in held_out], None


def interpolation_baseline(train: Sequence[PerfRecord], at: PerfRecord, axis: str) -> tuple[float | None, str]:
    """Plain interpolation (holdout_report's baseline): the time of configuration `at` from the runs `train`, linear
    between the two neighbouring measured values of `axis` ("latency", "batch_size" or "workers"); one machine of an
    all-reduce workload latency-independent. (None, "") when nothing brackets it.

    >>> runs = [PerfRecord("w", workers=2, batch_size=64, latency_ms=l, epoch_time_s=t) for l, t in [(0, 10), (40, 30)]]
    >>> interpolation_baseline(runs, PerfRecord("w", workers=2, batch_size=64, latency_ms=10.0), "latency")
    (15.0, 'interpolated')
    >>> one = [PerfRecord("w", workers=1, batch_size=64, latency_ms=0.0, epoch_time_s=12.0)]
    >>> interpolation_baseline(one, PerfRecord("w", workers=1, batch_size=64, latency_ms=80.0), "latency")
    (12.0, 'measured')
    """
    usable = _usable(train)
    axes = {"latency": "latency_ms", "batch_size": "batch_size", "workers": "workers"}
    field = axes[axis]
    if at.workers == 1 and _pattern(usable) != "ps":
        same = [
            r.epoch_time_s or 0.0
            for r in usable
            if (r.instance_type, r.workers, r.batch_size) == (at.instance_type, 1, at.batch_size)
        ]
        if same:
            return float(np.mean(same)), "measured"
    others = [name for name in ("instance_type", "workers", "batch_size", "latency_ms") if name != field]
    line: dict = defaultdict(list)
    for r in usable:
        if all(_coordinate(r, name) == _coordinate(at, name) for name in others) and _coordinate(r, field) is not None:
            line[_coordinate(r, field)].append(r.epoch_time_s)
    x = _coordinate(at, field)
    below = [v for v in line if x is not None and v < x]
    above = [v for v in line if x is not None and v > x]
    if not below or not above:
        return None, ""
    lo, hi = max(below), min(above)
    t_lo, t_hi = float(np.mean(line[lo])), float(np.mean(line[hi]))
    return t_lo + (x - lo) / (hi - lo) * (t_hi - t_lo), "interpolated"


def _coordinate(record: PerfRecord, name: str) -> object:
    value = getattr(record, name)
    return float(value or 0.0) if name == "latency_ms" else value


def _cell_key(record: PerfRecord) -> tuple:
    """Where a choice of worker count is made: (worker type, batch size, latency)."""
    return (record.instance_type, record.batch_size, float(record.latency_ms or 0.0))


def _runs(usable: Sequence[PerfRecord]) -> dict:
    """(worker type, batch size, latency) -> {workers: [measured times]}."""
    times: dict = defaultdict(lambda: defaultdict(list))
    for r in usable:
        times[_cell_key(r)][r.workers].append(r.epoch_time_s)
    return times


def _means(counts: dict) -> dict:
    """{workers: [times]} -> {workers: their mean}."""
    return {n: float(np.mean(times)) for n, times in counts.items()}


def _cells(usable: Sequence[PerfRecord]) -> dict:
    """_runs' cells of at least two worker counts: those where a choice is made."""
    return {key: counts for key, counts in _runs(usable).items() if len(counts) >= 2}


def _as_fast(runs: dict) -> set:
    """The worker counts the measurements cannot tell from the fastest (the smallest mean): those with a run at
    least as fast as the fastest count's slowest run. A count measured once ties only its equal.

    >>> sorted(_as_fast({1: [0.40, 0.50], 2: [0.45, 0.55], 3: [0.60, 0.62]}))  # 2's 0.45 s beats 1's 0.50 s
    [1, 2]
    >>> sorted(_as_fast({1: [5.10], 2: [5.12]}))
    [1]
    """
    means = _means(runs)
    slowest = max(runs[min(means, key=lambda n: means[n])])
    return {n for n, times in runs.items() if min(times) <= slowest}


def _fold_choices(
    cells: dict,
    train: Sequence[PerfRecord],
    held_out: Sequence[PerfRecord],
    fold: list[dict],
    chooser: Callable | None = None,
) -> dict[tuple, tuple[float, bool, int] | None]:
    """One fold's choice in each cell it holds runs of: cell -> (regret, best, the count chosen), or None when some
    measured count has neither a prediction nor a measurement in the fold. chooser(cell, counts): the method's own
    choice among the cell's measured counts (None: not answered); without one, the fastest of the fold's measured
    times and the held-out counts' predictions.

    >>> runs = [PerfRecord("w", workers=n, batch_size=64, latency_ms=0.0, epoch_time_s=t) for n, t in [(1, 9), (2, 6)]]
    >>> cells = _cells(runs)
    >>> two_held_out = [_pair(2, runs[1], 10.0)]  # two workers predicted 10 s: one machine's measured 9 s wins
    >>> [(round(regret, 2), best, pick) for regret, best, pick in _fold_choices(cells, runs[:1], runs[1:],
    ...                                                                         two_held_out).values()]
    [(0.5, False, 1)]
    >>> _fold_choices(cells, runs[:1], runs[1:], [])  # the held-out count not answered
    {('', 64, 0.0): None}
    """
    predicted: dict = defaultdict(lambda: defaultdict(list))
    for p in fold:
        predicted[(p["worker_type"], p["batch_size"], p["latency_ms"])][p["workers"]].append(p["predicted_s"])
    kept = _runs(_usable(train))
    choices = {}
    for key in sorted({_cell_key(r) for r in held_out} & set(cells), key=str):
        measured = _means(cells[key])
        if chooser is not None:
            pick = chooser(key, sorted(measured))
        else:
            # the fold's own runs (none of the held-out ones), then the held-out counts' predictions
            candidates = _means(kept.get(key, {})) | _means(predicted.get(key, {}))
            pick = None if set(measured) - set(candidates) else min(measured, key=lambda n: (candidates[n], n))
        choices[key] = (
            None
            if pick is None
            else (measured[pick] / min(measured.values()) - 1.0, pick in _as_fast(cells[key]), pick)
        )
    return choices
