"""The performance model: epoch time t(n, B, l, type) fitted per workload from its records, and the `model` algorithm.

Pure numpy/scipy over the shared dataclasses (recommender/types.py): no ORM, no Django.

Notation: n = workers, B = batch size, l = network latency (ms), type = worker instance type, speed_t = the catalogue's
ECU of the type (vCPU × the catalogue's median ECU per vCPU when ECU is "variable"). B enters every form through
b = B / B_ref, B_ref = the records' most common batch size, so coefficients are seconds per epoch at B_ref.

Model forms (every coefficient ≥ 0, fitted with scipy.optimize.nnls, so each term keeps its physical sign; predictions
are therefore positive and never decrease with latency):

- ``anwar-eq5`` — Anwar et al. eq. 5, t = o/x_n + l·r, generalised:
  t = θ_fixed + κ_type·w(b)/n + s(b)·(θ_step + θ_lat·l·m(n) + θ_xfer·v(n)).
  κ_type·w/n is compute over the cluster's throughput; s(b) counts steps per epoch; m(n) messages and v(n) bytes sent
  per step: ring all-reduce m = 2(n−1), v = 2(n−1)/n (no traffic for n = 1); parameter server m = 2, v = n (the PS
  link carries every worker's gradients). The pattern is the records' own: "ps" when most records name a PS or the
  ps strategy, else ring.
- ``ernest`` — Venkataraman et al. (NSDI'16), t = θ0 + θ1·size/n + θ2·log n + θ3·n, extended the same way:
  t = θ0 + κ_type·w(b)/n + s(b)·(θ_logn·log2 n + θ_n·n + l·(θ_lat_logn·log2 n + θ_lat_n·n)).

Each form comes with three readings of what an epoch is (the batch scaling, the part of the family name after ":"):
``pass`` — one pass over a fixed data set: steps ∝ 1/b, compute per epoch independent of b (s = 1/b, w = 1);
``steps`` — a fixed number of steps: s = 1, w = b; ``samples`` — work and messages both grow with b: s = w = b
(Anwar's Table 4, where epoch time is roughly proportional to the batch size at every n).
Speed: ``catalogue`` — one compute coefficient, κ_type = θ/speed_type; ``per-type`` — one free κ per measured type
(GPUs and burstable t2 do not follow their ECU); a type without records is priced through the catalogue as
median(κ_t·speed_t)/speed_type. Loss: ``absolute`` (plain NNLS) or ``relative`` (rows weighted 1/t, i.e. least
squares on relative error, close to a log-time fit under multiplicative noise, so small epochs count).

How the family is chosen: every applicable combination (2 forms × 3 scalings × 2 speeds × 2 losses) is scored by
cross-validated MAPE — leave-one-out (10 seeded folds above 100 records), or leave-one-group-out (one latency, worker
count, batch size or worker type at a time) when asked and at least 3 groups exist. The chosen combination is the
one with the fewest coefficients among those within 0.5 percentage points of the best MAPE (parsimony extrapolates
better), then refitted on every record. Failed runs (epoch_time_s None) are never fitted as times; they only keep
``recommend_model``/``predict_fallback`` away from a (type, n, batch size) that has only ever failed.

The α/β trade-off (Anwar eq. 6–9): among the feasible configurations (hourly cost c = c_ps + n·c_t ≤ C, or c = n·c_t
without a PS), minimise α·t/t_best + β·c/c_best, where t_best and c_best are the smallest predicted epoch time and the
smallest hourly cost among them. Each term is a ratio to the best (1.10 = 10 % worse), so α = 1, β = 0 picks the
fastest, α = 0, β = 1 the cheapest per hour (Anwar's c(n) = Σ p_i), α = β weighs 1 % of time against 1 % of cost;
ties go to the faster, then the cheaper configuration.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from recommender import algorithms
from recommender.types import Candidate, InstanceSpec, PerfRecord, Recommendation, RecommendationError, RecommendRequest

MIN_RECORDS = 4  # fewer successful runs cannot cross-validate even the smallest form
LOO_LIMIT = 100  # above this, leave-one-out becomes 10 seeded folds: nearly the same estimate, far fewer fits
FOLDS = 10
MIN_GROUPS = 3  # leave-one-group-out needs at least two groups left to learn the held-out axis from
PARSIMONY_MAPE = 0.005  # forms within 0.5 pp of the best CV MAPE count as equally good: the smallest one wins
MAX_WORKERS_EVALUATED = 256  # a budget can buy hundreds of cheap workers; no model is credible that far out

SHAPES = ("anwar-eq5", "ernest")
SCALINGS = ("pass", "steps", "samples")
SPEEDS = ("catalogue", "per-type")
LOSSES = ("relative", "absolute")

# How calibration_report and fit(cv=...) group records: name -> key of a record.
GROUPINGS: dict[str, Callable[[PerfRecord], object]] = {
    "latency": lambda r: float(r.latency_ms or 0.0),
    "workers": lambda r: r.workers,
    "batch_size": lambda r: r.batch_size,
    "type": lambda r: r.instance_type,
}


@dataclass(frozen=True)
class _Form:
    shape: str  # one of SHAPES
    scaling: str  # one of SCALINGS
    speed: str  # one of SPEEDS
    loss: str  # one of LOSSES

    @property
    def family(self) -> str:
        return f"{self.shape}:{self.scaling}"

    @property
    def label(self) -> str:
        return f"{self.family} ({self.speed} speed, {self.loss} error)"


@dataclass(frozen=True)
class _Data:
    """Successful records as arrays (latency None = 0 ms: same data centre; batch None = B_ref)."""

    types: tuple[str, ...]
    workers: np.ndarray
    batch: np.ndarray  # B / B_ref
    latency: np.ndarray  # ms
    time: np.ndarray  # measured epoch time, s


@dataclass(frozen=True)
class PerfModel:
    """Epoch time of one workload as a function of worker type, worker count, batch size and latency."""

    family: str  # chosen form and batch scaling, e.g. "anwar-eq5:samples" (module docstring)
    speed: str  # "catalogue" or "per-type"
    loss: str  # "relative" or "absolute"
    cv_mape: float  # cross-validated mean absolute percentage error of epoch time (0.12 = 12 %)
    cv: str  # the cross-validation actually used, e.g. "leave-one-out over 27 records"
    coefficients: dict[str, float]  # name -> value in seconds (per ms for latency terms), for display
    alternatives: dict[str, float]  # CV MAPE of every form considered, by label
    records: int  # successful records fitted
    pattern: str  # "ring" (all-reduce) or "ps": how messages grow with n
    batch_ref: float | None  # B_ref; None when no record gives a batch size (batch then has no effect)
    latency_ref: float  # latency used when a prediction gives none: the records' most common, ms
    coverage: dict  # measured ranges: workers [min, max], batch_sizes, latencies_ms, worker_types
    form: _Form = field(repr=False)
    terms: _Fit = field(repr=False)  # the fitted coefficients as the predictor uses them

    def can_price(self, worker_type: str) -> bool:
        """True when the model can predict for this type (it has records, or a catalogue speed)."""
        return self.terms.kappa(worker_type) is not None

    def predict(self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None) -> float:
        """Predicted epoch time in seconds; batch_size/latency_ms None mean the records' most common values."""
        if workers < 1:
            raise RecommendationError(f"cannot predict for {workers} workers: at least one is needed")
        if not self.can_price(worker_type):
            raise RecommendationError(
                f"the model cannot price worker type {worker_type!r}: it has no records and no catalogue speed"
            )
        return float(self._predict([worker_type], [workers], [batch_size], [latency_ms])[0])

    def _predict(self, types, workers, batch_sizes, latencies) -> np.ndarray:
        """Vectorised predictions; NaN for a type the model cannot price."""
        n = np.asarray(workers, dtype=float)
        b = np.array([self._batch(x) for x in batch_sizes], dtype=float)
        lat = np.array([self.latency_ref if x is None else float(x) for x in latencies], dtype=float)
        _, features = _shared_features(self.form, self.pattern, n, b, lat)
        time = self.terms.time(types, features, _work(self.form.scaling, b) / n)
        return np.maximum(time, 1e-9)  # a sum of non-negative terms; the floor only guards an all-zero fit

    def _batch(self, batch_size: int | None) -> float:
        if self.batch_ref is None or batch_size is None:
            return 1.0
        return float(batch_size) / self.batch_ref


