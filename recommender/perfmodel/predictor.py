"""The predictor: a workload's epoch time t(worker type, n, batch size B, latency l) with its uncertainty.

The model in a paragraph. The mean is the physics: the family that `fitting.fit` chose for the workload by
cross-validation (Anwar eq. 5, Ernest, the PS roofline: recommender.perfmodel.families). On the log residuals of every
successful run — each run a row, so repeats are data — sits a Gaussian process (scikit-learn's GaussianProcessRegressor,
prior mean zero) with the kernel C · Matérn-5/2(log n, log B, l[, worker type]) + noise: inputs standardised over the
runs, the worker type one-hot (its length scale learns how much the types' residuals share). A run's noise (`_Noise`) is
waiting + computing · c² in log time, c the share of its expected time that the model puts outside the latency's terms
(its time at 0 ms over its time: 1 where the run computes throughout, → 0 where it waits on the network): computing
shares the machine and jitters, waiting out the latency is steady — on the lab, two runs of a 0 ms cell differ by 20 %,
of a 20 or 40 ms cell by 0.5 %. Amplitude, length scales and both noises are bounded and fitted by maximum marginal
likelihood, a length scale no shorter than the runs can tell (the gap between its input's two closest measured values),
so that between two measured values the estimate follows both. Near runs the estimate follows them as closely as their
noise there allows (which the repeats set); far from them it returns to the physics, with the residuals' own spread as
its uncertainty. Every estimate is log-normal: a median, the standard deviation of its log (`std_log`: how well the data
pin the expected time) and a run's noise (`noise_log`). Where a configuration ran, its time is its runs' mean (a
measurement is not replaced by a model of it), with the process's standard deviation there. One machine of an all-reduce
workload sends nothing over the network, so its runs count at latency 0 whatever latency they ran at (Anwar's Figs.
9–15). Without a run of one machine, nothing tells its computing apart from the collectives that every run of several
pays on each step: one machine is then no candidate (`one_machine_unknown`). Likewise a worker count, batch size or
latency other than the one value every run measured (runs of 3 workers only, or at 20 ms only): nothing in them tells
what that axis costs, and such a configuration is no candidate (`unmeasured`; the predictor's own hold-out still
estimates it, to learn how far such guesses go wrong). Fewer than four runs fit no physical model: the process then
models the log times around their mean, and answers only within the measured ranges of a worker type. A worker type with
no runs is priced through the catalogue (the model's speed bridge); its uncertainty adds how far the measured types' own
speeds stray from the catalogue's (the spread of log κ_t·speed_t over them; none known with fewer than two).

Failed runs are information: a configuration with a failed run at the very point, or only failed runs at its batch
size, is no candidate there (`left_out`); one that failed at batch size B_f carries a warning (`risk`,
recommender.algorithms.failure_risk) at every B ≥ B_f / 2 at any latency.

What it is worth (`cross_validate`): every latency, batch size and worker count held out in turn and predicted from
the rest (the model refitted, the process conditioned on the rest with its hyper-parameters from every run): the
MAPE of the held-out runs and the share inside their 80 % intervals. That hold-out also bounds the process's
confidence where it has nothing to go on: an estimate at a worker count no run of its type measured, or at a batch
size or latency no run of its type and count measured, is no surer than the predictor was on that axis's held-out
values (between the measured ones and beyond them together): its `std_log` is at least the one with which 80 % of
those held-out runs, each with its own noise, would have fallen inside their 80 % intervals — of m runs,
⌈0.8·(m + 1)⌉ (at most m): the split-conformal quantile, so that a new run falls inside as often. The coverage it
reports gives each held-out value the floor the other held-out values of its axis set. And it sets how the choice
judges a time (`judged`, `rule`): in each held-out cell of two measured worker counts or more, the fastest count by
the upper ends of the 80 % intervals and by the estimates, each choice's regret against the measured best; the
estimates only where they lost less by more than one standard error.

Pure numpy/scikit-learn over the shared dataclasses: no ORM, no Django.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import minimize
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Exponentiation, Hyperparameter, Kernel, Matern

from common.numbers import significant
from recommender.algorithms import failure_risk, one_machine_latency_free
from recommender.perfmodel.families import PerfModel
from recommender.perfmodel.fitting import GROUPINGS, _usable, fit
from recommender.types import InstanceSpec, PerfRecord, RecommendationError

MEASURED, PREDICTED = "measured", "predicted"
BASES = (MEASURED, PREDICTED)
# How the choice weighs a configuration's time (PredictorModel.judged): the upper end of its 80 % interval, or the
# estimate itself where the workload's own held-out choices chose better by it (_cross_validate).
BOUND, ESTIMATE = "bound", "estimate"
CV_GROUPINGS = ("latency", "batch_size", "workers")  # the ways a query can miss the measurements
Z = 1.2815515655446004  # the standard normal's 90th percentile: the intervals are 80 % two-sided
# The hyper-parameters' bounds, in standardised inputs and log time. Length scales: a tenth of the runs' spread (the
# worker type's columns; a number's is at least the gap between its two closest measured values: _length_scales) to a
# hundred spreads (the input does not matter). Amplitude: residuals of 0.1 % to a factor e^3. Noise: 0.1 % to a
# factor e between repeats.
LENGTH_SCALE_BOUNDS = (0.1, 100.0)
AMPLITUDE_BOUNDS = (1e-6, 9.0)
NOISE_BOUNDS = (1e-6, 1.0)


@dataclass(frozen=True)
class Estimate:
    epoch_time_s: float  # the median (exp of the mean log time); where the configuration ran, its runs' mean
    std_log: float  # standard deviation of the log of the expected epoch time: what the data leave unknown
    noise_log: float  # standard deviation of one run's log time around it (the process's noise at this time)
    basis: str  # one of BASES
    detail: str  # where it came from, in words
    warning: str = ""  # failed runs of this configuration near this point ("" when none)

    @property
    def expected_error(self) -> float:
        """E|t/t̂ − 1| of one run t under the log-normal (σ the run's total log spread): e^{σ²/2}·erf(σ/√2)."""
        sigma = math.hypot(self.std_log, self.noise_log)
        return math.exp(sigma**2 / 2) * math.erf(sigma / math.sqrt(2))

    @property
    def interval(self) -> tuple[float, float]:
        """The 80 % interval of the expected epoch time."""
        return self.epoch_time_s * math.exp(-Z * self.std_log), self.epoch_time_s * math.exp(Z * self.std_log)

    @property
    def run_interval(self) -> tuple[float, float]:
        """The 80 % interval of one run's epoch time (the expected time's uncertainty and a run's noise)."""
        sigma = math.hypot(self.std_log, self.noise_log)
        return self.epoch_time_s * math.exp(-Z * sigma), self.epoch_time_s * math.exp(Z * sigma)


@dataclass(frozen=True)
class PredictorModel:
    """A workload's fitted model, the Gaussian process on its residuals, its runs, and what the whole is worth."""

    model: PerfModel | None  # the mean; None: too few records to fit one (model_error says why)
    model_error: str
    gp: GaussianProcessRegressor  # on the log residuals (log times less `offset` without a model)
    offset: float  # the prior mean of log time without a model (0 with one: the model is the mean)
    center: np.ndarray  # the standardisation of (log n, log B, l)
    scale: np.ndarray
    types: tuple[str, ...]  # the one-hot columns' worker types (none when the runs have one type)
    runs: dict  # (worker type, n, batch size, latency as fitted) -> the runs' epoch times
    failed: dict  # (worker type, n) -> {(batch size, latency ms): failed runs there}
    successes: dict  # (worker type, n) -> {(batch size, latency ms): successful runs there}
    latency_free: bool  # one machine's time is latency-independent (all-reduce or unknown strategy, not a PS)
    batch_ref: float | None  # a query's batch size when it gives none: the records' most common
    latency_ref: float  # a query's latency when it gives none: the records' most common
    coverage: dict  # measured ranges: workers [min, max], batch_sizes, latencies_ms, worker_types
    seen: dict  # the values each axis was measured at (_seen)
    bridge_error: float = 0.0  # std of log time added for a type with no runs (priced through the catalogue)
    cv_mape: float | None = None  # held-out MAPE of the whole predictor (None: not cross-validated)
    cv_coverage: float | None = None  # share of held-out runs inside their 80 % interval
    cv: str = ""  # that cross-validation in words
    # Its held-out estimates, each (measured s, estimated s, the grouping held out): what the Records page draws
    cv_pairs: tuple[tuple[float, float, str], ...] = ()
    # axis -> the floor on std_log of an estimate at a value of that axis no run measured
    held_out_spread: dict = field(default_factory=dict)
    rule: str = BOUND  # how the choice weighs a time (judged)
    # The held-out choices' mean regret under each rule, how many there were and the standard error of the difference
    # of their regrets (None with one choice); {} when none were made
    rule_regret: dict = field(default_factory=dict)

    @property
    def overall_error(self) -> float | None:
        """The predictor's cross-validated MAPE; without a cross-validation, the model's own."""
        if self.cv_mape is not None:
            return self.cv_mape
        return self.model.cv_mape if self.model else None

    @property
    def noise(self) -> tuple[float, float]:
        """A run's noise (std of log time) as the repeats and residuals set it (_Noise), at the runs: the least, where
        the run waits longest on the network, and the most, where it computes most."""
        noise = np.sqrt(self.gp.kernel_.k2.diag(self.gp.X_train_))
        return float(noise.min()), float(noise.max())

    @property
    def kernel(self) -> str:
        return str(self.gp.kernel_)

    @property
    def one_machine_unknown(self) -> bool:
        """True when one machine is no candidate: all-reduce (or no strategy named) and no run of one machine. It
        computes alone, without the collectives every run of several pays on each step, and those runs cannot tell
        its computing apart from their collectives (the model would extrapolate the collectives' terms to nothing)."""
        return self.latency_free and 1 not in self.seen.get(("workers", None), [])

    def judged(self, estimate: Estimate) -> float:
        """The time the choice weighs for this estimate (choice._choose): the upper end of its 80 % interval — a
        configuration the data know little about must be better by its uncertainty to be chosen — or, where the
        workload's own held-out choices lost less by trusting the estimates (`rule_regret`), the estimate."""
        return estimate.interval[1] if self.rule == BOUND else estimate.epoch_time_s

    def can_price(self, worker_type: str) -> bool:
        return any(t == worker_type for t, *_ in self.runs) or bool(self.model and self.model.can_price(worker_type))

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

    def estimate(
        self, worker_type: str, workers: int, batch_size: int | None, latency_ms: float | None
    ) -> Estimate | None:
        """The epoch time of this configuration with its uncertainty; None when it is left out for its failed runs,
        or nothing can price it (a type with no runs the model cannot price; without a model, outside the runs; one
        machine that no run measured: one_machine_unknown)."""
        return self.estimate_many([(worker_type, workers, batch_size, latency_ms)])[0]

    def estimate_many(
        self, points: Sequence[tuple[str, int, int | None, float | None]], *, unmeasured: bool = False
    ) -> list[Estimate | None]:
        """`estimate` for many configurations, the model and the process asked once. unmeasured: estimate also
        where an axis measured at one value leaves the cost of another unknown (`unmeasured`): the predictor's own
        hold-out does, to learn how far such estimates go wrong."""
        queries = [
            (t, int(n), self.batch_ref if b is None else b, self.latency_ref if lat is None else float(lat))
            for t, n, b, lat in points
        ]
        answered = [i for i, q in enumerate(queries) if self._answerable(*q, unmeasured)]
        estimates: list[Estimate | None] = [None] * len(queries)
        if not answered:
            return estimates
        rows = [self._row(*queries[i]) for i in answered]
        prior = self._prior(rows)
        inputs = self._inputs(rows, prior)
        residual, std = self.gp.predict(inputs, return_std=True)
        noises = np.sqrt(self.gp.kernel_.k2.diag(inputs))
        for i, row, m, r, s, noise in zip(answered, rows, prior, residual, std, noises, strict=True):
            latent = math.sqrt(max(float(s) ** 2 - noise**2, 0.0))
            if row[0] not in self.coverage["worker_types"]:
                latent = math.hypot(latent, self.bridge_error)
            off = _off_axes(self.seen, row, self.latency_free)
            floor, off = max(((self.held_out_spread.get(o[0], 0.0), o) for o in off), default=(0.0, None))
            runs = self.runs.get(row)
            if runs:
                time_s, basis, detail = float(np.mean(runs)), MEASURED, self._measured_text(queries[i], runs)
            else:
                time_s, basis, detail = math.exp(m + r), PREDICTED, self._predicted_text(m, r)
            if floor > latent:
                latent, detail = floor, f"{detail}; {_floor_text(off, floor)}"
            if math.isfinite(time_s) and time_s > 0:
                estimates[i] = Estimate(time_s, latent, float(noise), basis, detail, self.risk(*queries[i]))
        return estimates

    def unmeasured(self, workers: int, batch_size: int | None, latency_ms: float | None) -> str:
        """Why no model can estimate this configuration: its worker count, batch size or latency differs from the one
        value every run of the workload measured, and nothing in the runs then tells what that axis costs (e.g.
        "the runs measured only 3 workers"); "" when there is no such axis, or no model (its process answers only
        within the measured ranges). One machine of an all-reduce workload pays no latency, and its runs measure
        none."""
        if self.model is None:  # without one, only the measured ranges are answered (_answerable)
            return ""
        counts, batches, paid = self._single_values
        batch = self.batch_ref if batch_size is None else batch_size
        latency = self.latency_ref if latency_ms is None else float(latency_ms)
        if counts and workers != counts[0]:
            return f"the runs measured only {counts[0]} worker{'s' * (counts[0] != 1)}"
        if batch is not None and batches and batch != batches[0]:
            return f"the runs measured only batch size {batches[0]:g}"
        if not (self.latency_free and workers == 1) and paid and latency != paid[0]:
            return f"the runs measured only {paid[0]:g} ms latency"
        return ""

    @functools.cached_property
    def _single_values(self) -> tuple[list, list, list]:
        """The worker counts, batch sizes and latencies paid (one machine of an all-reduce workload pays none) that
        the runs measured, each kept only where it is a single value ([] otherwise)."""
        paid = sorted({x for key, values in self.seen.items() if key[:2] == ("latency", None) for x in values})
        axes = (self.seen.get(("workers", None), []), self.coverage["batch_sizes"], paid)
        return tuple(values if len(values) == 1 else [] for values in axes)

    # --- the pieces -------------------------------------------------------------------------------------------------

    def _answerable(self, worker_type: str, n: int, batch: int | None, latency: float, unmeasured: bool) -> bool:
        if n < 1 or self.left_out(worker_type, n, batch, latency) or (n == 1 and self.one_machine_unknown):
            return False
        if self.model is not None:
            return self.model.can_price(worker_type) and (unmeasured or not self.unmeasured(n, batch, latency))
        # No model to extrapolate with: only within the ranges this type ran at.
        own = [(m, b, lat) for t, m, b, lat in self.runs if t == worker_type]
        if not own:
            return False
        within = [
            (n, [m for m, _, _ in own]),
            (batch, [b for _, b, _ in own if b is not None]),
            (self._latency(n, latency), [lat for _, _, lat in own]),
        ]
        return all(x is None or not seen or min(seen) <= x <= max(seen) for x, seen in within)

    def _latency(self, n: int, latency: float) -> float:
        return 0.0 if self.latency_free and n == 1 else latency

    def _row(self, worker_type: str, n: int, batch: int | None, latency: float) -> tuple:
        return (worker_type, n, batch, self._latency(n, latency))

    def _prior(self, rows: Sequence[tuple]) -> np.ndarray:
        """The mean of log time at these rows: the model's log prediction, or the runs' mean log time."""
        if self.model is None:
            return np.full(len(rows), self.offset)
        return np.log(self.model.predict_many(*zip(*rows, strict=True)))

    def _inputs(self, rows: Sequence[tuple], prior: np.ndarray) -> np.ndarray:
        return _process_inputs(rows, prior, self.model, self.batch_ref, self.center, self.scale, self.types)

    def _measured_text(self, query: tuple, runs: list[float]) -> str:
        worker_type, n, batch, latency = query
        at = sorted(lat for b, lat in self.successes.get((worker_type, n), {}) if b == batch)
        count = f"{len(runs)} run{'s' * (len(runs) != 1)}"
        if self.latency_free and n == 1 and at != [latency]:
            where = ", ".join(f"{significant(lat, 4)} ms" for lat in at)
            return f"measured at {where} ({count}): one machine sends nothing over the network"
        return f"measured here ({count})"

    def _predicted_text(self, prior: float, residual: float) -> str:
        change = f"{math.exp(residual) - 1:+.1%}"
        if self.model is None:
            return f"the runs' Gaussian process ({change} on their typical time; no model: {self.model_error})"
        return (
            f"the {self.model.family} model's {significant(math.exp(prior), 4)} s, {change} by the Gaussian process "
            "on its residuals"
        )


def _floor_text(off: tuple[str, str], floor: float) -> str:
    axis, where = off
    return (
        f"{where} the measured {_GROUP_NAMES[axis]}: as unsure as the predictor was on held-out ones "
        f"(80 %: within a factor {significant(math.exp(Z * floor), 3)})"
    )


def _process_inputs(rows, prior: np.ndarray, model: PerfModel | None, batch_ref, center, scale, types) -> np.ndarray:
    """The process's inputs at these rows (their prior: the model's log times): _inputs, then the noise's column."""
    return np.column_stack([_inputs(rows, batch_ref, center, scale, types), _computing(model, rows, prior)])


def _computing(model: PerfModel | None, rows: Sequence[tuple], prior: np.ndarray) -> np.ndarray:
    """The noise's input (_Noise, the process's last column): the log of the share of each row's expected time the
    model puts outside the latency's terms, its time at 0 ms over its time (0: no model, or no latency)."""
    if model is None:
        return np.zeros(len(rows))
    types, workers, batches, _ = zip(*rows, strict=True)
    return np.minimum(np.log(model.predict_many(types, workers, batches, [0.0] * len(rows))) - prior, 0.0)


def _inputs(rows, batch_ref, center, scale, types) -> np.ndarray:
    """The process's inputs: standardised (log n, log B, l), and the worker type one-hot where there are several."""
    numbers = np.array(
        [[math.log(n), math.log(b or batch_ref or 1.0), lat] for _, n, b, lat in rows], dtype=float
    ).reshape(-1, 3)
    columns = [(numbers - center) / scale]
    if types:
        columns.append(np.array([[t == u for u in types] for t, *_ in rows], dtype=float))
    return np.hstack(columns)


# --- building one ---------------------------------------------------------------------------------------------------


def predictor(
    records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec] = (), *, cross_validate: bool = True
) -> PredictorModel:
    """The workload's predictor (module docstring). cross_validate: also hold out every latency, batch size and
    worker count in turn to measure what it is worth. Memoised like `fit`: the same records and catalogue give the
    same predictor. RecommendationError when no record has an epoch time.

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
def _predictor(records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], cross_validate: bool):
    built = _build(records, catalog)
    if not cross_validate:
        return built
    return replace(built, **_cross_validate(records, catalog, built.gp.kernel_))


def _build(records: Sequence[PerfRecord], catalog: Sequence[InstanceSpec], kernel=None) -> PredictorModel:
    """The predictor of these records; kernel: the process's hyper-parameters fixed (None: fitted)."""
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
    latency_free = one_machine_latency_free(usable)
    batch_ref = _most_common(r.batch_size for r in usable)
    rows = [
        (r.instance_type, r.workers, r.batch_size, 0.0 if latency_free and r.workers == 1 else _latency(r))
        for r in usable
    ]
    log_time = np.log([r.epoch_time_s for r in usable])
    if model is None:
        offset, prior = float(np.mean(log_time)), np.full(len(rows), float(np.mean(log_time)))
    else:
        offset, prior = 0.0, np.log(model.predict_many(*zip(*rows, strict=True)))
    numbers = _inputs(rows, batch_ref, np.zeros(3), np.ones(3), ())
    center, scale = numbers.mean(axis=0), numbers.std(axis=0)
    scale[scale < 1e-9] = 1.0  # an axis measured at one value: a query off it is that many of its units away
    types = tuple(sorted({r.instance_type for r in usable}))
    types = types if len(types) > 1 else ()
    inputs = _process_inputs(rows, prior, model, batch_ref, center, scale, types)
    gp = _fit_process(inputs, log_time - prior, kernel)
    runs, successes, failed = defaultdict(list), defaultdict(Counter), defaultdict(Counter)
    for r, row in zip(usable, rows, strict=True):
        runs[row].append(r.epoch_time_s)
        successes[(r.instance_type, r.workers)][(r.batch_size, _latency(r))] += 1
    for r in records:
        if r.epoch_time_s is None and r.workers:
            failed[(r.instance_type, r.workers)][(r.batch_size, _latency(r))] += 1
    return PredictorModel(
        model=model,
        model_error=model_error,
        gp=gp,
        offset=offset,
        center=center,
        scale=scale,
        types=types,
        runs=dict(runs),
        failed={key: dict(points) for key, points in failed.items()},
        successes={key: dict(points) for key, points in successes.items()},
        latency_free=latency_free,
        batch_ref=batch_ref,
        latency_ref=_most_common(_latency(r) for r in usable) or 0.0,
        seen=_seen(rows, latency_free),
        coverage={
            "workers": [min(r.workers for r in usable), max(r.workers for r in usable)],
            "batch_sizes": sorted({r.batch_size for r in usable if r.batch_size is not None}),
            "latencies_ms": sorted({_latency(r) for r in usable}),
            "worker_types": sorted({r.instance_type for r in usable}),
        },
        bridge_error=_bridge_error(model),
    )


