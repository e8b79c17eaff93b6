"""The explanation texts: the conditions a prediction assumes and where it leaves the measured ranges."""

from __future__ import annotations

from recommender.perfmodel.families import PerfModel
from recommender.types import Candidate, RecommendRequest

_UNNAMED_TYPES = " Hourly cost leaves out the workers: the records name no worker type."


def explain_model(
    model: PerfModel, request: RecommendRequest, pick: Candidate, configurations: int, *, unpriced_workers: bool
) -> str:
    """The `model` algorithm's explanation of its pick among `configurations` predicted ones; unpriced_workers: the
    records name no worker type, so hourly costs leave the workers out."""
    batch_text, latency_text = _conditions(model, request)
    if request.budget is not None:
        within = f" costing at most ${request.budget:g}/h"
    elif request.max_workers is not None:
        within = f" of at most {request.max_workers} workers"
    else:
        within = " up to the largest measured worker count (no budget or limit given)"
    return (
        f"Performance model {model.family} ({model.speed} speed; cross-validated error {model.cv_mape:.1%}, "
        f"{model.cv}) predicts {pick.epoch_time_s:.1f} s per epoch for "
        f"{f'{pick.workers} × {pick.worker_type}' if pick.worker_type else f'{pick.workers} workers'} "
        f"at {batch_text} and {latency_text}; it minimises α·time/best time + β·cost/best cost "
        f"(α = {request.alpha:g}, β = {request.beta:g}) over {configurations} configurations{within}."
        + _extrapolation(model, pick, request)
        + (_UNNAMED_TYPES if unpriced_workers else "")
    )


def explain_fallback(
    model: PerfModel, request: RecommendRequest, pick: Candidate, configurations: int, *, priced: bool
) -> str:
    """The lookup's explanation when the model answers for it; priced: the catalogue has a price for the pick's type."""
    batch_text, latency_text = _conditions(model, request)
    if priced:
        no_price = ""
    elif pick.worker_type:
        no_price = f" Hourly cost leaves out {pick.worker_type}: the catalogue has no price for it."
    else:
        no_price = _UNNAMED_TYPES
    return (
        f"No measured record matches {batch_text} and {latency_text}, so the performance model answers: "
        f"{model.family} ({model.speed} speed, cross-validated error {model.cv_mape:.1%}, {model.cv}) predicts "
        f"{pick.epoch_time_s:.1f} s per epoch with {pick.workers} worker{'s' * (pick.workers != 1)}, the fastest of "
        f"{configurations} configurations." + _extrapolation(model, pick, request) + no_price
    )


def _conditions(model: PerfModel, request: RecommendRequest) -> tuple[str, str]:
    batch = request.batch_size or model.batch_ref
    batch_text = f"batch size {batch:g}" if batch else "the measured batch size"
    if request.batch_size is None and batch:
        batch_text += " (the records' most common)"
    latency = model.latency_ref if request.latency_ms is None else request.latency_ms
    latency_text = f"{latency:g} ms latency" + (" (the records' most common)" if request.latency_ms is None else "")
    return batch_text, latency_text


def _extrapolation(model: PerfModel, pick: Candidate, request: RecommendRequest) -> str:
    """Where the answer leaves the measured ranges, said plainly."""
    coverage, notes = model.coverage, []
    low, high = coverage["workers"]
    if not low <= pick.workers <= high:
        notes.append(f"{pick.workers} workers lies outside the measured {low}–{high}")
    if pick.worker_type not in coverage["worker_types"]:
        notes.append(f"{pick.worker_type} has no records and is priced from its catalogue speed")
    for name, value, measured, unit in (
        ("batch size", request.batch_size, coverage["batch_sizes"], ""),
        ("latency", request.latency_ms, coverage["latencies_ms"], " ms"),
    ):
        if value is None:
            continue
        if len(measured) < 2 and value not in measured:
            seen = f"only {measured[0]:g}{unit}" if measured else f"no {name}"
            notes.append(f"the records measure {seen}, so the effect of {name} {value:g}{unit} is unknown to the model")
        elif not measured[0] <= value <= measured[-1]:
            notes.append(f"{name} {value:g}{unit} lies outside the measured {measured[0]:g}–{measured[-1]:g}{unit}")
    return f" Extrapolated: {'; '.join(notes)}." if notes else ""
