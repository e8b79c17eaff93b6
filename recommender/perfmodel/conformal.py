"""Calibration: one split-conformal interval, outside the model (Lei et al., "Distribution-free predictive inference
for regression", 2018). The predictor holds runs out (`cross_validate`: each latency, batch size and worker count in
turn, predicted by the rest) and scores each by how many of its σ the run missed by,
|log t/t̂| / σ; of m such scores the ⌈0.8·(m + 1)⌉-th smallest is q, and an interval t̂·e^{±q·σ} then holds a new run
at least 80 % of the time where the new run is like the held-out ones. σ grows away from the runs (the Gaussian
process's variance), so the same q reaches further there."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from recommender.perfmodel import guards
from recommender.perfmodel.fitting import GROUPINGS, _usable
from recommender.types import PerfRecord

LEVEL = 0.8  # the intervals' coverage
AXES = {"latency": "latencies", "batch_size": "batch sizes", "workers": "worker counts"}  # what a query can miss


def conformal_quantile(scores: Sequence[float], level: float = LEVEL) -> float:
    """The ⌈level·(m + 1)⌉-th smallest of m scores (the largest where that rank is past m; inf with none).

    >>> conformal_quantile([0.5, 0.1, 0.4, 0.2, 0.3])  # ⌈0.8 · 6⌉ = 5th of 5
    0.5
    >>> conformal_quantile([float(i) for i in range(1, 20)])  # ⌈0.8 · 20⌉ = 16th
    16.0
    >>> conformal_quantile([])
    inf
    """
    if not scores:
        return math.inf
    rank = min(math.ceil(level * (len(scores) + 1)), len(scores))
    return sorted(scores)[rank - 1]


def cross_validate(records: Sequence[PerfRecord], fold_of: Callable) -> dict:
    """What a predictor is worth, held out axis by axis: each value of each axis (AXES) predicted by `fold_of(the
    other runs)` (None: nothing to predict with), as it would answer — what its guards refuse (a latency when the
    rest ran at one other) scores nothing — the held-out MAPE, q, and the share of held-out runs inside their
    intervals, each fold's q from the other folds' runs (so that no run calibrates its own interval); {} when nothing
    could be held out."""
    usable = _usable(records)
    held = []  # (fold, measured s, estimated s, σ)
    kinds = []
    for axis, name in AXES.items():
        key = GROUPINGS[axis]
        groups = sorted({key(r) for r in usable}, key=lambda g: (g is None, g))
        if len(groups) < 2:
            continue
        kinds.append(f"{len(groups)} {name}")
        for group in groups:
            fold = fold_of([r for r in records if r.epoch_time_s is None or key(r) != group])
            out = [r for r in usable if key(r) == group]
            if fold is None:
                continue
            queries = [(r.instance_type, r.workers, r.batch_size, guards.latency(r)) for r in out]
            for r, e in zip(out, fold.estimate_many(queries), strict=True):
                if e is not None:
                    held.append(((axis, group), r.epoch_time_s, e.epoch_time_s, e.std_log))
    if not held:
        return {}
    scores = [abs(math.log(y / t)) / max(s, 1e-9) for _, y, t, s in held]
    inside = [
        score <= conformal_quantile([x for (g, *_), x in zip(held, scores, strict=True) if g != fold])
        for (fold, *_), score in zip(held, scores, strict=True)
    ]
    return {
        "q": conformal_quantile(scores),
        "cv_mape": float(np.mean([abs(t / y - 1) for _, y, t, _ in held])),
        "cv_coverage": float(np.mean(inside)),
        "cv": f"{', '.join(kinds)}, each held out in turn: {len(held)} held-out estimates",
        "cv_pairs": tuple((y, t, fold[0]) for fold, y, t, _ in held),
    }
