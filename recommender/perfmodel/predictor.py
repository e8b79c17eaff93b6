"""The predictor: a workload's epoch time t(worker type, n, batch size B, latency l) from its measurements where they
are dense, from the fitted model (families, fitting) only where they are not, and what each answer is worth.

For one (worker type, worker count), from that pair's own measurements (failed runs never count as times):

1. ``measured`` — runs at exactly (B, l): their mean. One machine of an all-reduce workload (no PS) sends nothing over
   the network, so its epoch time does not depend on latency: its runs at B at any latency count (Anwar's Figs. 9–15:
   the single machine's time is the same at every latency; Table 4 holds it at 0 ms only).
2. ``interpolated`` — measured neighbours bracket the query: linear in latency between the two nearest measured
   latencies at B; in batch size between the two nearest measured batch sizes at l, log–log (a power law between the
   two) or linear in B, whichever predicts the workload's own interior batch sizes better when each is left out
   (log–log without that evidence; Table 4 picks linear: its epoch times are a fixed cost plus a cost per sample);
   both in turn (bilinear) when each needs the other. Where the model also speaks, the two are blended in log time by
   inverse squared expected error: the interpolation's (floor + slope·d₁d₂, d₁ and d₂ the distances to the two
   neighbours, fitted to its leave-one-out errors on the workload's own interior points: the runs' noise, plus the
   curvature a wider bracket meets) against the model's cross-validated error — near a measurement, or beside a poor
   model, the data decide. ``blend`` when the model's weight is 10 % or more.
3. ``extrapolated`` — outside this pair's measured range. The model's prediction carried from the nearest
   measurement (× measured ÷ predicted there, or + measured − predicted: whichever predicts the ends of the workload's
   own lines of measurements better from the point next to them) — or from the nearest two, by their mean error, where
   that predicts those ends better from the two points next to them (a run's noise weighs more than the model's error
   moving along the line: the lab's PS grid) — blended in log time with the measurements' own
   trend through the two nearest along that axis, by inverse squared error: each one's leave-one-end-out error on the
   workload's lines, the trend's grown with how many of its spacings it is continued. So the model extrapolates where
   it has earned it, and a poor model gives way to the data's own slope a step beyond them — but not ten steps.
   Where the pair ran neither at this batch size nor at this latency, first the estimate at this batch size at the
   measured latencies next to the query (as above, from the runs at each), then linear in latency between the two
   around it, or the model carried in latency from the nearest: so the query's latency never cuts the estimate off
   from the runs' trend in batch size, and it never falls with latency where the model rises.
   Without a model, the trend alone. A worker count never measured for the type: the model corrected by its error at
   the neighbouring measured counts at the same (B, l) (interpolated in n between two, the nearest one's beyond); for
   one machine of an all-reduce workload, latency-free, at the lowest measured latency whatever l is asked (the
   others' runs there say most about their computing and least about a network the one machine does not use).
4. ``model`` — no measurement of the type at all: the model alone (a type priced from its catalogue speed).

Expected error: the whole predictor cross-validated — every latency, batch size and worker count held out in turn and
predicted from the rest (model refitted), the MAPE of the held-out times per basis (`PredictorModel.expected_error`).

Failed runs are information: a configuration with a failed run at the very point, or only failed runs at its batch
size, is never an estimate there (`left_out`); one that failed at batch size B_f carries a warning (`risk`,
recommender.algorithms.failure_risk) at every B ≥ B_f / 2 at any latency.

Pure numpy over the shared dataclasses: no ORM, no Django.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from recommender.algorithms import failure_risk, one_machine_latency_free
from recommender.perfmodel.families import PerfModel
from recommender.perfmodel.fitting import GROUPINGS, _usable, fit
from recommender.types import InstanceSpec, PerfRecord, RecommendationError

MEASURED, INTERPOLATED, BLEND, EXTRAPOLATED, MODEL = "measured", "interpolated", "blend", "extrapolated", "model"
BASES = (MEASURED, INTERPOLATED, BLEND, EXTRAPOLATED, MODEL)
CV_GROUPINGS = ("latency", "batch_size", "workers")  # the ways a query can miss the measurements
BATCH_SPACES = ("log-log", "linear")
ANCHORINGS = ("multiplicative", "additive")
ANCHOR_POINTS = (1, 2)  # how many of the nearest measurements the model is carried from (their mean error)
PRIOR_INTERPOLATION_ERROR = 0.05  # an interpolation's error before any leave-one-out says otherwise
PRIOR_TREND_ERROR = 0.20  # a trend continued past the measurements, before any leave-one-out says otherwise
BLEND_LABEL = 0.10  # the model's weight from which an interpolated estimate is called a blend
MIN_CV_PAIRS = 3  # fewer held-out estimates of a basis do not make its own error figure: the overall one stands in


@dataclass(frozen=True)
class Estimate:
    epoch_time_s: float
    basis: str  # one of BASES
    detail: str  # which measurements it came from and how, in words
    expected_error: float | None  # CV MAPE of the whole predictor for this basis; None: measured at this very point
    warning: str = ""  # failed runs of this configuration near this point ("" when none)


@dataclass(frozen=True)
class _Interpolation:
    time_s: float
    error: float  # expected relative error, for the blend
    detail: str


def _fmt(x: float) -> str:
    return f"{x:.4f}".rstrip("0").rstrip(".")


def _latency_text(latency: float) -> str:
    return f"{_fmt(latency)} ms"


def _batch_text(batch: float | None) -> str:
    return "no batch size" if batch is None else f"batch size {_fmt(batch)}"


def _bracket(values, x: float) -> tuple[float, float] | None:
    below = [v for v in values if v < x]
    above = [v for v in values if v > x]
    return (max(below), min(above)) if below and above else None


def _coordinate(x: float, space: str) -> float:
    return math.log(x) if space == "log-log" else float(x)


def _between(x: float, lo: tuple[float, float], hi: tuple[float, float], space: str) -> float:
    """The time at x on the line through (x, t) points lo and hi: in log t over log x (log-log) or t over x.

    >>> [round(_between(2000, (1000, 10.0), (4000, 20.0), space), 2) for space in ("linear", "log-log")]
    [13.33, 14.14]
    """
    (x0, t0), (x1, t1) = lo, hi
    u = (_coordinate(x, space) - _coordinate(x0, space)) / (_coordinate(x1, space) - _coordinate(x0, space))
    if space == "log-log":
        return math.exp(math.log(t0) + u * (math.log(t1) - math.log(t0)))
    return t0 + u * (t1 - t0)


def _spread(x: float, lo: float, hi: float, space: str) -> float:
    """d₁·d₂ in the interpolation's coordinate: linear interpolation's error grows with it (∝ the curvature)."""
    c = _coordinate(x, space)
    return (c - _coordinate(lo, space)) * (_coordinate(hi, space) - c)


def _ratio(a: float, b: float) -> float:
    return abs(a / b - 1.0)


@dataclass(frozen=True)
class _ErrorLaw:
    """An interpolation's expected relative error at a query whose neighbours lie d₁ and d₂ away: floor + slope·d₁d₂,
    fitted (non-negative, least squares) to its leave-one-out errors on the workload's own interior points — the floor
    is the runs' noise, the slope the curvature a wider bracket meets. Without interior points, a prior."""

    floor: float
    slope: float

    def at(self, spread: float) -> float:
        return self.floor + self.slope * spread


