"""The recommendation algorithms: pure functions from a request, an instance catalogue and performance records to a
Recommendation.

Owns PS selection, the worker count from a budget or a limit, Cost-Opt, Time-Opt, Scala-Opt and Scala-Opt-M (FC² §5.2),
Anwar's lookup (Anwar et al. §7.1) and `recommend`, which dispatches on the request's algorithm. The semantics are
fixed in ../shared/DESIGN.md ("Recommendation algorithms"). The performance model lives in recommender.perfmodel and
reaches this module only as the `predict` callable; loading catalogues and records from the database is the service
layer's job. No ORM, no Django.

Money and bandwidth are divided as decimals: in floats (1.511 − 0.125) / 0.231 is 5.999…, and a budget that buys
exactly six workers must give six.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from decimal import Decimal

from recommender.types import (
    ALGORITHMS,
    ALL_REDUCE_STRATEGIES,
    MAX_BATCH_SIZE,
    MAX_LATENCY_MS,
    Candidate,
    InstanceSpec,
    MissingProfile,
    MissingProfilesError,
    PerfRecord,
    Recommendation,
    RecommendationError,
    RecommendRequest,
    key_conflict,
    key_framework,
)

Predictor = Callable[[RecommendRequest], Recommendation]
"""The performance model's answer to a request (recommender.perfmodel provides one)."""

RULE, MEASURED, PREDICTED = "rule", "measured", "predicted"


# --- numbers ---------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)  # the same few prices are converted thousands of times per request
def _dec(x: float) -> Decimal:
    """The decimal a person wrote: Decimal(str(0.231)) is 0.231, where Decimal(0.231) is 0.23100000000000000533…"""
    return Decimal(str(x))


def _fmt(x: float | Decimal) -> str:
    """A price, bandwidth or time as people write it: at most 4 decimals, no trailing zeros.

    >>> _fmt(0.2310), _fmt(2.0), _fmt(Decimal("427.50")), _fmt(0.23359999)
    ('0.231', '2', '427.5', '0.2336')
    """
    return f"{_dec(x):.4f}".rstrip("0").rstrip(".")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def hourly_cost(workers: int, worker_price: float | Decimal, ps_price: float | Decimal = 0) -> Decimal:
    """A cluster's price, c_ps + n·c_t in $/h (FC² §5; n·c_t for a cluster with no PS), exactly as the prices are
    written: the one rule the algorithms, the performance model and the job's own price all use.

    >>> hourly_cost(3, 0.231, 0.125)
    Decimal('0.818')
    >>> hourly_cost(2, 0.2336)
    Decimal('0.4672')
    """
    return _dec(ps_price) + workers * _dec(worker_price)


def _hourly_cost(workers: int, worker_price: float, ps: InstanceSpec | None = None) -> float:
    """`hourly_cost` as the answers carry it: a float, to 4 decimals."""
    return float(round(hourly_cost(workers, worker_price, ps.hourly_price if ps else 0), 4))


def _price_order(spec: InstanceSpec) -> tuple[Decimal, str]:
    return _dec(spec.hourly_price), spec.name


# --- catalogue and request checks ------------------------------------------------------------------------------------


def _index(catalog: Collection[InstanceSpec]) -> dict[str, InstanceSpec]:
    return {spec.name: spec for spec in catalog}


def _offered(index: dict[str, InstanceSpec], role: str) -> list[InstanceSpec]:
    """The types the catalogue lists for `role` ("ps" or "worker"); "any" types are on both lists."""
    return [spec for spec in index.values() if spec.role in (role, "any")]


def _known(names: Collection[str], index: dict[str, InstanceSpec], role: str) -> list[InstanceSpec]:
    """The catalogue entries of `names` (duplicates dropped), or an error naming the unknown ones and what exists."""
    label = "PS" if role == "ps" else role
    unknown = [name for name in names if name not in index]
    if unknown:
        offered = ", ".join(spec.name for spec in _offered(index, role)) or "none"
        raise RecommendationError(
            f"unknown {label} type{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"the catalogue's {label} types are {offered}"
        )
    return [index[name] for name in dict.fromkeys(names)]


def _considered(names: Collection[str], index: dict[str, InstanceSpec], role: str) -> list[InstanceSpec]:
    """L^w or L^p: the request's list, else every type the catalogue offers for the role."""
    types = _known(names, index, role) if names else _offered(index, role)
    if not types:
        raise RecommendationError(f"the catalogue offers no {'PS' if role == 'ps' else role} types")
    return types


def _check_limit(request: RecommendRequest, *, required: bool) -> None:
    """Exactly one of budget and max_workers (or none, when not `required`), and a positive one."""
    budget, max_workers = request.budget, request.max_workers
    if budget is not None and max_workers is not None:
        raise RecommendationError(
            f"give a budget or a maximum number of workers, not both (budget ${_fmt(budget)}/h, {max_workers} workers)"
        )
    if required and budget is None and max_workers is None:
        raise RecommendationError(f"{request.algorithm} needs a budget in $/h or a maximum number of workers")
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise RecommendationError(f"the budget must be a positive number of $/h, not {budget}")
    # isinstance: a request made from JSON or a form may carry a float where an int is declared
    if max_workers is not None and not (isinstance(max_workers, int) and max_workers >= 1):  # type: ignore[redundant-expr]
        raise RecommendationError(
            f"the maximum number of workers must be a whole number of at least 1, not {max_workers}"
        )


def _check_point(request: RecommendRequest) -> None:
    """The batch size and latency asked about, when given, are ones a run could have: a whole number of samples from
    1 to MAX_BATCH_SIZE, a finite number of ms from 0 to MAX_LATENCY_MS.

    >>> _check_point(RecommendRequest("lookup", batch_size=64, latency_ms=float("nan")))
    Traceback (most recent call last):
    ...
    recommender.types.RecommendationError: The latency must be a number of ms from 0 to 60000, not nan
    """
    batch, latency = request.batch_size, request.latency_ms
    # isinstance: as _check_limit's
    if batch is not None and not (isinstance(batch, int) and 1 <= batch <= MAX_BATCH_SIZE):  # type: ignore[redundant-expr]
        raise RecommendationError(f"the batch size must be a whole number from 1 to {MAX_BATCH_SIZE}, not {batch}")
    if latency is not None and not (math.isfinite(latency) and 0 <= latency <= MAX_LATENCY_MS):
        raise RecommendationError(f"the latency must be a number of ms from 0 to {_fmt(MAX_LATENCY_MS)}, not {latency}")


