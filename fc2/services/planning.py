"""The one planner: a job request → the cluster it runs on, priced (`Plan`). The wizard's preview, submit's budget
check, the pipeline's recommend step and its relaunch out of capacity all call `plan`; `explore`, restarts and spot
are to call it too. What the recommender answers is taken as it is — its cluster, its PS and its $/h (PS included,
`recommender.types.Recommendation.hourly_cost`) — nothing here prices it again. Manual's cluster, the one asked, is
priced here from the catalogue, by the rule the recommender prices with (`recommender.service.cluster_price`).

`explore` (recommender/explore_answer.py) answers TrialsNeeded until its search of trial runs has stopped: the plan
is then the search (`Plan.search`, source "explore"): the trial to run now and what the search is expected to cost.
The pipeline runs that trial (fc2/services/trials.py) and plans again with what this job's trials spent
(`trials_spent`), until the plan is a cluster.

A relaunch out of capacity plans again with the worker types no zone had blocked, as SkyPilot's optimizer plans
again with its `blocked_resources`: the same request, the same strategy already planned, the blocked types left out
of L^w.

A spot request's plan is priced at the cluster's expected spot price (`Plan.spot`, by fc2/services/pricing.py's one
rule, `market_hourly`), so that its estimate and submit's budget check reckon what the job will pay."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

import provisioner
from common.numbers import significant
from fc2.models import Job, batch_size_parameter
from fc2.services import pricing, profiling
from fc2.services.requests import JobRequest, SubmitError
from recommender import service
from recommender.models import InstanceType
from recommender.types import (
    MissingProfile,
    MissingProfilesError,
    Recommendation,
    RecommendationError,
    RecommendRequest,
    SearchEstimate,
    TrialsNeeded,
    strategy_request,
)

# Whose records the plan reads beside the platform's: a user, a user's id, or None (the platform's alone).
Owner = AbstractBaseUser | int | None

# The algorithms that run one worker type the user picks (nothing to fail over to when a cloud has none of it); the
# others choose among the worker types (L^w).
ONE_WORKER_TYPE = ("manual", "scala-opt-m")


@dataclass(frozen=True)
class Plan:
    """The cluster a job request gets, known before the job exists and stored on it by its recommend step: the
    recommender's answer, or for Manual the user's own choice, priced as the job will be billed."""

    strategy: str  # what the cluster runs: the request's, or for a strategy left open the one the model chose
    ps_type: str  # what the PS node runs on; "" with no PS (all-reduce), or for a local cluster of no types
    worker_type: str  # "" when none is chosen
    workers: int  # number of workers
    # $/h: the recommender's own price of its answer (PS included), or Manual's from the catalogue — on spot, the
    # expected spot price (`spot`); None where it is not known yet (no worker type chosen for Manual on a typed
    # provider; Scala-Opt's types before their profiling)
    hourly_cost: Decimal | None
    predicted_epoch_time_s: float | None  # measured or predicted; None when nothing is known yet
    source: str  # "manual", "profiling", or the recommender's "measured", "predicted" or "rule"
    explanation: str  # why this cluster, in the recommender's words
    recommendation: dict | None  # recommender.service.as_dict of the answer; None for Manual
    provider: str  # where it runs: its start-up and teardown are billed too (pricing.overheads)
    epoch_time_note: str = ""  # why there is no epoch time, where the plan can say more than "none is known yet"
    missing: tuple[MissingProfile, ...] = ()  # source "profiling": the bandwidth runs to measure before it is known
    search: SearchEstimate | None = None  # source "explore": the trial runs to make before it is known
    # Spot asked: the cluster's expected spot price beside on-demand, or why it is unknown; `hourly_cost` is the
    # spot price where it is known (pricing.market_hourly). None: on-demand.
    spot: pricing.SpotSaving | None = None

    def estimate(self, epochs: int | None) -> pricing.Estimate | None:
        """What the whole job will cost (`pricing.estimate`: start-up + epochs × epoch time + teardown, at its $/h);
        None when the $/h, the epoch time or the epochs is unknown."""
        return pricing.estimate(self.hourly_cost, self.predicted_epoch_time_s, epochs, self.provider)

    def columns(self) -> dict:
        """The plan as the job's columns keep it (`Job.strategy` … `Job.recommendation`)."""
        return {
            "strategy": self.strategy,
            "ps_type": self.ps_type,
            "worker_type": self.worker_type,
            "workers": self.workers,
            "hourly_cost": self.hourly_cost,
            "recommendation": self.recommendation,
        }