_PRIOR = _ErrorLaw(PRIOR_INTERPOLATION_ERROR, 0.0)


def _carry(there: Sequence[tuple[float, float]], predicted_here: float, mode: str) -> float:
    """The model's prediction here, carried from measurements there ((measured, predicted) each): × their mean
    measured ÷ predicted in log time (multiplicative) or + their mean measured − predicted (additive; multiplicative
    where that would not leave a positive time).

    >>> _carry([(12.0, 10.0)], 20.0, "multiplicative"), _carry([(12.0, 10.0)], 20.0, "additive")
    (24.0, 22.0)
    >>> round(_carry([(12.0, 10.0), (9.0, 10.0)], 20.0, "multiplicative"), 2)  # × √(1.2 · 0.9)
    20.78
    """
    if mode == "additive" and (time_s := predicted_here + float(np.mean([m - p for m, p in there]))) > 0:
        return time_s
    return predicted_here * math.exp(float(np.mean([math.log(m / p) for m, p in there])))


@dataclass(frozen=True)
class PredictorModel:
    """A workload's measurements by (worker type, worker count), its fitted model, and the predictor's errors."""

    slices: dict  # (worker type, n) -> {(batch size, latency ms): mean epoch time s}
    failed: dict  # (worker type, n) -> {(batch size, latency ms): failed runs there}
    successes: dict  # (worker type, n) -> {(batch size, latency ms): successful runs there}
    model: PerfModel | None  # None: too few records to fit one (then only the measurements' trend extrapolates)
    model_error: str  # why there is no model ("" when there is one)
    latency_free: bool  # one machine's time is latency-independent (all-reduce or unknown strategy, not a PS)
    batch_space: str  # one of BATCH_SPACES
    latency_loo: _ErrorLaw
    batch_loo: _ErrorLaw
    anchoring: str  # one of ANCHORINGS: how the model is carried from measurements
    anchor_points: int  # one of ANCHOR_POINTS: from how many of the nearest
    # "model" / "trend" -> leave-one-end-out mean relative error (absent: no evidence); "trend_steps": how far, in
    # spacings, those trends were continued
    extrapolation_errors: dict
    batch_ref: float | None  # a query's batch size when it gives none: the records' most common
    latency_ref: float  # a query's latency when it gives none: the records' most common
    coverage: dict  # measured ranges: workers [min, max], batch_sizes, latencies_ms, worker_types
    cv_errors: dict  # basis -> (MAPE, held-out estimates); "all" -> every basis together
    cv: str  # the cross-validation that gave cv_errors, in words ("" when not run)

    # --- what it is worth ---------------------------------------------------------------------------------------

    def expected_error(self, basis: str) -> float | None:
        """The whole predictor's cross-validated MAPE for estimates of this basis (the overall one where the basis
        had too few held-out estimates; the model's own CV MAPE when no cross-validation ran); None: measured."""
        own = self.cv_errors.get(basis)
        if own and own[1] >= MIN_CV_PAIRS:
            return own[0]
        overall = self.cv_errors.get("all")
        if overall and overall[1]:
            return overall[0]
        return self.model.cv_mape if self.model else None

    @property
    def overall_error(self) -> float | None:
        """The whole predictor's cross-validated MAPE over every held-out estimate."""
        overall = self.cv_errors.get("all")
        return overall[0] if overall and overall[1] else (self.model.cv_mape if self.model else None)

    def can_price(self, worker_type: str) -> bool:
        return any(t == worker_type for t, _ in self.slices) or bool(self.model and self.model.can_price(worker_type))

    def left_out(self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None) -> bool:
        """True when this configuration is no candidate here: a run of it failed at this very point, or it only ever
        failed at this batch size (at whatever latency it ran)."""
        key = (worker_type, workers)
        batch = self.batch_ref if batch_size is None else batch_size
        latency = self.latency_ref if latency_ms is None else float(latency_ms)
        failed = self.failed.get(key, {})
        if (batch, latency) in failed:
            return True
        return any(b == batch for b, _ in failed) and not any(b == batch for b, _ in self.successes.get(key, {}))

    def risk(self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None) -> str:
        """Why this configuration is risky near this point (algorithms.failure_risk; "" when no run failed near)."""
        key = (worker_type, workers)
        return failure_risk(
            self.failed.get(key, {}),
            self.successes.get(key, {}),
            self.batch_ref if batch_size is None else batch_size,
            self.latency_ref if latency_ms is None else float(latency_ms),
        )

    # --- estimates ----------------------------------------------------------------------------------------------

    def estimate(
        self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None
    ) -> Estimate | None:
        """The epoch time of this configuration and where it comes from; None when neither the measurements nor the
        model can say (a type with no records the model cannot price, or no model to extrapolate with)."""
        return self.estimate_many([(worker_type, workers, batch_size, latency_ms)])[0]

    def estimate_many(self, points: Sequence[tuple[str, int, int | None, float | None]]) -> list[Estimate | None]:
        """`estimate` for many configurations, the model asked once for every prediction they need."""
        queries = [
            (t, int(n), self.batch_ref if b is None else b, self.latency_ref if lat is None else float(lat))
            for t, n, b, lat in points
        ]
        # Which model predictions an estimate needs does not depend on their values: one pass records them, one
        # predict_many answers them all, a second pass uses them.
        needed: dict[tuple, float] = {}
        for q in queries:
            self._estimate(q, lambda *point: needed.setdefault(point, 1.0))
        if needed and self.model is not None:
            keys = [k for k in needed if self.model.can_price(k[0])]
            if keys:
                times = self.model.predict_many(*zip(*keys, strict=True))
                needed.update(zip(keys, map(float, times), strict=True))
            for k in needed.keys() - set(keys):
                needed[k] = math.nan
        estimates = []
        for q in queries:
            estimate = self._estimate(q, lambda *point: needed[point])
            if estimate is not None and not math.isfinite(estimate.epoch_time_s):
                estimate = None
            estimates.append(estimate)
        return estimates

    def _estimate(self, q, model_time: Callable[..., float]) -> Estimate | None:
        worker_type, n, batch, latency = q
        if self.left_out(worker_type, n, batch, latency):
            return None
        if (worker_type, n) in self.slices:
            found = self._from_points(worker_type, n, batch, latency, model_time)
        elif self.latency_free and n == 1:
            # One machine sends nothing: its time is the same at any latency, so it is estimated where the other
            # counts' runs say most about their computing and least about their network, the lowest latency.
            measured = [points for (t, _), points in self.slices.items() if t == worker_type]
            lowest = min((lat for points in measured for _, lat in points), default=0.0)
            found = self._other_counts(worker_type, n, batch, lowest, model_time)
            if found is not None and lowest != latency:
                found = (found[0], found[1], f"{found[2]}, at {_latency_text(lowest)}: one machine is latency-free")
        else:
            found = self._other_counts(worker_type, n, batch, latency, model_time)
        if found is None:
            return None
        time_s, basis, detail = found
        error = None if basis == MEASURED and not detail else self.expected_error(basis)
        return Estimate(time_s, basis, detail or "measured here", error, self.risk(worker_type, n, batch, latency))

    def _points(self, worker_type: str, n: int) -> tuple[dict, bool]:
        """This pair's measured (batch size, latency) -> time, and whether it is latency-free: one machine of an
        all-reduce workload, whose runs at each batch size are pooled over latencies under latency None."""
        points = self.slices.get((worker_type, n), {})
        if not (self.latency_free and n == 1):
            return points, False
        runs = self.successes[(worker_type, n)]
        totals, counts = defaultdict(float), defaultdict(int)
        for (b, lat), t in points.items():
            totals[b] += t * runs[(b, lat)]
            counts[b] += runs[(b, lat)]
        return {(b, None): totals[b] / counts[b] for b in totals}, True

    def _from_points(self, worker_type, n, batch, latency, model_time) -> tuple | None:
        """(time, basis, detail) from this pair's own measurements, the model blended in or carrying them."""
        points, latency_free = self._points(worker_type, n)
        at = None if latency_free else latency
        if (batch, at) in points:
            measured_at = sorted(lat for b, lat in self.slices[(worker_type, n)] if b == batch)
            if not latency_free or latency in measured_at:
                return points[(batch, at)], MEASURED, ""
            where = ", ".join(_latency_text(lat) for lat in measured_at)
            return points[(batch, at)], MEASURED, f"measured at {where}: one machine sends nothing over the network"
        found = self._interpolate(points, batch, at)
        priced = self.model is not None and self.model.can_price(worker_type)
        if found is not None:
            detail = found.detail + (" (one machine: latency-free)" if latency_free else "")
            found = _Interpolation(found.time_s, found.error, detail)
            if not priced:
                return found.time_s, INTERPOLATED, found.detail
            return self._blend(found, model_time(worker_type, n, batch, latency))
        if at is not None and all(b != batch and lat != at for b, lat in points):
            across = self._across_latencies(worker_type, n, points, batch, at, priced, model_time)
            if across is not None:
                return across
        trend = self._trend(points, batch, at)
        if not priced:
            return None if trend is None else (trend[0], EXTRAPOLATED, trend[1])
        anchors = self._nearest(points, batch, at)[: self.anchor_points]
        there = [
            (points[(b, lat)], model_time(worker_type, n, b, latency if latency_free else lat)) for b, lat in anchors
        ]
        carried = _carry(there, model_time(worker_type, n, batch, latency), self.anchoring)
        where = " and ".join(
            f"{_fmt(points[(b, lat)])} s at {_batch_text(b)}" + ("" if latency_free else f", {_latency_text(lat)}")
            for b, lat in anchors
        )
        detail = f"the {self.model.family} model carried ({self.anchoring}) from the measured {where}"
        if trend is None:
            return carried, EXTRAPOLATED, detail
        # The trend's error grows with how far it is continued (in steps of the spacing it was drawn through),
        # relative to the one step its leave-one-end-out error was measured at; the model's does not depend on it.
        model_error = max(self.extrapolation_errors.get("model", self.model.cv_mape), 1e-9)
        trend_error = max(self.extrapolation_errors.get("trend", PRIOR_TREND_ERROR) * trend[2], 1e-9)
        weight = model_error**2 / (model_error**2 + trend_error**2)  # the trend's
        time_s = math.exp(weight * math.log(trend[0]) + (1 - weight) * math.log(carried))
        return time_s, EXTRAPOLATED, f"{trend[1]}, {weight:.0%}, and {detail}, {1 - weight:.0%}"

    def _across_latencies(self, worker_type, n, points, batch, latency, priced, model_time) -> tuple | None:
        """Neither this batch size nor this latency measured for the pair: the estimates at this batch size at the
        measured latencies next to the query (each from the runs at its latency: their trend in batch size with the
        model), then linear in latency between the two around it, or the model carried in latency from the nearest
        beyond them — so an estimate does not leave those runs behind because the query is at a latency they missed,
        and does not fall with latency where the model rises."""
        latencies = sorted({lat for _, lat in points})
        around = _bracket(latencies, latency)
        if around is None and not priced:
            return None
        sides = around or (min(latencies, key=lambda lat: (abs(lat - latency), lat)),)
        at = {lat: self._from_points(worker_type, n, batch, lat, model_time) for lat in sides}
        if any(found is None for found in at.values()):
            return None
        if around is not None:
            lo, hi = around
            time_s = _between(latency, (lo, at[lo][0]), (hi, at[hi][0]), "linear")
            detail = (
                f"interpolated linearly in latency between {_latency_text(lo)} ({at[lo][2]}) and "
                f"{_latency_text(hi)} ({at[hi][2]})"
            )
            return time_s, EXTRAPOLATED, detail
        (near,) = sides
        there = model_time(worker_type, n, batch, near)
        time_s = _carry([(at[near][0], there)], model_time(worker_type, n, batch, latency), self.anchoring)
        detail = (
            f"the {self.model.family} model carried ({self.anchoring}) in latency from {_fmt(at[near][0])} s at "
            f"{_latency_text(near)} ({at[near][2]})"
        )
        return time_s, EXTRAPOLATED, detail

    def _trend(self, points: dict, batch, latency) -> tuple[float, str, float] | None:
        """The measurements' own trend continued to a query beyond them: linear in latency through the two nearest
        latencies at this batch size, or in batch size (self.batch_space) through the two nearest at this latency
        (both, their geometric mean); with how far it reaches relative to the workload's leave-one-end-out steps.
        None when no line of two measurements leads to it, or it leads below zero."""
        found = []
        if latency is not None:
            line = {lat: t for (b, lat), t in points.items() if b == batch}
            found.append(_continue(line, latency, "linear", "latency", _latency_text))
        if batch is not None:
            line = {b: t for (b, lat), t in points.items() if lat == latency and b is not None}
            found.append(_continue(line, batch, self.batch_space, "batch size", _fmt))
        found = [f for f in found if f is not None]
        if not found:
            return None
        time_s = found[0][0] if len(found) == 1 else math.exp(sum(math.log(t) for t, _, _ in found) / len(found))
        reach = np.mean([steps for _, _, steps in found]) / self.extrapolation_errors.get("trend_steps", 1.0)
        return time_s, " and ".join(text for _, text, _ in found), float(reach)

    def _other_counts(self, worker_type, n, batch, latency, model_time) -> tuple | None:
        """A worker count never measured for this type: the model, corrected by its error at the neighbouring counts."""
        if self.model is None or not self.model.can_price(worker_type):
            return None
        predicted = model_time(worker_type, n, batch, latency)
        counts = sorted(m for t, m in self.slices if t == worker_type)
        if not counts:
            return predicted, MODEL, f"the {self.model.family} model alone (no runs of this worker type)"
        neighbours = [max((m for m in counts if m < n), default=None), min((m for m in counts if m > n), default=None)]
        residuals = {}  # count -> measured (or interpolated) time there, and the model's
        for m in neighbours:
            found = None if m is None else self._from_points(worker_type, m, batch, latency, model_time)
            if found is not None:
                residuals[m] = (found[0], model_time(worker_type, m, batch, latency))
        if not residuals:
            return None
        time_s = _across_counts(n, residuals, predicted, self.anchoring)
        of = " and ".join(_plural(m, "worker") for m in sorted(residuals))
        detail = f"the {self.model.family} model corrected ({self.anchoring}) by its error at {of}"
        return time_s, EXTRAPOLATED, detail

    def _interpolate(self, points: dict, batch, latency) -> _Interpolation | None:
        """Linear in latency at this batch size, or in batch size (self.batch_space) at this latency, or both in
        turn; with both routes open, their inverse-variance mean in log time. latency None: a latency-free machine."""
        routes = [self._latency_first(points, batch, latency), self._batch_first(points, batch, latency)]
        routes = [r for r in routes if r is not None]
        if len(routes) < 2:
            return routes[0] if routes else None
        weights = [1.0 / max(r.error, 1e-9) ** 2 for r in routes]
        log_time = sum(w * math.log(r.time_s) for w, r in zip(weights, routes, strict=True)) / sum(weights)
        return _Interpolation(math.exp(log_time), 1.0 / math.sqrt(sum(weights)), " and ".join(r.detail for r in routes))

    def _at_batch(self, points: dict, batch, latency) -> _Interpolation | None:
        """The time at (batch, latency) from the runs at this latency: measured, or between two batch sizes."""
        if (batch, latency) in points:
            return _Interpolation(points[(batch, latency)], 0.0, "measured")
        sizes = {b: t for (b, lat), t in points.items() if lat == latency and b is not None}
        around = None if batch is None else _bracket(sizes, batch)
        if around is None:
            return None
        lo, hi = around
        return _Interpolation(
            _between(batch, (lo, sizes[lo]), (hi, sizes[hi]), self.batch_space),
            self.batch_loo.at(_spread(batch, lo, hi, self.batch_space)),
            f"interpolated in batch size ({self.batch_space}) between {_fmt(lo)} and {_fmt(hi)}",
        )

    def _latency_first(self, points: dict, batch, latency) -> _Interpolation | None:
        """At each measured latency the time at this batch size (measured or between batch sizes), then linear in
        latency between the two latencies around the query."""
        if latency is None:  # a latency-free machine: batch size only
            return self._at_batch(points, batch, None)
        at = {lat: found for lat in {lat for _, lat in points} if (found := self._at_batch(points, batch, lat))}
        if latency in at:
            return at[latency]
        around = _bracket(at, latency)
        if around is None:
            return None
        lo, hi = around
        error = math.hypot(self.latency_loo.at(_spread(latency, lo, hi, "linear")), max(at[lo].error, at[hi].error))
        ends = [_latency_text(x) + ("" if at[x].detail == "measured" else f" ({at[x].detail})") for x in (lo, hi)]
        return _Interpolation(
            _between(latency, (lo, at[lo].time_s), (hi, at[hi].time_s), "linear"),
            error,
            f"interpolated linearly in latency between {ends[0]} and {ends[1]}",
        )

    def _batch_first(self, points: dict, batch, latency) -> _Interpolation | None:
        """At each measured batch size the time at this latency (linear between the latencies around it), then in
        batch size between the two around the query: the other order of _latency_first, for grids with holes."""
        if latency is None or batch is None:
            return None
        at = {}
        for b in {b for b, _ in points if b is not None}:
            latencies = {lat: t for (bb, lat), t in points.items() if bb == b}
            around = _bracket(latencies, latency)
            if around is not None:
                lo, hi = around
                time_s = _between(latency, (lo, latencies[lo]), (hi, latencies[hi]), "linear")
                at[b] = (time_s, self.latency_loo.at(_spread(latency, lo, hi, "linear")))
            elif latency in latencies:
                at[b] = (latencies[latency], 0.0)
        around = _bracket(at, batch)
        if around is None or all(at[x][1] == 0.0 for x in around):
            return None  # nothing, or measured at this latency on both sides: _latency_first's answer already
        lo, hi = around
        error = math.hypot(self.batch_loo.at(_spread(batch, lo, hi, self.batch_space)), max(at[lo][1], at[hi][1]))
        return _Interpolation(
            _between(batch, (lo, at[lo][0]), (hi, at[hi][0]), self.batch_space),
            error,
            f"interpolated in batch size ({self.batch_space}) between {_fmt(lo)} and {_fmt(hi)}, each first "
            "interpolated linearly in latency",
        )

    def _blend(self, found: _Interpolation, predicted: float) -> tuple:
        model_error = max(self.model.cv_mape, 1e-9)
        weight = found.error**2 / (found.error**2 + model_error**2)  # the model's
        time_s = math.exp((1 - weight) * math.log(found.time_s) + weight * math.log(predicted))
        if weight < BLEND_LABEL:
            return time_s, INTERPOLATED, found.detail
        return (
            time_s,
            BLEND,
            f"{found.detail}, {1 - weight:.0%}, and the {self.model.family} model ({_fmt(predicted)} s), {weight:.0%}",
        )

    def _nearest(self, points: dict, batch, latency) -> list[tuple]:
        """The measured points, nearest the query first: by latency over the workload's measured range plus log batch
        size over its measured range (each at least 1)."""
        latencies = [lat for _, lat in points if lat is not None]
        batches = [b for b, _ in points if b is not None]
        latency_span = max(max(latencies, default=0) - min(latencies, default=0), 1.0)
        batch_span = max(math.log(max(batches)) - math.log(min(batches)), 1.0) if batches else 1.0

        def distance(point):
            b, lat = point
            d = 0.0 if latency is None or lat is None else abs(lat - latency) / latency_span
            if b is not None and batch is not None:
                d += abs(math.log(b) - math.log(batch)) / batch_span
            elif b != batch:
                d += 1.0
            return (d, -(b or 0), lat or 0)

        return sorted(points, key=distance)