# --- PS selection and the worker count from the limit ----------------------------------------------------------------


def _count(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec) -> int:
    """n from the limit, ⌊(C − c_ps) / c_t⌋ or max_workers; below 1 when the budget cannot buy one such worker."""
    if request.budget is None:
        assert request.max_workers is not None  # _check_limit(required=True) ran first
        return request.max_workers
    if worker.hourly_price <= 0:
        raise RecommendationError(f"{worker.name} has no price in the catalogue, so a budget cannot count its workers")
    ps_price = _dec(ps.hourly_price) if ps else 0
    return math.floor((_dec(request.budget) - ps_price) / _dec(worker.hourly_price))


def select_ps(
    request: RecommendRequest,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord] = (),
    worker_types: Collection[str] | None = None,
) -> InstanceSpec | None:
    """The PS (`choose_ps` without its reason).

    >>> small = InstanceSpec("small", 0.1, "ps", network_mbps=500)
    >>> big = InstanceSpec("big", 1.0, "ps", network_mbps=5000)
    >>> catalog = [small, big, InstanceSpec("w", 0.2, "worker")]
    >>> select_ps(RecommendRequest("cost-opt", max_workers=2), catalog).name  # 2 × 213.75 Mbps (FC² §8.3) ≤ 475
    'small'
    >>> select_ps(RecommendRequest("cost-opt", max_workers=4), catalog).name
    'big'
    >>> select_ps(RecommendRequest("cost-opt", budget=1.1), catalog).name  # big + one w = $1.2/h
    'small'
    >>> profile = PerfRecord("wl", "w", workers=1, bandwidth_mbps=100.0)
    >>> select_ps(RecommendRequest("cost-opt", max_workers=4, workload="wl"), catalog, [profile]).name
    'small'
    >>> select_ps(RecommendRequest("cost-opt", max_workers=5, workload="wl"), catalog, [profile]).name  # 500 > 475
    'big'
    """
    return choose_ps(request, catalog, records, worker_types)[0]


def choose_ps(
    request: RecommendRequest,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord] = (),
    worker_types: Collection[str] | None = None,
) -> tuple[InstanceSpec | None, str]:
    """The PS and why: the user's type; else, where a budget binds, FC²'s rule — the type of L^p with the largest
    network capacity that still leaves budget for one worker of the cheapest type in L^w; else (a worker limit) the
    cheapest type of L^p whose capacity × p covers the traffic of the limit's workers, each sending what one worker of
    the busiest type that may run (`worker_types`, default L^w) was measured to send for this workload and batch size
    — or, where that is not measured, an estimate (`_worker_traffic`). No type that covers it: the largest capacity,
    as FC² does. Ties go to the cheaper type."""
    _check_limit(request, required=False)
    if not request.parameter_server:
        return None, ""  # an all-reduce cluster: workers only
    index = _index(catalog)
    if request.ps_type:
        return _known([request.ps_type], index, "ps")[0], "your choice"
    options = _considered(request.ps_types, index, "ps")
    largest = "the largest network capacity"
    if request.budget is None:
        workers = _considered(worker_types or request.worker_types, index, "worker")
        if traffic := _worker_traffic(request, records, workers):
            return _ps_for_traffic(request, options, *traffic)
        return min(options, key=lambda ps: (-(ps.network_mbps or 0), *_price_order(ps))), largest
    if request.budget is not None:
        cheapest = min(_considered(request.worker_types, index, "worker"), key=_price_order)
        affordable = [ps for ps in options if _count(request, ps, cheapest) >= 1]
        if not affordable:
            ps = min(options, key=_price_order)
            together = hourly_cost(1, cheapest.hourly_price, ps.hourly_price)
            raise RecommendationError(
                f"the budget of ${_fmt(request.budget)}/h cannot buy a PS plus one worker: the cheapest PS, {ps.name}, "
                f"costs ${_fmt(ps.hourly_price)}/h and the cheapest worker, {cheapest.name}, "
                f"${_fmt(cheapest.hourly_price)}/h (${_fmt(together)}/h together)"
            )
        options = affordable
    return min(options, key=lambda ps: (-(ps.network_mbps or 0), *_price_order(ps))), f"{largest} the budget allows"


# What one worker sends when nothing about the workload is measured: the most FC² §8.3 saw — two p2.xlarge workers at
# batch size 128 saturated its 450 Mbps PS at p = 0.95 (a CNN of over a million parameters), 213.75 Mbps each — unless
# the worker's own link is slower. An estimate until a run of the workload measures its own (every lab or EC2 job does).
PRIOR_WORKER_MBPS = 450 * 0.95 / 2


def _worker_traffic(
    request: RecommendRequest,
    records: Collection[PerfRecord],
    workers: Collection[InstanceSpec],
) -> tuple[float, str] | None:
    """The traffic the limit's workers (of the types `workers`) put on the PS in Mbps, and how it is known: measured
    for those types; else estimated from the most any worker of the workload sent, else from FC²'s figure (or the
    workers' link, if slower). None without a worker limit."""
    if request.max_workers is None:
        return None
    names = [t.name for t in workers]
    measured = {t: b for t in names if (b := _measured(records, "bandwidth_mbps", request, t, "")) is not None}
    others = [
        (record.bandwidth_mbps, record.instance_type)
        for record in records
        if request.workload and record.workload == request.workload and record.bandwidth_mbps is not None
    ]
    if measured and len(measured) == len(names):
        busiest = max(measured, key=measured.__getitem__)
        per_worker, how = measured[busiest], f"{_fmt(measured[busiest])} Mbps measured for one {busiest} worker"
    elif others:
        per_worker, source = max(others)
        missing = ", ".join(t for t in names if t not in measured)
        how = (
            f"{_fmt(per_worker)} Mbps a worker, estimated as the most one {source} worker of this workload sent "
            f"({missing} not measured)"
        )
    else:
        links = [t.network_mbps for t in workers if t.network_mbps]
        per_worker = min([PRIOR_WORKER_MBPS, max(links)] if links and len(links) == len(names) else [PRIOR_WORKER_MBPS])
        how = (
            f"{_fmt(per_worker)} Mbps a worker, estimated (nothing of this workload is measured yet: "
            + ("its workers' links" if per_worker < PRIOR_WORKER_MBPS else "the most FC² §8.3 saw one worker send")
            + "; its first run on the lab or EC2 measures its own)"
        )
    n = request.max_workers
    return per_worker * n, f"{n} {'worker' if n == 1 else 'workers'} × {how}"