# --- features -----------------------------------------------------------------------------------------------------


def _steps(scaling: str, b: np.ndarray) -> np.ndarray:
    return {"pass": 1.0 / b, "steps": np.ones_like(b), "samples": b}[scaling]


def _work(scaling: str, b: np.ndarray) -> np.ndarray:
    return np.ones_like(b) if scaling == "pass" else b


def _shared_features(form: _Form, pattern: str, n, b, lat) -> tuple[tuple[str, ...], np.ndarray]:
    """The type-independent columns of a form (the compute column is added per speed mode)."""
    s = _steps(form.scaling, b)
    if form.shape == "anwar-eq5":
        if pattern == "ps":
            messages, volume = np.full_like(n, 2.0), n
        else:
            messages, volume = 2.0 * (n - 1.0), 2.0 * (n - 1.0) / n
        columns = {
            "fixed_s": np.ones_like(n),
            "step_overhead_s": s,
            "latency_s_per_ms": s * lat * messages,
            "transfer_s": s * volume,
        }
    else:
        log_n = np.log2(n)
        columns = {
            "fixed_s": np.ones_like(n),
            "log_n_s": s * log_n,
            "n_s": s * n,
            "latency_log_n_s_per_ms": s * lat * log_n,
            "latency_n_s_per_ms": s * lat * n,
        }
    return tuple(columns), np.column_stack(list(columns.values()))