def _seen(rows: Sequence[tuple], latency_free: bool) -> dict:
    """The values each axis was measured at: worker counts per worker type, batch sizes and latencies per worker type
    and count (a key None: every type's together). One machine's runs of an all-reduce workload measure no latency."""
    seen = defaultdict(set)
    for worker_type, n, batch, latency in rows:
        for key in (worker_type, None):
            seen[("workers", key)].add(n)
            if batch is not None:
                seen[("batch_size", key, n)].add(batch)
            if not (latency_free and n == 1):
                seen[("latency", key, n)].add(latency)
    return {key: sorted(values) for key, values in seen.items()}


def _off_axes(seen: dict, row: tuple, latency_free: bool) -> list[tuple[str, str]]:
    """Where this row is off the runs, each with "between" (inside the measured values) or "beyond": at a worker count
    no run of its type ran (only that: its batch size and latency are then no question of their own); else at a batch
    size or latency no run of its type and count ran (a type with no runs: any type's)."""
    worker_type, n, batch, latency = row
    key = worker_type if ("workers", worker_type) in seen else None
    counts = seen.get(("workers", key), [])
    if n not in counts:
        axes = [("workers", counts, n)]
    else:
        axes = [("batch_size", seen.get(("batch_size", key, n), []), batch)]
        if not (latency_free and n == 1):
            axes.append(("latency", seen.get(("latency", key, n), []), latency))
    return [
        (axis, "between" if values and values[0] < value < values[-1] else "beyond")
        for axis, values, value in axes
        if value is not None and value not in values
    ]