def _ps_for_traffic(
    request: RecommendRequest, options: Collection[InstanceSpec], traffic_mbps: float, how: str
) -> tuple[InstanceSpec, str]:
    p = _dec(request.saturation)
    covering = [ps for ps in options if ps.network_mbps and _dec(ps.network_mbps) * p >= _dec(traffic_mbps)]
    if covering:
        ps = min(covering, key=lambda ps: (*_price_order(ps), -(ps.network_mbps or 0)))
        return ps, (
            f"the cheapest whose {_fmt(_dec(ps.network_mbps) * p)} Mbps (× p {_fmt(request.saturation)}) covers "
            f"{_fmt(traffic_mbps)} Mbps: {how}"
        )
    ps = min(options, key=lambda ps: (-(ps.network_mbps or 0), *_price_order(ps)))
    return ps, f"the largest network capacity: none covers {_fmt(traffic_mbps)} Mbps ({how})"


def workers_from_limit(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec) -> int:
    """n from the limit: ⌊(C − c_ps) / c_t⌋ with a budget C, else the maximum number of workers; never below 1.

    Prices are divided as the decimals they were written as, so a budget that buys exactly n workers gives n:

    >>> m4_large, c4_xlarge = InstanceSpec("m4.large", 0.125), InstanceSpec("c4.xlarge", 0.231)
    >>> (1.511 - 0.125) / 0.231
    5.999999999999999
    >>> workers_from_limit(RecommendRequest("cost-opt", budget=1.511), m4_large, c4_xlarge)
    6
    >>> workers_from_limit(RecommendRequest("cost-opt", max_workers=6), m4_large, c4_xlarge)
    6
    >>> workers_from_limit(RecommendRequest("cost-opt", budget=0.2), m4_large, c4_xlarge)
    Traceback (most recent call last):
    ...
    recommender.types.RecommendationError: The budget of $0.2/h cannot buy the m4.large PS ($0.125/h) and one \
c4.xlarge worker ($0.231/h)
    """
    _check_limit(request, required=True)
    n = _count(request, ps, worker)
    if n < 1:
        raise _cannot_buy(request, ps, worker)
    return n


def _cannot_buy(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec) -> RecommendationError:
    assert request.budget is not None  # only a budget buys fewer than one worker
    ps_text = f"the {ps.name} PS (${_fmt(ps.hourly_price)}/h) and " if ps else ""
    return RecommendationError(
        f"the budget of ${_fmt(request.budget)}/h cannot buy {ps_text}one {worker.name} worker "
        f"(${_fmt(worker.hourly_price)}/h)"
    )


def _limit_name(request: RecommendRequest) -> str:
    if request.budget is None:
        return f"the limit of {request.max_workers} workers"
    return f"the budget of ${_fmt(request.budget)}/h"


def _limit_text(request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec, n: int) -> str:
    """Where n came from, with the arithmetic for a budget."""
    if request.budget is None:
        return _limit_name(request)
    budget = f"(${_fmt(request.budget)} − ${_fmt(ps.hourly_price)})" if ps else f"${_fmt(request.budget)}"
    prices = f"{budget} / ${_fmt(worker.hourly_price)}"
    return f"{_limit_name(request)}: ⌊{prices}⌋ = {n}"


def _ps_text(ps: InstanceSpec | None, why: str) -> str:
    if ps is None:
        return "no PS (All-Reduce: the workers average their gradients among themselves)"
    mbps = f"{_fmt(ps.network_mbps)} Mbps" if ps.network_mbps else "capacity unknown"
    return f"PS {ps.name} ({mbps}, ${_fmt(ps.hourly_price)}/h, {why})"


# --- performance records ---------------------------------------------------------------------------------------------


def _same(wanted: object, got: object) -> bool:
    """A field the request leaves empty (None) matches every record."""
    return wanted is None or wanted == got


def _measured(
    records: Collection[PerfRecord],
    field: str,
    request: RecommendRequest,
    worker_type: str,
    ps_type: str,
    *,
    workers: int | None = None,
    latency_ms: float | None = None,
) -> float | None:
    """The mean `field` ("bandwidth_mbps" or "epoch_time_s") of the records of the request's workload and batch size
    for this worker type (and worker count and latency when given) that have one, preferring runs against `ps_type`;
    None when no record has it."""
    rows = [
        record
        for record in records
        if record.workload == request.workload
        and record.instance_type == worker_type
        and getattr(record, field) is not None
        and _same(request.batch_size, record.batch_size)
        and _same(workers, record.workers)
        and _same(latency_ms, record.latency_ms)
    ]
    rows = [record for record in rows if record.ps_type == ps_type] or rows
    if not rows:
        return None
    return float(sum(_dec(getattr(record, field)) for record in rows) / len(rows))


def _epoch_time(
    records: Collection[PerfRecord], request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec, n: int
) -> float | None:
    """The measured epoch time of n workers of this type at the request's batch size and latency, if any — from runs
    of the cluster's own strategy only (a PS, or all-reduce): one strategy's time is no measure of the other's."""
    return _measured(
        _of_cluster_strategy(records, ps),
        "epoch_time_s",
        request,
        worker.name,
        ps.name if ps else "",
        workers=n,
        latency_ms=request.latency_ms,
    )


