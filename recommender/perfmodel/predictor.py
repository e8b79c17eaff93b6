"""The predictor: a workload's epoch time t(worker type, n, batch size B, latency l) with an 80 % interval.

The model in five lines:
1. mean: log t̂₀ = the log of the family whose form `fitting.fit` chose by cross-validation (recommender.perfmodel
   .families); with fewer than 4 runs, none fits, and the mean is the runs' mean log time;
2. residuals: a Gaussian process (scikit-learn's GaussianProcessRegressor, C·Matérn-5/2 over standardised log n,
   log B, l and the worker type one-hot; n_restarts_optimizer with a fixed random_state) on each configuration's
   mean log residual, alpha = a run's noise² there (its own repeats', else pooled) / its runs;
3. estimate: t̂ = exp(log t̂₀ + the process's mean), σ² = the process's variance + a run's pooled noise² (+ how far the
   catalogue's speeds miss the measured types', for a type with no runs); where a configuration ran, its runs' mean;
4. far from every run the process returns to the mean and its variance to its prior: the estimate says so;
5. interval: t̂·e^{±q·σ}, q the split-conformal quantile of the held-out runs' |log t/t̂|/σ (`conformal`).

Which configurations it answers at all is recommender.perfmodel.guards; the process, recommender.perfmodel.process;
what it is worth, and q, recommender.perfmodel.conformal.

Pure numpy/scikit-learn over the shared dataclasses: no ORM, no Django.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import Kernel, WhiteKernel
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from common.numbers import significant
from recommender.perfmodel import conformal, guards, process
from recommender.perfmodel.families import PerfModel
from recommender.perfmodel.fitting import _usable, fit
from recommender.perfmodel.guards import Point, Runs
from recommender.types import InstanceSpec, PerfRecord, RecommendationError

MEASURED, PREDICTED = "measured", "predicted"
BASES = (MEASURED, PREDICTED)
Z = 1.2815515655446004  # the standard normal's 90th percentile: q before any hold-out has calibrated it


@dataclass(frozen=True)
class Estimate:
    epoch_time_s: float  # the median of a run's time; where the configuration ran, its runs' mean
    std_log: float  # σ: the standard deviation of a run's log time about it (the process's and a run's noise)
    basis: str  # one of BASES
    detail: str  # where it came from, in words
    warning: str = ""  # failed runs of this configuration near this point ("" when none)
    q: float = Z  # the interval's reach in σ (the conformal quantile)

    @property
    def interval(self) -> tuple[float, float]:
        """The 80 % interval of one run's epoch time."""
        return self.epoch_time_s * math.exp(-self.q * self.std_log), self.epoch_time_s * math.exp(self.q * self.std_log)

    @property
    def expected_error(self) -> float:
        """The one error figure an answer quotes: how far above the estimate the interval reaches (0.1 = +10 %)."""
        return math.exp(self.q * self.std_log) - 1.0


