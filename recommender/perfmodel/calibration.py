"""The calibration report: how well a workload's model predicts records it was not fitted on (the Records page,
`manage.py model_report`, benchmarks/model_calibration.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from sklearn.metrics import mean_absolute_percentage_error
from sklearn.model_selection import LeaveOneGroupOut

from recommender.perfmodel.fitting import GROUPINGS, _usable, fit
from recommender.types import InstanceSpec, PerfRecord, RecommendationError


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
        pairs += [
            {
                "group": _json(group),
                "worker_type": r.instance_type,
                "workers": r.workers,
                "batch_size": r.batch_size,
                "latency_ms": float(r.latency_ms or 0.0),
                "measured_s": float(r.epoch_time_s),
                "predicted_s": float(p),
            }
            for r, p in zip(priced, predicted, strict=True)
        ]
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


def _json(value):
    return value.item() if isinstance(value, np.generic) else value