def check_workers(provider: str, workers: int, what: str = "") -> None:
    """A worker count (or limit) the provider can run; `what` names whose count it is in the refusal."""
    if workers < 1:
        raise SubmitError("a cluster needs at least 1 worker", "workers")
    if provider in provisioner.PROVIDERS and workers > (limit := provisioner.get(provider).max_workers):
        raise SubmitError(f"{what}the {provider} provider runs at most {limit} workers", "workers")


def explore_unavailable(provider: str) -> str | None:
    """Why explore cannot search on `provider`, or None: its trials are clusters of instance types, which a provider
    whose nodes are all this machine (local) does not have."""
    if provider not in provisioner.PROVIDERS or (entry := provisioner.get(provider)).typed_nodes:
        return None
    return (
        f"explore chooses among instance types by running trials of your code on them, and {entry.label}'s nodes are "
        f"all this machine, of no type: choose Manual, Cost-Opt, Time-Opt or the model for a {provider} job, or run it "
        "on the lab or AWS"
    )


class Spent(NamedTuple):
    """What a job's explore search has spent of its budget so far (fc2/services/trials.py, `spent`)."""

    dollars: float = 0.0  # its trials' cost, summed
    minutes: float = 0.0  # wall-clock: trials that overlap in time count once
    trials: int = 0  # the trials it made, failed ones included


NOTHING_SPENT = Spent()


def plan(
    request: JobRequest,
    owner: Owner = None,
    blocked: Collection[str] = (),
    *,
    trials_spent: Spent = NOTHING_SPENT,
) -> Plan:
    """The cluster `request` runs on for `owner`, from the platform's records and theirs (None: the platform's alone),
    with none of the `blocked` worker types (a cloud had no capacity for them in any zone); for explore, the search
    while it needs a trial, `trials_spent` being what this job's trials spent of its budget so far. Priced in its
    market: spot asked, at the expected spot price (`_on_spot`).
    RecommendationError when the algorithm cannot answer; SubmitError when the provider cannot run the answer."""
    chosen = _cluster(request, owner, blocked, trials_spent)
    return _on_spot(chosen, request) if request.spot else chosen


def _on_spot(chosen: Plan, request: JobRequest) -> Plan:
    """A spot request's plan priced as its job will be billed (pricing.market_hourly): at the cluster's expected spot
    price in the request's region, on-demand where that is unknown; `spot` says which, beside on-demand."""
    if chosen.search:
        return replace(chosen, spot=pricing.SpotSaving(unknown="known once the search has chosen the cluster's types"))
    nodes = pricing.cluster_nodes(chosen.strategy, chosen.worker_type, chosen.workers, chosen.ps_type)
    region = request.region or settings.FC2_AWS_REGION
    saving = pricing.spot_saving(nodes, request.catalog, region, request.spot_max_price)
    return replace(chosen, hourly_cost=pricing.market_hourly(chosen.hourly_cost, saving), spot=saving)