@dataclass(frozen=True)
class PredictorModel:
    """A workload's mean, the Gaussian process on its residuals, its runs, and what the whole is worth."""

    model: PerfModel | None  # the family as the mean; None: a constant mean (model_error says why)
    model_error: str
    gp: GaussianProcessRegressor  # on the configurations' mean log residuals
    offset: float  # the constant mean of log time, where there is no model
    center: np.ndarray  # the standardisation of (log n, log B, l)
    scale: np.ndarray
    types: tuple[str, ...]  # the one-hot columns' worker types (none when the runs have one type)
    noise_log: float  # a run's noise: the standard deviation of its log time about its configuration's mean
    facts: Runs  # what the guards read
    runs: dict  # point -> the runs' epoch times there
    batch_ref: float | None  # a query's batch size when it gives none: the records' most common
    latency_ref: float  # a query's latency when it gives none: the records' most common
    coverage: dict  # measured ranges: workers [min, max], batch_sizes, latencies_ms, worker_types
    bridge_error: float = 0.0  # std of log time added for a type with no runs, priced through the catalogue
    q: float = Z  # the conformal quantile (conformal.conformal_quantile): an interval reaches t̂·e^{±qσ}
    cv_mape: float | None = None  # held-out MAPE of the whole predictor (None: not cross-validated)
    cv_coverage: float | None = None  # share of held-out runs inside their 80 % interval
    cv: str = ""  # that cross-validation in words
    cv_pairs: tuple[tuple[float, float, str], ...] = ()  # (measured s, estimated s, the axis held out)

    @property
    def overall_error(self) -> float | None:
        """The predictor's cross-validated MAPE; without a cross-validation, the model's own."""
        if self.cv_mape is not None:
            return self.cv_mape
        return self.model.cv_mape if self.model else None

    @property
    def kernel(self) -> str:
        return str(self.gp.kernel_)

    @property
    def one_machine_unknown(self) -> bool:
        """True when one machine is no candidate (guards.one_machine_unmeasured)."""
        return bool(guards.one_machine_unmeasured(self.facts, ("", 1, None, 0.0)))

    def judged(self, estimate: Estimate) -> float:
        """The time the choice weighs (choice.choose): the upper end of the 80 % interval."""
        return estimate.interval[1]

    def can_price(self, worker_type: str) -> bool:
        return worker_type in self.facts.priced

    def point(self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None) -> Point:
        """A query as the runs are keyed: the records' usual batch size and latency where it gives none, and one
        machine of an all-reduce workload at 0 ms (it pays no latency)."""
        batch = self.batch_ref if batch_size is None else batch_size
        latency = self.latency_ref if latency_ms is None else float(latency_ms)
        free = self.facts.latency_free and workers == 1
        return worker_type, int(workers), None if batch is None else int(batch), 0.0 if free else latency

    def refusal(self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None) -> str:
        """Why this configuration is not estimated (guards.refusal), "" when it is."""
        return guards.refusal(self.facts, self.point(worker_type, workers, batch_size, latency_ms))

    def estimate(
        self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None
    ) -> Estimate | None:
        return self.estimate_many([(worker_type, workers, batch_size, latency_ms)])[0]

    def estimate_many(self, queries: Sequence[tuple[str, int, int | None, float | None]]) -> list[Estimate | None]:
        """Each configuration's Estimate, None where a guard refuses it."""
        points = [self.point(*query) for query in queries]
        answered = [i for i, p in enumerate(points) if not guards.refusal(self.facts, p)]
        estimates: list[Estimate | None] = [None] * len(points)
        if not answered:
            return estimates
        rows = [points[i] for i in answered]
        prior = self._prior(rows)
        residual, std = self.gp.predict(self._inputs(rows), return_std=True)
        for i, row, m, r, s in zip(answered, rows, prior, residual, std, strict=True):
            bridge = self.bridge_error if row[0] not in self.coverage["worker_types"] else 0.0
            sigma = math.sqrt(process.latent(self.gp, float(s)) ** 2 + self.noise_log**2 + bridge**2)
            runs = self.runs.get(row)
            if runs:
                count = f"{len(runs)} run{'s' * (len(runs) != 1)}"
                time_s, basis, detail = float(np.mean(runs)), MEASURED, f"measured here ({count})"
            else:
                time_s, basis, detail = math.exp(m + r), PREDICTED, self._predicted_text(m, r)
            if math.isfinite(time_s) and time_s > 0:
                estimates[i] = Estimate(time_s, sigma, basis, detail, guards.warning(self.facts, row), self.q)
        return estimates

    def _prior(self, rows: Sequence[Point]) -> np.ndarray:
        """The mean of log time at these rows: the family's log prediction, or the constant."""
        if self.model is None:
            return np.full(len(rows), self.offset)
        return np.log(self.model.predict_many(*zip(*rows, strict=True)))

    def _inputs(self, rows: Sequence[Point]) -> np.ndarray:
        return process.inputs(rows, self.batch_ref, self.center, self.scale, self.types)

    def _predicted_text(self, prior: float, residual: float) -> str:
        change = f"{math.exp(residual) - 1:+.1%}"
        if self.model is None:
            return f"predicted: the runs' Gaussian process ({change} on their typical time)"
        return (
            f"predicted: the {self.model.family} model's {significant(math.exp(prior), 4)} s, {change} by the "
            "Gaussian process on its residuals"
        )


# --- building one ---------------------------------------------------------------------------------------------------


def predictor(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, cross_validate: bool = True
) -> PredictorModel:
    """The workload's predictor (module docstring). cross_validate: hold out every latency, batch size and worker
    count in turn, to calibrate the interval (q) and say what it is worth.
    Memoised: the same records and catalogue give the same predictor. RecommendationError when no record has an
    epoch time.

    Three runs, too few to fit a model: the process answers within their ranges, one machine latency-free.

    >>> runs = [PerfRecord("w", workers=2, batch_size=64, latency_ms=l, epoch_time_s=t) for l, t in [(0, 10), (40, 30)]]
    >>> runs.append(PerfRecord("w", workers=1, batch_size=64, latency_ms=0.0, epoch_time_s=12.0))
    >>> model = predictor(runs, cross_validate=False)
    >>> [(e.basis, round(e.epoch_time_s, 1)) for e in model.estimate_many([("", 2, 64, 40.0), ("", 1, 64, 80.0)])]
    [('measured', 30.0), ('measured', 12.0)]
    >>> between = model.estimate("", 2, 64, 20.0)
    >>> between.basis, 10 < between.epoch_time_s < 30, between.interval[0] < between.epoch_time_s
    ('predicted', True, True)
    >>> model.estimate("", 2, 64, 80.0) is None  # beyond the runs, and no model to extrapolate with
    True
    """
    return _predictor(tuple(records), tuple(catalog), cross_validate)


@functools.lru_cache(maxsize=64)
def _predictor(
    records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], cross_validate: bool
) -> PredictorModel:
    with threadpool_limits(1):  # matrices of a hundred rows: BLAS threads only wait on each other
        return _checked(records, catalog, cross_validate)


