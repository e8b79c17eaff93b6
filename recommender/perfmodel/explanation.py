"""The explanation of a pick: one plain sentence (the pick, its time with its 80 % interval — the one error figure —
and its cost), and the details behind a "why", a list the pages fold away, with the answer's other details as JSON;
and the refusal when nothing can be estimated (the warning of failed runs near a pick is
recommender.algorithms.warning_text)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from recommender.algorithms import configuration_text
from recommender.perfmodel.predictor import PredictorModel
from recommender.types import Candidate, RecommendationError, RecommendRequest

ALIKE_NAMED = 3  # the why names this many of the configurations the data cannot tell from the pick
KNEE_SEARCH = 64  # the largest worker count at which a roofline's knee is looked for


@dataclass(frozen=True)
class Context:
    """What an explanation says of a pick besides the pick itself."""

    request: RecommendRequest
    model: PredictorModel  # the predictor that estimated it
    detail: str  # where the pick's time came from
    configurations: int  # how many were estimated
    refused: Counter  # why the others within the limit were not (guards: reason -> how many)
    left: int  # runs through other PS types left out (0: none)
    unpriced_workers: bool  # the records name no worker type: hourly costs leave the workers out
    priced: bool  # the catalogue prices the pick's type
    fallback: bool = False  # the lookup's fallback, not the model algorithm


def error_text(fraction: float) -> str:
    """A cross-validated error as every door writes it.

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


def sentence(context: Context, pick: Candidate, ps_type: str | None) -> str:
    """The answer in one sentence, e.g. "4 × c4.xlarge with a m4.large PS: 42.1 s per epoch (80 %: 38–47.5 s),
    $1.05/h."."""
    low, high = pick.interval_s or (pick.epoch_time_s, pick.epoch_time_s)
    cluster = f"{configuration_text(pick)} {f'with a {ps_type} PS' if ps_type else 'and no PS'}"
    cost = (
        "hourly cost unknown (the records name no worker type)"
        if context.unpriced_workers
        else (
            f"${pick.hourly_cost:g}/h" if context.priced else f"hourly cost unknown (no price for {pick.worker_type})"
        )
    )
    time = f"{pick.epoch_time_s:.3g} s per epoch ({pick.basis}; 80 %: {low:.3g}–{high:.3g} s)"
    lead = f"No run matches {_conditions(context)}; the model answers " if context.fallback else ""
    return f"{lead}{cluster}: {time}, {cost}."


def choice_rule_text(model: PredictorModel) -> str:
    """How every answer chooses (choice.choose), as the Records page and `model_report` quote it."""
    return (
        "Each time is judged by the upper end of its 80 % interval, so a configuration the data know little about "
        "must be better by its uncertainty; ties go to the cheaper, then by name."
    )


def why(context: Context, pick: Candidate, ps_type: str | None, alike: Sequence[Candidate]) -> list[str]:
    """The details behind the sentence, one plain line each."""
    model, request = context.model, context.request
    if request.budget is not None:
        within = f"costing at most ${request.budget:g}/h"
    elif request.max_workers is not None:
        within = f"of at most {request.max_workers} workers"
    else:
        within = "up to the largest measured worker count (no budget or limit given)"
    lines = [
        f"Chosen among {context.configurations} configuration{'s' * (context.configurations != 1)} {within} at "
        f"{_conditions(context)}: the least α·U/U_best + β·cost/cost_best (α = {request.alpha:g}, β = "
        f"{request.beta:g}). {choice_rule_text(model)}",
        f"Its time: {context.detail}.",
        _worth(model),
    ]
    if alike:
        named = "; ".join(f"{configuration_text(c)}, {_span(c.interval_s)}" for c in alike[:ALIKE_NAMED])
        more = f" and {len(alike) - ALIKE_NAMED} more" if len(alike) > ALIKE_NAMED else ""
        lines.append(f"The data cannot tell it from {len(alike)} other{'s' * (len(alike) != 1)}: {named}{more}.")
    if context.refused:
        lines.append(f"Not estimated: {_reasons(context.refused)} (measure a run there to compare).")
    if context.left:
        lines.append(f"From the runs through {ps_type} only: the {context.left} through other PS types say nothing of "
                     "its capacity.")  # fmt: skip
    lines += _knee(model, request, pick) + _outside(model, pick, request)
    if context.unpriced_workers:
        lines.append("Hourly cost leaves out the workers: the records name no worker type.")
    return lines