def _cluster(request: JobRequest, owner: Owner, blocked: Collection[str], trials_spent: Spent) -> Plan:
    """`plan`'s cluster at on-demand prices."""
    if request.algorithm == "manual":
        return _manual(request, owner)
    if request.algorithm == "explore" and (reason := explore_unavailable(request.provider)):
        raise SubmitError(reason, "algorithm")
    try:
        answer = service.recommend(recommend_request(request, blocked, trials_spent), request.catalog, owner=owner)
    except TrialsNeeded as needed:
        return _searching(request, needed.search)
    except MissingProfilesError as missing:  # the job's recommend step measures them first (fc2/services/profiling.py)
        if reason := profiling.cannot_profile(request.provider, missing.missing):
            raise SubmitError(reason, "algorithm") from missing
        return Plan(
            strategy=request.strategy,
            ps_type=missing.missing[0].ps_type,
            worker_type=request.worker_type,
            workers=request.workers,
            hourly_cost=None,  # the types are chosen once their bandwidth is measured
            predicted_epoch_time_s=None,
            source="profiling",
            explanation=profiling.plan_text(missing.missing),
            recommendation=None,
            provider=request.provider,
            missing=missing.missing,
        )
    check_workers(request.provider, answer.workers, f"the recommended {answer.workers} workers are too many: ")
    return Plan(
        strategy=_strategy(request, answer),
        ps_type=answer.ps_type or "",
        worker_type=answer.worker_type,
        workers=answer.workers,
        hourly_cost=_amount(answer.hourly_cost),
        predicted_epoch_time_s=answer.predicted_epoch_time_s,
        source=answer.source,
        explanation=answer.explanation,
        recommendation=service.as_dict(answer),
        provider=request.provider,
        epoch_time_note="" if answer.predicted_epoch_time_s is not None else _no_run_yet(request),
    )


def _searching(request: JobRequest, search: SearchEstimate) -> Plan:
    """The plan while explore's search needs a trial: its columns are the trial's cluster (what runs now, not the
    job's: that is chosen once the search stops), with no $/h nor epoch time for the job yet."""
    trial = search.next
    check_workers(request.provider, trial.workers, f"explore's trial of {trial.workers} workers is too many: ")
    return Plan(
        strategy=trial.strategy,
        ps_type=trial.ps_type,
        worker_type=trial.worker_type,
        workers=trial.workers,
        hourly_cost=None,  # the job's cluster is chosen once the search stops
        predicted_epoch_time_s=None,
        source="explore",
        explanation=search.text,
        recommendation=None,
        provider=request.provider,
        epoch_time_note="explore's search chooses the cluster first; these are its next trial's workers and types",
        search=search,
    )


def trial_minutes(provider: str) -> float:
    """One explore trial's billed length in minutes: its training window (FC2_EXPLORE_TRIAL_S) plus the provider's
    start-up and teardown (`pricing.overheads`)."""
    taken = pricing.overheads(provider)
    return (settings.FC2_EXPLORE_TRIAL_S + taken.startup_s + taken.teardown_s) / 60


def known_trial_minutes(provider: str) -> float | None:
    """`trial_minutes` for a provider this platform has, else None: what the recommender's own doors (its API,
    `manage.py recommend`) count a trial's start-up and teardown by (recommender.service.trial_minutes, which
    settings.FC2_TRIAL_MINUTES_RULE names it to)."""
    return trial_minutes(provider) if provider in provisioner.PROVIDERS else None


def trials_at_once(provider: str) -> int:
    """How many of explore's trial runs may overlap in time on `provider`: FC2_EXPLORE_AT_ONCE where its nodes are
    machines of their own (aws), else 1 — the lab's and local's nodes share this machine's CPUs, and trials at once
    would slow and mis-measure each other — and never more clusters than the provider holds workers (each trial has
    at least one; the recommender keeps the batch's workers within `workers_cap`)."""
    entry = provisioner.get(provider)
    if not entry.own_machine:
        return 1
    return max(1, min(settings.FC2_EXPLORE_AT_ONCE, entry.max_workers))