def _of_cluster_strategy(records: Collection[PerfRecord], ps: InstanceSpec | None) -> list[PerfRecord]:
    """The runs of the strategy of a cluster with this PS (None: all-reduce)."""
    return [record for record in records if runs_through_ps(record) == (ps is not None)]


def _epoch_time_text(
    records: Collection[PerfRecord], request: RecommendRequest, ps: InstanceSpec | None, worker: InstanceSpec, n: int
) -> str:
    """The explanation's tail on the chosen cluster's epoch time: the measured one, or why none is quoted."""
    if (epoch := _epoch_time(records, request, ps, worker, n)) is not None:
        return f"; measured epoch time {_fmt(epoch)} s"
    other = [record for record in records if runs_through_ps(record) != (ps is not None)]
    ps_type = ps.name if ps else ""
    if _measured(other, "epoch_time_s", request, worker.name, ps_type, workers=n, latency_ms=request.latency_ms):
        ran, runs = ("all-reduce", "a parameter server") if ps else ("a parameter server", "all-reduce")
        return (
            f"; epoch time unknown: this cluster was measured with {ran} only, and a run with {ran} is no measure of "
            f"one with {runs}"
        )
    return ""


def _rule_answer(
    algorithm: str,
    request: RecommendRequest,
    records: Collection[PerfRecord],
    ps_and_why: tuple[InstanceSpec | None, str],
    counts: list[tuple[InstanceSpec, int]],
    chosen: InstanceSpec,
    n: int,
    why: str,
    extra: dict | None = None,
) -> Recommendation:
    """The Recommendation of an FC² rule: `ps` the PS and why, `counts` the (type, n) it considered, `why` its
    reasoning."""
    ps, ps_why = ps_and_why
    epoch = _epoch_time(records, request, ps, chosen, n)
    cost = _hourly_cost(n, chosen.hourly_price, ps)
    tail = _epoch_time_text(records, request, ps, chosen, n)
    candidates = tuple(
        Candidate(
            t.name, count, _epoch_time(records, request, ps, t, count), _hourly_cost(count, t.hourly_price, ps), RULE
        )
        for t, count in counts
    )
    return Recommendation(
        algorithm=algorithm,
        ps_type=ps.name if ps else None,
        worker_type=chosen.name,
        workers=n,
        hourly_cost=cost,
        predicted_epoch_time_s=epoch,
        source=RULE,
        explanation=f"{why}; {_ps_text(ps, ps_why)}; ${_fmt(cost)}/h in all{tail}.",
        candidates=candidates,
        extra=extra or {},
    )


# --- FC² §5.2: Cost-Opt, Time-Opt, Scala-Opt, Scala-Opt-M ------------------------------------------------------------


def _by_price(
    algorithm: str, request: RecommendRequest, catalog: Collection[InstanceSpec], records: Collection[PerfRecord]
) -> Recommendation:
    """Cost-Opt (the cheapest type of L^w) or Time-Opt (the most expensive), n from the limit. With a budget, Time-Opt
    takes the most expensive type the budget still buys one of beside its PS (chosen first, FC²'s rule): the fastest
    cluster it can buy, rather than a refusal while types that fit exist."""
    _check_limit(request, required=True)
    types = _considered(request.worker_types, _index(catalog), "worker")
    ordered = sorted(types, key=_price_order)
    too_dear: list[str] = []
    if algorithm == "time-opt" and request.budget is not None:
        ps, ps_why = choose_ps(request, catalog, records)  # leaves the budget one of the cheapest type, at least
        affordable = [t for t in ordered if _count(request, ps, t) >= 1]
        if not affordable:  # (a PS of the user's own choosing may leave too little)
            raise _cannot_buy(request, ps, ordered[0])
        too_dear = [t.name for t in ordered if t not in affordable]
        chosen = affordable[-1]
    else:
        chosen = ordered[0] if algorithm == "cost-opt" else ordered[-1]
        ps, ps_why = choose_ps(request, catalog, records, [chosen.name])
    n = workers_from_limit(request, ps, chosen)
    counts = [(t, _count(request, ps, t)) for t in types]
    label, rank = ("Cost-Opt", "cheapest") if algorithm == "cost-opt" else ("Time-Opt", "most expensive")
    among = ", ".join(t.name for t in types if t.name not in too_dear)
    beyond = f" the budget buys beside the PS (it buys no {', '.join(too_dear)})" if too_dear else ""
    why = (
        f"{label}: {chosen.name} is the {rank} of {among}{beyond} "
        f"(${_fmt(chosen.hourly_price)}/h); {n} workers from {_limit_text(request, ps, chosen, n)}"
    )
    counts = [(t, c) for t, c in counts if c >= 1]
    return _rule_answer(algorithm, request, records, (ps, ps_why), counts, chosen, n, why)


def cost_opt(
    request: RecommendRequest, catalog: Collection[InstanceSpec], records: Collection[PerfRecord] = ()
) -> Recommendation:
    """Cost-Opt (FC² §5.2.2): the cheapest type in L^w, as many workers as the limit allows."""
    return _by_price("cost-opt", request, catalog, records)


def time_opt(
    request: RecommendRequest, catalog: Collection[InstanceSpec], records: Collection[PerfRecord] = ()
) -> Recommendation:
    """Time-Opt (FC² §5.2.3): the most expensive type in L^w, as many workers as the limit allows."""
    return _by_price("time-opt", request, catalog, records)