def _across_counts(n: int, residuals: dict, predicted: float, mode: str) -> float:
    """The model's prediction at n workers, corrected by its error at the measured counts around n (count ->
    (measured, predicted)): the error interpolated linearly in n between two, the one's beyond them."""
    if mode == "additive":
        errors = {m: measured - model for m, (measured, model) in residuals.items()}
    else:
        errors = {m: math.log(measured / model) for m, (measured, model) in residuals.items()}
    if len(errors) == 2:
        (lo, e_lo), (hi, e_hi) = sorted(errors.items())
        error = e_lo + (n - lo) / (hi - lo) * (e_hi - e_lo)
    else:
        (error,) = errors.values()
    if mode == "additive" and predicted + error > 0:
        return predicted + error
    if mode == "additive":
        return _across_counts(n, residuals, predicted, "multiplicative")
    return predicted * math.exp(error)


def _continue(
    line: dict, x: float, space: str, axis: str, text: Callable[[float], str]
) -> tuple[float, str, float] | None:
    """The line through the two measurements of `line` (x -> time) nearest x, continued to x outside them: the time,
    in words, and how far (the distance from the nearer measurement over the two's spacing, in `space`)."""
    if len(line) < 2 or min(line) <= x <= max(line):
        return None
    near = sorted(line)[:2] if x < min(line) else sorted(line)[-2:]
    time_s = _between(x, (near[0], line[near[0]]), (near[1], line[near[1]]), space)
    if not time_s > 0:
        return None
    c = [_coordinate(v, space) for v in (x, *near)]
    steps = min(abs(c[0] - c[1]), abs(c[0] - c[2])) / abs(c[2] - c[1])
    kind = "linearly" if space == "linear" else space
    return time_s, f"the trend {kind} in {axis} through {text(near[0])} and {text(near[1])}", steps


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# --- building one ---------------------------------------------------------------------------------------------------


