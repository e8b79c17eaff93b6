"""The explanation texts: where a pick's epoch time came from, what it is worth, the conditions it assumes, where it
leaves the measured ranges, the configurations the data cannot tell from it and those that cannot be estimated, and
why nothing could be (the warning of failed runs near it is recommender.algorithms.warning_text)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from recommender.algorithms import configuration_text
from recommender.perfmodel.predictor import BOUND, ESTIMATE, PredictorModel
from recommender.types import Candidate, RecommendationError, RecommendRequest

KNEE_SEARCH = 64  # the largest worker count at which a roofline's knee is looked for
_UNNAMED_TYPES = " Hourly cost leaves out the workers: the records name no worker type."


def error_text(fraction: float) -> str:
    """A cross-validated error as every door writes it (the explanation here, the Records page).

    >>> error_text(0.0904)
    '9.0%'
    """
    return f"{fraction:.1%}"


def coverage_text(fraction: float) -> str:
    """An interval's coverage as every door writes it.

    >>> coverage_text(0.774)
    '77%'
    """
    return f"{fraction:.0%}"


def explain_model(
    model: PredictorModel,
    request: RecommendRequest,
    pick: Candidate,
    configurations: int,
    detail: str,
    *,
    unpriced_workers: bool,
) -> str:
    """The `model` algorithm's explanation of its pick among `configurations` estimated ones (detail: where its time
    came from); unpriced_workers: the records name no worker type, so hourly costs leave the workers out."""
    batch_text, latency_text = _conditions(model, request)
    if request.budget is not None:
        within = f" costing at most ${request.budget:g}/h"
    elif request.max_workers is not None:
        within = f" of at most {request.max_workers} workers"
    else:
        within = " up to the largest measured worker count (no budget or limit given)"
    return (
        f"{configuration_text(pick)} at {batch_text} and {latency_text}: {pick.epoch_time_s:.3g} s per epoch, "
        f"{_source(pick, detail)}; it minimises α·time/best time + β·cost/best cost (α = {request.alpha:g}, "
        f"β = {request.beta:g}) over {_configurations(configurations)}{within}. {choice_rule_text(model)} "
        f"{_predictor_text(model)}"
        + _saturation(model, request, pick)
        + _extrapolation(model, pick, request)
        + _one_machine(model)
        + (_UNNAMED_TYPES if unpriced_workers else "")
    )


def explain_fallback(
    model: PredictorModel, request: RecommendRequest, pick: Candidate, configurations: int, detail: str, *, priced: bool
) -> str:
    """The lookup's explanation when the predictor answers for it (detail: where the pick's time came from); priced:
    the catalogue prices the pick's type."""
    batch_text, latency_text = _conditions(model, request)
    if priced:
        no_price = ""
    elif pick.worker_type:
        no_price = f" Hourly cost leaves out {pick.worker_type}: the catalogue has no price for it."
    else:
        no_price = _UNNAMED_TYPES
    return (
        f"No measured record matches {batch_text} and {latency_text}, so the predictor answers: "
        f"{configuration_text(pick)}, {pick.epoch_time_s:.3g} s per epoch, {_source(pick, detail)} — the fastest of "
        f"{_configurations(configurations)}. {choice_rule_text(model)} {_predictor_text(model)}"
        + _extrapolation(model, pick, request)
        + _one_machine(model)
        + no_price
    )


def _configurations(count: int) -> str:
    return f"{count} configuration{'s' * (count != 1)}"


def judged_text(model: PredictorModel) -> str:
    """What the choice weighs of each configuration's time (PredictorModel.judged), in words."""
    return "the upper end of its 80 % interval" if model.rule == BOUND else "its estimate"


def choice_rule_text(model: PredictorModel) -> str:
    """How the choice judged each configuration's time, and the held-out choices that set it (PredictorModel.rule)."""
    judged = judged_text(model)
    regret = model.rule_regret
    if not regret:
        return (
            f"Each time is judged by {judged}: a configuration the data know little about must be better by its "
            "uncertainty (no held-out choice could tell that from trusting the estimates)."
        )
    other, other_name = (ESTIMATE, "the estimates") if model.rule == BOUND else (BOUND, "the intervals' upper ends")
    close = ""
    if model.rule == BOUND and regret[ESTIMATE] < regret[BOUND]:
        error = "" if regret["error"] is None else f", {regret['error']:.1%}"
        close = f", less by no more than the standard error of the difference{error}"
    return (
        f"Each time is judged by {judged}: on the workload's {regret['choices']} held-out choices that lost "
        f"{regret[model.rule]:.1%} of time on average, judging by {other_name} {regret[other]:.1%}{close}."
    )


def _one_machine(model: PredictorModel) -> str:
    """Why one machine is no candidate, where it is not (PredictorModel.one_machine_unknown)."""
    if not model.one_machine_unknown:
        return ""
    return (
        " One machine is no candidate: no run measured one, and the runs of several cannot tell its computing apart "
        "from the collectives they pay on every step."
    )


def _source(c: Candidate, detail: str) -> str:
    """Where a candidate's time came from, its 80 % interval and expected error, e.g. "predicted: … (80 %: 40.1–44 s,
    expected error 3.1%)"."""
    worth = [f"80 %: {c.interval_s[0]:.3g}–{c.interval_s[1]:.3g} s"] if c.interval_s else []
    worth += [] if c.expected_error is None else [f"expected error {c.expected_error:.1%}"]
    worth_text = f" ({', '.join(worth)})" if worth else ""
    return f"{detail if detail.startswith(c.basis) else f'{c.basis}: {detail}'}{worth_text}"