def _scala(
    algorithm: str,
    request: RecommendRequest,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord],
    p: float | None,
) -> Recommendation:
    """Scala-Opt over the request's L^w (Scala-Opt-M passes L^w = its one worker type)."""
    label = "Scala-Opt" if algorithm == "scala-opt" else "Scala-Opt-M"
    _check_limit(request, required=True)
    p = request.saturation if p is None else p
    if not 0 < p <= 1:
        raise RecommendationError(f"the saturation margin p must be above 0 and at most 1, not {p}")
    if not request.workload:
        raise RecommendationError(f"{label} needs a workload: its measured bandwidth decides the worker count")
    ps, ps_why = choose_ps(request, catalog, records)
    if ps is None:
        raise RecommendationError(
            f"{label} sizes the cluster by its parameter server's network capacity; an All-Reduce cluster has no PS "
            "(choose the parameter-server strategy, or Cost-Opt, Time-Opt or the model)"
        )
    if not ps.network_mbps:
        raise RecommendationError(f"{label} needs the PS's network capacity; the catalogue gives none for {ps.name}")
    capacity = _dec(ps.network_mbps) * _dec(p)

    # From the most to the least expensive (FC² §5.2.4); a type the budget cannot buy one of is no candidate.
    types = sorted(_considered(request.worker_types, _index(catalog), "worker"), key=_price_order, reverse=True)
    limits = [(t, _count(request, ps, t)) for t in types]
    affordable = [(t, limit) for t, limit in limits if limit >= 1]
    if not affordable:
        raise _cannot_buy(request, ps, types[-1])
    too_dear = [t.name for t, limit in limits if limit < 1]

    bandwidth = {t.name: _measured(records, "bandwidth_mbps", request, t.name, ps.name) for t, _ in affordable}
    missing = [
        MissingProfile(request.workload, name, ps.name, request.batch_size)
        for name, b in bandwidth.items()
        if b is None
    ]
    if missing:
        raise MissingProfilesError(missing)

    counts, steps = [], []
    chosen, n = None, 0
    for t, limit in affordable:
        b_t = _dec(bandwidth[t.name])
        by_bandwidth = math.floor(capacity / b_t) if b_t > 0 else limit
        n_t = max(1, min(by_bandwidth, limit))
        counts.append((t, n_t))
        steps.append(f"{t.name} {_fmt(b_t)} Mbps → min({by_bandwidth}, {limit}) = {n_t}")
        if chosen is None or n_t <= n:  # going down in price, so a tie goes to the cheaper type (FC² §8.4)
            chosen, n = t, n_t

    limit_text = "the limit" if request.budget is None else f"⌊(${_fmt(request.budget)} − c_ps) / c_t⌋"
    why = (
        f"{label}: the PS carries {_fmt(capacity)} Mbps ({_fmt(ps.network_mbps)} Mbps × p {_fmt(p)}); "
        f"n_t = min(⌊{_fmt(capacity)} / b_t⌋, {limit_text}) from the most expensive type: {', '.join(steps)}"
    )
    if too_dear:
        why += f" (the budget buys no {', '.join(too_dear)})"
    assert chosen is not None  # `affordable` has a type: one was chosen
    why += f"; {chosen.name} needs the fewest workers ({n})" if len(counts) > 1 else f"; {n} {chosen.name} workers"
    extra = {
        "ps_capacity_mbps": float(ps.network_mbps),
        "saturation": p,
        "bandwidth_mbps": dict(bandwidth),
    }
    return _rule_answer(algorithm, request, records, (ps, ps_why), counts, chosen, n, why, extra)


def scala_opt(
    request: RecommendRequest,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord],
    p: float | None = None,
) -> Recommendation:
    """Scala-Opt (FC² §5.2.4): for each type t of L^w, n_t = min(⌊B_ps·p / b_t⌋, n from the limit), at least 1; the
    type with the smallest n_t wins, the cheaper on a tie. p defaults to request.saturation. b_t is the mean measured
    bandwidth of one worker of type t for the workload (and batch size), against this PS type when such runs exist;
    when some are missing, MissingProfilesError lists every profiling run needed."""
    return _scala("scala-opt", request, catalog, records, p)


def scala_opt_m(
    request: RecommendRequest,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord],
    p: float | None = None,
) -> Recommendation:
    """Scala-Opt-M (FC² §5.2.4): the user's worker type, n_t as in Scala-Opt."""
    if not request.worker_type:
        raise RecommendationError("Scala-Opt-M needs your worker type (worker_type)")
    _known([request.worker_type], _index(catalog), "worker")
    return _scala("scala-opt-m", replace(request, worker_types=(request.worker_type,)), catalog, records, p)


# --- Anwar et al. §7.1: lookup ---------------------------------------------------------------------------------------


def _point_text(request: RecommendRequest) -> str:
    batch = f"batch size {request.batch_size}" if request.batch_size is not None else "any batch size"
    latency = f"{_fmt(request.latency_ms)} ms latency" if request.latency_ms is not None else "any latency"
    return f"{batch} and {latency}"


def _within_limit(request: RecommendRequest, candidate: Candidate, priced: bool) -> bool:
    if request.max_workers is not None:
        return candidate.workers <= request.max_workers
    if request.budget is not None and priced:
        return _dec(candidate.hourly_cost) <= _dec(request.budget)
    return True


def runs_through_ps(record: PerfRecord) -> bool:
    """A run with a parameter server: the ps strategy, or a PS type named without an all-reduce strategy (mirrored,
    PyTorch's ddp).

    >>> [runs_through_ps(PerfRecord("w", ps_type=p, strategy=s)) for p, s in (("m4.large", ""), ("m4.large", "ddp"),
    ...     ("", "ps"), ("m4.large", "mirrored"), ("", ""))]
    [True, False, True, False, False]
    """
    return record.strategy == "ps" or bool(record.ps_type and record.strategy not in ALL_REDUCE_STRATEGIES.values())


def all_reduce_of(record: PerfRecord) -> str:
    """The all-reduce strategy a run without a PS ran: its own name where it gives one (mirrored, ddp), else its
    workload key's framework's (`key_framework`: TensorFlow's for Anwar's runs and records from before frameworks).

    >>> [all_reduce_of(PerfRecord(w, strategy=s)) for w, s in (("w", ""), ("w@pytorch", ""), ("w", "ddp"))]
    ['mirrored', 'ddp', 'ddp']
    """
    if record.strategy in ALL_REDUCE_STRATEGIES.values():
        return record.strategy
    return ALL_REDUCE_STRATEGIES[key_framework(record.workload)]