def _bridge_error(model: PerfModel | None) -> float:
    """How far the catalogue's speeds miss the measured types' own: the standard deviation of log κ_t·speed_t over the
    types fitted with their own compute coefficient and a catalogue speed (0 with fewer than two: not known)."""
    terms = model.terms if model else None
    if terms is None:
        return 0.0
    bridged = [math.log(k * terms.speeds[t]) for t, k in terms.compute_s.items() if k > 0 and t in terms.speeds]
    return float(np.std(bridged, ddof=1)) if len(bridged) >= 2 else 0.0


class _Leading(Exponentiation):
    """A kernel of every input column but the last (the noise's, _Noise), which scikit-learn's own kernels would take
    as a coordinate: its one-kernel wrapper (Exponentiation, here to the power 1) with that column dropped."""

    def __init__(self, kernel: Kernel, exponent: float = 1.0):
        super().__init__(kernel, exponent)

    def __call__(self, X, Y=None, eval_gradient=False):
        return super().__call__(X[:, :-1], None if Y is None else Y[:, :-1], eval_gradient)

    def diag(self, X):
        return super().diag(X[:, :-1])

    def __repr__(self):
        return repr(self.kernel)


class _Noise(Kernel):
    """A run's noise in log time, on the diagonal only (like scikit-learn's WhiteKernel): waiting + computing · c²,
    c = e^u the share of the run's expected time outside the latency's terms (u the last input column, _computing).
    Time spent computing shares the machine and jitters; time spent waiting on the network's latency is steady."""

    def __init__(self, waiting=1e-3, computing=1e-3, waiting_bounds=NOISE_BOUNDS, computing_bounds=NOISE_BOUNDS):
        self.waiting, self.computing = waiting, computing
        self.waiting_bounds, self.computing_bounds = waiting_bounds, computing_bounds

    @property
    def hyperparameter_waiting(self):
        return Hyperparameter("waiting", "numeric", self.waiting_bounds)

    @property
    def hyperparameter_computing(self):
        return Hyperparameter("computing", "numeric", self.computing_bounds)

    def __call__(self, X, Y=None, eval_gradient=False):
        if Y is not None:  # between different runs: no covariance
            return np.zeros((X.shape[0], Y.shape[0]))
        waiting, computing = np.full(X.shape[0], self.waiting), self.computing * np.exp(2.0 * X[:, -1])
        noise = np.diag(waiting + computing)
        if not eval_gradient:
            return noise
        return noise, np.stack([np.diag(waiting), np.diag(computing)], axis=2)  # by the log of each hyper-parameter

    def diag(self, X):
        return self.waiting + self.computing * np.exp(2.0 * X[:, -1])

    def is_stationary(self):
        return False

    def __repr__(self):
        return f"{type(self).__name__}(waiting={self.waiting:.3g}, computing={self.computing:.3g})"