def recommend_request(
    request: JobRequest, blocked: Collection[str] = (), trials_spent: Spent = NOTHING_SPENT
) -> RecommendRequest:
    """What the recommender is asked for a job request: its workers is the limit when it has no budget; a strategy
    left open is the model's (or explore's) to choose; L^w without the `blocked` types, and for a bundle that needs
    CUDA its GPU types alone. explore is also given its weights, its search's budget (the request's, else the
    platform's default), what this job's trials spent of it (`trials_spent`), one trial's length, how many trials may
    overlap and the job's epochs."""
    explore: dict = {}
    if request.algorithm == "explore":
        dollars, minutes = request.search_limits
        explore = {
            "alpha": float(request.alpha),
            "beta": float(request.beta),
            "search_dollars": float(dollars),
            "search_minutes": float(minutes),
            "spent_dollars": float(trials_spent.dollars),
            "spent_minutes": float(trials_spent.minutes),
            "spent_trials": trials_spent.trials,
            "trial_minutes": trial_minutes(request.provider),
            "epochs": request.epochs,
            "workers_cap": provisioner.get(request.provider).max_workers,
            "trials_at_once": trials_at_once(request.provider),
        }
    asked = RecommendRequest(
        algorithm=request.algorithm,
        workload=request.workload,
        budget=float(request.budget) if request.budget is not None else None,
        max_workers=None if request.budget is not None else request.workers,
        ps_type=request.ps_type or None,
        worker_types=tuple(request.worker_types),
        worker_type=request.worker_type or None,
        **strategy_request(request.strategy),
        batch_size=batch_size_parameter(request.parameters),
        # The delay its nodes will have where the provider adds one (the lab); elsewhere not the job's to say.
        latency_ms=request.latency_ms if provisioner.get(request.provider).latency else None,
        **explore,
    )
    cuda = request.bundle.cuda_requirement
    if not blocked and not cuda:
        return asked
    considered = request.worker_types or InstanceType.objects.filter(
        catalog__name=request.catalog, role__in=("worker", "any")
    ).values_list("name", flat=True)
    remaining = tuple(t for t in considered if t not in blocked)
    if not remaining:
        raise RecommendationError(f"no worker type the job may use has capacity (tried {', '.join(blocked)})")
    if cuda:  # a CUDA-only dependency installs on GPU workers alone (jobs.check_gpu refused the rest at submission)
        remaining = gpu_worker_types(request.catalog, remaining)
        if not remaining:
            capacity = f" and capacity (no capacity for {', '.join(blocked)})" if blocked else ""
            raise RecommendationError(
                f"the bundle requires {cuda}, which installs only where CUDA is, and no worker type the job may use "
                f"has a GPU{capacity}"
            )
    return replace(asked, worker_types=remaining, worker_type=None if blocked else asked.worker_type)


def gpu_worker_types(catalog: str, names: Collection[str] | None = None) -> tuple[str, ...]:
    """The worker types of `catalog` with a GPU, cheapest first (of `names` alone, when given)."""
    types = InstanceType.objects.filter(catalog__name=catalog, role__in=("worker", "any"), gpus__gt=0)
    if names is not None:
        types = types.filter(name__in=list(names))
    return tuple(types.values_list("name", flat=True))


def _strategy(request: JobRequest, answer: Recommendation) -> str:
    """The strategy the cluster runs: the one asked, or for one left open the one the model chose (its answer's
    `extra["strategy"]`)."""
    if request.strategy != Job.Strategy.AUTO:
        return request.strategy
    chosen = answer.extra.get("strategy")
    if chosen not in (Job.Strategy.PS, Job.Strategy.MIRRORED):
        raise ValueError(f"the {answer.algorithm} recommender did not choose a strategy for a job that left it open")
    return chosen