def of_strategy(records: Sequence[PerfRecord], through_ps: bool) -> tuple[PerfRecord, ...]:
    """The runs of one strategy (through a PS, or all-reduce) of each workload measured both ways: one strategy's
    times say nothing of the other's. A workload measured one way only keeps every run: they are what there is, and
    their own pattern decides (an all-reduce workload asked with the default strategy, ps)."""
    kinds: dict[str, set[bool]] = {}
    for record in records:
        kinds.setdefault(record.workload, set()).add(runs_through_ps(record))
    return tuple(r for r in records if len(kinds[r.workload]) == 1 or runs_through_ps(r) == through_ps)


MIN_OWN_PS_RUNS = 4  # fewer runs through the chosen PS type cannot fit a model of their own: every run is kept


def of_ps_type(records: Sequence[PerfRecord], ps_type: str) -> tuple[PerfRecord, ...]:
    """The runs through PS type `ps_type` of each workload measured through several PS types: a saturated PS bounds
    the epoch by its own capacity (FC² §8), so another type's times are not this one's. A workload measured through
    one PS type, or with fewer than MIN_OWN_PS_RUNS successful runs through this one, keeps every run: they are what
    there is. Runs without a PS are kept (of_strategy decides about them).

    >>> runs = [PerfRecord("w", "c", "big", n, epoch_time_s=10.0 / n, strategy="ps") for n in (1, 2, 3, 4)]
    >>> runs += [PerfRecord("w", "c", "small", n, epoch_time_s=12.0, strategy="ps") for n in (1, 2, 3, 4)]
    >>> {r.ps_type for r in of_ps_type(runs, "big")}, len(of_ps_type(runs, "medium"))
    ({'big'}, 8)
    >>> len(of_ps_type(runs[:6], "small"))  # two runs through "small": too few of its own
    6
    """
    types: dict[str, set[str]] = {}
    own: Counter = Counter()
    for record in records:
        if runs_through_ps(record):
            types.setdefault(record.workload, set()).add(record.ps_type)
            own[record.workload] += record.ps_type == ps_type and record.epoch_time_s is not None
    return tuple(
        r
        for r in records
        if not runs_through_ps(r) or r.ps_type == ps_type or len(types[r.workload]) == 1
        or own[r.workload] < MIN_OWN_PS_RUNS
    )  # fmt: skip


def one_machine_latency_free(records: Collection[PerfRecord]) -> bool:
    """Whether one machine's epoch time is independent of latency for these runs: most go through no PS (all-reduce),
    so a single worker sends nothing over the network (Anwar Figs. 9–15: the one machine's time at every latency)."""
    return sum(map(runs_through_ps, records)) * 2 <= len(records)


FAILURE_REACH = 2  # a run that failed at batch size B_f makes B ≥ B_f / FAILURE_REACH risky


def failure_risk(
    failed: dict[tuple, int], succeeded: dict[tuple, int], batch_size: int | None, latency_ms: float | None
) -> str:
    """Why one configuration is risky at this point, from its runs (failed / succeeded: (batch size, latency ms) ->
    runs), in words; "" when none failed near it. A failure at B_f counts at every B ≥ B_f / 2 at any latency: a
    larger batch per worker needs more memory (Anwar's one machine at 64,000), and a factor 2 below it the margin is
    thin.

    >>> failure_risk({(64000, 0.0): 1}, {}, 32000, 20.0)
    '1 run failed at batch size 64000, 0 ms'
    >>> failure_risk({(64000, 0.0): 1}, {(64000, 0.0): 2}, 64000, 0.0), failure_risk({(64000, 0.0): 1}, {}, 6400, 0.0)
    ('1 of 3 runs failed here', '')
    """
    if batch_size is None:
        return ""
    notes = []
    for (batch, latency), count in sorted(failed.items(), key=lambda item: (item[0][0] or 0, item[0][1] or 0)):
        if batch is None or batch_size * FAILURE_REACH < batch:
            continue
        ok = succeeded.get((batch, latency), 0)
        runs = f"{count} of {count + ok} runs" if ok else _plural(count, "run")
        here = batch == batch_size and latency == latency_ms
        notes.append(f"{runs} failed " + ("here" if here else f"at batch size {batch}, {_fmt(latency or 0)} ms"))
    return "; ".join(notes)


def configuration_text(candidate: Candidate) -> str:
    """A configuration in words: "3 × c4.xlarge", or "3 workers" when the records name no type."""
    n = candidate.workers
    return f"{n} × {candidate.worker_type}" if candidate.worker_type else _plural(n, "worker")


def _seconds(candidate: Candidate) -> float:
    """The epoch time of a candidate known to have one (a measured one, or one a filter kept)."""
    if candidate.epoch_time_s is None:
        raise ValueError(f"{configuration_text(candidate)} has no epoch time")
    return candidate.epoch_time_s


def warning_text(pick: Candidate, candidates: Collection[Candidate]) -> str:
    """The warning of a pick with failed runs near it, and the fastest candidate with none, if any."""
    text = f"runs of {configuration_text(pick)} failed near this point ({pick.warning}), so it may fail too"
    safe = [c for c in candidates if not c.warning and c.epoch_time_s is not None]
    if safe:
        alternative = min(safe, key=lambda c: (_seconds(c), c.hourly_cost, c.workers))
        text += (
            f"; the fastest configuration with no failed run near it is {configuration_text(alternative)}, "
            f"{_fmt(round(_seconds(alternative), 1))} s per epoch ({alternative.basis or alternative.source})"
        )
    return text + "."