def predictor(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, cross_validate: bool = True
) -> PredictorModel:
    """The workload's predictor (module docstring). cross_validate: also hold out every latency, batch size and
    worker count in turn to measure what each basis is worth (`expected_error`); without it the errors are the
    model's own. Memoised like `fit`: the same records and catalogue give the same predictor.

    Three runs, too few to fit a model: the predictor still interpolates, one machine is latency-free, and beyond
    the runs only their own trend speaks.

    >>> runs = [PerfRecord("w", workers=2, batch_size=64, latency_ms=l, epoch_time_s=t) for l, t in [(0, 10), (40, 30)]]
    >>> runs.append(PerfRecord("w", workers=1, batch_size=64, latency_ms=0.0, epoch_time_s=12.0))
    >>> model = predictor(runs, cross_validate=False)
    >>> [(e.epoch_time_s, e.basis) for e in model.estimate_many([("", 2, 64, 10.0), ("", 1, 64, 80.0)])]
    [(15.0, 'interpolated'), (12.0, 'measured')]
    >>> estimate = model.estimate("", 2, 64, 80.0)
    >>> estimate.epoch_time_s, estimate.basis, estimate.detail
    (50.0, 'extrapolated', 'the trend linearly in latency through 0 ms and 40 ms')
    """
    return _predictor(tuple(records), tuple(catalog), cross_validate)