def _fit_process(inputs: np.ndarray, residuals: np.ndarray, kernel=None) -> GaussianProcessRegressor:
    """The Gaussian process on the residuals, its hyper-parameters by maximum marginal likelihood within bounds (or
    the given kernel's, fixed). inputs: the standardised coordinates, then the noise's column (_computing)."""
    fixed = kernel is not None and kernel.n_dims == inputs.shape[1] + 2
    if not fixed:
        bounds = _length_scales(inputs[:, :-1])
        kernel = (
            ConstantKernel(0.01, AMPLITUDE_BOUNDS) * _Leading(Matern(np.maximum(bounds[:, 0], 1.0), bounds, nu=2.5))
            + _Noise()
        )
    gp = GaussianProcessRegressor(kernel, optimizer=None if fixed else _optimise)
    with warnings.catch_warnings():
        # A hyper-parameter at its bound is an answer (e.g. no noise between exact copies), not a failure.
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gp.fit(inputs, residuals)


def _length_scales(coordinates: np.ndarray) -> np.ndarray:
    """The bounds of each input's length scale (LENGTH_SCALE_BOUNDS), the lower of each number (log n, log B, l) raised
    to the gap between its two closest measured values (at most to the upper): the runs cannot tell a shorter one
    from it (Betancourt, "Robust Gaussian processes in Stan", 2017). Without the bound the process may explain each
    measured value of an input apart from its neighbours, and then a value between two measured ones, or one step past
    them, falls back to the model instead of following the nearest runs' residuals.

    >>> runs = np.array([[0.0, 5.0, 1.0, 1, 0], [0.5, 5.0, 2.0, 0, 1], [2.0, 5.0, 4.0, 1, 0]])  # and two types' columns
    >>> _length_scales(runs)[:, 0].tolist()  # the second number measured at one value: nothing to tell
    [0.5, 0.1, 1.0, 0.1, 0.1]
    """
    bounds = np.tile(LENGTH_SCALE_BOUNDS, (coordinates.shape[1], 1))
    for i in range(3):  # the numbers; the worker types' one-hot columns follow
        gaps = np.diff(np.unique(coordinates[:, i].round(9)))
        if len(gaps):
            bounds[i, 0] = min(max(bounds[i, 0], float(gaps.min())), bounds[i, 1])
    return bounds


