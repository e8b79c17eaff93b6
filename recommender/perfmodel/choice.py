"""The `model` algorithm and the lookup's fallback: predict every configuration within the limit and choose one.

Every epoch time comes from the workload's predictor (recommender.perfmodel.predictor): its runs' mean where it ran,
else the fitted model corrected by the Gaussian process on its residuals; each candidate says which (`basis`), its
80 % interval and expected error, and carries a warning where a run of it failed nearby. A configuration that failed
at the very point asked, or only ever failed at its batch size, is no candidate; a risky pick is still answered, with
the warning and the fastest configuration with no failed run nearby beside it.

The α/β trade-off (Anwar eq. 6–9), risk-aware: among the feasible configurations (hourly cost c = c_ps + n·c_t ≤ C,
or c = n·c_t without a PS), minimise α·t*/t*_best + β·c/c_best, where t* is a configuration's judged epoch time
(PredictorModel.judged) and t*_best and c_best the smallest among them. A time is judged by the upper end of its 80 %
interval (an upper confidence bound: a configuration the data know little about must be better by its uncertainty to
be chosen), or by the estimate itself where the workload's own held-out choices lost less that way by more than one
standard error (the predictor's `rule`, which the answer states with those choices' regrets). Each term is a ratio to
the best (1.10 = 10 % worse), so α = 1, β = 0 picks the fastest, α = 0, β = 1 the cheapest per hour (Anwar's c(n) =
Σ p_i), α = β weighs 1 % of time against 1 % of cost; ties go to the faster, then the cheaper configuration. The answer
names the configurations the data cannot tell from the pick: those whose score's 80 % interval (t from the lower to the
upper end of its interval) reaches below the score at the pick's upper end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from recommender import algorithms
from recommender.perfmodel.explanation import (
    alike_text,
    explain_fallback,
    explain_model,
    judged_text,
    nothing_estimated,
    unmeasured_text,
)
from recommender.perfmodel.fitting import _pattern, _usable
from recommender.perfmodel.predictor import MEASURED, PredictorModel, _most_common, predictor
from recommender.types import Candidate, InstanceSpec, PerfRecord, Recommendation, RecommendationError, RecommendRequest

MAX_WORKERS_EVALUATED = 256  # a budget can buy hundreds of cheap workers; no model is credible that far out

_NO_PS = InstanceSpec("no parameter server", 0.0)  # all-reduce records: a cluster costs n·c_t


def _prepare(request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]):
    """The workload's records, its predictor and the catalogue's prices."""
    if request.budget is not None and request.max_workers is not None:
        raise RecommendationError("give a budget or a maximum number of workers, not both")
    records = _of_workload(request, records)
    return records, predictor(records, catalog), {s.name: s.hourly_price for s in catalog}


def _of_workload(request: RecommendRequest, records: Sequence[PerfRecord]) -> list[PerfRecord]:
    """The records of the request's workload (all of them when it names none); RecommendationError when it has none."""
    if not request.workload:
        return list(records)
    own = [r for r in records if r.workload == request.workload]
    if not own:
        raise RecommendationError(f"no performance records for workload {request.workload!r}")
    return own


def _through(ps_type: str, records, model: PredictorModel, types: list[str], catalog):
    """The records, predictor and worker types for a cluster through PS type `ps_type`: a workload measured through
    several PS types answers from that type's runs alone (algorithms.of_ps_type) where they can still price one of the
    types; and what to say about it ("" when nothing was left out)."""
    own = algorithms.of_ps_type(records, ps_type) if ps_type else records
    measured = sorted({r.ps_type or "unnamed" for r in records if algorithms.runs_through_ps(r)})
    if len(own) == len(records):
        if len(measured) < 2 or ps_type in measured:
            return records, model, types, ""
        return (
            records,
            model,
            types,
            (
                f" The workload has too few runs through a {ps_type} PS to answer from alone: its times come from the "
                f"runs through {', '.join(measured)} together, whose capacities differ."
            ),
        )
    narrowed = predictor(own, catalog)
    priced = [t for t in types if not t or narrowed.can_price(t)]
    if not priced:
        return records, model, types, ""
    others = [t for t in measured if t != ps_type]
    note = (
        f" From the workload's runs through a {ps_type} PS only: its {len(records) - len(own)} runs through "
        f"{', '.join(others)} say nothing of this PS's capacity, which bounds a saturated cluster."
    )
    return list(own), narrowed, priced, note


def _limit(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec, measured_max: int) -> int:
    """n from the limit as the FC² rules count it (algorithms.workers_from_limit); 0 when the budget cannot buy one
    worker; without a limit (or a budget but no price for the type), the largest measured worker count."""
    if request.max_workers is None and (request.budget is None or worker.hourly_price <= 0):
        return measured_max
    try:
        return min(algorithms.workers_from_limit(request, ps or _NO_PS, worker), MAX_WORKERS_EVALUATED)
    except RecommendationError:
        return 0