@functools.lru_cache(maxsize=64)
def _predictor(records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], cross_validate: bool):
    return _build(records, catalog, cross_validate)


def _build(records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec], cross_validate: bool) -> PredictorModel:
    usable = _usable(records)
    if not usable:
        failed = sum(1 for r in records if r.epoch_time_s is None)
        raise RecommendationError(
            "no performance record with an epoch time to predict from"
            + (f" ({_plural(failed, 'failed run')} only)" if failed else "")
        )
    try:
        model, model_error = fit(usable, catalog), ""
    except RecommendationError as error:
        model, model_error = None, str(error)
    sums, successes, failed = defaultdict(float), defaultdict(dict), defaultdict(dict)
    for r in usable:
        point = (r.batch_size, float(r.latency_ms or 0.0))
        key = (r.instance_type, r.workers)
        sums[key + point] += r.epoch_time_s
        successes[key][point] = successes[key].get(point, 0) + 1
    for r in records:
        if r.epoch_time_s is None and r.workers:
            point = (r.batch_size, float(r.latency_ms or 0.0))
            failed[(r.instance_type, r.workers)][point] = failed[(r.instance_type, r.workers)].get(point, 0) + 1
    slices = {
        key: {point: sums[key + point] / count for point, count in points.items()} for key, points in successes.items()
    }
    batch_space, batch_loo, latency_loo = _interpolation_errors(slices)
    anchoring, anchor_points, extrapolation_errors = _extrapolation(slices, model, batch_space)
    built = PredictorModel(
        slices=slices,
        failed=dict(failed),
        successes=dict(successes),
        model=model,
        model_error=model_error,
        latency_free=one_machine_latency_free(usable),
        batch_space=batch_space,
        latency_loo=latency_loo,
        batch_loo=batch_loo,
        anchoring=anchoring,
        anchor_points=anchor_points,
        extrapolation_errors=extrapolation_errors,
        batch_ref=_most_common(r.batch_size for r in usable),
        latency_ref=_most_common(float(r.latency_ms or 0.0) for r in usable) or 0.0,
        coverage={
            "workers": [min(r.workers for r in usable), max(r.workers for r in usable)],
            "batch_sizes": sorted({r.batch_size for r in usable if r.batch_size is not None}),
            "latencies_ms": sorted({float(r.latency_ms or 0.0) for r in usable}),
            "worker_types": sorted({r.instance_type for r in usable}),
        },
        cv_errors={},
        cv="",
    )
    if not cross_validate:
        return built
    cv_errors, cv = _cross_validate(records, catalog)
    return PredictorModel(**{**built.__dict__, "cv_errors": cv_errors, "cv": cv})


