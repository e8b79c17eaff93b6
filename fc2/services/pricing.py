"""What a job costs, by one rule for every page: the one estimate of a whole job's cost before it runs (its cluster is
billed from the start of its launch to the end of its teardown, so the estimate is the training — epochs × epoch time
— plus the provider's start-up and teardown, as this platform measured them), its projection while it runs, and its
cost so far (`cost_summary`: the job page, the jobs API and the admin dashboard). A cluster's $/h is the plan's
(fc2/services/planning.py), priced once.

The market a cluster runs in prices it too, by one rule (`market_hourly`): on-demand, the catalogue's price; on spot,
the expected spot price — its types' latest spot prices in the region's cheapest zone, raised for interruptions
(`spot_saving`, as the wizard shows it) — where that is known. The plan of a spot job is priced so (its estimate and
submit's budget check), and each launch of its cluster bills it from then on at its market's price then (`bill`: the
job's `hourly_cost` and `rates`), the on-demand price once it fell back to on-demand: its cost so far, projection and
whole-job budget follow."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

import provisioner
from fc2.models import Job, JobEvent, Projection
from recommender import service
from recommender.models import InstanceType
from recommender.pricing import SPOT_INTERRUPTION_OVERHEAD, PricingError, SpotQuote, fetch_spot_quotes


def ps_node_type(job: Job) -> str:
    """The instance type a job's PS node runs on: its planned PS type — for a job planned before the planner named
    it, the workers' type (a PS cluster always has its PS node). "" for a cluster with no PS, or of no types."""
    if job.strategy != Job.Strategy.PS:
        return ""
    return job.ps_type or job.worker_type


def cluster_nodes(strategy: str, worker_type: str, workers: int, ps_type: str = "") -> dict[str, int]:
    """Instance type -> how many of a cluster's nodes run on it: its workers, and a PS cluster's PS node (on the
    workers' type where it names none); empty for a cluster of no type.

    >>> cluster_nodes("ps", "c4.xlarge", 2, "m4.large"), cluster_nodes("ps", "c4.xlarge", 2)
    ({'c4.xlarge': 2, 'm4.large': 1}, {'c4.xlarge': 3})
    >>> cluster_nodes("mirrored", "c4.xlarge", 2, "m4.large"), cluster_nodes("mirrored", "", 2)
    ({'c4.xlarge': 2}, {})
    """
    if not worker_type:
        return {}
    nodes = {worker_type: workers}
    if strategy == Job.Strategy.PS:
        ps = ps_type or worker_type
        nodes[ps] = nodes.get(ps, 0) + 1
    return nodes


# The jobs a provider's overheads are the medians of: its latest, so that they follow the cloud (a slow start or
# teardown among them moves a median little).
OVERHEADS_MEASURED = 20
# Seconds of a job's cluster before its epochs, per provider, until a job of it ran here: making the nodes and
# bootstrapping them (copying the wheel and the dataset, installing), then each node's own start (a Python process,
# TensorFlow's ~5 s import, the strategy's set-up, the first trace). Local: measured here, 10.8–25.7 s (median 13.2 s)
# over three 2-epoch digits jobs on a busy 2-core machine; lab: network namespaces reached over SSH (the lab
# jobs were billed 70–130 s beyond their epochs); aws: EC2 instances booting (about a minute) and installing
# TensorFlow (~80 s). The first job of a provider measures its own, and from then on the estimate says so.
DEFAULT_STARTUP_S = {"local": 15.0, "lab": 90.0, "aws": 300.0}


@dataclass(frozen=True)
class Overheads:
    """What a provider's cluster is billed for beyond the training, each the median of its latest jobs' here, or
    the provider's default while none has one."""

    provider: str
    # From the start of the launch to the end of the training, less its epochs (epochs × its epoch time): the nodes'
    # making and bootstrapping, and each run's own start, which its steady epoch time leaves out.
    startup_s: float
    teardown_s: float  # from the end of the training (or of the job) to the end of the teardown
    startups: int  # jobs the start-up is the median of; 0: the default
    teardowns: int  # jobs the teardown is the median of; 0: the provider's own figure

    @property
    def source(self) -> str:
        """Where the figures come from, in a clause a page or a refusal can quote."""
        if self.startups == self.teardowns:
            return "start-up and teardown: " + (
                f"the medians of this platform's latest {self.startups} {self.provider} job"
                f"{'s' if self.startups != 1 else ''}"
                if self.startups
                else f"the {self.provider} provider's defaults, until a job of it has run here"
            )
        return f"start-up: {self._said(self.startups)}; teardown: {self._said(self.teardowns)}"

    def _said(self, count: int) -> str:
        if not count:
            return f"the {self.provider} provider's default, until a job of it has run here"
        return f"the median of this platform's latest {count} {self.provider} job{'s' if count != 1 else ''}"