def _checked(
    records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], cross_validate: bool
) -> PredictorModel:
    usable = _usable(records)
    if not usable:
        failed = sum(1 for r in records if r.epoch_time_s is None)
        raise RecommendationError(
            "no performance record with an epoch time to predict from"
            + (f" ({failed} failed run{'s' * (failed != 1)} only)" if failed else "")
        )
    try:
        model, model_error = fit(usable, catalog), ""
    except RecommendationError as error:
        model, model_error = None, str(error)
    built = _build(records, catalog, model, model_error)
    if not cross_validate:
        return built
    return replace(built, **conformal.cross_validate(records, functools.partial(_fold, catalog, built)))


def _build(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec], model: PerfModel | None, model_error: str,
    kernel: Kernel | None = None, noise: float | None = None,
) -> PredictorModel:  # fmt: skip
    """The predictor of these records with this mean (None: constant); kernel and noise: the process's kernel, fixed,
    and a run's noise (a fold's, from every run; None: fitted, and from these runs' repeats)."""
    usable = _usable(records)
    facts = guards.runs_of(usable, records, _catalogue_priced(model, catalog), model is not None)
    batch_ref = _most_common(r.batch_size for r in usable)
    runs: dict = defaultdict(list)
    for r in usable:
        free = facts.latency_free and r.workers == 1
        runs[(r.instance_type, r.workers, r.batch_size, 0.0 if free else guards.latency(r))].append(r.epoch_time_s)
    rows = list(runs)
    log_means = np.array([np.mean(np.log(runs[row])) for row in rows])
    offset = float(np.mean(np.log([t for r in usable if (t := r.epoch_time_s)])))
    prior = np.log(model.predict_many(*zip(*rows, strict=True))) if model else np.full(len(rows), offset)
    numbers = process.inputs(rows, batch_ref, np.zeros(3), np.ones(3), ())
    center, scale = numbers.mean(axis=0), numbers.std(axis=0)
    scale[scale < 1e-9] = 1.0  # an axis measured at one value: a query off it is that many of its units away
    types = tuple(sorted({r.instance_type for r in usable}))
    types = types if len(types) > 1 else ()
    noise = process.run_noise(runs) if kernel is None else noise
    own = process.own_noise(runs, noise)
    variance = None if noise is None else np.array([own[row] ** 2 / len(runs[row]) for row in rows])
    gp = process.fit(process.inputs(rows, batch_ref, center, scale, types), log_means - prior, variance, kernel)
    white = gp.kernel_.k2.noise_level if isinstance(gp.kernel_.k2, WhiteKernel) else 0.0
    return PredictorModel(
        model=model,
        model_error=model_error,
        gp=gp,
        offset=offset,
        center=center,
        scale=scale,
        types=types,
        noise_log=noise if noise is not None else math.sqrt(white),
        facts=facts,
        runs={row: list(times) for row, times in runs.items()},
        batch_ref=batch_ref,
        latency_ref=_most_common(guards.latency(r) for r in usable) or 0.0,
        bridge_error=_bridge_error(model),
        coverage={
            "workers": [min(facts.workers), max(facts.workers)],
            "batch_sizes": sorted({r.batch_size for r in usable if r.batch_size is not None}),
            "latencies_ms": sorted({guards.latency(r) for r in usable}),
            "worker_types": sorted({r.instance_type for r in usable}),
        },
    )


def _bridge_error(model: PerfModel | None) -> float:
    """How far the catalogue's speeds miss the measured types' own: the standard deviation of log κ_t·speed_t over the
    types fitted with their own compute coefficient and a catalogue speed (0 with fewer than two: not known). A type
    with no runs is priced through its catalogue speed, and is that much less sure."""
    terms = model.terms if model else None
    if terms is None:
        return 0.0
    bridged = [math.log(k * terms.speeds[t]) for t, k in terms.compute_s.items() if k > 0 and t in terms.speeds]
    return float(np.std(bridged, ddof=1)) if len(bridged) >= 2 else 0.0


def _catalogue_priced(model: PerfModel | None, catalog: Sequence[InstanceSpec]) -> frozenset[str]:
    """The catalogue's worker types the family prices through their speed (none without a family)."""
    return frozenset(s.name for s in catalog if model is not None and model.can_price(s.name))


def _most_common(values: Iterable[Any]) -> Any:
    values = [v for v in values if v is not None]
    return Counter(values).most_common(1)[0][0] if values else None


def _fold(catalog: tuple[InstanceSpec, ...], whole: PredictorModel, train: list[PerfRecord]) -> PredictorModel | None:
    """The predictor of one fold's runs: the whole's family refitted on them, the process conditioned on them with the
    hyper-parameters that every run chose."""
    kernel = whole.gp.kernel_
    usable = _usable(train)
    if not usable:
        return None
    model = None
    if whole.model is not None:
        try:
            model = fit(usable, catalog, form=whole.model.form)
        except RecommendationError:
            model = None
    noise = None if isinstance(kernel.k2, WhiteKernel) else whole.noise_log
    return _build(train, catalog, model, whole.model_error, kernel, noise)