def _most_common(values) -> float | None:
    values = [v for v in values if v is not None]
    return Counter(values).most_common(1)[0][0] if values else None


def _interpolation_errors(slices: dict) -> tuple[str, _ErrorLaw, _ErrorLaw]:
    """Each interior measured point predicted from its two neighbours, in latency (linear) and in batch size (in each
    space): the batch space that does better, and the two interpolations' leave-one-out errors."""
    latency_errors, batch_errors = [], {space: [] for space in BATCH_SPACES}
    for points in slices.values():
        lines_by_batch, lines_by_latency = defaultdict(dict), defaultdict(dict)
        for (b, lat), t in points.items():
            lines_by_batch[b][lat] = t
            if b is not None:
                lines_by_latency[lat][b] = t
        for line in lines_by_batch.values():
            latency_errors += _leave_one_out(line, "linear")
        for line in lines_by_latency.values():
            for space in BATCH_SPACES:
                batch_errors[space] += _leave_one_out(line, space)
    # log-log unless linear is better on the workload's own points (ties and no evidence: log-log)
    space = min(BATCH_SPACES, key=lambda s: np.mean([e for e, _ in batch_errors[s]]) if batch_errors[s] else 0.0)
    return space, _loo(batch_errors[space]), _loo(latency_errors)