def _catalog_speeds(catalog: Sequence[InstanceSpec]) -> dict[str, float]:
    """speed_t per type: ECU, else vCPU × the catalogue's median ECU per vCPU (t2's "variable" ECU)."""
    per_vcpu = [s.ecu / s.vcpu for s in catalog if s.ecu and s.vcpu]
    ecu_per_vcpu = float(np.median(per_vcpu)) if per_vcpu else None
    speeds = {}
    for spec in catalog:
        if spec.ecu:
            speeds[spec.name] = float(spec.ecu)
        elif spec.vcpu and ecu_per_vcpu:
            speeds[spec.name] = spec.vcpu * ecu_per_vcpu
    return speeds


# --- fitting ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fit:
    shared: np.ndarray  # coefficients of the type-independent features
    compute_s: dict[str, float]  # κ of each measured type (per-type speed)
    compute_per_speed: float | None  # θ with κ = θ / speed (catalogue speed, and bridging unmeasured types)
    speeds: dict[str, float]  # catalogue speed per type

    def kappa(self, worker_type: str) -> float | None:
        if worker_type in self.compute_s:
            return self.compute_s[worker_type]
        if self.compute_per_speed is not None and worker_type in self.speeds:
            return self.compute_per_speed / self.speeds[worker_type]
        return None

    def time(self, types: Sequence[str], shared_features: np.ndarray, work_per_worker: np.ndarray) -> np.ndarray:
        kappa = np.array([np.nan if (k := self.kappa(t)) is None else k for t in types], dtype=float)
        return shared_features @ self.shared + kappa * work_per_worker


def _design(form: _Form, pattern: str, data: _Data, speeds: dict[str, float], measured: tuple[str, ...]):
    names, shared = _shared_features(form, pattern, data.workers, data.batch, data.latency)
    work = _work(form.scaling, data.batch) / data.workers
    if form.speed == "catalogue":
        compute = (work / np.array([speeds[t] for t in data.types]))[:, None]
    else:
        compute = np.column_stack([work * np.array([t == m for t in data.types]) for m in measured])
    return names, shared, compute


def _solve(matrix: np.ndarray, time: np.ndarray, loss: str) -> np.ndarray:
    weight = 1.0 / time if loss == "relative" else np.ones_like(time)
    a = matrix * weight[:, None]
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0  # a feature that is zero on every row (e.g. latency when all runs are at 0 ms)
    coef, _ = nnls(a / scale, time * weight, maxiter=50 * a.shape[1])
    return coef / scale


def _fit_rows(form, shared, compute, data: _Data, rows: np.ndarray, measured, speeds) -> _Fit:
    matrix = np.hstack([shared[rows], compute[rows]])
    coef = _solve(matrix, data.time[rows], form.loss)
    k = shared.shape[1]
    if form.speed == "catalogue":
        return _Fit(coef[:k], {}, float(coef[k]), speeds)
    present = {data.types[i] for i in rows}
    compute_s = {t: float(c) for t, c in zip(measured, coef[k:], strict=True) if t in present}
    bridges = [c * speeds[t] for t, c in compute_s.items() if t in speeds]
    return _Fit(coef[:k], compute_s, float(np.median(bridges)) if bridges else None, speeds)


def _usable(records: Sequence[PerfRecord]) -> list[PerfRecord]:
    return [r for r in records if r.epoch_time_s is not None and r.epoch_time_s > 0 and r.workers and r.workers >= 1]


def _pattern(records: Sequence[PerfRecord]) -> str:
    ps = sum(1 for r in records if r.strategy == "ps" or (r.ps_type and r.strategy != "mirrored"))
    return "ps" if ps * 2 > len(records) else "ring"