def overheads(provider: str) -> Overheads:
    """The provider's start-up — the median of its latest OVERHEADS_MEASURED jobs that trained and measured their
    epoch time: from the start of the launch to the end of the training (the chief's completion) less epochs × that
    epoch time; else DEFAULT_STARTUP_S — and its teardown (`teardown_s`). Launch → running alone would leave out each
    run's own start (on local, ~10 s of a 2-epoch digits job whose epochs take 0.35 s)."""
    trained = (
        Job.objects.filter(provider=provider, launched_at__isnull=False, epochs__isnull=False)
        .annotate(trained_at=Subquery(_completed()[:1]))
        .filter(trained_at__gte=F("launched_at"), figures__epoch_time_s__isnull=False)
        .order_by("-trained_at")
    )
    startups = [
        spent
        for launched, done, epochs, epoch_s in trained.values_list(
            "launched_at", "trained_at", "epochs", "figures__epoch_time_s"
        )[:OVERHEADS_MEASURED]
        if (spent := (done - launched).total_seconds() - (epochs or 0) * float(epoch_s)) >= 0  # (filtered: epochs)
    ]
    teardown, teardowns = _teardown(provider)
    return Overheads(
        provider=provider,
        startup_s=statistics.median(startups) if startups else DEFAULT_STARTUP_S.get(provider, 0.0),
        teardown_s=teardown,
        startups=len(startups),
        teardowns=teardowns,
    )


def _completed() -> QuerySet[JobEvent, Any]:
    """When a job's training ended: its chief's completion (the move to collecting)."""
    return JobEvent.objects.filter(job=OuterRef("pk"), state=Job.State.COLLECTING).order_by("at").values("at")


def teardown_s(provider: str) -> float:
    """Seconds a cluster of the provider is billed for after its job's training ended: the median of its latest
    OVERHEADS_MEASURED jobs whose cluster is gone — from the end of its training (the chief's completion; the job's
    end where it never completed) to the end of its teardown — else the provider's own figure (`Provider.teardown_s`).
    What the estimate adds, and what the budget watchdog (fc2/services/sweep.py) stops a job that much earlier for."""
    return _teardown(provider)[0]


def _teardown(provider: str) -> tuple[float, int]:
    gone = (
        Job.objects.filter(provider=provider, finished_at__isnull=False, torn_down_at__isnull=False)
        .annotate(trained_at=Coalesce(Subquery(_completed()[:1]), F("finished_at")))
        .filter(torn_down_at__gte=F("trained_at"))
        .order_by("-torn_down_at")
    )
    taken = [
        (torn_down - trained).total_seconds()
        for trained, torn_down in gone.values_list("trained_at", "torn_down_at")[:OVERHEADS_MEASURED]
    ]
    if not taken:
        known = provisioner.PROVIDERS.get(provider)
        return (known.teardown_s if known else 0.0), 0
    return statistics.median(taken), len(taken)


@dataclass(frozen=True)
class Estimate:
    """What a whole job will cost: its cluster's $/h over the time it is billed for — the provider's start-up, the
    training (epochs × epoch time) and the provider's teardown. At the catalogue's prices: an estimate, not a bill."""

    total: Decimal  # $
    training_s: float  # epochs × epoch time
    overheads: Overheads  # the start-up and teardown it adds, and where they come from

    @property
    def basis(self) -> str:
        """How it was reckoned, in one sentence."""
        o = self.overheads
        return (
            f"Billed from launch to teardown: {o.startup_s:.0f} s start-up + {self.training_s:.0f} s training + "
            f"{o.teardown_s:.0f} s teardown ({o.source})."
        )


def estimate(hourly: Decimal | None, epoch_time_s: float | None, epochs: int | None, provider: str) -> Estimate | None:
    """The whole job's estimated cost — the wizard's, the review's, submit's budget check's — or None when its $/h,
    its epoch time or its epochs is not known."""
    if hourly is None or epoch_time_s is None or not epochs:
        return None
    taken = overheads(provider)
    training_s = epoch_time_s * epochs
    billed = Decimal(str(taken.startup_s)) + Decimal(str(training_s)) + Decimal(str(taken.teardown_s))
    return Estimate(total=hourly * billed / 3600, training_s=training_s, overheads=taken)