def _optimise(objective, theta: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, float]:
    """The hyper-parameters of the greatest marginal likelihood (objective: its negative and gradient, by the log of
    each): L-BFGS-B from the kernel's start, its noise split evenly between waiting and computing, and again with the
    noise all waiting (theta's last two: _Noise's), the better kept. A run's noise read as waiting or as computing are
    two basins of the likelihood; from the even split the search often stays in the computing one."""
    all_waiting = theta.copy()
    all_waiting[-2:] = np.log([NOISE_BOUNDS[1] / 10, NOISE_BOUNDS[0] * 10])  # inside the bounds: the gradient moves
    results = [minimize(objective, start, method="L-BFGS-B", jac=True, bounds=bounds) for start in (theta, all_waiting)]
    best = min(results, key=lambda result: result.fun)
    return best.x, float(best.fun)


def _latency(r: PerfRecord) -> float:
    return float(r.latency_ms or 0.0)


def _cell_key(record: PerfRecord) -> tuple:
    """Where a choice of worker count is made: (worker type, batch size, latency)."""
    return (record.instance_type, record.batch_size, _latency(record))


def _runs(usable: Sequence[PerfRecord]) -> dict:
    """(worker type, batch size, latency) -> {workers: [measured times]}."""
    times = defaultdict(lambda: defaultdict(list))
    for r in usable:
        times[_cell_key(r)][r.workers].append(r.epoch_time_s)
    return times