def _most_common(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(Counter(values).most_common(1)[0][0]) if values else None


def _folds(records: list[PerfRecord], cv: str) -> tuple[list[np.ndarray], str]:
    count = len(records)
    if cv != "loo":
        keys = [GROUPINGS[cv](r) for r in records]
        groups = sorted(set(keys), key=str)
        if len(groups) >= MIN_GROUPS:
            folds = [np.array([i for i, k in enumerate(keys) if k == g]) for g in groups]
            return folds, f"leave-one-{cv}-out over {len(groups)} groups ({count} records)"
        fallback = f" (only {len(groups)} {cv} group{'s' * (len(groups) != 1)}: leave-one-{cv}-out needs {MIN_GROUPS})"
    else:
        fallback = ""
    if count <= LOO_LIMIT:
        return [np.array([i]) for i in range(count)], f"leave-one-out over {count} records{fallback}"
    order = np.random.default_rng(0).permutation(count)
    return [np.sort(order[k::FOLDS]) for k in range(FOLDS)], f"{FOLDS}-fold over {count} records{fallback}"


def fit(records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, cv: str = "loo") -> PerfModel:
    """Fit every candidate form, keep the one with the best cross-validated MAPE (module docstring).

    cv: "loo", or "latency" / "workers" / "batch_size" / "type" for leave-one-group-out. The same records and catalogue
    (they are frozen, so hashable) give the same model: fits are memoised, since a request recommends from a workload
    whose records rarely change between requests.
    """
    return _fit(tuple(records), tuple(catalog), cv)


@functools.lru_cache(maxsize=64)
def _fit(records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], cv: str) -> PerfModel:
    if cv != "loo" and cv not in GROUPINGS:
        raise ValueError(f"unknown cross-validation {cv!r}: use 'loo' or one of {', '.join(GROUPINGS)}")
    usable = _usable(records)
    if len(usable) < MIN_RECORDS:
        failed = sum(1 for r in records if r.epoch_time_s is None)
        raise RecommendationError(
            f"too few performance records to fit a model: {len(usable)} with an epoch time"
            f"{f' ({failed} failed runs skipped)' if failed else ''}, at least {MIN_RECORDS} needed"
        )
    speeds = _catalog_speeds(catalog)
    batch_ref = _most_common(r.batch_size for r in usable)
    data = _Data(
        types=tuple(r.instance_type for r in usable),
        workers=np.array([r.workers for r in usable], dtype=float),
        batch=np.array([(r.batch_size or batch_ref or 1.0) / (batch_ref or 1.0) for r in usable], dtype=float),
        latency=np.array([r.latency_ms or 0.0 for r in usable], dtype=float),
        time=np.array([r.epoch_time_s for r in usable], dtype=float),
    )
    measured = tuple(sorted(set(data.types)))
    pattern = _pattern(usable)
    folds, cv_text = _folds(usable, cv)
    everything = np.arange(len(usable))

    scored = []  # (coverage, mape, parameters, order, form, design)
    for order, form in enumerate(_forms(measured, speeds)):
        names, shared, compute = _design(form, pattern, data, speeds, measured)
        predicted = np.full(len(usable), np.nan)
        for test in folds:
            train = np.setdiff1d(everything, test)
            fold_fit = _fit_rows(form, shared, compute, data, train, measured, speeds)
            work = _work(form.scaling, data.batch[test]) / data.workers[test]
            predicted[test] = fold_fit.time([data.types[i] for i in test], shared[test], work)
        priced = ~np.isnan(predicted)
        if not priced.any():
            continue
        errors = np.abs(predicted[priced] - data.time[priced]) / data.time[priced]
        parameters = shared.shape[1] + compute.shape[1]
        scored.append((priced.mean(), float(errors.mean()), parameters, order, form, (names, shared, compute)))
    if not scored:
        raise RecommendationError(
            "cannot cross-validate a model: every worker type has a single record and the catalogue gives no speed"
        )
    coverage = max(s[0] for s in scored)
    complete = [s for s in scored if s[0] == coverage]
    best = min(s[1] for s in complete)
    chosen = min((s for s in complete if s[1] <= best + PARSIMONY_MAPE), key=lambda s: (s[2], s[1], s[3]))
    _, mape, _, _, form, (names, shared, compute) = chosen
    if coverage < 1:
        cv_text += f"; {coverage:.0%} of held-out records could be priced"

    final = _fit_rows(form, shared, compute, data, everything, measured, speeds)
    coefficients = {name: float(c) for name, c in zip(names, final.shared, strict=True)}
    if form.speed == "catalogue":
        coefficients["compute_s_x_speed"] = float(final.compute_per_speed)
    else:
        coefficients.update({f"compute_s[{t or 'unnamed type'}]": c for t, c in final.compute_s.items()})
    return PerfModel(
        family=form.family,
        speed=form.speed,
        loss=form.loss,
        cv_mape=mape,
        cv=cv_text,
        coefficients=coefficients,
        alternatives={s[4].label: s[1] for s in scored},
        records=len(usable),
        pattern=pattern,
        batch_ref=batch_ref,
        latency_ref=_most_common(float(r.latency_ms or 0.0) for r in usable) or 0.0,
        coverage={
            "workers": [int(data.workers.min()), int(data.workers.max())],
            "batch_sizes": sorted({r.batch_size for r in usable if r.batch_size is not None}),
            "latencies_ms": sorted({float(r.latency_ms or 0.0) for r in usable}),
            "worker_types": list(measured),
        },
        form=form,
        terms=final,
    )


