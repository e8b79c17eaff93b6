"""The configurations a request may be answered with, each estimated: the workload's records, the worker types and
PS types asked for (the user's; else L^w and those of L^p the runs went through), every worker count within the limit
as FC² counts it, and the predictor that estimates them (recommender.perfmodel.predictor; for a PS with runs of its
own, the predictor of those runs). The choice among them is recommender.perfmodel.choice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from recommender import algorithms
from recommender.perfmodel.predictor import MEASURED, PredictorModel, predictor
from recommender.types import Candidate, InstanceSpec, PerfRecord, RecommendationError, RecommendRequest

MAX_WORKERS_EVALUATED = 256  # a budget can buy hundreds of cheap workers; no model is credible that far out
_NO_PS = InstanceSpec("no parameter server", 0.0)  # all-reduce records: a cluster costs n·c_t


def of_workload(request: RecommendRequest, records: Sequence[PerfRecord]) -> list[PerfRecord]:
    """The records of the request's workload (all of them when it names none); RecommendationError when it has none."""
    if request.budget is not None and request.max_workers is not None:
        raise RecommendationError("give a budget or a maximum number of workers, not both")
    if not request.workload:
        return list(records)
    own = [r for r in records if r.workload == request.workload]
    if not own:
        raise RecommendationError(f"no performance records for workload {request.workload!r}")
    return own


def _limit(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec, measured_max: int) -> int:
    """n from the limit as the FC² rules count it (algorithms.workers_from_limit); 0 when the budget cannot buy one
    worker; without a limit (or a budget but no price for the type), the largest measured worker count."""
    if request.max_workers is None and (request.budget is None or worker.hourly_price <= 0):
        return measured_max
    try:
        return min(algorithms.workers_from_limit(request, ps or _NO_PS, worker), MAX_WORKERS_EVALUATED)
    except RecommendationError:
        return 0


def through(
    ps: InstanceSpec | None, records: list[PerfRecord], catalog: Sequence[InstanceSpec]
) -> tuple[PredictorModel, int]:
    """The predictor for a cluster through PS `ps`: of its own runs where they fit one (algorithms.of_ps_type), else
    of every run; and how many runs that left out."""
    own = list(algorithms.of_ps_type(records, ps.name)) if ps else records
    return predictor(own, catalog), len(records) - len(own)


def estimated(
    model: PredictorModel, request: RecommendRequest, types: Sequence[str], prices: dict[str, float],
    ps: InstanceSpec | None,
) -> tuple[list[Candidate], dict[tuple[str, int], str], list[str], Counter]:  # fmt: skip
    """Every (type, n) within the limit estimated: the candidates, where each estimate came from, the types the
    limit cannot buy one of, and why the others were refused (guards: reason -> how many)."""
    pairs, unaffordable, refused = [], [], Counter[str]()
    for t in types:
        measured_max = max((n for (u, n) in model.facts.succeeded if u == t), default=model.coverage["workers"][1])
        limit = _limit(request, ps, InstanceSpec(t, prices.get(t, 0.0)), measured_max)
        unaffordable += [t] if limit < 1 else []
        pairs += [(t, n) for n in range(1, limit + 1)]
    estimates = model.estimate_many([(t, n, request.batch_size, request.latency_ms) for t, n in pairs])
    ps_price = ps.hourly_price if ps else 0.0
    candidates, details = [], {}
    for (t, n), e in zip(pairs, estimates, strict=True):
        if e is None:
            refused[model.refusal(t, n, request.batch_size, request.latency_ms)] += 1
            continue
        cost = float(round(algorithms.hourly_cost(n, prices.get(t, 0.0), ps_price), 4))
        low, high = (float(f"{x:.6g}") for x in e.interval)  # six digits, however small the time
        interval = (min(low, e.epoch_time_s), max(high, e.epoch_time_s))
        source = "measured" if e.basis == MEASURED else "predicted"
        candidates.append(Candidate(t, n, e.epoch_time_s, cost, source, basis=e.basis, expected_error=e.expected_error,
                                    interval_s=interval, judged_s=model.judged(e), warning=e.warning,
                                    ps_type=ps.name if ps else ""))  # fmt: skip
        details[(t, n)] = e.detail
    return candidates, details, unaffordable, refused


def ps_options(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], records: list[PerfRecord]
) -> list[InstanceSpec]:
    """The PS types to compare: the user's; else those of L^p (request.ps_types, else the catalogue's PS types) that
    the runs went through — nothing in them tells what another PS costs — or all of L^p where the runs name none."""
    index = {s.name: s for s in catalog}
    if request.ps_type:
        return [index.get(request.ps_type, InstanceSpec(request.ps_type, 0.0, "ps"))]
    named = [index[n] for n in request.ps_types if n in index] if request.ps_types else []
    named = named or [s for s in catalog if s.role in ("ps", "any")] or [_NO_PS]
    measured = {r.ps_type for r in records if algorithms.runs_through_ps(r)}
    return _distinct([s for s in named if s.name in measured] or named, records)


def _distinct(options: list[InstanceSpec], records: list[PerfRecord]) -> list[InstanceSpec]:
    """The PS types whose own runs give them estimates of their own, and of the others (estimated alike, from every
    run) the cheaper, then by name: with the same estimates it wins every tie, and its budget buys as much or more."""
    own = [ps for ps in options if len(algorithms.of_ps_type(records, ps.name)) < len(records)]
    alike = [ps for ps in options if ps not in own]
    return own + ([min(alike, key=lambda ps: (ps.hourly_price, ps.name))] if alike else [])


def worker_types(
    request: RecommendRequest, catalog: Sequence[InstanceSpec], model: PredictorModel, prices: dict[str, float]
) -> tuple[list[str], list[str]]:
    """The worker types asked for, and those of them the model prices and the catalogue has a price for."""
    if request.worker_type:
        wanted = [request.worker_type]
    elif request.worker_types:
        wanted = list(request.worker_types)
    else:
        wanted = [s.name for s in catalog if s.role in ("worker", "any")] or list(model.coverage["worker_types"])
    types = [t for t in wanted if t in prices and model.can_price(t)]
    if not types and not (request.worker_type or request.worker_types) and model.coverage["worker_types"] == [""]:
        types = [""]  # the records name no worker type (Anwar's table): their times stand for any type, unpriced
    if not types:
        raise RecommendationError(
            f"the model cannot price any of {', '.join(wanted) or 'the worker types'}: "
            "each needs records or a catalogue speed, and a catalogue price"
        )
    return wanted, types