def _leave_one_out(line: dict, space: str) -> list[tuple[float, float]]:
    xs = sorted(line)
    return [
        (_ratio(_between(x, (lo, line[lo]), (hi, line[hi]), space), line[x]), _spread(x, lo, hi, space))
        for lo, x, hi in zip(xs, xs[1:], xs[2:], strict=False)
    ]


def _loo(errors: list[tuple[float, float]]) -> _ErrorLaw:
    if not errors:
        return _PRIOR
    matrix = np.array([[1.0, spread] for _, spread in errors])
    scale = np.abs(matrix).max(axis=0)
    scale[scale == 0] = 1.0
    (floor, slope), _ = nnls(matrix / scale, np.array([e for e, _ in errors]))
    return _ErrorLaw(float(floor / scale[0]), float(slope / scale[1]))


def _extrapolation(slices: dict, model: PerfModel | None, batch_space: str) -> tuple[str, int, dict]:
    """How to extrapolate, learnt from the workload's own runs: each end of every line of measurements (one latency,
    batch size or worker count varying, the rest fixed) predicted from the points next to it — an extrapolation one
    step out. Returns the way of carrying the model that does better (multiplicative without evidence), from how many
    of the nearest points (the next one, or the next two where the line has them: one unless two do better on the
    ends where both can be tried — one measurement's noise against the model's error changing along the line), and
    the mean relative errors, on latency and batch-size lines, of the model so carried ("model") and of the trend
    through the next two points ("trend", continued "trend_steps" of their spacing on average). (The model saw those
    points: a small leak, the same for every end.)"""
    points = [(t, n, b, lat) for (t, n), times in slices.items() for (b, lat) in times]
    measured = {(t, n, b, lat): slices[(t, n)][(b, lat)] for t, n, b, lat in points}
    lines = defaultdict(list)
    for point in points:
        t, n, b, lat = point
        lines[("latency", t, n, b)].append((lat, point))
        if b is not None:
            lines[("batch size", t, n, lat)].append((b, point))
        lines[("workers", t, b, lat)].append((n, point))
    priced = [p for p in points if model is not None and model.can_price(p[0])]
    predicted = (
        dict(zip(priced, map(float, model.predict_many(*zip(*priced, strict=True))), strict=True)) if priced else {}
    )
    carried = []  # per end: (axis, {(mode, anchor points): relative error})
    trend, steps = [], []
    for (axis, *_), line in lines.items():
        line.sort(key=lambda item: item[0])
        if len(line) < 2:
            continue
        for ends in (line[:3], line[::-1][:3]):
            end, *next_to = (p for _, p in ends)
            if end in predicted and next_to[0] in predicted:
                errors = {}
                for k in ANCHOR_POINTS[: len(next_to)]:
                    there = [(measured[p], predicted[p]) for p in next_to[:k] if p in predicted]
                    for mode in ANCHORINGS if len(there) == k else ():
                        errors[(mode, k)] = _ratio(_carry(there, predicted[end], mode), measured[end])
                carried.append((axis, errors))
            if axis != "workers" and len(ends) == 3:
                space = "linear" if axis == "latency" else batch_space
                xs = {x: measured[p] for x, p in ends[1:]}
                if (guess := _continue(xs, ends[0][0], space, axis, _fmt)) is not None:
                    trend.append(_ratio(guess[0], measured[end]))
                    steps.append(guess[2])

    def mean_error(way, ends) -> float:
        return float(np.mean([errors[way] for _, errors in ends])) if ends else 0.0

    mode = min(ANCHORINGS, key=lambda m: mean_error((m, 1), carried))
    both = [end for end in carried if (mode, 2) in end[1]]
    k = min(ANCHOR_POINTS, key=lambda k: (mean_error((mode, k), both), k))
    errors = {}
    within = [end for end in carried if end[0] != "workers" and (mode, k) in end[1]]
    if within:
        errors["model"] = mean_error((mode, k), within)
    if trend:
        errors["trend"] = float(np.mean(trend))
        errors["trend_steps"] = float(np.mean(steps))
    return mode, k, errors


