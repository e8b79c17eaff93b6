"""The `model` algorithm and the lookup's fallback: estimate every configuration within the limit and choose one.

One rule (DESIGN.md, Anwar eq. 6–9): among the configurations the guards let through, with hourly cost c = c_ps + n·c_t
within the budget C, minimise α·U/U_best + β·c/c_best, U the upper end of a configuration's 80 % interval (a
configuration the data know little about must be better by its uncertainty), U_best and c_best the least among them;
ties go to the cheaper, then by name (PS type, worker type), then the fewer workers. Where the records run through a
PS and the user names none, every PS type of L^p the runs went through is a candidate (every one, where the runs name
none): one whose own runs fit a predictor of their own (algorithms.of_ps_type) is estimated from them, every other
from all the runs — so the same estimate goes to the cheaper PS, limit or none. The lookup's fallback is the same rule
with α = 1, β = 0 and the records' PS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from recommender import algorithms
from recommender.perfmodel import candidates as configurations
from recommender.perfmodel import explanation as words
from recommender.perfmodel.fitting import _pattern, _usable
from recommender.perfmodel.predictor import _most_common, predictor
from recommender.types import Candidate, InstanceSpec, PerfRecord, Recommendation, RecommendationError, RecommendRequest


def _upper(c: Candidate) -> float:
    return c.judged_s if c.judged_s is not None else _time(c)


def _time(c: Candidate) -> float:
    return c.epoch_time_s or 0.0  # (every candidate here is estimated)


def choose(candidates: Sequence[Candidate], alpha: float, beta: float) -> Candidate:
    """The one rule (module docstring): least α·U/U_best + β·c/c_best; ties: cheaper, then by name (PS type, worker
    type), then fewer workers."""
    best_time = min(_upper(c) for c in candidates)
    best_cost = min(c.hourly_cost for c in candidates)

    def key(c: Candidate) -> tuple[float, float, str, str, int]:
        cost = beta * c.hourly_cost / best_cost if best_cost > 0 else 0.0
        return alpha * _upper(c) / best_time + cost, c.hourly_cost, c.ps_type, c.worker_type, c.workers

    return min(candidates, key=key)


def _alike(candidates: Sequence[Candidate], pick: Candidate) -> list[Candidate]:
    """The candidates the data cannot tell from the pick: their interval reaches below the upper end of its own."""
    return sorted((c for c in candidates if c is not pick and c.interval_s and c.interval_s[0] <= _upper(pick)),
                  key=lambda c: (_upper(c), c.hourly_cost, c.worker_type, c.workers))  # fmt: skip


def pareto_front(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """The configurations no other is both faster and cheaper than (of equal ones, one), sorted by hourly cost.

    >>> front = pareto_front([Candidate("a", 1, 90.0, 0.5, "predicted"), Candidate("a", 2, 50.0, 1.0, "predicted"),
    ...                       Candidate("b", 1, 95.0, 0.6, "predicted"), Candidate("a", 3, 40.0, 1.5, "predicted")])
    >>> [(c.worker_type, c.workers) for c in front]
    [('a', 1), ('a', 2), ('a', 3)]
    """
    front: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.hourly_cost, c.epoch_time_s, c.workers)):
        if not front or _time(c) < _time(front[-1]):
            front.append(c)
    return tuple(front)


def recommend_model(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """The `model` algorithm: every (PS, type, n) within the limit estimated (without a limit, up to the largest
    measured worker count) and chosen by the one rule. With the strategy left open (request.parameter_server None),
    both are compared: `_either_strategy`."""
    if request.alpha < 0 or request.beta < 0:
        raise RecommendationError(f"alpha and beta must be non-negative (got {request.alpha}, {request.beta})")
    if request.parameter_server is None:
        return _either_strategy(request, catalog, records)
    records = configurations.of_workload(request, records)
    model = predictor(records, catalog)
    prices = {s.name: s.hourly_price for s in catalog}
    wanted, types = configurations.worker_types(request, catalog, model, prices)
    uses_ps = request.ps_type or _pattern(_usable(records)) == "ps"
    options, found = [], {}
    for ps in configurations.ps_options(request, catalog, records) if uses_ps else [None]:
        own, left = configurations.through(ps, records, catalog)
        priced = [t for t in types if not t or own.can_price(t)]
        found[ps.name if ps else ""] = (ps, own, left, *configurations.estimated(own, request, priced, prices, ps))
        options += found[ps.name if ps else ""][3]
    if not options:
        ps, own, _, _, _, unaffordable, refused = next(iter(found.values()))
        if len(unaffordable) == len(types):
            raise RecommendationError(
                f"a budget of ${request.budget:g}/h cannot buy {f'the {ps.name} PS and ' if ps else ''}"
                f"one worker of {', '.join(types)}"
            )
        raise words.nothing_estimated(refused)
    pick = choose(options, request.alpha, request.beta)
    ps, own, left, candidates, details, unaffordable, refused = found[pick.ps_type]
    extra = {
        "objective": "alpha*U/best_U + beta*hourly_cost/best_hourly_cost, U the upper end of the 80 % interval",
        "unpriced_types": [t for t in wanted if t not in types],
        "unaffordable_types": unaffordable,
        "ps_types_compared": sorted(found) if uses_ps else [],
    }
    context = words.Context(request, own, details[(pick.worker_type, pick.workers)], len(candidates), refused, left,
                            unpriced_workers=types == [""], priced=True)  # fmt: skip
    return _answer(context, ps.name if ps else None, pick, candidates, extra, pareto=True)


STRATEGIES = {"ps": ("a parameter server", True), "mirrored": ("all-reduce", False)}


def _either_strategy(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """The strategy left open (Shi et al.: neither a parameter server nor all-reduce wins everywhere): each strategy
    answered from its own records alone, then the one rule over both. A strategy with no records is not guessed at."""
    records = configurations.of_workload(request, records)
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
    candidates = tuple(replace(c, strategy=s) for s, answer in answers.items() for c in answer.candidates)
    pick = choose(candidates, request.alpha, request.beta)
    strategy, chosen = pick.strategy, answers[pick.strategy]
    best = {s: {"workers": a.workers, "worker_type": a.worker_type, "epoch_time_s": a.predicted_epoch_time_s,
                "hourly_cost": a.hourly_cost, "ps_type": a.ps_type} for s, a in answers.items()}  # fmt: skip
    why = words.strategies_text(STRATEGIES[strategy][0], {STRATEGIES[s][0]: b for s, b in best.items()}, left_out)
    return replace(
        chosen,
        worker_type=pick.worker_type,
        workers=pick.workers,
        hourly_cost=pick.hourly_cost,
        predicted_epoch_time_s=pick.epoch_time_s,
        explanation=f"Strategy left open, {STRATEGIES[strategy][0]} chosen. {chosen.explanation}",
        candidates=candidates,
        pareto=pareto_front(candidates),
        extra={
            **chosen.extra,
            "why": [why, *chosen.extra["why"]],
            "strategy": strategy,
            "strategies": best,
            "strategies_not_compared": left_out,
        },  # fmt: skip
    )


def predict_fallback(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """What the lookup answers when no measured record matches: the one rule with α = 1, β = 0 over the worker counts
    up to the request's limit (else the largest measured), through the user's PS or the records' most common."""
    records = configurations.of_workload(request, records)
    model = predictor(records, catalog)
    prices = {s.name: s.hourly_price for s in catalog}
    wanted = [request.worker_type] if request.worker_type else list(request.worker_types)
    types = [t for t in wanted if model.can_price(t)] if wanted else list(model.coverage["worker_types"])
    if not types:
        raise RecommendationError(
            f"the model cannot price worker type {', '.join(wanted)}: it needs records or a catalogue speed"
        )
    ps_name = request.ps_type or _most_common([r.ps_type for r in _usable(records) if r.ps_type]) or ""
    ps = next((s for s in catalog if s.name == ps_name), None)
    own, left = configurations.through(ps, records, catalog) if ps else (model, 0)
    candidates, details, _, refused = configurations.estimated(own, request, types, prices, ps)
    if not candidates:
        raise words.nothing_estimated(refused)
    pick = choose(candidates, 1.0, 0.0)
    extra = {"unpriced_types": [t for t in wanted if t not in types]}
    context = words.Context(replace(request, alpha=1.0, beta=0.0), own, details[(pick.worker_type, pick.workers)],
                            len(candidates), refused, left, unpriced_workers=types == [""],
                            priced=pick.worker_type in prices, fallback=True)  # fmt: skip
    return _answer(context, str(ps_name) or None, pick, candidates, extra, pareto=False)


def _answer(
    context: words.Context, ps_type: str | None, pick: Candidate, candidates: Sequence[Candidate], extra: dict,
    *, pareto: bool,
) -> Recommendation:  # fmt: skip
    alike = _alike(candidates, pick)
    warnings = (algorithms.warning_text(pick, candidates),) if pick.warning else ()
    return Recommendation(
        algorithm=context.request.algorithm,
        ps_type=ps_type,
        worker_type=pick.worker_type,
        workers=pick.workers,
        hourly_cost=pick.hourly_cost,
        predicted_epoch_time_s=pick.epoch_time_s,
        source="predicted",
        explanation=words.sentence(context, pick, ps_type) + (f" Warning: {warnings[0]}" if warnings else ""),
        candidates=tuple(candidates),
        pareto=pareto_front(candidates) if pareto else (),
        model_error=context.model.overall_error,
        warnings=warnings,
        extra=words.details(context, pick, ps_type, alike, warnings) | extra,
    )