def _manual(request: JobRequest, owner: Owner) -> Plan:
    """The cluster the user chose: a PS cluster's PS on the type named for it, else on the workers' type (a PS
    cluster always has its PS node)."""
    ps_type = (request.ps_type or request.worker_type) if request.strategy == Job.Strategy.PS else ""
    epoch_time_s, note = measured_epoch_time(request, ps_type, owner)
    hourly: Decimal | None
    if request.worker_type:
        hourly = _amount(service.cluster_price(request.catalog, request.workers, request.worker_type, ps_type))
    else:  # a local cluster of no types is the machine's own, which costs nothing; elsewhere not known yet
        hourly = None if provisioner.get(request.provider).typed_nodes else Decimal(0)
    where = f"{request.worker_type} " if request.worker_type else ""
    ps = f" and a {ps_type} PS" if ps_type else ""
    return Plan(
        strategy=request.strategy,
        ps_type=ps_type,
        worker_type=request.worker_type,
        workers=request.workers,
        hourly_cost=hourly,
        predicted_epoch_time_s=epoch_time_s,
        source="manual",
        explanation=f"Manual: the {request.workers} {where}workers{ps} you chose."
        + (f" {note}" if epoch_time_s is not None else ""),
        recommendation=None,
        provider=request.provider,
        epoch_time_note="" if epoch_time_s is not None else note,
    )


def _no_run_yet(request: JobRequest) -> str:
    """Why a cluster has no epoch time where nothing was measured or predicted of it: its own run will measure it."""
    if not provisioner.get(request.provider).typed_nodes:
        return (
            f"a {request.provider} cluster is no instance type, so no performance record describes it — the job's own "
            "run will measure this machine"
        )
    return f"no run of {request.workload} on this cluster yet — the job's own run will measure it"


def measured_epoch_time(request: JobRequest, ps_type: str, owner: Owner = None) -> tuple[float | None, str]:
    """The mean epoch time of this workload's measured runs of the very cluster a Manual request asks for — its
    worker type and count, strategy, PS type, the lab's latency and the batch size — and a sentence saying where it
    comes from; or None and why there is none."""
    provider = provisioner.get(request.provider)
    if not provider.typed_nodes:
        return None, _no_run_yet(request)
    if not request.worker_type:
        return None, "choose a worker type to look up its measured runs"
    batch_size = batch_size_parameter(request.parameters)
    latency = request.latency_ms if provider.latency else 0.0
    runs = [
        r
        for r in service.workload_records(request.workload, owner)  # the platform's and the owner's, no one else's
        if r.epoch_time_s is not None
        and (r.instance_type, r.workers, r.strategy) == (request.worker_type, request.workers, request.strategy)
        and (request.strategy != Job.Strategy.PS or r.ps_type == ps_type)
        and float(r.latency_ms or 0.0) == float(latency)
        and (batch_size is None or r.batch_size == batch_size)
    ]
    sizes = {r.batch_size for r in runs}
    if not runs:
        return None, (
            f"{request.workload} has no measured run of {request.workers} × {request.worker_type} "
            f"({request.strategy}{f', PS {ps_type}' if ps_type else ''}) at {latency:g} ms"
            + (f" and batch size {batch_size}" if batch_size else "")
            + " yet — the job's own run will measure it"
        )
    if len(sizes) > 1:
        listed = ", ".join(str(size) for size in sorted(sizes, key=lambda size: size or 0))
        return None, f"its measured runs differ in batch size ({listed}): give a batch_size parameter"
    mean = sum(r.epoch_time_s or 0.0 for r in runs) / len(runs)  # (each has one: see above)
    return mean, (
        f"Its epoch time, {significant(mean)} s, is the mean of {len(runs)} measured run{'s' if len(runs) != 1 else ''}"
        f" of this cluster for {request.workload} at {latency:g} ms."
    )


def _amount(hourly: float | Decimal) -> Decimal:
    """$/h as people write it: 0.231000 -> 0.231, 2.000000 -> 2 (never 2E+0); a float as the decimal it prints as."""
    return Decimal(format(Decimal(str(hourly)).normalize(), "f"))