def _forms(measured: tuple[str, ...], speeds: dict[str, float]) -> list[_Form]:
    speed_modes = [m for m in SPEEDS if m != "catalogue" or all(t in speeds for t in measured)]
    return [
        _Form(shape, scaling, speed, loss)
        for shape in SHAPES
        for scaling in SCALINGS
        for speed in speed_modes
        for loss in LOSSES
    ]


# --- recommending -------------------------------------------------------------------------------------------------

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
    times = model._predict(names, workers, [request.batch_size] * len(pairs), [request.latency_ms] * len(pairs))
    ps_price = ps.hourly_price if ps else 0.0
    candidates = [
        Candidate(t, n, float(time), round(ps_price + n * prices.get(t, 0.0), 4), "predicted")
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
    batch_text, latency_text = _conditions(model, request)
    if request.budget is not None:
        within = f" costing at most ${request.budget:g}/h"
    elif request.max_workers is not None:
        within = f" of at most {request.max_workers} workers"
    else:
        within = " up to the largest measured worker count (no budget or limit given)"
    explanation = (
        f"Performance model {model.family} ({model.speed} speed; cross-validated error {model.cv_mape:.1%}, "
        f"{model.cv}) predicts {pick.epoch_time_s:.1f} s per epoch for "
        f"{f'{pick.workers} × {pick.worker_type}' if pick.worker_type else f'{pick.workers} workers'} "
        f"at {batch_text} and {latency_text}; it minimises α·time/best time + β·cost/best cost "
        f"(α = {request.alpha:g}, β = {request.beta:g}) over {len(candidates)} configurations{within}."
        + _extrapolation(model, pick, request)
        + (" Hourly cost leaves out the workers: the records name no worker type." if types == [""] else "")
    )
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
    batch_text, latency_text = _conditions(model, request)
    if pick.worker_type in prices:
        no_price = ""
    elif pick.worker_type:
        no_price = f" Hourly cost leaves out {pick.worker_type}: the catalogue has no price for it."
    else:
        no_price = " Hourly cost leaves out the workers: the records name no worker type."
    explanation = (
        f"No measured record matches {batch_text} and {latency_text}, so the performance model answers: "
        f"{model.family} ({model.speed} speed, cross-validated error {model.cv_mape:.1%}, {model.cv}) predicts "
        f"{pick.epoch_time_s:.1f} s per epoch with {pick.workers} worker{'s' * (pick.workers != 1)}, the fastest of "
        f"{len(candidates)} configurations." + _extrapolation(model, pick, request) + no_price
    )
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


# --- calibration --------------------------------------------------------------------------------------------------


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
    groups = sorted({key(r) for r in usable}, key=str)
    pairs, skipped, families = [], [], {}
    for group in groups:
        train = [r for r in usable if key(r) != group]
        held_out = [r for r in usable if key(r) == group]
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
        predicted = model._predict(
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
    errors = [abs(p["predicted_s"] - p["measured_s"]) / p["measured_s"] for p in pairs]
    regrets = _regrets(pairs)
    return {
        "group_by": group_by,
        "groups": [_json(g) for g in groups],
        "records": len(usable),
        "failed_runs": sum(1 for r in records if r.epoch_time_s is None),
        "predicted": len(pairs),
        "mape": float(np.mean(errors)) if errors else None,
        "median_ape": float(np.median(errors)) if errors else None,
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