def _predictor_text(model: PredictorModel) -> str:
    """What the predictor is and what it is worth: its cross-validation, its mean and the process on its residuals."""
    if model.cv:
        worth = (
            f"The predictor's cross-validated error is {error_text(model.overall_error)}, its 80 % intervals holding "
            f"{coverage_text(model.cv_coverage)} of the held-out runs ({model.cv})"
        )
    elif model.overall_error is not None:
        worth = f"The predictor's error is taken as the model's own, {model.overall_error:.1%}"
    else:
        worth = "The predictor's error is unknown"
    least, most = (f"{math.exp(noise) - 1:.1%}" for noise in model.noise)
    noise = f"a run's noise ±{most}" if least == most else f"a run's noise ±{least} to ±{most}, the more it computes"
    fitted = model.model
    if fitted is None:
        return (
            f"{worth}; a Gaussian process over the runs' log times ({noise}) answers within their ranges, and there "
            f"is no model to extrapolate with ({model.model_error})."
        )
    return (
        f"{worth}; its mean is the performance model {fitted.family} ({fitted.speed} speed; its own cross-validated "
        f"error {fitted.cv_mape:.1%}, {fitted.cv}), corrected near the runs by a Gaussian process on its log "
        f"residuals ({noise})."
    )


def _saturation(model: PredictorModel, request: RecommendRequest, pick: Candidate) -> str:
    """Where a roofline's server bounds the epoch for the pick's type, e.g. " … saturates from 3 workers …"; nothing
    when the pick has more workers than that (its own estimates then say more than the model's knee)."""
    if model.model is None:
        return ""
    knee = model.model.saturates_from(pick.worker_type, request.batch_size, request.latency_ms, KNEE_SEARCH)
    if knee is None or pick.workers > knee:
        return ""
    measured = model.coverage["workers"][1]
    beyond = f", beyond the {measured} workers measured" if knee > measured else ""
    return (
        f" The parameter server bounds the epoch from {knee} worker{'s' * (knee != 1)}"
        f"{f' of {pick.worker_type}' if pick.worker_type else ''} at these conditions (the model's roofline{beyond}): "
        "more workers than that train no faster."
    )


def _conditions(model: PredictorModel, request: RecommendRequest) -> tuple[str, str]:
    batch = request.batch_size or model.batch_ref
    batch_text = f"batch size {batch:g}" if batch else "the measured batch size"
    if request.batch_size is None and batch:
        batch_text += " (the records' most common)"
    latency = model.latency_ref if request.latency_ms is None else request.latency_ms
    latency_text = f"{latency:g} ms latency" + (" (the records' most common)" if request.latency_ms is None else "")
    return batch_text, latency_text


def _extrapolation(model: PredictorModel, pick: Candidate, request: RecommendRequest) -> str:
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
        if value is None or (name == "latency" and pick.workers == 1 and model.latency_free):
            continue  # one machine of an all-reduce workload: latency does not reach it
        if not measured:  # one measured value and another asked is no candidate (PredictorModel.unmeasured)
            notes.append(f"the records measure no {name}, so the effect of {name} {value:g}{unit} is unknown")
        elif not measured[0] <= value <= measured[-1]:
            notes.append(f"{name} {value:g}{unit} lies outside the measured {measured[0]:g}–{measured[-1]:g}{unit}")
    return f" Extrapolated: {'; '.join(notes)}." if notes else ""


ALIKE_NAMED = 3  # the explanation names this many of the configurations the data cannot tell from the pick


def alike_text(alike: Sequence[Candidate]) -> str:
    """The sentence on the configurations the data cannot tell from the pick ("" when there are none)."""
    if not alike:
        return ""
    named = "; ".join(
        f"{configuration_text(c)}, {c.interval_s[0]:.3g}–{c.interval_s[1]:.3g} s" if c.interval_s else
        f"{configuration_text(c)}, {c.epoch_time_s:.3g} s"
        for c in alike[:ALIKE_NAMED]
    )  # fmt: skip
    more = f" and {len(alike) - ALIKE_NAMED} more" if len(alike) > ALIKE_NAMED else ""
    return (
        f" The data cannot tell it apart from {len(alike)} other configuration{'s' * (len(alike) != 1)} (80 % "
        f"intervals overlapping its own): {named}{more}."
    )


def unmeasured_text(unmeasured: Counter) -> str:
    """The sentence on the configurations within the limit that could not be estimated at all ("" when none)."""
    if not unmeasured:
        return ""
    count = sum(unmeasured.values())
    return (
        f" {count} other configuration{'s' * (count != 1)} within the limit cannot be estimated: "
        f"{_unmeasured_reasons(unmeasured)} (measure a run there to compare)."
    )


def _unmeasured_reasons(unmeasured: Counter) -> str:
    """Why configurations could not be estimated (PredictorModel.unmeasured's reasons), in one clause."""
    return f"{'; '.join(sorted(unmeasured))}, and nothing in them tells what another value costs"


def nothing_estimated(model: PredictorModel, skip: set, unmeasured: Counter) -> RecommendationError:
    """Why no configuration within the limit has an epoch time."""
    if unmeasured:
        return RecommendationError(
            f"no configuration within the limit can be estimated: {_unmeasured_reasons(unmeasured)} (measure a run "
            "there, or ask at the measured value)"
        )
    if model.model is None:
        failed = f"; {len(skip)} only ever failed" if skip else ""
        return RecommendationError(
            f"no configuration within the limit lies within the measured ranges{failed}, and there is no model "
            f"to extrapolate with: {model.model_error}"
        )
    if skip:
        return RecommendationError("every configuration within the limit has only failed runs on record")
    return RecommendationError("no configuration within the limit can be predicted (none affordable)")