_GROUP_NAMES = {"latency": "latencies", "batch_size": "batch sizes", "workers": "worker counts"}


def _cross_validate(records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...]) -> tuple[dict, str]:
    """The whole predictor's held-out errors by basis: each latency, batch size and worker count left out in turn."""
    usable = _usable(records)
    errors: dict[str, list[float]] = defaultdict(list)
    kinds = []
    for group_by in CV_GROUPINGS:
        key = GROUPINGS[group_by]
        groups = sorted({key(r) for r in usable}, key=lambda g: (g is None, g))
        if len(groups) < 2:
            continue
        kinds.append(f"{len(groups)} {_GROUP_NAMES[group_by]}")
        for group in groups:
            train = [r for r in records if r.epoch_time_s is None or key(r) != group]
            held_out = [r for r in usable if key(r) == group]
            try:
                fold = _build(train, catalog, cross_validate=False)  # not memoised: each fold is built once
            except RecommendationError:
                continue
            estimates = fold.estimate_many(
                [(r.instance_type, r.workers, r.batch_size, float(r.latency_ms or 0.0)) for r in held_out]
            )
            for r, e in zip(held_out, estimates, strict=True):
                if e is not None:
                    errors[e.basis].append(_ratio(e.epoch_time_s, r.epoch_time_s))
    everything = [e for values in errors.values() for e in values]
    cv_errors = {basis: (float(np.mean(v)), len(v)) for basis, v in errors.items()}
    cv_errors["all"] = (float(np.mean(everything)) if everything else math.nan, len(everything))
    text = f"{', '.join(kinds)}, each held out in turn: {len(everything)} held-out estimates" if kinds else ""
    return cv_errors, text