def lookup(
    request: RecommendRequest,
    records: Collection[PerfRecord],
    catalog: Collection[InstanceSpec],
    predict: Predictor | None = None,
) -> Recommendation:
    """Anwar's lookup: among the workload's measured runs at the request's batch size and latency (either left empty
    matches all), the cluster with the smallest epoch time (repeats averaged; ties: fewer workers), within max_workers
    or the budget. A cluster is a worker type and count and, for a parameter-server request, the PS type its runs
    went through (the user's, when named: runs through another are not this cluster), priced with that PS: c_ps +
    n·c_t ($0 for a type the catalogue does not price).
    One machine of an all-reduce workload sends nothing over the network: its runs at this batch size count at any
    latency. Failed runs (no epoch time) are information: a configuration with a failed run at this very point is
    never picked, and one with failed runs near it (`failure_risk`) is answered with a warning (`warnings`, and the
    explanation) naming the fastest configuration with none. With no measured match, the answer is predict(request)
    marked "predicted" (extra["lookup_miss"] says why nothing matched); without `predict`, or when the workload has no
    records at all, RecommendationError."""
    _check_limit(request, required=False)
    index = _index(catalog)

    def ps_of(record: PerfRecord) -> str:
        return record.ps_type if request.parameter_server and runs_through_ps(record) else ""

    runs = [record for record in records if record.workload == request.workload]
    if not runs:
        workloads = sorted({record.workload for record in records})
        raise RecommendationError(
            f"no performance records for workload {request.workload!r}; "
            f"records exist for {', '.join(map(repr, workloads)) or 'no workload'}"
        )
    at_point = [
        record
        for record in runs
        if _same(request.batch_size, record.batch_size)
        and _same(request.latency_ms, record.latency_ms)
        and record.workers is not None
        and (not request.ps_type or not ps_of(record) or record.ps_type == request.ps_type)
    ]
    failed = sum(record.epoch_time_s is None for record in at_point)
    failed_here = {(r.instance_type, r.workers, ps_of(r)) for r in at_point if r.epoch_time_s is None}
    times: dict[tuple[str, int, str], list[float]] = {}  # (worker type, n, PS type) -> its epoch times here
    for record in at_point:
        if (workers := record.workers) is not None and record.epoch_time_s is not None:
            key = (record.instance_type, workers, ps_of(record))
            if key not in failed_here:
                times.setdefault(key, []).append(record.epoch_time_s)
    outcomes: dict[tuple[str, int, str], tuple[dict, dict]] = {}  # cluster -> (failed, succeeded) runs by point
    for record in runs:
        if (workers := record.workers) is not None:
            failed_at, succeeded_at = outcomes.setdefault((record.instance_type, workers, ps_of(record)), ({}, {}))
            counts = failed_at if record.epoch_time_s is None else succeeded_at
            point = (record.batch_size, float(record.latency_ms or 0.0))
            counts[point] = counts.get(point, 0) + 1
    elsewhere: dict[tuple[str, int, str], list[PerfRecord]] = {}  # one latency-free machine, at other latencies
    if times and request.latency_ms is not None and one_machine_latency_free(runs):
        for record in runs:
            key = (record.instance_type, 1, ps_of(record))
            if (
                record.workers == 1
                and record.epoch_time_s is not None
                and _same(request.batch_size, record.batch_size)
                and key not in times
                and key not in failed_here
            ):
                elsewhere.setdefault(key, []).append(record)

    def candidate(key: tuple[str, int, str], seconds: list[float]) -> Candidate:
        worker_type, n, ps_type = key
        return Candidate(
            worker_type,
            n,
            float(sum(map(_dec, seconds)) / len(seconds)),
            _hourly_cost(n, index[worker_type].hourly_price, index.get(ps_type)) if worker_type in index else 0.0,
            MEASURED,
            basis=MEASURED,
            warning=failure_risk(*outcomes[key], request.batch_size, request.latency_ms),
            ps_type=ps_type,
        )

    measured = sorted(
        [candidate(key, seconds) for key, seconds in times.items()]
        + [
            candidate(key, [r.epoch_time_s for r in found if r.epoch_time_s is not None])
            for key, found in elsewhere.items()
        ],
        key=lambda c: (c.worker_type, c.workers, c.ps_type),
    )
    allowed = [c for c in measured if _within_limit(request, c, c.worker_type in index)]
    if not allowed:
        reason = f"no measured epoch time for {request.workload} at {_point_text(request)}"
        if measured:
            worker_counts = ", ".join(str(c.workers) for c in measured)
            reason += f" within {_limit_name(request)}"
            reason += f" (measured worker counts there: {worker_counts})"
        if failed:
            reason += f" ({_plural(failed, 'failed run')} there, skipped)"
        return _predicted(request, runs, predict, reason)

    best = min(allowed, key=lambda c: (_seconds(c), c.workers, c.hourly_cost, c.worker_type, c.ps_type))
    others = "".join(f"; {_plural(c.workers, 'worker')} {_fmt(_seconds(c))} s" for c in allowed if c is not best)
    of_type = (f" of {best.worker_type}" if best.worker_type else "") + (
        f" through a {best.ps_type} PS" if best.ps_type else ""
    )
    why = (
        f"Lookup: of the measured runs of {request.workload} at {_point_text(request)}, "
        f"{_plural(best.workers, 'worker')}{of_type} train{'s' * (best.workers == 1)} an epoch fastest "
        f"({_fmt(_seconds(best))} s{others})"
    )
    for worker_type, n, ps_type in sorted(elsewhere):
        latencies = sorted({float(r.latency_ms or 0.0) for r in elsewhere[(worker_type, n, ps_type)]})
        why += (
            f"; one machine{f' of {worker_type}' if worker_type else ''} counts as measured at "
            f"{', '.join(map(_fmt, latencies))} ms: it sends nothing over the network, so latency does not slow it"
        )
    if len(allowed) < len(measured):
        why += (
            f"; {_plural(len(measured) - len(allowed), 'measured configuration')} over {_limit_name(request)} left out"
        )
    if failed:
        why += f"; {_plural(failed, 'failed run')} skipped"
        left_out = [key for key in sorted(failed_here) if key in outcomes and outcomes[key][1]]
        if left_out:
            names = ", ".join(f"{n} × {t}" if t else _plural(n, "worker") for t, n, _ in left_out)
            why += f" ({names} never picked here: a run of it failed at this point)"
    if best.worker_type in index:
        each = f"{best.workers} × ${_fmt(index[best.worker_type].hourly_price)}"
        if best.ps_type in index:
            each += f" + the {best.ps_type} PS's ${_fmt(index[best.ps_type].hourly_price)}"
        why += f"; ${_fmt(best.hourly_cost)}/h ({each})"
    else:
        named = best.worker_type or "the records' instance type (they name none)"
        why += f"; the price of {named} is unknown to the catalogue, so the cost is shown as $0/h"
    warnings = (warning_text(best, allowed),) if best.warning else ()
    return Recommendation(
        algorithm="lookup",
        ps_type=best.ps_type or None,
        worker_type=best.worker_type,
        workers=best.workers,
        hourly_cost=best.hourly_cost,
        predicted_epoch_time_s=best.epoch_time_s,
        source=MEASURED,
        explanation=why + "." + "".join(f" Warning: {w}" for w in warnings),
        candidates=tuple(allowed),
        extra={"failed_runs_skipped": failed, "warnings": list(warnings)},
        warnings=warnings,
    )