def _evaluate(model: PredictorModel, request: RecommendRequest, types, prices, ps: InstanceSpec | None, records):
    """Estimate every (type, n) within the limit. Returns the candidates, the types the limit cannot buy one of, the
    (type, n) left out for their failed runs (PredictorModel.left_out), where each estimate came from, in words, and
    why the others could not be estimated at all (PredictorModel.unmeasured: reason -> how many)."""
    usable = _usable(records)
    pairs, unaffordable, skip = [], [], set()
    for t in types:
        measured_max = max((r.workers for r in usable if r.instance_type == t), default=model.coverage["workers"][1])
        limit = _limit(request, ps, InstanceSpec(t, prices.get(t, 0.0)), measured_max)
        unaffordable += [t] if limit < 1 else []
        for n in range(1, limit + 1):
            if model.left_out(t, n, request.batch_size, request.latency_ms):
                skip.add((t, n))
            else:
                pairs.append((t, n))
    estimates = model.estimate_many([(t, n, request.batch_size, request.latency_ms) for t, n in pairs])
    ps_price = ps.hourly_price if ps else 0.0
    candidates = [
        Candidate(
            t,
            n,
            float(e.epoch_time_s),
            float(round(algorithms.hourly_cost(n, prices.get(t, 0.0), ps_price), 4)),
            "measured" if e.basis == MEASURED else "predicted",
            basis=e.basis,
            expected_error=e.expected_error,
            warning=e.warning,
            interval_s=tuple(float(f"{x:.6g}") for x in e.interval),  # six digits, however small the time
            judged_s=model.judged(e),
        )
        for (t, n), e in zip(pairs, estimates, strict=True)
        if e is not None
    ]
    details = {(t, n): e.detail for (t, n), e in zip(pairs, estimates, strict=True) if e is not None}
    unmeasured = Counter(
        reason
        for (t, n), e in zip(pairs, estimates, strict=True)
        if e is None and (reason := model.unmeasured(n, request.batch_size, request.latency_ms))
    )
    return candidates, unaffordable, skip, details, unmeasured


def _choose(candidates: Sequence[Candidate], alpha: float, beta: float) -> Candidate:
    """Minimise α·t*/t*_best + β·c/c_best, t* the judged time (module docstring); ties: faster, cheaper, fewer
    workers."""
    score = _scores(candidates, alpha, beta)
    return min(candidates, key=lambda c: (score(c)[1], c.epoch_time_s, c.hourly_cost, c.workers))


def _scores(candidates: Sequence[Candidate], alpha: float, beta: float):
    """A candidate's score at the lower end of its interval of epoch time, at its judged time and at the upper end
    (its time alone where it has no interval)."""
    best_time = min(_times(c)[1] for c in candidates)
    best_cost = min(c.hourly_cost for c in candidates)

    def score(c: Candidate) -> tuple[float, float, float]:
        cost = beta * c.hourly_cost / best_cost if best_cost > 0 else 0.0
        return tuple(alpha * t / best_time + cost for t in _times(c))

    return score


def _times(c: Candidate) -> tuple[float, float, float]:
    """The lower end of a candidate's interval, its judged time and the upper end."""
    low, high = c.interval_s or (c.epoch_time_s, c.epoch_time_s)
    return low, high if c.judged_s is None else c.judged_s, high


def _alike(candidates: Sequence[Candidate], pick: Candidate, alpha: float, beta: float) -> list[Candidate]:
    """The candidates the data cannot tell from the pick: their score's interval reaches below its upper end, best
    first."""
    score = _scores(candidates, alpha, beta)
    bound = score(pick)[2]
    others = [c for c in candidates if c is not pick and score(c)[0] <= bound]
    return sorted(others, key=lambda c: (score(c)[1], c.epoch_time_s, c.hourly_cost, c.workers))