def _means(counts: dict) -> dict:
    """{workers: [times]} -> {workers: their mean}."""
    return {n: float(np.mean(times)) for n, times in counts.items()}


def _most_common(values) -> float | None:
    values = [v for v in values if v is not None]
    return Counter(values).most_common(1)[0][0] if values else None


_GROUP_NAMES = {"latency": "latencies", "batch_size": "batch sizes", "workers": "worker counts"}


def _cross_validate(records: tuple[PerfRecord, ...], catalog: tuple[InstanceSpec, ...], kernel) -> dict:
    """The whole predictor's held-out MAPE and 80 % interval coverage: each latency, batch size and worker count left
    out in turn, the model refitted on the rest and the process conditioned on them with the hyper-parameters fitted
    on every run (refitting those too costs a marginal-likelihood search per fold on every request; the benchmark,
    calibration.holdout_report, refits everything). Also the floors on std_log at unmeasured values of an axis
    (`held_out_spread`), from the held-out log errors; each held-out run's interval takes the floors the other
    held-out values set."""
    usable = _usable(records)
    held, kinds = [], []  # held: (fold, its estimate, the measured time, the kinds of axis it is off on)
    folds = {}  # fold -> (its predictor, the cells it holds out runs of)
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
                fold = _build(train, catalog, kernel)
            except RecommendationError:
                continue
            rows = [(r.instance_type, r.workers, r.batch_size, _latency(r)) for r in held_out]
            folds[(group_by, group)] = fold, {(t, b, lat) for t, _, b, lat in rows}
            for r, row, e in zip(held_out, rows, fold.estimate_many(rows, unmeasured=True), strict=True):
                if e is not None:
                    off = _off_axes(fold.seen, fold._row(*row), fold.latency_free)
                    held.append(((group_by, group), e, r.epoch_time_s, off))
    if not held:
        return {}
    # axis -> [(fold, the estimate's std_log, the std_log its run's interval needed to hold the run)]
    needed = defaultdict(list)
    for fold, e, measured, off in held:
        if any(axis == fold[0] for axis, _ in off):  # off the runs on the axis held out (its value not measured)
            error = abs(math.log(measured / e.epoch_time_s))
            needed[fold[0]].append((fold, e.std_log, math.sqrt(max((error / Z) ** 2 - e.noise_log**2, 0.0))))

    @functools.cache
    def floor(axis, leave_out=None) -> float:
        """The axis's floor from its held-out runs, those of fold leave_out apart (_floor)."""
        return _floor([(std, need) for fold, std, need in needed[axis] if fold != leave_out])

    def floored(fold, e: Estimate, off: list) -> float:
        """An estimate's std_log with the floors the other held-out values of the axes it is off on set."""
        return max([e.std_log, *(floor(axis, fold) for axis, _ in off)])

    inside = []
    for fold, e, measured, off in held:
        sigma = math.hypot(floored(fold, e, off), e.noise_log)
        inside.append(abs(math.log(measured / e.epoch_time_s)) <= Z * sigma)
    return {
        "cv_mape": float(np.mean([abs(e.epoch_time_s / measured - 1) for _, e, measured, _ in held])),
        "cv_coverage": float(np.mean(inside)),
        "cv": f"{', '.join(kinds)}, each held out in turn: {len(held)} held-out estimates",
        "cv_pairs": tuple((measured, e.epoch_time_s, fold[0]) for fold, e, measured, _ in held),
        "held_out_spread": {axis: floor(axis) for axis in needed},
        **_choose_rule(usable, folds, floored),
    }


