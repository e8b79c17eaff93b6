"""The `model` algorithm and the lookup's fallback: predict every configuration within the limit and choose one.

The α/β trade-off (Anwar eq. 6–9): among the feasible configurations (hourly cost c = c_ps + n·c_t ≤ C, or c = n·c_t
without a PS), minimise α·t/t_best + β·c/c_best, where t_best and c_best are the smallest predicted epoch time and the
smallest hourly cost among them. Each term is a ratio to the best (1.10 = 10 % worse), so α = 1, β = 0 picks the
fastest, α = 0, β = 1 the cheapest per hour (Anwar's c(n) = Σ p_i), α = β weighs 1 % of time against 1 % of cost;
ties go to the faster, then the cheaper configuration.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from recommender import algorithms
from recommender.perfmodel.explanation import explain_fallback, explain_model
from recommender.perfmodel.families import PerfModel
from recommender.perfmodel.fitting import _pattern, _usable, fit
from recommender.types import Candidate, InstanceSpec, PerfRecord, Recommendation, RecommendationError, RecommendRequest

MAX_WORKERS_EVALUATED = 256  # a budget can buy hundreds of cheap workers; no model is credible that far out

_NO_PS = InstanceSpec("no parameter server", 0.0)  # all-reduce records: a cluster costs n·c_t


def _prepare(request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]):
    """The workload's records, its fitted model and the catalogue's prices."""
    if request.budget is not None and request.max_workers is not None:
        raise RecommendationError("give a budget or a maximum number of workers, not both")
    if request.workload:
        records = [r for r in records if r.workload == request.workload]
        if not records:
            raise RecommendationError(f"no performance records for workload {request.workload!r}")
    return list(records), fit(records, catalog), {s.name: s.hourly_price for s in catalog}


def _failed_only(records: Sequence[PerfRecord], batch_size: int | None) -> set[tuple[str, int]]:
    """(type, n) that only ever failed at this batch size (e.g. one machine out of memory at B = 64,000)."""
    runs = defaultdict(list)
    for r in records:
        if r.workers and (batch_size is None or r.batch_size == batch_size):
            runs[(r.instance_type, r.workers)].append(r.epoch_time_s is not None)
    return {key for key, ok in runs.items() if not any(ok)}


def _limit(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec, measured_max: int) -> int:
    """n from the limit as the FC² rules count it (algorithms.workers_from_limit); 0 when the budget cannot buy one
    worker; without a limit (or a budget but no price for the type), the largest measured worker count."""
    if request.max_workers is None and (request.budget is None or worker.hourly_price <= 0):
        return measured_max
    try:
        return min(algorithms.workers_from_limit(request, ps or _NO_PS, worker), MAX_WORKERS_EVALUATED)
    except RecommendationError:
        return 0


def _evaluate(model: PerfModel, request: RecommendRequest, types, prices, ps: InstanceSpec | None, records):
    """Predict every (type, n) within the limit. Returns the candidates, the types the limit cannot buy one of, and
    the (type, n) left out because they only ever failed."""
    usable = _usable(records)
    skip = _failed_only(records, request.batch_size)
    pairs, unaffordable = [], []
    for t in types:
        measured_max = max((r.workers for r in usable if r.instance_type == t), default=model.coverage["workers"][1])
        limit = _limit(request, ps, InstanceSpec(t, prices.get(t, 0.0)), measured_max)
        unaffordable += [t] if limit < 1 else []
        pairs += [(t, n) for n in range(1, limit + 1) if (t, n) not in skip]
    if not pairs:
        return [], unaffordable, skip
    names, workers = zip(*pairs, strict=True)
    times = model.predict_many(names, workers, [request.batch_size] * len(pairs), [request.latency_ms] * len(pairs))
    ps_price = ps.hourly_price if ps else 0.0
    candidates = [
        Candidate(
            t, n, float(time), float(round(algorithms.hourly_cost(n, prices.get(t, 0.0), ps_price), 4)), "predicted"
        )
        for (t, n), time in zip(pairs, times, strict=True)
    ]
    return candidates, unaffordable, skip


def _choose(candidates: Sequence[Candidate], alpha: float, beta: float) -> Candidate:
    """Minimise α·t/t_best + β·c/c_best (module docstring); ties: faster, cheaper, fewer workers."""
    best_time = min(c.epoch_time_s for c in candidates)
    best_cost = min(c.hourly_cost for c in candidates)

    def score(c: Candidate) -> tuple:
        cost = c.hourly_cost / best_cost if best_cost > 0 else 0.0
        return (alpha * c.epoch_time_s / best_time + beta * cost, c.epoch_time_s, c.hourly_cost, c.workers)

    return min(candidates, key=score)


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
    """The `model` algorithm: fit the workload's model, predict every (type, n) within the limit (without one, up to
    the largest measured worker count) and minimise α·time + β·cost, normalised as the module docstring says, subject
    to cost ≤ C. The PS: the user's, else DESIGN.md's selection when the records use one, else none (all-reduce)."""
    if request.alpha < 0 or request.beta < 0:
        raise RecommendationError(f"alpha and beta must be non-negative (got {request.alpha}, {request.beta})")
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
    ps = algorithms.select_ps(request, catalog) if uses_ps else None
    candidates, unaffordable, skip = _evaluate(model, request, types, prices, ps, records)
    if not candidates:
        if len(unaffordable) == len(types):
            raise RecommendationError(
                f"a budget of ${request.budget:g}/h cannot buy {f'the {ps.name} PS and ' if ps else ''}"
                f"one worker of {', '.join(types)}"
            )
        raise RecommendationError("every configuration within the limit has only failed runs on record")
    pick = _choose(candidates, request.alpha, request.beta)
    explanation = explain_model(model, request, pick, len(candidates), unpriced_workers=types == [""])
    extra = {
        "objective": "alpha*time/best_time + beta*hourly_cost/best_hourly_cost",
        "unpriced_types": [t for t in wanted if t not in types],
        "unaffordable_types": unaffordable,
    }
    return _answer(request, model, ps.name if ps else None, pick, candidates, explanation, extra, skip)


def predict_fallback(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: Sequence[PerfRecord]
) -> Recommendation:
    """What the lookup answers when no measured record matches: the worker count with the smallest predicted epoch
    time at the request's batch size and latency (n up to the request's limit, else the largest measured n)."""
    records, model, prices = _prepare(request, catalog, records)
    wanted = (request.worker_type,) if request.worker_type else request.worker_types
    types = [t for t in wanted if model.can_price(t)] if wanted else list(model.coverage["worker_types"])
    if not types and model.coverage["worker_types"] == [""]:
        types = [""]  # the records name no worker type (Anwar's table): their times stand for any type
    if not types:
        raise RecommendationError(
            f"the model cannot price worker type {', '.join(wanted)}: it needs records or a catalogue speed"
        )
    ps_name = request.ps_type or _most_common_str(r.ps_type for r in _usable(records))
    ps = next((s for s in catalog if s.name == ps_name), None)
    candidates, _, skip = _evaluate(model, request, types, prices, ps, records)
    if not candidates:
        raise RecommendationError("no configuration within the limit can be predicted (all failed or none affordable)")
    pick = _choose(candidates, 1.0, 0.0)  # the lookup minimises time (Anwar: α = 1, β = 0)
    explanation = explain_fallback(model, request, pick, len(candidates), priced=pick.worker_type in prices)
    extra = {"unpriced_types": [t for t in wanted if t not in types]}
    return _answer(request, model, ps_name or None, pick, candidates, explanation, extra, skip, pareto=False)


def _answer(request, model: PerfModel, ps_type, pick: Candidate, candidates, explanation, extra, skip, pareto=True):
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
        model_error=model.cv_mape,
        extra={
            "family": model.family,
            "speed": model.speed,
            "loss": model.loss,
            "cv": model.cv,
            "coefficients": model.coefficients,
            "batch_size": request.batch_size or model.batch_ref,
            "latency_ms": model.latency_ref if request.latency_ms is None else request.latency_ms,
            "epoch_cost": round(pick.hourly_cost * pick.epoch_time_s / 3600.0, 6),  # $ per epoch of the pick
            "coverage": model.coverage,
            "failed_only": sorted([t, n] for t, n in skip),
        }
        | extra,
    )


def _most_common_str(values) -> str:
    values = [v for v in values if v]
    return Counter(values).most_common(1)[0][0] if values else ""