def pareto_front(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The configurations no other is both faster and cheaper than (of equal ones, one), sorted by hourly cost.

    >>> front = pareto_front([Candidate("a", 1, 90.0, 0.5, "predicted"), Candidate("a", 2, 50.0, 1.0, "predicted"),
    ...                       Candidate("b", 1, 95.0, 0.6, "predicted"), Candidate("a", 3, 40.0, 1.5, "predicted")])
    >>> [(c.worker_type, c.workers) for c in front]
    [('a', 1), ('a', 2), ('a', 3)]
    """
    front: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.hourly_cost, c.epoch_time_s, c.workers)):
        if not front or c.epoch_time_s < front[-1].epoch_time_s:
            front.append(c)
    return tuple(front)


def recommend_model(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """The `model` algorithm: estimate every (type, n) within the limit with the workload's predictor (without a
    limit, up to the largest measured worker count) and minimise α·time + β·cost, normalised as the module docstring
    says, subject to cost ≤ C. The PS: the user's, else DESIGN.md's selection when the records use one, else none
    (all-reduce). With the strategy left open (request.parameter_server None), both are compared: `_either_strategy`."""
    if request.alpha < 0 or request.beta < 0:
        raise RecommendationError(f"alpha and beta must be non-negative (got {request.alpha}, {request.beta})")
    if request.parameter_server is None:
        return _either_strategy(request, catalog, records)
    records, model, prices = _prepare(request, catalog, records)
    if request.worker_type:
        wanted = (request.worker_type,)
    elif request.worker_types:
        wanted = request.worker_types
    else:
        wanted = tuple(s.name for s in catalog if s.role in ("worker", "any")) or tuple(model.coverage["worker_types"])
    types = [t for t in wanted if t in prices and model.can_price(t)]
    untyped = not types and not (request.worker_type or request.worker_types)
    if untyped and model.coverage["worker_types"] == [""]:
        types = [""]  # the records name no worker type (Anwar's table): their times stand for any type, unpriced
    if not types:
        raise RecommendationError(
            f"the model cannot price any of {', '.join(wanted) or 'the worker types'}: "
            "each needs records or a catalogue speed, and a catalogue price"
        )
    uses_ps = request.parameter_server and (request.ps_type or _pattern(_usable(records)) == "ps")
    ps = algorithms.select_ps(request, catalog, records, [t for t in types if t] or None) if uses_ps else None
    records, model, types, through = _through(ps.name if ps else "", records, model, types, catalog)
    candidates, unaffordable, skip, details, unmeasured = _evaluate(model, request, types, prices, ps, records)
    if not candidates:
        if len(unaffordable) == len(types):
            raise RecommendationError(
                f"a budget of ${request.budget:g}/h cannot buy {f'the {ps.name} PS and ' if ps else ''}"
                f"one worker of {', '.join(types)}"
            )
        raise nothing_estimated(model, skip, unmeasured)
    pick = _choose(candidates, request.alpha, request.beta)
    detail = details[(pick.worker_type, pick.workers)]
    explanation = explain_model(model, request, pick, len(candidates), detail, unpriced_workers=types == [""])
    explanation += unmeasured_text(unmeasured) + through
    extra = {
        "detail": detail,
        "objective": "alpha*time/best_time + beta*hourly_cost/best_hourly_cost",
        "unpriced_types": [t for t in wanted if t not in types],
        "unaffordable_types": unaffordable,
    }
    weights = (request.alpha, request.beta)
    return _answer(request, model, ps.name if ps else None, pick, candidates, explanation, extra, skip, weights)


STRATEGIES = {"ps": ("a parameter server", True), "mirrored": ("all-reduce", False)}


def _either_strategy(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """The strategy left open (Shi et al.: neither a parameter server nor all-reduce wins everywhere): each strategy's
    configurations are estimated from the workload's records of that strategy alone (measured where they were, its
    own predictor elsewhere), a parameter-server cluster paying for its PS and an all-reduce one for none; the α/β
    choice is then made over both together. A strategy with no records of the workload is not guessed at: the answer
    says it was not compared and how to give it records."""
    records = _of_workload(request, records)
    answers: dict[str, Recommendation] = {}
    left_out: list[str] = []
    for strategy, (label, through_ps) in STRATEGIES.items():
        own = [r for r in records if algorithms.runs_through_ps(r) == through_ps]
        if not own:
            left_out.append(f"{label} has no records of this workload")
            continue
        try:
            answers[strategy] = recommend_model(replace(request, parameter_server=through_ps), catalog, own)
        except RecommendationError as error:
            left_out.append(f"{label}: {error}")
    if not answers:
        raise RecommendationError(f"neither strategy can be estimated: {'; '.join(left_out)}")
    candidates = [replace(c, strategy=s) for s, answer in answers.items() for c in answer.candidates]
    pick = _choose(candidates, request.alpha, request.beta)
    chosen = answers[pick.strategy]
    best = {s: next(c for c in candidates if c.strategy == s and (c.worker_type, c.workers) == (a.worker_type,
            a.workers)) for s, a in answers.items()}  # fmt: skip
    compared = "; ".join(
        f"{STRATEGIES[s][0]}: {c.workers} × {c.worker_type or 'workers'} at {c.epoch_time_s:.3g} s, "
        f"${c.hourly_cost:.4g}/h" + (f" with its {answers[s].ps_type} PS" if answers[s].ps_type else "")
        for s, c in best.items()
    )
    why = (
        f"Strategy left open, {STRATEGIES[pick.strategy][0]} chosen: each strategy's best ({compared})"
        + ("" if len(answers) == 2 else f"; not compared: {'; '.join(left_out)} (run it once to compare)")
        + ". "
    )
    return replace(
        chosen,
        worker_type=pick.worker_type,
        workers=pick.workers,
        hourly_cost=pick.hourly_cost,
        predicted_epoch_time_s=pick.epoch_time_s,
        explanation=why + chosen.explanation,
        candidates=tuple(candidates),
        pareto=pareto_front(candidates),
        extra={
            **chosen.extra,
            "strategy": pick.strategy,
            "strategies": {
                s: {
                    "workers": c.workers,
                    "worker_type": c.worker_type,
                    "epoch_time_s": c.epoch_time_s,
                    "hourly_cost": c.hourly_cost,
                    "ps_type": answers[s].ps_type,
                }
                for s, c in best.items()
            },
            "strategies_not_compared": left_out,
        },  # fmt: skip
    )


def predict_fallback(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """What the lookup answers when no measured record matches: the worker count with the smallest estimated epoch
    time at the request's batch size and latency (n up to the request's limit, else the largest measured n), from
    the workload's predictor."""
    records, model, prices = _prepare(request, catalog, records)
    wanted = (request.worker_type,) if request.worker_type else request.worker_types
    types = [t for t in wanted if model.can_price(t)] if wanted else list(model.coverage["worker_types"])
    if not types and model.coverage["worker_types"] == [""]:
        types = [""]  # the records name no worker type (Anwar's table): their times stand for any type
    if not types:
        raise RecommendationError(
            f"the model cannot price worker type {', '.join(wanted)}: it needs records or a catalogue speed"
        )
    ps_name = request.ps_type or _most_common([r.ps_type for r in _usable(records) if r.ps_type]) or ""
    ps = next((s for s in catalog if s.name == ps_name), None)
    records, model, types, through = _through(ps_name, records, model, types, catalog)
    candidates, _, skip, details, unmeasured = _evaluate(model, request, types, prices, ps, records)
    if not candidates:
        raise nothing_estimated(model, skip, unmeasured)
    pick = _choose(candidates, 1.0, 0.0)  # the lookup minimises time (Anwar: α = 1, β = 0)
    detail = details[(pick.worker_type, pick.workers)]
    explanation = explain_fallback(model, request, pick, len(candidates), detail, priced=pick.worker_type in prices)
    explanation += unmeasured_text(unmeasured) + through
    extra = {"detail": detail, "unpriced_types": [t for t in wanted if t not in types]}
    return _answer(request, model, ps_name or None, pick, candidates, explanation, extra, skip, (1.0, 0.0), False)