def _floor(runs: Sequence[tuple[float, float]]) -> float:
    """The least floor on std_log with which ⌈0.8·(m + 1)⌉ of m held-out runs (at most all m) would have been inside
    their 80 % intervals: those their own std_log holds, and enough of the others. runs: each held-out run's (std_log
    of its estimate, the std_log its interval would have needed to hold it). The one more is conformal prediction's
    (Lei et al., "Distribution-free predictive inference for regression", 2018): the m runs and a new one are alike,
    so the new one's rank among them is uniform, and it is inside at least as often as 80 % of m + 1.

    >>> _floor([(0.0, need) for need in (0.1, 0.2, 0.3, 0.4, 0.5)])  # 5 runs: 4 inside would be 80 % of them only
    0.5
    >>> _floor([(0.0, 0.1), (0.0, 0.2), (0.0, 0.3), (0.6, 0.5), (0.6, 0.4)])  # two held by their own std_log
    0.3
    >>> _floor([(0.2, 0.1)] * 4)  # every one held: no floor
    0.0
    """
    short = sorted(need for std, need in runs if std < need)
    missing = min(math.ceil(0.8 * (len(runs) + 1)), len(runs)) - (len(runs) - len(short))
    return short[missing - 1] if missing > 0 else 0.0


def _choose_rule(usable: Sequence[PerfRecord], folds: dict, floored) -> dict:
    """How the choice judges a time (`PredictorModel.judged`), by the workload's own held-out choices: in every fold,
    each cell (worker type, batch size, latency) that it holds out runs of and that measured two worker counts or
    more has every measured count estimated by the fold's predictor (with the floors the other folds set), and the
    fastest chosen by each rule — each time judged by the upper end of its 80 % interval, or by the estimate; a
    choice's regret is the measured time of its count over the best's, less one. The estimate only where it lost less
    by more than the standard error of the choices' differences (the one-standard-error rule: the cautious rule
    stands unless the data show the other better); the bound on a tie, with one choice, and with none."""
    cells = _runs(usable)
    regrets = {BOUND: [], ESTIMATE: []}
    for fold, (predictor, held_cells) in folds.items():
        asked = [(cell, sorted(cells[cell])) for cell in held_cells if len(cells[cell]) > 1]
        points = [(t, n, b, lat) for (t, b, lat), counts in asked for n in counts]
        estimates = iter(predictor.estimate_many(points, unmeasured=True))  # one call for the fold's cells
        for (worker_type, batch, latency), counts in asked:
            cell = [(n, next(estimates)) for n in counts]
            if any(e is None for _, e in cell):
                continue
            off = [
                _off_axes(predictor.seen, predictor._row(worker_type, n, batch, latency), predictor.latency_free)
                for n, _ in cell
            ]
            judged = {
                BOUND: [
                    e.epoch_time_s * math.exp(Z * floored(fold, e, o)) for (_, e), o in zip(cell, off, strict=True)
                ],
                ESTIMATE: [e.epoch_time_s for _, e in cell],
            }
            means = _means(cells[(worker_type, batch, latency)])
            for rule, times in judged.items():
                pick, _ = min(zip(cell, times, strict=True), key=lambda c: (c[1], c[0][1].epoch_time_s, c[0][0]))
                regrets[rule].append(means[pick[0]] / min(means.values()) - 1.0)
    if not regrets[BOUND]:
        return {}
    mean = {rule: float(np.mean(values)) for rule, values in regrets.items()}
    gain = np.subtract(regrets[BOUND], regrets[ESTIMATE])  # what each choice would gain by the estimate
    error = float(np.std(gain, ddof=1) / math.sqrt(len(gain))) if len(gain) > 1 else math.inf
    return {
        "rule": ESTIMATE if gain.mean() > error else BOUND,
        "rule_regret": mean | {"choices": len(gain), "error": error if math.isfinite(error) else None},
    }
