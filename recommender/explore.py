"""`explore`'s search: which trial run to make next for a workload with no records, when to stop, and which
configuration to choose — pure functions over frozen dataclasses (no ORM, no Django).

A configuration is chosen whole: worker type, PS type, worker count, strategy and latency together. The surrogate is
scikit-learn's GaussianProcessRegressor on log epoch time over features every catalogue gives (log workers, the
worker type's log price, vCPU or ECU and network, the PS type's log price and network, the strategy, the latency):
a linear kernel (how log time trends along each feature: Bayesian linear regression) plus an RBF kernel (what the
trend misses, e.g. a PS that saturates) plus white noise (one run's spread). Its prior mean is this workload's mean
log time, plus, where `history` (other workloads' records) is given, the trend fitted on those records — the scaling
shape other code showed, shifted to this workload's level by its own trials. History counts only where it has shown
it transfers (each of its workloads predicted from the others better than by no trend; one workload cannot show it),
and once the trials can tell, its trend stands only where it explains them better than no trend does. History
shapes the prior only: it may choose the first trial and steer the next ones, never end the search (the belief
without it must also find no trial worth its cost), and the chosen configuration is always one this workload
measured.

The objective is the model's rule (recommender/perfmodel/choice.py) on the run's cost rather than its hourly price:
f = α·t/t_ref + β·c/c_ref, c = t·price the cost of an epoch, t_ref and c_ref the least among the candidates (the
believed ones while searching, the measured ones when choosing). Under the surrogate t is log-normal, so f is too
and the expected improvement over the best measured f has a closed form. The next trial is the candidate with the
largest expected improvement per dollar of its trial; the search stops when that improvement — a share of the
job's cost on the current pick — is worth less than the trial costs, when the next trial would overrun the budget
(dollars or minutes), or when nothing is left to try. A configuration whose trial failed is not tried again.

Trials may overlap in time: `next_step(width=k)` proposes up to k trials to run together. The first is the rule's; each
next is the rule's with the earlier ones pending (the kriging believer: the belief is conditioned on a pending trial
as if it had measured what the belief expects there, which leaves the mean where it was and shrinks the uncertainty
near it, so the next proposal looks elsewhere). Each must be worth its cost by the same rule and fit the budget with
the others: dollars are the batch's sum, minutes one window for the whole batch (they run at the same time), and
its workers, where the provider limits them, those of the trials under way included. Trials under way, started and
not yet measured, are pending the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, DotProduct, Kernel, WhiteKernel

from recommender.algorithms import hourly_cost
from recommender.types import InstanceSpec

# α, β presets the user picks from (time vs cost weights, as the model's rule reads them).
PRESETS: dict[str, tuple[float, float]] = {"fastest": (1.0, 0.0), "cheapest": (0.0, 1.0), "balanced": (0.5, 0.5)}
# The weights a request that names neither a preset nor α and β gets: explore's (balanced), the model's (time alone).
DEFAULT_WEIGHTS = {"explore": PRESETS["balanced"], "model": (1.0, 0.0)}


def weights(
    preset: str | None, alpha: float | None, beta: float | None, default: tuple[float, float] = PRESETS["balanced"]
) -> tuple[float, float]:
    """(α, β): a preset's, or those given (one not given: `default`'s); a ValueError for a preset given with weights
    or an unknown one, the same at every door (the wizard, the APIs, the command lines).

    >>> weights("cheapest", None, None), weights(None, 2.0, None)
    ((0.0, 1.0), (2.0, 0.5))
    """
    if preset is not None:
        if alpha is not None or beta is not None:
            raise ValueError(f"give the preset {preset!r} or alpha and beta, not both")
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r} (expected {', '.join(PRESETS)})")
        return PRESETS[preset]
    return (default[0] if alpha is None else alpha), (default[1] if beta is None else beta)


# The surrogate's hyperparameters. The trend (linear kernel) is in the features' own units, logs of ratios, where a
# slope has a physical reading: −1 on log workers or log speed is ideal scaling, 0 none, +1 time proportional (to
# latency, or to workers on a saturated PS) — so slopes of sd 1 about 0 (or about history's) span what code does.
# Beyond the trend (RBF), log time moves by about 0.5 over half each feature's span among the candidates (so it
# holds for any grid's spread, and a best inside the range — a PS that saturates midway — can be believed). Both
# amplitudes are then fitted to the trials by marginal likelihood, once there are enough trials to say anything —
# upwards only: a handful of trials can show more variation than the prior assumed, but one that shows less has
# most likely not looked where it varies. A run repeats within about 5 %.
SLOPE_VARIANCE = 1.0
BUMP_VARIANCE = 0.25
AMPLITUDE_GROWTH = 100.0  # how far above the prior's the trials may fit an amplitude; never below (see belief)
LENGTH_SCALE = 0.5
NOISE_VARIANCE = 0.05**2
FIT_FROM_TRIALS = 3  # fewer trials than this cannot fit an amplitude: the prior ones stand
RIDGE = 1e-2  # keeps a history workload's trend fit defined where its records do not vary a feature


@dataclass(frozen=True, order=True)
class Config:
    instance_type: str
    ps_type: str
    workers: int
    strategy: str
    latency_ms: float

    def as_dict(self) -> dict:
        return {"instance_type": self.instance_type, "ps_type": self.ps_type, "workers": self.workers,
                "strategy": self.strategy, "latency_ms": self.latency_ms}  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    config: Config
    hourly_price: float  # the whole cluster's $/h: workers × worker price + the PS's
    features: tuple[float, ...]


@dataclass(frozen=True)
class Trial:
    config: Config
    epoch_time_s: float | None  # steady-state epoch time; None: the trial failed


@dataclass(frozen=True)
class HistoryRecord:
    workload: str
    config: Config
    epoch_time_s: float


@dataclass(frozen=True)
class Budget:
    dollars: float  # the search's money: trials stop before overrunning it
    minutes: float  # the search's wall-clock time: a batch of trials run together takes one window
    window_minutes: float  # one trial's length (it is billed for it)
    job_hours: float  # the job's expected length on the chosen cluster: what a better choice saves is a share of it


@dataclass(frozen=True)
class Prior:
    """The trend history taught: slopes of log time on the features, and history's mean level (used before any
    trial of this workload). Empty slopes: no history."""

    slopes: tuple[float, ...] = ()
    level: float = 0.0


@dataclass(frozen=True)
class Belief:
    mean: tuple[float, ...]  # of log epoch time, one per candidate
    sd: tuple[float, ...]


@dataclass(frozen=True)
class Step:
    """What to do now: `proposal` is the next trial's configuration, or None with `reason` saying why the search
    stops; `chosen` is the best measured configuration so far (None before any successful trial); `also` the trials
    to run at the same time as the proposal (next_step's `width`)."""

    proposal: Config | None
    chosen: Config | None
    reason: str
    gain_per_dollar: float  # of the proposal (or of the best candidate left, when stopping on value); 0 if none
    also: tuple[Config, ...] = ()

    @property
    def batch(self) -> tuple[Config, ...]:
        """The trials to run now, together: the proposal first; none when the search stops."""
        return (self.proposal, *self.also) if self.proposal else ()


@dataclass(frozen=True)
class Search:
    trials: tuple[Trial, ...]
    chosen: Config | None
    reason: str
    spent_dollars: float
    spent_minutes: float = 0.0  # wall-clock: one window per batch


def features(config: Config, catalog: Mapping[str, InstanceSpec]) -> tuple[float, ...]:
    """The configuration's raw features (belief() scales each to the candidates' span); what the catalogue does not
    say counts as the reference (0): a type it does not list, a missing figure, no PS. Latency enters as log(1 + l/ms):
    an epoch's time is compute plus latency × round trips, whose log bends like it."""
    worker, ps = catalog.get(config.instance_type), catalog.get(config.ps_type)
    speed = (worker.ecu or worker.vcpu) if worker else None
    return (
        math.log(max(config.workers, 1)),
        _log(worker.hourly_price if worker else None),
        _log(speed),
        _log(worker.network_mbps / 1000 if worker and worker.network_mbps else None),
        _log(ps.hourly_price if ps else None),
        _log(ps.network_mbps / 1000 if ps and ps.network_mbps else None),
        1.0 if config.strategy == "ps" or config.ps_type else 0.0,
        math.log1p(max(config.latency_ms, 0.0)),
    )


def _log(value: float | None) -> float:
    return math.log(value) if value and value > 0 else 0.0


def cluster_price(config: Config, catalog: Mapping[str, InstanceSpec], unpriced: float) -> float:
    """$/h of the cluster; a type the catalogue does not list costs `unpriced` per node."""

    def price(name: str) -> float:
        return catalog[name].hourly_price if name in catalog else unpriced

    ps_price = price(config.ps_type) if config.ps_type else 0.0
    return float(hourly_cost(config.workers, price(config.instance_type), ps_price))


def make_candidates(
    configs: Sequence[Config], catalog: Mapping[str, InstanceSpec], unpriced: float = 1.0
) -> tuple[Candidate, ...]:
    return tuple(Candidate(c, cluster_price(c, catalog, unpriced), features(c, catalog)) for c in sorted(set(configs)))


def _spans(x: np.ndarray) -> np.ndarray:
    """How far each column ranges over the rows (one where they do not vary it): the RBF's length scales."""
    span = x.max(axis=0) - x.min(axis=0)
    return np.where(span > 0, span, 1.0)


def fit_prior(history: Sequence[HistoryRecord], catalog: Mapping[str, InstanceSpec]) -> Prior:
    """The trend of log epoch time on the features across other workloads: each workload's ridge fit around its own
    mean (so workloads of any size count by their shape), averaged weighting each by its records. History earns its
    place by predicting itself: each of its workloads, predicted from the others' trend alone, must be missed by less
    (mean square of log time about its mean) than by no trend at all; history that cannot (other code scales
    otherwise, or a single workload, which cannot be checked) teaches nothing: the empty prior."""
    by_workload: dict[str, list[HistoryRecord]] = {}
    for record in history:
        if record.epoch_time_s and record.epoch_time_s > 0:
            by_workload.setdefault(record.workload, []).append(record)
    centred = []
    for records in by_workload.values():
        if len(records) >= 2:
            x = np.array([features(r.config, catalog) for r in records])
            y = np.log([r.epoch_time_s for r in records])
            centred.append((x - x.mean(axis=0), y - y.mean(), float(y.mean())))
    if len(centred) < 2:
        return Prior()
    fits = [np.linalg.solve(xc.T @ xc + RIDGE * np.eye(xc.shape[1]), xc.T @ yc) for xc, yc, _ in centred]
    weights = np.array([len(yc) for _, yc, _ in centred], dtype=float)
    missed = flat = 0.0
    for k, (xc, yc, _) in enumerate(centred):
        others = np.average(np.delete(np.array(fits), k, axis=0), axis=0, weights=np.delete(weights, k))
        missed += float(np.sum((yc - xc @ others) ** 2))
        flat += float(np.sum(yc**2))
    if missed >= flat:
        return Prior()
    slopes = np.average(np.array(fits), axis=0, weights=weights)
    return Prior(tuple(float(s) for s in slopes), float(np.average([c[2] for c in centred], weights=weights)))


def belief(
    candidates: Sequence[Candidate], trials: Sequence[Trial], prior: Prior = Prior(), pending: Sequence[Config] = ()
) -> Belief:
    """The surrogate's mean and sd of log epoch time for every candidate, given the successful trials and, as the
    kriging believer, the `pending` ones (measured, as if, at the belief's own mean: the mean stays, the uncertainty
    near them shrinks)."""
    # Features are centred on the candidates so the linear kernel's slopes pivot about the middle of the search space.
    xc = np.array([c.features for c in candidates])
    xc = xc - xc.mean(axis=0)
    trend = xc @ np.array(prior.slopes) if prior.slopes else np.zeros(len(candidates))
    index = {c.config: i for i, c in enumerate(candidates)}
    done = [(index[t.config], math.log(t.epoch_time_s)) for t in trials if t.epoch_time_s and t.config in index]
    waiting = sorted({index[c] for c in pending if c in index})
    fitted = len(done) >= FIT_FROM_TRIALS
    kernel = (
        ConstantKernel(SLOPE_VARIANCE, _bounds(SLOPE_VARIANCE, fitted)) * DotProduct(0.0, "fixed")
        + ConstantKernel(BUMP_VARIANCE, _bounds(BUMP_VARIANCE, fitted)) * RBF(LENGTH_SCALE * _spans(xc), "fixed")
        + WhiteKernel(NOISE_VARIANCE, "fixed")
    )
    if not done:
        # Before any trial the level is history's (with its spread across workloads unknown: sd 1) or unknown.
        level = prior.level if prior.slopes else 0.0
        variance = kernel.diag(xc) if not waiting else _believer(kernel, xc, waiting)
        prior_sd = np.sqrt(variance + 1.0)
        return Belief(tuple(float(v) for v in trend + level), tuple(float(v) for v in prior_sd))
    rows, observed = [i for i, _ in done], np.array([y for _, y in done])
    # History's trend is a hypothesis about this workload: once the trials can fit the surrogate, it stands only if
    # it explains them better (higher marginal likelihood) than no trend does — other code may scale otherwise.
    trends = [trend, np.zeros(len(candidates))] if prior.slopes and fitted else [trend]
    fits = [_fit(kernel, xc, rows, observed - t[rows], fitted, waiting) for t in trends]
    best = max(range(len(fits)), key=lambda k: fits[k][0])
    _, level, mean, sd = fits[best]
    # The belief is about the configuration's mean epoch time, not one noisy run: the white noise's variance is taken
    # out (else every configuration near the best would seem worth a trial by the runs' spread alone); the level is
    # estimated from the trials, its uncertainty shrinking as 1/√(trials).
    sd = np.sqrt(np.maximum(sd**2 - NOISE_VARIANCE, 0.0) + NOISE_VARIANCE / len(done))
    return Belief(tuple(float(v) for v in trends[best] + level + mean), tuple(float(v) for v in sd))


def _fit(
    kernel: Kernel, x: np.ndarray, rows: list[int], residual: np.ndarray, fitted: bool, waiting: Sequence[int] = ()
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(log marginal likelihood, level, mean, sd) of the GP on the trials' residuals about their level; the sd also
    conditioned on the `waiting` rows at the GP's own mean there (the kriging believer)."""
    level = float(residual.mean())
    gp = GaussianProcessRegressor(kernel, optimizer="fmin_l_bfgs_b" if fitted else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x[rows], residual - level)
        mean, sd = gp.predict(x, return_std=True)
    if waiting:
        # An observation at the mean moves no mean (its innovation is 0): only the variance changes, which the
        # kernel's fitted amplitudes alone give — the trials' values are not needed again.
        sd = np.sqrt(_believer(gp.kernel_, x, [*rows, *waiting]))
    return float(gp.log_marginal_likelihood_value_), level, mean, sd


def _believer(kernel: Kernel, x: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """The GP's posterior variance of every row given observations at `rows` (whatever their values), noise included
    as the GP's predict gives it."""
    k = kernel(x[list(rows)])
    cross = kernel(x, x[list(rows)])
    solved = np.linalg.solve(k + 1e-10 * np.eye(len(rows)), cross.T)
    return np.maximum(kernel.diag(x) - np.sum(cross * solved.T, axis=1), 0.0)


def _bounds(prior: float, fitted: bool) -> tuple[float, float] | str:
    return (prior, prior * AMPLITUDE_GROWTH) if fitted else "fixed"


def objective(time_s: float, hourly_price: float, alpha: float, beta: float, t_ref: float, c_ref: float) -> float:
    """α·t/t_ref + β·c/c_ref, c = t·price (an epoch's cost)."""
    return alpha * time_s / t_ref + beta * time_s * hourly_price / c_ref


def expected_improvement(log_mean: float, log_sd: float, scale: float, best: float) -> float:
    """E[max(best − f, 0)] for f = scale·exp(Y), Y ~ N(log_mean, log_sd²): the log-normal's closed form."""
    m = log_mean + math.log(scale)
    if log_sd <= 0:
        return max(best - math.exp(m), 0.0)
    z = (math.log(best) - m) / log_sd
    return best * norm.cdf(z) - math.exp(m + log_sd**2 / 2) * norm.cdf(z - log_sd)


def best_measured(
    candidates: Sequence[Candidate], trials: Sequence[Trial], alpha: float, beta: float
) -> tuple[Candidate, float] | None:
    """The measured candidate with the least objective (its trials' mean time; refs: the measured least) and that
    objective; ties: cheaper, then by configuration."""
    times: dict[Config, list[float]] = {}
    for t in trials:
        if t.epoch_time_s:
            times.setdefault(t.config, []).append(t.epoch_time_s)
    measured = [(c, float(np.mean(times[c.config]))) for c in candidates if c.config in times]
    if not measured:
        return None
    t_ref = min(t for _, t in measured)
    c_ref = min(t * c.hourly_price for c, t in measured)
    scored = [
        (objective(t, c.hourly_price, alpha, beta, t_ref, c_ref), c.hourly_price, c.config, c) for c, t in measured
    ]
    score, _, _, pick = min(scored)
    return pick, score


def next_step(
    candidates: Sequence[Candidate],
    trials: Sequence[Trial],
    alpha: float,
    beta: float,
    budget: Budget,
    prior: Prior = Prior(),
    *,
    spent_dollars: float | None = None,
    spent_minutes: float | None = None,
    width: int = 1,
    pending: Sequence[Config] = (),
    max_workers: int | None = None,
) -> Step:
    """The next trial (module docstring's rule) or why the search stops, with up to `width` − 1 more to run at the
    same time (`Step.also`). `spent_dollars` and `spent_minutes` are this search's spending so far; when not given,
    every trial in `trials` counts as this search's (a caller whose `trials` also hold earlier jobs' records of the
    workload, which cost this search nothing, gives them). `pending`: trials under way (their cost is in
    `spent_dollars`), never proposed again, believed as the module docstring says. `max_workers`: the most workers
    the provider runs at once, the batch's and the pending trials' together."""
    if alpha < 0 or beta < 0 or alpha + beta <= 0:
        raise ValueError(f"alpha and beta must be non-negative and not both 0 (got {alpha}, {beta})")
    if width < 1:
        raise ValueError(f"a batch holds at least one trial (width {width})")
    priced = {c.config: c for c in candidates}
    spent = spent_dollars if spent_dollars is not None else _spent(priced, trials, budget)
    minutes = spent_minutes if spent_minutes is not None else len(trials) * budget.window_minutes
    room = math.inf if max_workers is None else max_workers - sum(c.workers for c in pending)
    first = _step(candidates, trials, tuple(pending), alpha, beta, budget, prior, spent, minutes, room)
    batch = [first.proposal] if first.proposal else []
    while batch and len(batch) < width:
        # The batch shares one window (the minutes stand) and adds up its dollars and workers.
        spent += trial_cost(priced[batch[-1]], budget)
        room -= batch[-1].workers
        extra = _step(candidates, trials, (*pending, *batch), alpha, beta, budget, prior, spent, minutes, room)
        if extra.proposal is None:
            break
        batch.append(extra.proposal)
    return replace(first, also=tuple(batch[1:]))


def _step(
    candidates: Sequence[Candidate],
    trials: Sequence[Trial],
    pending: tuple[Config, ...],
    alpha: float,
    beta: float,
    budget: Budget,
    prior: Prior,
    spent: float,
    minutes: float,
    room: float = math.inf,
) -> Step:
    """One trial by the rule, `pending` ones believed (kriging believer) and never proposed, of at most `room`
    workers, or why none."""
    tried = {t.config for t in trials} | set(pending)
    current = best_measured(candidates, trials, alpha, beta)
    chosen = current[0].config if current else None
    left = [c for c in candidates if c.config not in tried]
    affordable = [
        c
        for c in left
        if spent + trial_cost(c, budget) <= budget.dollars + 1e-9
        and minutes + budget.window_minutes <= budget.minutes + 1e-9
        and c.config.workers <= room
    ]
    if not left:
        return Step(None, chosen, "every candidate has been tried", 0.0)
    if not affordable:
        return Step(None, chosen, "the next trial would overrun the search budget", 0.0)
    if current is None and not pending:
        # Nothing measured yet: the first trial is the candidate believed best (with history, its trend; without,
        # the candidates' middle — every one is believed alike, and the middle tells the trend most about the rest).
        if prior.slopes:
            times = np.exp(belief(candidates, trials, prior).mean)
            t_ref, c_ref = float(times.min()), float((times * [c.hourly_price for c in candidates]).min())
            index = {c.config: i for i, c in enumerate(candidates)}
            scores = [(objective(float(times[index[c.config]]), c.hourly_price, alpha, beta, t_ref, c_ref),
                       c.hourly_price, c.config) for c in affordable]  # fmt: skip
        else:
            spans = _spans(np.array([c.features for c in candidates]))
            scaled = {c.config: np.array(c.features) / spans for c in candidates}
            centre = np.median(np.array(list(scaled.values())), axis=0)
            scores = [(float(np.sum((scaled[c.config] - centre) ** 2)), c.hourly_price, c.config) for c in affordable]
        return Step(min(scores)[2], None, "first trial", 0.0)
    ratio, config = _value(candidates, trials, pending, alpha, beta, budget, prior, affordable)
    # The value rule stands once the surrogate's amplitudes are fitted to this workload's trials: before that its
    # uncertainty is the prior's guess, and a guess too small would stop the search at its first trials. History may
    # steer which trial comes next, never end the search: the belief without it must find no trial worth it either.
    successes = sum(1 for t in trials if t.epoch_time_s)
    if ratio < 1.0 and successes >= FIT_FROM_TRIALS:
        alone = _value(candidates, trials, pending, alpha, beta, budget, Prior(), affordable) if prior.slopes else None
        if alone is None or alone[0] < 1.0:
            return Step(None, chosen, "another trial is expected to save less than it costs", ratio)
        ratio, config = alone
    return Step(config, chosen, "largest expected improvement per dollar", ratio)


def _value(
    candidates: Sequence[Candidate],
    trials: Sequence[Trial],
    pending: tuple[Config, ...],
    alpha: float,
    beta: float,
    budget: Budget,
    prior: Prior,
    affordable: Sequence[Candidate],
) -> tuple[float, Config]:
    """The affordable trial whose expected saving on the job is the most per dollar of its trial, and that ratio.
    References for the objective: the least believed time and epoch cost among the candidates. The saving is over
    the best measured candidate; with none measured yet, over the pending one believed best (the believer's)."""
    b = belief(candidates, trials, prior, pending)
    mean, sd = np.array(b.mean), np.array(b.sd)
    prices = np.array([c.hourly_price for c in candidates])
    t_ref = float(np.exp(mean).min())
    c_ref = float((np.exp(mean) * prices).min())
    index = {c.config: i for i, c in enumerate(candidates)}

    def f(c: Candidate, time_s: float) -> float:
        return objective(time_s, c.hourly_price, alpha, beta, t_ref, c_ref)

    if current := best_measured(candidates, trials, alpha, beta):
        pick = current[0]
        best_f = f(pick, float(np.mean([t.epoch_time_s for t in trials if t.config == pick.config and t.epoch_time_s])))
    else:
        best_f, _, _, pick = min(
            (f(c, math.exp(mean[index[c.config]])), c.hourly_price, c.config, c)
            for c in candidates if c.config in set(pending)
        )  # fmt: skip
    job_cost = budget.job_hours * pick.hourly_price
    scored = []
    for c in affordable:
        i = index[c.config]
        scale = alpha / t_ref + beta * c.hourly_price / c_ref
        gain = expected_improvement(mean[i], sd[i], scale, best_f) / best_f * job_cost
        scored.append((gain / trial_cost(c, budget), -c.hourly_price, c.config))
    ratio, _, config = max(scored)
    return ratio, config


def trial_cost(candidate: Candidate, budget: Budget) -> float:
    return candidate.hourly_price * budget.window_minutes / 60.0


def _spent(priced: Mapping[Config, Candidate], trials: Sequence[Trial], budget: Budget) -> float:
    return sum(trial_cost(priced[t.config], budget) for t in trials)


def search(
    candidates: Sequence[Candidate],
    run_trial: Callable[[Config], float | None],
    alpha: float,
    beta: float,
    budget: Budget,
    prior: Prior = Prior(),
    *,
    spent_dollars: float | None = None,
    spent_minutes: float | None = None,
    width: int = 1,
) -> Search:
    """Propose a batch of up to `width` trials, run them (`run_trial` answers a configuration's steady-state epoch
    time, or None if it failed), repeat until `next_step` stops. `spent_dollars` and `spent_minutes`: what this
    search spent before this call (none if not given); the result's spending adds its own trials to it, a window of
    minutes a batch."""
    trials: list[Trial] = []
    priced = {c.config: c for c in candidates}
    minutes = spent_minutes or 0.0
    while True:
        spent = (spent_dollars or 0.0) + _spent(priced, trials, budget)
        step = next_step(
            candidates, trials, alpha, beta, budget, prior, spent_dollars=spent, spent_minutes=minutes, width=width
        )
        if step.proposal is None:
            break
        trials += [Trial(config, run_trial(config)) for config in step.batch]
        minutes += budget.window_minutes
    reason = step.reason if step.chosen else f"no trial succeeded ({step.reason})"
    return Search(tuple(trials), step.chosen, reason, spent, minutes)