def _answer(
    request, model: PredictorModel, ps_type, pick: Candidate, candidates, explanation, extra, skip, weights, pareto=True
):
    fitted = model.model
    alike = _alike(candidates, pick, *weights)
    explanation += alike_text(alike)
    warnings = ()
    if pick.warning:
        warnings = (algorithms.warning_text(pick, candidates),)
        explanation += f" Warning: {warnings[0]}"
    return Recommendation(
        algorithm=request.algorithm,
        ps_type=ps_type,
        worker_type=pick.worker_type,
        workers=pick.workers,
        hourly_cost=pick.hourly_cost,
        predicted_epoch_time_s=pick.epoch_time_s,
        source="predicted",
        explanation=explanation,
        candidates=tuple(candidates),
        pareto=pareto_front(candidates) if pareto else (),
        model_error=model.overall_error,
        warnings=warnings,
        extra={
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
                "kernel": model.kernel,
                "noise": dict(zip(("least", "most"), model.noise, strict=True)),
                "choice": "least alpha*time/best_time + beta*hourly_cost/best_hourly_cost, each time judged by "
                + judged_text(model),
                "choice_regret": model.rule_regret,
            },
            "family": fitted.family if fitted else None,
            "speed": fitted.speed if fitted else None,
            "loss": fitted.loss if fitted else None,
            "cv": fitted.cv if fitted else model.model_error,
            "model_cv_mape": fitted.cv_mape if fitted else None,
            "coefficients": fitted.coefficients if fitted else {},
            "batch_size": request.batch_size or model.batch_ref,
            "latency_ms": model.latency_ref if request.latency_ms is None else request.latency_ms,
            "epoch_cost": round(pick.hourly_cost * pick.epoch_time_s / 3600.0, 6),  # $ per epoch of the pick
            "coverage": model.coverage,
            "failed_only": sorted([t, n] for t, n in skip),
            "warnings": list(warnings),
        }
        | extra,
    )