# How stale a job page's overheads may be: they are medians of the provider's latest jobs, which one more job moves
# little, and the page polls every few seconds.
OVERHEADS_CACHE_S = 60


def projection(job: Job) -> Projection | None:
    """What the job will have cost once its cluster is gone (`Job.projection`), with its provider's start-up and
    teardown, the overheads its estimate took before it ran: a queued job's projection is its estimate."""
    if job.hourly_cost is None or job.is_terminal:
        return job.projection()
    key = f"fc2:overheads:{job.provider}"
    taken = cache.get_or_set(key, lambda: overheads(job.provider), OVERHEADS_CACHE_S) or overheads(job.provider)
    return job.projection(startup_s=taken.startup_s, teardown_s=taken.teardown_s)


def cost_summary(job: Job) -> dict:
    """The job's costs as its JSON gives them (`Job.cost_summary`), projected with its provider's overheads."""
    return job.cost_summary(projection(job))


# How long a region's spot quotes are reused: the wizard's live panel asks at each change of its fields, and spot
# prices move over hours, not seconds.
SPOT_QUOTES_CACHE_S = 600


@dataclass(frozen=True)
class SpotSaving:
    """A cluster's expected price on spot beside on-demand (the wizard's, before the job runs), or why it is unknown:
    each node at its type's spot quote (recommender.pricing.SpotQuote: the region's cheapest zone, raised for
    interruptions) beside its on-demand price in the catalogue."""

    quotes: tuple[SpotQuote, ...] = ()  # of the cluster's types
    spot: float | None = None  # $/h expected, the interruptions' overhead included
    on_demand: float | None = None  # $/h
    unknown: str = ""  # why there is no saving to show; "" when there is
    over_max: str = ""  # a type whose spot price is above the max price asked: no spot capacity at that price

    @property
    def saving(self) -> float | None:
        """The expected saving as a share of the on-demand price (negative: spot costs more)."""
        return 1 - self.spot / self.on_demand if self.spot is not None and self.on_demand else None

    @property
    def overhead(self) -> float:
        return SPOT_INTERRUPTION_OVERHEAD

    @property
    def billable(self) -> bool:
        """Whether the cluster is billed at its expected spot price (`market_hourly`): known, and not over the max
        price asked."""
        return self.spot is not None and not self.over_max


def spot_saving(nodes: dict[str, int], catalog: str, region: str, max_price: Decimal | None = None) -> SpotSaving:
    """The expected spot price of a cluster of `nodes` (type -> how many) beside on-demand: the catalogue's on-demand
    prices, the region's spot price history (read from AWS once per SPOT_QUOTES_CACHE_S); `unknown` says why not."""
    if not nodes:
        return SpotSaving(unknown="no instance type chosen yet: choose a worker type to price spot")
    prices = dict(
        InstanceType.objects.filter(catalog__name=catalog, name__in=nodes).values_list("name", "hourly_price")
    )
    on_demand = {name: float(prices[name]) if prices.get(name) else None for name in sorted(nodes)}
    key = f"fc2:spot:{region}:{','.join(on_demand)}"
    try:
        quotes = cache.get(key)
        if quotes is None:
            quotes = fetch_spot_quotes(region, on_demand)
            cache.set(key, quotes, SPOT_QUOTES_CACHE_S)
    except PricingError as error:
        return SpotSaving(unknown=f"the spot price is unknown: {error}")
    by_type = {quote.instance_type: quote for quote in quotes}
    if missing := [name for name in on_demand if name not in by_type]:
        return SpotSaving(tuple(quotes), unknown=f"{region} has no spot price for {', '.join(missing)}")
    over = [q.instance_type for q in quotes if max_price is not None and q.spot_price > float(max_price)]
    spot = sum(by_type[name].expected * count for name, count in nodes.items())
    if unpriced := [name for name, price in on_demand.items() if price is None]:
        unknown = f"the {catalog} catalogue has no on-demand price of {', '.join(unpriced)} to set it beside"
        return SpotSaving(tuple(quotes), spot, unknown=unknown, over_max=", ".join(over))
    total = sum((on_demand[name] or 0.0) * count for name, count in nodes.items())
    return SpotSaving(tuple(quotes), spot, total, over_max=", ".join(over))