def _span(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f"{interval[0]:.3g}–{interval[1]:.3g} s"


def _worth(model: PredictorModel) -> str:
    """What the predictor is and what it is worth."""
    if model.cv_mape is not None and model.cv_coverage is not None:
        worth = (f"The predictor's cross-validated error is {error_text(model.cv_mape)}, its 80 % intervals holding "
                 f"{coverage_text(model.cv_coverage)} of the held-out runs ({model.cv})")  # fmt: skip
    else:
        worth = "The predictor is not cross-validated: too few values of any axis to hold one out"
    mean = f"the {model.model.family} model" if model.model else f"the runs' mean ({model.model_error})"
    noise = f"{math.exp(model.noise_log) - 1:.1%}"
    return (
        f"{worth}. Its mean is {mean}; a Gaussian process on the log residuals corrects it near the runs (a "
        f"run's noise ±{noise})."
    )


def _knee(model: PredictorModel, request: RecommendRequest, pick: Candidate) -> list[str]:
    """Where a roofline's server bounds the epoch for the pick's type (none when the pick has more workers than that:
    its own estimates then say more than the model's knee)."""
    knee = model.model.saturates_from(pick.worker_type, request.batch_size, request.latency_ms, KNEE_SEARCH) if (
        model.model) else None  # fmt: skip
    if knee is None or pick.workers > knee:
        return []
    of = f" of {pick.worker_type}" if pick.worker_type else ""
    return [f"The parameter server bounds the epoch from {knee} worker{'s' * (knee != 1)}{of} at these conditions (the "
            "model's roofline): more workers than that train no faster."]  # fmt: skip


def _conditions(context: Context) -> str:
    model, request = context.model, context.request
    batch = request.batch_size or model.batch_ref
    latency = model.latency_ref if request.latency_ms is None else request.latency_ms
    usual = " (the records' most common)"
    batch_text = f"batch size {batch:g}{usual * (request.batch_size is None)}" if batch else "the measured batch size"
    return f"{batch_text} and {latency:g} ms latency{usual * (request.latency_ms is None)}"


def _outside(model: PredictorModel, pick: Candidate, request: RecommendRequest) -> list[str]:
    """Where the pick leaves the measured ranges, said plainly."""
    coverage, notes = model.coverage, []
    low, high = coverage["workers"]
    if not low <= pick.workers <= high:
        notes.append(f"{pick.workers} workers lies outside the measured {low}–{high}")
    if pick.worker_type not in coverage["worker_types"]:
        notes.append(f"{pick.worker_type} has no runs and is priced from its catalogue speed")
    for name, value, measured, unit in (
        ("batch size", request.batch_size, coverage["batch_sizes"], ""),
        ("latency", request.latency_ms, coverage["latencies_ms"], " ms"),
    ):
        if value is None or not measured or (name == "latency" and pick.workers == 1 and model.facts.latency_free):
            continue  # one machine of an all-reduce workload: latency does not reach it
        if not measured[0] <= value <= measured[-1]:
            notes.append(f"{name} {value:g}{unit} lies outside the measured {measured[0]:g}–{measured[-1]:g}{unit}")
    if model.one_machine_unknown:
        notes.append("one machine is no candidate: no run measured one, and the runs of several cannot tell its "
                     "computing from the collectives they pay on every step")  # fmt: skip
    return [f"Extrapolated: {'; '.join(notes)}."] if notes else []


def _reasons(refused: Counter) -> str:
    return "; ".join(f"{count} because {reason}" for reason, count in sorted(refused.items()))


def nothing_estimated(refused: Counter) -> RecommendationError:
    """Why no configuration within the limit has an epoch time."""
    if not refused:
        return RecommendationError("no configuration within the limit can be predicted (none affordable)")
    return RecommendationError(
        f"no configuration within the limit can be estimated: {_reasons(refused)} (measure a run there, or ask at "
        "the measured values)"
    )


def strategies_text(chosen: str, best: dict[str, dict], left_out: Sequence[str]) -> str:
    """The strategy left open: each one's best, and those not compared."""
    compared = "; ".join(
        f"{label}: {b['workers']} × {b['worker_type'] or 'workers'} at {b['epoch_time_s']:.3g} s, "
        f"${b['hourly_cost']:.4g}/h" + (f" with its {b['ps_type']} PS" if b["ps_type"] else "")
        for label, b in best.items()
    )
    missing = f"; not compared: {'; '.join(left_out)} (run it once to compare)" if left_out else ""
    return f"Strategy left open, {chosen} chosen: each strategy's best ({compared}){missing}."


def details(
    context: Context, pick: Candidate, ps_type: str | None, alike: Sequence[Candidate], warnings: Sequence[str]
) -> dict:
    """The answer's details as JSON (`extra`): its why, the pick's interval, the predictor's figures, the mean."""
    model, request, fitted = context.model, context.request, context.model.model
    return {
        "why": why(context, pick, ps_type, alike),
        "detail": context.detail,
        "basis": pick.basis,
        "expected_error": pick.expected_error,
        "interval_s": pick.interval_s,
        "indistinguishable": [
            {"worker_type": c.worker_type, "workers": c.workers, "interval_s": c.interval_s} for c in alike
        ],
        "predictor": {
            "cv": model.cv,
            "cv_mape": model.cv_mape,
            "cv_coverage_80": model.cv_coverage,
            "conformal_q": model.q,
            "kernel": model.kernel,
            "run_noise": model.noise_log,
            "choice": choice_rule_text(model),
        },
        "family": fitted.family if fitted else None,
        "cv": fitted.cv if fitted else model.model_error,
        "model_cv_mape": fitted.cv_mape if fitted else None,
        "coefficients": fitted.coefficients if fitted else {},
        "batch_size": request.batch_size or model.batch_ref,
        "latency_ms": model.latency_ref if request.latency_ms is None else request.latency_ms,
        "epoch_cost": round(pick.hourly_cost * (pick.epoch_time_s or 0.0) / 3600.0, 6),  # $ per epoch of the pick
        "coverage": model.coverage,
        "not_estimated": dict(context.refused),
        "warnings": list(warnings),
    }
