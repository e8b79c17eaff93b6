"""`explore`'s answer to a recommendation request — pure, no ORM: the configurations the request allows, the
workload's records as the search's trials, other workloads' records as its history, and from them either the
Recommendation (the search has stopped on a measured configuration) or TrialsNeeded (a trial run must come first),
with what the search is expected to cost from here. The search itself — its belief, the next trial, when to stop — is
recommender/explore.py's; the service (recommender/service.py) loads what this module reads.

- Candidates: the configuration is chosen whole — every worker type of L^w (the request's worker type, else its list,
  else the catalogue's), every count from 1 to n (n from the budget C per PS and worker type, as the other algorithms
  count it, or the maximum number of workers; past 8 on a ladder of about four counts a doubling, `worker_counts`),
  every strategy the request allows (a parameter server, all-reduce, or both when left open) and, through a PS, every PS
  type of L^p (the request's PS type, else its list, else the catalogue's). Where the catalogue gives a list, the types
  another beats on every figure that matters at no more $/h are left out (`dominates`). The latency is the request's;
  the counts stop at the provider's limit (`workers_cap`); and at most MAX_CANDIDATES configurations are weighed (more:
  the request is refused, saying how to narrow it).
- Trials: the workload's records of those configurations at the request's batch size (any batch size when it names
  none), whatever measured them (imported, a job, a profiling run with an epoch time, a trial); a run that failed is
  a trial that failed (never tried again). What this search spent is the request's `spent_dollars`/`spent_minutes`:
  records made before it cost it nothing.
- History: other workloads' records (those the user may read, the service's concern) shape the prior only
  (`explore.fit_prior`), each workload at each batch size a history of its own.
- Trials at once: up to the request's `trials_at_once` trials run together (`SearchEstimate.also` besides `next`),
  their workers together within the provider's limit (`workers_cap`); minutes are wall-clock, a window a batch.
- The job's length, what a better cluster saves a share of: its epochs × the pick's believed epoch time; when the
  job's epochs are not known, JOB_HOURS_UNKNOWN_EPOCHS (one hour), said in the answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from common.numbers import significant, usd
from recommender import algorithms, explore
from recommender.explore import Budget, Candidate, Config, HistoryRecord, Prior, Trial
from recommender.types import (
    MAX_WORKERS,
    InstanceSpec,
    PerfRecord,
    Recommendation,
    RecommendationError,
    RecommendRequest,
    SearchEstimate,
    TrialConfig,
    TrialsNeeded,
)
from recommender.types import Candidate as AnswerCandidate

# The z of an 80 % interval of log epoch time (its 10th and 90th percentiles).
Z80 = 1.2816
# The job's length when its epochs are not known: what a better cluster saves is weighed against one hour of it.
JOB_HOURS_UNKNOWN_EPOCHS = 1.0
# The worker counts weighed (`worker_counts`): each up to EVERY_COUNT_UP_TO, then a ladder of about
# COUNTS_PER_DOUBLING counts a doubling — 1 to 100 workers are 23 counts, not 100.
EVERY_COUNT_UP_TO = 8
COUNTS_PER_DOUBLING = 4
# The most configurations one search weighs: its belief is computed over them all for each trial and each step of
# the estimate's replay (a cloud's catalogue — 61 worker types and 11 PS types on aws-us-east-1 once dominated ones
# are left out — up to 100 workers: about 16,000, a few seconds a plan).
MAX_CANDIDATES = 20000
# The most trials the estimate simulates (each one fits the surrogate): the budget stops a search long before.
MAX_SIMULATED = 30


def answer(
    request: RecommendRequest,
    specs: Sequence[InstanceSpec],
    records: Sequence[PerfRecord],
    history: Sequence[PerfRecord] = (),
) -> Recommendation:
    """The measured configuration the search stopped on, or TrialsNeeded with the trial to run now, or a
    RecommendationError saying why neither can be (every trial failed, the budget cannot buy a trial)."""
    _check(request)
    catalog = {spec.name: spec for spec in specs}
    candidates = explore.make_candidates(configurations(request, specs), catalog)
    trials = own_trials(request, records, {c.config for c in candidates})
    prior = explore.fit_prior(history_records(history, request.workload), catalog)
    return _Search(request, candidates, trials, prior).answer()


def _check(request: RecommendRequest) -> None:
    if not request.workload:
        raise RecommendationError("explore needs the workload whose code its trials run (workload)")
    alpha, beta = request.alpha, request.beta
    if not (math.isfinite(alpha) and math.isfinite(beta) and alpha >= 0 and beta >= 0 and alpha + beta > 0):
        raise RecommendationError(f"alpha and beta must be non-negative numbers, not both 0 (not {alpha}, {beta})")
    amounts = {
        "search budget in $": request.search_dollars,
        "search budget in minutes": request.search_minutes,
        "$ spent": request.spent_dollars,
        "minutes spent": request.spent_minutes,
    }
    for name, value in amounts.items():
        if value is None or not (math.isfinite(value) and value >= 0):
            raise RecommendationError(f"explore's {name} must be a number of at least 0, not {value}")
    if request.trial_minutes is None or not (math.isfinite(request.trial_minutes) and request.trial_minutes > 0):
        raise RecommendationError(f"a trial's length must be a positive number of minutes, not {request.trial_minutes}")
    # Counts come from callers that may pass any number (the API's JSON): a whole number is checked, not assumed.
    counts: dict[str, tuple[object, int]] = {
        "trials at once": (request.trials_at_once, 1),
        "trials made": (request.spent_trials, 0),
    }
    for name, (count, least) in counts.items():
        if not isinstance(count, int) or count < least:
            raise RecommendationError(f"explore's {name} must be a whole number of at least {least}, not {count}")
    if request.epochs is not None and request.epochs < 1:
        raise RecommendationError(f"the job's epochs must be at least 1, not {request.epochs}")


# --- what the request allows ------------------------------------------------------------------------------------------


def configurations(request: RecommendRequest, specs: Sequence[InstanceSpec]) -> list[Config]:
    """Every configuration the request allows (module docstring), or the reason there is none."""
    index = {spec.name: spec for spec in specs}
    workers = _types([request.worker_type] if request.worker_type else list(request.worker_types), index, "worker")
    all_reduce = request.all_reduce  # (a PyTorch request's parameter_server is False: algorithms.recommend)
    strategies = {True: ("ps",), False: (all_reduce,), None: ("ps", all_reduce)}[request.parameter_server]
    latency = float(request.latency_ms or 0.0)
    configs: list[Config] = []
    refusals: list[RecommendationError] = []
    for strategy in strategies:
        ps_types: list[InstanceSpec | None] = [None]
        if strategy == "ps":
            ps_types = list(_types([request.ps_type] if request.ps_type else list(request.ps_types), index, "ps"))
        for ps in ps_types:
            for worker in workers:
                try:
                    n = algorithms.workers_from_limit(request, ps, worker)
                except RecommendationError as refused:  # this PS and worker type: not one worker within the budget
                    refusals.append(refused)
                    continue
                ps_name = ps.name if ps else ""
                counts = worker_counts(min(n, request.workers_cap or MAX_WORKERS, MAX_WORKERS))
                configs += [Config(worker.name, ps_name, k, strategy, latency) for k in counts]
    if not configs:
        raise refusals[0]
    if len(configs) > MAX_CANDIDATES:
        raise RecommendationError(
            f"explore would choose among {len(configs):,} configurations, more than the {MAX_CANDIDATES:,} its search "
            "weighs: name the worker types it may use, a PS type or the strategy, or give a lower worker limit"
        )
    return configs


def worker_counts(n: int) -> list[int]:
    """The worker counts weighed up to n: every count up to EVERY_COUNT_UP_TO, then about COUNTS_PER_DOUBLING a
    doubling (each some 19 % above the last: an epoch time that scales with the count moves less between two), and n.

    >>> worker_counts(5), worker_counts(20), worker_counts(100)[-6:]
    ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, 16, 19, 20], [45, 54, 64, 76, 91, 100])
    """
    counts = list(range(1, min(n, EVERY_COUNT_UP_TO) + 1))
    k = 1
    while (count := round(EVERY_COUNT_UP_TO * 2 ** (k / COUNTS_PER_DOUBLING))) < n:
        if count > counts[-1]:
            counts.append(count)
        k += 1
    return counts if counts[-1] == n else [*counts, n]


def _types(names: list[str], index: Mapping[str, InstanceSpec], role: str) -> list[InstanceSpec]:
    """L^w or L^p: the names given; else the catalogue's types for the role that no other of them dominates (a
    cloud's catalogue lists a hundred types, most of them beaten on every figure by another at no more $/h); an
    unknown name is refused."""
    label = "PS" if role == "ps" else role
    offered = [spec for spec in index.values() if spec.role in (role, "any")]
    if unknown := [name for name in names if name not in index]:
        raise RecommendationError(
            f"unknown {label} type {', '.join(unknown)}; the catalogue's {label} types are "
            f"{', '.join(spec.name for spec in offered) or 'none'}"
        )
    if names:
        return [index[name] for name in dict.fromkeys(names)]
    if not offered:
        raise RecommendationError(f"the catalogue offers no {label} types")
    return [spec for spec in offered if not any(dominates(other, spec, role) for other in offered)]


def dominates(a: InstanceSpec, b: InstanceSpec, role: str) -> bool:
    """Whether type `a` makes type `b` pointless for `role`: no dearer, and at least as good on every figure that
    matters there — a PS is its link (network capacity); a worker its vCPUs, ECUs (where `b`'s are published),
    memory, GPUs and link. Of two alike, the cheaper (then the first by name) stands.

    >>> small, big = InstanceSpec("a", 0.1, vcpu=2, network_mbps=500), InstanceSpec("b", 0.2, vcpu=4, network_mbps=500)
    >>> dominates(small, big, "ps"), dominates(small, big, "worker"), dominates(big, small, "ps")
    (True, False, False)
    """
    if a is b or (a.hourly_price, a.name) >= (b.hourly_price, b.name):
        return False
    figures = ["network_mbps"] if role == "ps" else ["network_mbps", "vcpu", "memory_gib", "gpus", "ecu"]
    return all(
        getattr(b, name) is None or (getattr(a, name) is not None and getattr(a, name) >= getattr(b, name))
        for name in figures
    )


def record_config(record: PerfRecord) -> Config | None:
    """The configuration a record ran, as the search names them (its all-reduce as its framework names it:
    `algorithms.all_reduce_of`); None where it does not say (no type or count)."""
    if not record.instance_type or not record.workers:
        return None
    strategy = "ps" if algorithms.runs_through_ps(record) else algorithms.all_reduce_of(record)
    return Config(
        record.instance_type,
        record.ps_type if strategy == "ps" else "",
        record.workers,
        strategy,
        float(record.latency_ms or 0.0),
    )


def own_trials(request: RecommendRequest, records: Sequence[PerfRecord], allowed: set[Config]) -> tuple[Trial, ...]:
    """The workload's records of allowed configurations at the request's batch size, as the search's trials: a
    measured time, or a failed run (no time; a bandwidth profile without a time is no run of the code's epochs)."""
    trials = []
    for record in records:
        if record.workload != request.workload or not _same_batch(request, record):
            continue
        if record.epoch_time_s is None and record.source == "profiled":
            continue
        if (config := record_config(record)) in allowed:
            trials.append(Trial(config, record.epoch_time_s))
    return tuple(trials)


def _same_batch(request: RecommendRequest, record: PerfRecord) -> bool:
    return request.batch_size is None or record.batch_size == request.batch_size


def history_records(records: Sequence[PerfRecord], workload: str) -> tuple[HistoryRecord, ...]:
    """Other workloads' measured runs, each workload at each batch size a history of its own (its scaling shape)."""
    return tuple(
        HistoryRecord(f"{r.workload} at batch size {r.batch_size}", config, r.epoch_time_s)
        for r in records
        if r.workload != workload and r.epoch_time_s and (config := record_config(r)) is not None
    )


# --- the search from here -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Search:
    request: RecommendRequest
    candidates: tuple[Candidate, ...]
    trials: tuple[Trial, ...]
    prior: Prior

    def answer(self) -> Recommendation:
        request = self.request
        belief = explore.belief(self.candidates, self.trials, self.prior)
        budget = self._budget(belief)
        step = self._next(self.trials, budget, request.spent_dollars, request.spent_minutes)
        if step.proposal is not None:
            raise TrialsNeeded(self._estimate(step, belief, budget))
        if step.chosen is None:
            raise RecommendationError(self._nothing_measured(step, budget))
        return self._recommendation(step.chosen, step.reason, belief)

    def _next(self, trials: Sequence[Trial], budget: Budget, dollars: float, minutes: float) -> explore.Step:
        """The search's next batch of trials (or why it stops), after `trials`, `dollars` and `minutes` spent."""
        request = self.request
        return explore.next_step(
            self.candidates, trials, request.alpha, request.beta, budget, self.prior,
            spent_dollars=dollars, spent_minutes=minutes, width=request.trials_at_once, max_workers=request.workers_cap,
        )  # fmt: skip

    @cached_property
    def _index(self) -> dict[Config, int]:
        return {c.config: i for i, c in enumerate(self.candidates)}

    def _pick(self, belief: explore.Belief) -> int:
        """The candidate the job would run on now: the best measured one, else the one believed best."""
        if current := explore.best_measured(self.candidates, self.trials, self.request.alpha, self.request.beta):
            return self._index[current[0].config]
        times = np.exp(np.array(belief.mean))
        prices = np.array([c.hourly_price for c in self.candidates])
        t_ref, c_ref = float(times.min()), float((times * prices).min()) or 1.0
        scores = [
            (explore.objective(float(t), float(p), self.request.alpha, self.request.beta, t_ref, c_ref), float(p), i)
            for i, (t, p) in enumerate(zip(times, prices, strict=True))
        ]
        return min(scores)[2]

    def _budget(self, belief: explore.Belief) -> Budget:
        request = self.request
        assert request.search_dollars is not None and request.search_minutes is not None  # _check
        assert request.trial_minutes is not None
        if request.epochs:
            job_hours = request.epochs * math.exp(belief.mean[self._pick(belief)]) / 3600
        else:
            job_hours = JOB_HOURS_UNKNOWN_EPOCHS
        return Budget(request.search_dollars, request.search_minutes, request.trial_minutes, job_hours)

    def _trial_config(self, config: Config) -> TrialConfig:
        price = self.candidates[self._index[config]].hourly_price
        return TrialConfig(config.instance_type, config.workers, config.ps_type, config.strategy, round(price, 4))

    def _known(self) -> bool:
        """Whether the belief says anything of this workload's times: a successful run of it, or a prior."""
        return bool(self.prior.slopes) or any(t.epoch_time_s for t in self.trials)

    def _estimate(self, step: explore.Step, belief: explore.Belief, budget: Budget) -> SearchEstimate:
        request = self.request
        assert step.proposal is not None
        trials, dollars, minutes = self._simulate(step.batch, belief, budget)
        dollars_left = max(budget.dollars - request.spent_dollars, 0.0)
        minutes_left = max(budget.minutes - request.spent_minutes, 0.0)
        tried = {t.config for t in self.trials}
        untried = [c for c in self.candidates if c.config not in tried]
        cheapest = min(explore.trial_cost(c, budget) for c in untried)
        at_most = min(
            len(untried),
            math.floor(minutes_left / budget.window_minutes + 1e-9) * request.trials_at_once,
            math.floor(dollars_left / cheapest + 1e-9) if cheapest > 0 else len(untried),
        )
        predicted, predicted_config = None, None
        if self._known():
            i = self._pick(belief)
            predicted = _interval(belief, i)
            predicted_config = self._trial_config(self.candidates[i].config)
        made = request.spent_trials
        succeeded = any(t.epoch_time_s for t in self.trials)
        reason = step.reason if succeeded else f"no run of {request.workload} at this point has a time yet"
        batch = [self._trial_config(config) for config in step.batch]
        cost = sum(explore.trial_cost(self.candidates[self._index[config]], budget) for config in step.batch)
        now = trial_text(batch[0]) if len(batch) == 1 else f"{len(batch)} trials at once, {_listed(batch)},"
        text = (
            f"explore runs trials of your code before choosing: {'first' if not made else 'next'} {now} for about "
            f"{significant(budget.window_minutes)} min ({usd(cost)}); from here the search is expected to make "
            f"{trials} trial{'s' if trials != 1 else ''}, about {usd(dollars)} and {significant(minutes)} min (at "
            f"most {usd(dollars_left)} and {significant(minutes_left)} min)."
        )
        return SearchEstimate(
            workload=request.workload,
            next=batch[0],
            also=tuple(batch[1:]),
            candidates=len(self.candidates),
            trials_made=made,
            trials_at_most=at_most,
            dollars=dollars,
            dollars_at_most=dollars_left,
            minutes=minutes,
            minutes_at_most=minutes_left,
            trial_minutes=budget.window_minutes,
            reason=reason,
            predicted=predicted,
            predicted_config=predicted_config,
            text=text,
        )

    def _simulate(self, first: tuple[Config, ...], belief: explore.Belief, budget: Budget) -> tuple[int, float, float]:
        """The search from here under the current belief, batch by batch from `first`, each trial answering its
        believed epoch time: (trials, $, minutes — a window a batch) until it stops."""
        request, index = self.request, self._index
        trials, dollars, minutes = list(self.trials), 0.0, 0.0
        batch = first
        made = 0
        while batch and made < MAX_SIMULATED:
            trials += [Trial(config, math.exp(belief.mean[index[config]])) for config in batch]
            dollars += sum(explore.trial_cost(self.candidates[index[config]], budget) for config in batch)
            minutes += budget.window_minutes
            made += len(batch)
            batch = self._next(trials, budget, request.spent_dollars + dollars, request.spent_minutes + minutes).batch
        return made, dollars, minutes

    def _nothing_measured(self, step: explore.Step, budget: Budget) -> str:
        request = self.request
        if self.trials and not any(t.epoch_time_s for t in self.trials):
            failed = len({t.config for t in self.trials})
            return (
                f"explore found no cluster that runs {request.workload}: every run of it here failed ({failed} "
                f"configuration{'s' if failed != 1 else ''}), and {step.reason}"
            )
        cheapest = min(self.candidates, key=lambda c: explore.trial_cost(c, budget))
        return (
            f"explore cannot make a first trial of {request.workload}: the cheapest, "
            f"{trial_text(self._trial_config(cheapest.config))}, costs {usd(explore.trial_cost(cheapest, budget))} "
            f"for {significant(budget.window_minutes)} min, and the search's budget is {usd(budget.dollars)} and "
            f"{significant(budget.minutes)} min ({usd(request.spent_dollars)} and {significant(request.spent_minutes)}"
            " min spent)"
        )

    def _recommendation(self, chosen: Config, reason: str, belief: explore.Belief) -> Recommendation:
        request, index = self.request, self._index
        times: dict[Config, list[float]] = {}
        for t in self.trials:
            if t.epoch_time_s:
                times.setdefault(t.config, []).append(t.epoch_time_s)
        measured = [
            AnswerCandidate(
                worker_type=config.instance_type,
                workers=config.workers,
                epoch_time_s=float(np.mean(runs)),
                hourly_cost=round(self.candidates[index[config]].hourly_price, 4),
                source=algorithms.MEASURED,
                basis=algorithms.MEASURED,
                interval_s=_interval(belief, index[config])[1:],
                strategy=config.strategy,
                ps_type=config.ps_type,
            )
            for config, runs in sorted(times.items())
        ]
        pick = next(c for c in measured if (c.worker_type, c.workers, c.strategy, c.ps_type) == (
            chosen.instance_type, chosen.workers, chosen.strategy, chosen.ps_type))  # fmt: skip
        low, high = _interval(belief, index[chosen])[1:]
        runs = len(times[chosen])
        first_plan = request.spent_dollars == 0 and request.spent_minutes == 0
        stopped = (
            f"No trial is needed: the {len(self.trials)} record{'s' if len(self.trials) != 1 else ''} of this "
            f"workload here are enough ({reason})."
            if first_plan
            else f"The search stopped: {reason}."
        )
        explanation = (
            f"explore: {trial_text(self._trial_config(chosen))}, measured at {significant(pick.epoch_time_s or 0)} s "
            f"an epoch (the mean of {runs} run{'s' if runs != 1 else ''}; 80 % interval {significant(low)}–"
            f"{significant(high)} s), is {goal_text(request.alpha, request.beta)} of the {len(measured)} "
            f"configuration{'s' if len(measured) != 1 else ''} measured among the {len(self.candidates)} allowed. "
            f"{stopped}"
        )
        if not request.epochs:
            explanation += (
                f" (The job's epochs are not known: a better cluster's saving was weighed over "
                f"{significant(JOB_HOURS_UNKNOWN_EPOCHS)} h of it.)"
            )
        return Recommendation(
            algorithm="explore",
            ps_type=chosen.ps_type or None,
            worker_type=chosen.instance_type,
            workers=chosen.workers,
            hourly_cost=pick.hourly_cost,
            predicted_epoch_time_s=pick.epoch_time_s,
            source=algorithms.MEASURED,
            explanation=explanation,
            candidates=tuple(measured),
            extra={
                "search": {
                    "reason": reason,
                    "trials": len(self.trials),
                    "interval_s": [low, high],
                    "candidates": len(self.candidates),
                    "no_trial_needed": first_plan,
                },
                "strategy": chosen.strategy,
            },
        )


def _interval(belief: explore.Belief, i: int) -> tuple[float, float, float]:
    """(believed epoch time, 80 % interval's low, high) of candidate i, in seconds."""
    mean, sd = belief.mean[i], belief.sd[i]
    return math.exp(mean), math.exp(mean - Z80 * sd), math.exp(mean + Z80 * sd)


def trial_text(config: TrialConfig) -> str:
    """A configuration in words: "3 × c4.xlarge with an m4.large PS at $0.818/h", "2 × c4.xlarge, all-reduce, at
    $0.462/h"."""
    cluster = f"{config.workers} × {config.worker_type}"
    how = f" with a {config.ps_type} PS" if config.ps_type else ", all-reduce,"
    return f"{cluster}{how} at ${significant(config.hourly_cost, 4)}/h"


def _listed(configs: Sequence[TrialConfig]) -> str:
    """Trials in words, the last after "and".

    >>> a, b = TrialConfig("c4.xlarge", 2, "", "mirrored", 0.462), TrialConfig("m4.large", 1, "m4.large", "ps", 0.2)
    >>> _listed([a, b])
    '2 × c4.xlarge, all-reduce, at $0.462/h and 1 × m4.large with a m4.large PS at $0.2/h'
    """
    words = [trial_text(c) for c in configs]
    return ", ".join(words[:-1]) + " and " + words[-1]


def goal_text(alpha: float, beta: float) -> str:
    """What "best" meant, in words."""
    if beta == 0:
        return "the fastest"
    if alpha == 0:
        return "the cheapest per epoch"
    return f"the best by {significant(alpha)}·time + {significant(beta)}·cost (each relative to the least)"