def _predicted(
    request: RecommendRequest, runs: list[PerfRecord], predict: Predictor | None, reason: str
) -> Recommendation:
    """The performance model's answer where the lookup has no measurement (marked "predicted", with why there was
    none in extra["lookup_miss"]), or an error saying what data exists."""
    if predict is None:
        timed = [record for record in runs if record.epoch_time_s is not None]
        batches = sorted({record.batch_size for record in timed if record.batch_size is not None})
        latencies = sorted({record.latency_ms for record in timed if record.latency_ms is not None})
        raise RecommendationError(
            f"{reason}, and no performance model to predict it; {request.workload} has measured batch sizes "
            f"{', '.join(map(str, batches)) or 'none'} and latencies {', '.join(map(_fmt, latencies)) or 'none'} ms"
        )
    answer = predict(request)
    # The model explains its own answer (the fallback says there was no match); the lookup's details go beside it.
    return replace(answer, algorithm="lookup", source=PREDICTED, extra={**answer.extra, "lookup_miss": reason})


# --- dispatch --------------------------------------------------------------------------------------------------------

_RULES: dict[str, Callable[[RecommendRequest, Collection[InstanceSpec], Collection[PerfRecord]], Recommendation]] = {
    "cost-opt": cost_opt,
    "time-opt": time_opt,
    "scala-opt": scala_opt,
    "scala-opt-m": scala_opt_m,
}


def recommend(
    request: RecommendRequest,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord] = (),
    predict: Predictor | None = None,
    explore: Predictor | None = None,
) -> Recommendation:
    """Answer `request` with the algorithm it names: the FC² rules, Anwar's lookup (falling back on `predict`), the
    performance model itself ("model": predict(request)), or explore's search of trial runs ("explore":
    explore(request), recommender/explore_answer.py)."""
    if request.algorithm not in ALGORITHMS:
        raise RecommendationError(f"unknown algorithm {request.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    _check_point(request)
    index = _index(catalog)
    _known(request.worker_types, index, "worker")
    _known(request.ps_types, index, "ps")
    if request.framework not in ALL_REDUCE_STRATEGIES:
        raise RecommendationError(
            f"unknown framework {request.framework!r}; choose one of {', '.join(ALL_REDUCE_STRATEGIES)}"
        )
    if request.framework == "pytorch" and request.parameter_server is not False:
        raise RecommendationError(
            "a PyTorch workload runs DistributedDataParallel, all-reduce with no parameter server: ask for strategy ddp"
        )
    asked = "ps" if request.parameter_server else "auto" if request.parameter_server is None else request.all_reduce
    if reason := key_conflict(request.workload, asked):
        raise RecommendationError(reason)
    if request.parameter_server is None and request.algorithm not in ("model", "explore"):
        raise RecommendationError(
            f"only the model chooses between a parameter server and all-reduce (and explore tries both); "
            f"{request.algorithm} needs the strategy (ps or mirrored)"
        )
    if request.algorithm == "explore":
        if explore is None:
            raise RecommendationError("the explore algorithm needs its search (recommender.explore_answer)")
        return explore(request)
    if request.algorithm == "lookup":
        return with_its_ps(request, lookup(request, records, catalog, predict), catalog, records)
    if request.algorithm == "model":
        if predict is None:
            raise RecommendationError("the model algorithm needs a fitted performance model (recommender.perfmodel)")
        _check_limit(request, required=False)
        return with_its_ps(request, predict(request), catalog, records)
    return _RULES[request.algorithm](request, catalog, records)


def with_its_ps(
    request: RecommendRequest,
    answer: Recommendation,
    catalog: Collection[InstanceSpec],
    records: Collection[PerfRecord] = (),
) -> Recommendation:
    """A parameter-server request's answer with its PS named and priced in: where the runs it answers from name no
    PS type (or the model's records run none), the PS selection's choice for its workers (`choose_ps`), added to its
    $/h and said in its explanation — never a PS left for someone else to pick and price.

    >>> catalog = [InstanceSpec("ps", 0.125, "ps", network_mbps=500), InstanceSpec("w", 0.231, "worker")]
    >>> bare = Recommendation("lookup", None, "w", 3, 0.693, 8.0, MEASURED, "Lookup: 3 w.")
    >>> answer = with_its_ps(RecommendRequest("lookup", max_workers=4), bare, catalog)
    >>> answer.ps_type, answer.hourly_cost
    ('ps', 0.818)
    """
    if not request.parameter_server or answer.ps_type:
        return answer
    index = _index(catalog)
    sized = replace(request, budget=None, max_workers=answer.workers)
    ps, why = choose_ps(sized, catalog, records, [answer.worker_type] if answer.worker_type in index else None)
    if ps is None:
        return answer
    cost = float(round(_dec(answer.hourly_cost) + _dec(ps.hourly_price), 4))
    return replace(
        answer,
        ps_type=ps.name,
        hourly_cost=cost,
        explanation=f"{answer.explanation} The runs it answers from name no PS, and a parameter-server cluster has "
        f"one: {_ps_text(ps, why)}; ${_fmt(cost)}/h in all.",
    )