SPOT, ON_DEMAND = "spot", "on-demand"  # the markets a cluster is billed in (`Job.rates`)
# $/h are kept to 6 places: EC2 quotes spot prices so (`Job.hourly_cost`)
HOURLY_PLACES = Decimal("0.000001")


def market_hourly(on_demand: Decimal | None, saving: SpotSaving | None) -> Decimal | None:
    """The $/h a cluster is billed at in its market — the one rule of a spot job's estimate, running cost,
    projection and budget: on-demand (`saving` None) its on-demand price; on spot its expected spot price
    (`SpotSaving.spot`: the region's latest, raised by SPOT_INTERRUPTION_OVERHEAD for interruptions) — else, where
    that is unknown or over the max price asked (no spot capacity at it: the job falls back or waits), the
    on-demand price, which bounds it.

    >>> market_hourly(Decimal("0.462"), None), market_hourly(Decimal("0.462"), SpotSaving(spot=0.0924, on_demand=0.462))
    (Decimal('0.462'), Decimal('0.092400'))
    >>> market_hourly(Decimal("0.462"), SpotSaving(unknown="no price")), market_hourly(None, SpotSaving(spot=0.1))
    (Decimal('0.462'), Decimal('0.100000'))
    >>> market_hourly(Decimal("0.462"), SpotSaving(spot=0.0924, on_demand=0.462, over_max="c4.xlarge"))
    Decimal('0.462')
    """
    if saving is None or not saving.billable:
        return on_demand
    return Decimal(str(saving.spot)).quantize(HOURLY_PLACES, ROUND_HALF_UP)


def on_demand_hourly(job: Job) -> Decimal:
    """The on-demand $/h of the job's planned cluster, at its catalogue's prices (the rule the plan priced it by)."""
    return service.cluster_price(job.catalog, job.workers or 0, job.worker_type, ps_node_type(job))


def market(job: Job) -> str:
    """The market the job's cluster is in (its latest rate's): a spot job's is spot until it fell back to
    on-demand, and on-demand from then on — its relaunches too, so that its cluster is never half of each."""
    if job.rates:
        return str(job.rates[-1].get("market"))
    return SPOT if job.spot else ON_DEMAND


def bill(job: Job, spot: bool) -> str:
    """A spot job's cluster, launched now (again) on spot or on-demand (`spot`), billed from now on at that market's
    $/h (`market_hourly`; on spot the region's prices now) — its first launch from its start (`launched_at`): the
    job's `hourly_cost` becomes it, its `rates` gain a span and the one before ends. Returns the timeline's line
    saying the price; "" where the market and price are those already billed (a launch tried again): nothing changes.
    The caller holds the job's lease."""
    on_demand = on_demand_hourly(job)
    nodes = cluster_nodes(job.strategy, job.worker_type, job.workers or 0, job.ps_type)
    region = job.region or settings.FC2_AWS_REGION
    saving = spot_saving(nodes, job.catalog, region, job.spot_max_price) if spot else None
    hourly = market_hourly(on_demand, saving) or on_demand
    chosen = SPOT if spot else ON_DEMAND
    said = _billed_text(chosen, hourly, on_demand, saving)
    last = job.rates[-1] if job.rates else None
    if last and (last["market"], Decimal(str(last["hourly_cost"]))) == (chosen, hourly):
        return ""
    now = timezone.now()
    since: datetime = job.launched_at if last is None and job.launched_at else now
    ended = [{**rate, "ended_at": rate.get("ended_at") or now.isoformat()} for rate in job.rates]
    span = {"market": chosen, "hourly_cost": float(hourly), "started_at": since.isoformat(), "ended_at": None}
    job.rates, job.hourly_cost = [*ended, span], hourly
    Job.objects.filter(pk=job.pk).update(rates=job.rates, hourly_cost=hourly)
    return said


def _billed_text(chosen: str, hourly: Decimal, on_demand: Decimal, saving: SpotSaving | None) -> str:
    """What a launch of a spot job's cluster is billed at, as its timeline says it."""
    if saving is None:
        return f"its cluster is billed at the on-demand ${on_demand:.4f}/h from now on"
    prices = "spot prices: " + "; ".join(q.describe() for q in saving.quotes) + " — " if saving.quotes else ""
    if saving.billable:
        return f"{prices}its cluster is billed at ${hourly:.6f}/h on spot (${on_demand:.4f}/h on-demand)"
    why = saving.unknown or f"the max price asked is under the spot price of {saving.over_max}"
    return f"{prices}its cluster on spot is billed at the on-demand ${on_demand:.4f}/h, which bounds it: {why}"
