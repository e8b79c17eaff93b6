"""The recommender's service layer: loads catalogues and performance records from the database into the
algorithms' dataclasses, runs the algorithm, and shapes the answer for the CLI, the REST API and the pages.

Answers are memoised per process, with the catalogues and records they were computed from, for
`settings.FC2_RECOMMEND_MEMO_S` seconds (5 by default; 0 turns the memo off): every algorithm is a pure function of the
request, the catalogue and the workload's records, and a page or a script polling a recommendation asks the same
question again and again. The staleness bound:

- a write the platform makes in this process — a catalogue, an instance type or a performance record saved or deleted
  (model signals: the admin, a job's measured run, `save_catalog`) or records imported
  (`recommender.perfdata.import_file`) — empties this process's memo at once, and again when its transaction commits:
  the next answer here reads the database;
- any other write — another process's, a bulk `.update()`, raw SQL — is seen by every process at most
  FC2_RECOMMEND_MEMO_S seconds later: what was read from the database is kept that long from the moment it was read,
  and an answer no longer than what it was computed from (a cachetools.TLRUCache, a TTL per entry, for that reason).

Performance records are tenant data (models.PerformanceRecord): an answer for a user reads the platform's records and
that user's own, never another user's, and says whose it read (`WorkloadRecords.counts`). Every memo key that holds
records names whose they are; the predictor's own memo (recommender/perfmodel) is keyed by the records themselves.
Whatever the records hold, an answer is one or a RecommendationError saying why: a record with a figure out of its
bound (recommender/bounds.py) is not read, and an answer with a NaN or an infinity in it is refused.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from cachetools import TLRUCache
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils.module_loading import import_string

# recommender.perfmodel is imported where an answer needs it: it pulls in scikit-learn and scipy, about a second of
# CPU that every process setting Django up (the admin imports this module) would otherwise pay at its start.
from recommender import algorithms
from recommender.bounds import BOUNDS, out_of_bounds
from recommender.models import Catalog, InstanceType, PerformanceRecord, PerformanceRecordQuerySet
from recommender.types import (
    DEFAULT_CATALOG,
    InstanceSpec,
    PerfRecord,
    Recommendation,
    RecommendationError,
    RecommendRequest,
    TrialsNeeded,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

T = TypeVar("T")
Owner: TypeAlias = "AbstractBaseUser | AnonymousUser | int | None"  # whose records join the platform's (owner_id)

# ("answer", catalogue, request, owner id) -> (answer, its JSON shape), or explore's TrialsNeeded; ("catalog", name) ->
# specs; ("records", workload, owner id) -> WorkloadRecords; ("history", workload, owner id) -> the other workloads'
# records explore's prior reads; each entry with the time it runs out. A bound, not a policy: a lookup grid is a few
# hundred points.
_memo: TLRUCache[tuple, tuple] = TLRUCache(maxsize=4096, ttu=lambda key, value, now: value[0])
_memo_lock = threading.Lock()  # (a cachetools cache is not safe across threads: runserver's, a threaded server's)


def _kept(key: tuple, load: Callable[[], T], until: float | None = None) -> tuple[float, T]:
    """(when it runs out, what `load()` gives), kept under `key` until then: FC2_RECOMMEND_MEMO_S from now unless
    `until` says sooner."""
    with _memo_lock:
        found = _memo.get(key)
    if found is None:
        now = time.monotonic()
        found = (min(now + settings.FC2_RECOMMEND_MEMO_S, until or math.inf), load())
        if found[0] > now:
            with _memo_lock:
                _memo[key] = found
    return found


def forget() -> None:
    """Empty this process's memo, now and when the current transaction commits (a read meanwhile, inside it, may
    have kept rows that a rollback takes back)."""
    _clear()
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(_clear)


def _clear() -> None:
    with _memo_lock:
        _memo.clear()


@receiver([post_save, post_delete], sender=Catalog)
@receiver([post_save, post_delete], sender=InstanceType)
@receiver([post_save, post_delete], sender=PerformanceRecord)
def _written(**kwargs: object) -> None:
    forget()


def _load_specs(name: str) -> tuple[InstanceSpec, ...]:
    specs = tuple(to_spec(t) for t in InstanceType.objects.filter(catalog__name=name))
    if not specs and not Catalog.objects.filter(name=name).exists():
        available = ", ".join(Catalog.objects.order_by("name").values_list("name", flat=True)) or "none loaded"
        raise RecommendationError(f"unknown catalogue {name!r} (available: {available})")
    return specs


# What numbers the records hold can make numpy, scipy and scikit-learn raise, where no answer can come from them: an
# overflow, a singular matrix (numpy's LinAlgError is a ValueError), a warning where warnings are errors (the tests').
# Each becomes a RecommendationError saying so: a 400 with the reason, never a 500.
NUMERIC_FAILURES = (ArithmeticError, ValueError, Warning)


def owner_id(owner: Owner) -> int | None:
    """The user whose own records join the platform's in an answer, as an id: a user (an anonymous one: none), an
    id, or None (the platform's records alone: the command line, an operator)."""
    if owner is None or isinstance(owner, int):
        return owner
    return owner.pk if getattr(owner, "is_authenticated", False) else None


@dataclass(frozen=True)
class WorkloadRecords:
    """A workload's records as one user's answers read them, and whose they are."""

    records: tuple[PerfRecord, ...]  # what the answers read: the platform's and the user's own, usable ones
    platform: int  # of them, the platform's
    own: int  # the user's
    unusable: int  # records the user may see but no answer reads: marked unusable, or a figure out of its bound

    def counts(self) -> dict:
        """{"platform", "own", "unusable", "text"}: what an answer says of the records it read."""
        said = [f"{self.platform} platform record{'s' if self.platform != 1 else ''}"]
        if self.own:
            said.append(f"{self.own} of yours")
        if self.unusable:
            said.append(f"{self.unusable} not read (a figure out of its bound)")
        text = ", ".join(said)
        return {"platform": self.platform, "own": self.own, "unusable": self.unusable, "text": text}


_PERF_FIELDS = tuple(PerfRecord.__dataclass_fields__)


def _load_records(workload: str, owner: int | None) -> WorkloadRecords:
    # The bounds are checked here as the doors check them (recommender/bounds.py), whatever wrote the row: raw SQL, a
    # row older than the doors, a NaN that SQLite gave back as NULL and PostgreSQL as NaN.
    rows = (
        PerformanceRecord.objects.filter(workload=workload)
        .readable_by(owner)
        .order_by("pk")
        .values(*{*_PERF_FIELDS, *BOUNDS}, "owner_id", "unusable")
    )
    records, platform, own, unusable = [], 0, 0, 0
    for row in rows:
        if row["unusable"] or out_of_bounds(row):
            unusable += 1
            continue
        records.append(PerfRecord(**{name: row[name] for name in _PERF_FIELDS}))
        if row["owner_id"] is None:
            platform += 1
        else:
            own += 1
    return WorkloadRecords(tuple(records), platform, own, unusable)


def catalog_specs(name: str = DEFAULT_CATALOG) -> tuple[InstanceSpec, ...]:
    return _kept(("catalog", name), lambda: _load_specs(name))[1]


def to_spec(row: InstanceType) -> InstanceSpec:
    return InstanceSpec(
        name=row.name,
        hourly_price=float(row.hourly_price),
        role=row.role,
        vcpu=row.vcpu,
        ecu=row.ecu,
        memory_gib=row.memory_gib,
        gpus=row.gpus,
        gpu_model=row.gpu_model,
        network_mbps=row.network_mbps,
    )


def records_of(workload: str, owner: Owner = None) -> WorkloadRecords:
    """`workload`'s records that `owner`'s answers read (the platform's and theirs: `owner_id`), and whose."""
    whose = owner_id(owner)
    return _kept(("records", workload, whose), lambda: _load_records(workload, whose))[1]


def workload_records(workload: str, owner: Owner = None) -> tuple[PerfRecord, ...]:
    return records_of(workload, owner).records


def cluster_price(catalog: str, workers: int, worker_type: str, ps_type: str = "") -> Decimal:
    """$/h of `workers` workers of `worker_type` and, where named, a `ps_type` PS, at the catalogue's prices (a type it
    does not price costs 0): the one place a cluster is priced from the database."""
    prices = dict(
        InstanceType.objects.filter(catalog__name=catalog, name__in=[worker_type, ps_type]).values_list(
            "name", "hourly_price"
        )
    )
    return algorithms.hourly_cost(workers, prices.get(worker_type, 0), prices.get(ps_type, 0))


def trial_minutes(provider: str) -> float | None:
    """One explore trial's minutes on `provider`, start-up and teardown included; None where it is not known.

    The rule is the platform's — what this installation measured of each provider — named by its dotted path in
    settings.FC2_TRIAL_MINUTES_RULE, since the recommender knows no provider; with none named, no provider is known
    (a trial is its training window alone)."""
    rule = _trial_rule(settings.FC2_TRIAL_MINUTES_RULE)
    return rule(provider) if rule is not None else None


@functools.cache
def _trial_rule(path: str) -> Callable[[str], float | None] | None:
    """The function `path` names, imported once per path (a setting changed in a test imports its own)."""
    return import_string(path) if path else None


def recommend(request: RecommendRequest, catalog: str = DEFAULT_CATALOG, owner: Owner = None) -> Recommendation:
    """Answer `request` from the catalogue and the workload's records that `owner`'s answers read — the platform's
    and their own, never another user's (`owner_id`) — or a RecommendationError saying why it cannot.

    The answer may be one given before (see the module's docstring): shared, so not to be changed."""
    return _answer(request, catalog, owner_id(owner))[0]


def recommend_as_dict(request: RecommendRequest, catalog: str = DEFAULT_CATALOG, owner: Owner = None) -> dict:
    """`as_dict(recommend(request, catalog, owner))`, made once per answer: shared as the answer is, so not to be
    changed."""
    return _answer(request, catalog, owner_id(owner))[1]


def _answer(request: RecommendRequest, catalog: str, owner: int | None) -> tuple[Recommendation, dict]:
    # Whose records were read is part of every key that holds them: one user's answer is never another's.
    key = ("answer", catalog, request, owner)
    with _memo_lock:
        found = _memo.get(key)
    if found is None:
        specs_until, specs = _kept(("catalog", catalog), lambda: _load_specs(catalog))
        records_until, loaded = (
            _kept(("records", request.workload, owner), lambda: _load_records(request.workload, owner))
            if request.workload
            else (math.inf, None)
        )
        history_until, history = (
            _kept(("history", request.workload, owner), lambda: _load_history(request.workload, owner))
            if request.algorithm == "explore"
            else (math.inf, ())
        )
        until = min(specs_until, records_until, history_until)
        found = _kept(key, lambda: _compute_or_trials(request, specs, loaded, history), until=until)
    if isinstance(found[1], TrialsNeeded):  # (a new exception each time: a raised one keeps its traceback)
        raise TrialsNeeded(found[1].search)
    return found[1]


def _load_history(workload: str, owner: int | None) -> tuple[PerfRecord, ...]:
    """The other workloads' usable records `owner`'s answers read (the platform's and theirs, never another user's):
    explore's prior (recommender/explore_answer.py), never its measurements."""
    rows = (
        PerformanceRecord.objects.readable_by(owner)
        .usable()
        .exclude(workload=workload)
        .filter(epoch_time_s__isnull=False)
        .order_by("pk")
        .values(*_PERF_FIELDS)
    )
    return tuple(PerfRecord(**row) for row in rows)


def _compute_or_trials(
    request: RecommendRequest,
    specs: tuple[InstanceSpec, ...],
    loaded: WorkloadRecords | None,
    history: tuple[PerfRecord, ...],
) -> tuple[Recommendation, dict] | TrialsNeeded:
    """`_compute`, or explore's TrialsNeeded: kept like an answer, since estimating the search's cost simulates it."""
    try:
        return _compute(request, specs, loaded, history)
    except TrialsNeeded as needed:
        return needed


def _compute(
    request: RecommendRequest,
    specs: tuple[InstanceSpec, ...],
    loaded: WorkloadRecords | None,
    history: tuple[PerfRecord, ...] = (),
) -> tuple[Recommendation, dict]:
    """The answer and its JSON shape, or a RecommendationError: whatever the records hold, never an exception that
    is not one (a 500) nor a NaN or an infinity in the JSON."""
    try:
        answer = _computed(request, specs, loaded.records if loaded else (), history)
    except RecommendationError:
        raise
    except NUMERIC_FAILURES as exc:
        raise RecommendationError(f"the workload's records give no answer: {type(exc).__name__}: {exc}") from exc
    if loaded is not None:
        answer = replace(answer, records=loaded.counts())
    data = as_dict(answer)
    if where := non_finite(data):
        raise RecommendationError(f"the workload's records give no finite answer ({where})")
    return answer, data


def non_finite(data: object, path: str = "") -> str:
    """Where `data` (JSON-shaped: dicts, lists, tuples, scalars) holds a NaN or an infinity, e.g.
    "candidates[2].epoch_time_s is inf"; "" where it holds none.

    >>> non_finite({"a": [1.0, {"b": float("nan")}]}), non_finite({"a": (1, "x", None)})
    ('a[1].b is nan', '')
    """
    if isinstance(data, float):
        return "" if math.isfinite(data) else f"{path or 'the answer'} is {data}"
    if isinstance(data, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in data.items())
    elif isinstance(data, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(data))
    else:
        return ""
    return next((found for where, value in items if (found := non_finite(value, where))), "")


def promote(records: PerformanceRecordQuerySet) -> tuple[int, int]:
    """Make `records` (a PerformanceRecord queryset) the platform's, which every user's answers then read: an admin's
    judgement that a user's measurements are sound (the admin's action, `manage.py promote_records`). Who measured
    each is kept (`promoted_from`). A record no answer may read (marked unusable, or a figure out of its bound) is not
    promoted. (promoted, left as they were)."""
    with transaction.atomic():
        candidates = records.filter(owner__isnull=False).select_for_update()
        usable = list(candidates.usable().values_list("pk", "owner_id"))
        for pk, owner in usable:
            PerformanceRecord.objects.filter(pk=pk).update(owner=None, promoted_from_id=owner)
        left = candidates.count()  # (those promoted are the platform's now: what is left is what was not)
        forget()  # (.update() sends no signal)
    return len(usable), left


def _computed(
    request: RecommendRequest,
    specs: tuple[InstanceSpec, ...],
    every: tuple[PerfRecord, ...],
    history: tuple[PerfRecord, ...] = (),
) -> Recommendation:
    if request.algorithm == "explore":
        # explore tells the strategies apart itself: each configuration names its own (recommender/explore_answer.py).
        return algorithms.recommend(request, specs, every, explore=lambda req: _explore(req, specs, every, history))
    # A strategy asked for: a workload measured both ways answers from that strategy's runs alone (left open, the
    # model compares the two).
    records = every if request.parameter_server is None else algorithms.of_strategy(every, request.parameter_server)

    def predict(req: RecommendRequest) -> Recommendation:
        from recommender import perfmodel  # (lazily: see the imports above)

        if req.algorithm == "lookup":
            return perfmodel.predict_fallback(req, specs, records)
        return perfmodel.recommend_model(req, specs, records)

    answer = algorithms.recommend(request, specs, records, predict=predict)
    if len(records) < len(every):
        kept, other = ("a parameter server", "all-reduce") if request.parameter_server else ("all-reduce", "a PS")
        answer = replace(
            answer,
            explanation=f"{answer.explanation} From the workload's runs with {kept} only: its "
            f"{len(every) - len(records)} runs with {other} say nothing of this strategy (the model compares the two "
            "when the strategy is left open).",
        )
    return answer


def _explore(
    request: RecommendRequest,
    specs: tuple[InstanceSpec, ...],
    records: tuple[PerfRecord, ...],
    history: tuple[PerfRecord, ...],
) -> Recommendation:
    """explore's answer, its search's budget and trial length the platform's defaults where the request leaves them
    (FC2_EXPLORE_USD, FC2_EXPLORE_MINUTES; a trial of FC2_EXPLORE_TRIAL_S, with no provider's start-up and teardown:
    the planner, which knows the provider, adds them)."""
    from recommender import explore_answer  # (lazily: scikit-learn, as perfmodel above)

    asked = replace(
        request,
        search_dollars=settings.FC2_EXPLORE_USD if request.search_dollars is None else request.search_dollars,
        search_minutes=settings.FC2_EXPLORE_MINUTES if request.search_minutes is None else request.search_minutes,
        trial_minutes=settings.FC2_EXPLORE_TRIAL_S / 60 if request.trial_minutes is None else request.trial_minutes,
    )
    return explore_answer.answer(asked, specs, records, history)


def as_dict(recommendation: Recommendation) -> dict:
    """The JSON shape of DESIGN.md's `recommend --json` contract (plus the model's frontier and error)."""
    data: dict[str, Any] = {
        "algorithm": recommendation.algorithm,
        "ps_type": recommendation.ps_type,
        "worker_type": recommendation.worker_type,
        "workers": recommendation.workers,
        "hourly_cost": recommendation.hourly_cost,
        "predicted_epoch_time_s": recommendation.predicted_epoch_time_s,
        "source": recommendation.source,
        "candidates": [asdict(c) for c in recommendation.candidates],
        "explanation": recommendation.explanation,
    }
    if recommendation.pareto:
        data["pareto"] = [asdict(c) for c in recommendation.pareto]
    if recommendation.model_error is not None:
        data["model_error"] = recommendation.model_error
    if recommendation.warnings:
        data["warnings"] = list(recommendation.warnings)
    if recommendation.extra:
        data["extra"] = recommendation.extra
    if recommendation.records:
        data["records"] = recommendation.records
    return data


def workloads(owner: Owner = None) -> list[str]:
    """The workloads with records `owner` may see: the platform's and their own (`owner_id`), never another user's
    names."""
    readable = PerformanceRecord.objects.readable_by(owner_id(owner))
    return list(readable.order_by("workload").values_list("workload", flat=True).distinct())


def lacking_records(workload: str, owner: Owner = None) -> dict[str, str]:
    """algorithm -> what `workload`'s records (those `owner`'s answers read) lack for it to answer at all, whatever
    else is asked (none: absent).

    The model and Lookup learn from measured epoch times. Scala-Opt(-M) sizes the cluster by measured bandwidth, which
    a job lacking it measures first, in a profiling run (fc2/services/profiling.py): never absent for want of records.
    """
    records = workload_records(workload, owner)
    lacking = {}
    if not any(r.epoch_time_s for r in records):
        for algorithm in ("lookup", "model"):
            lacking[algorithm] = f"no performance records with an epoch time for workload {workload!r}"
    return lacking


def records_catalog(records: Collection[PerfRecord]) -> str:
    """The catalogue that knows the most of the records' instance types (the lab's for a lab grid), else the default
    one: what prices a workload's records where the user names no catalogue (the Recommender and Records pages,
    `model_report`)."""
    types = {r.instance_type for r in records if r.instance_type}
    known = Counter(InstanceType.objects.filter(name__in=types).values_list("catalog__name", flat=True)).most_common(1)
    return known[0][0] if known else DEFAULT_CATALOG


STRATEGY_LABELS = {"ps": "parameter server", "mirrored": "all-reduce", "ddp": "all-reduce (PyTorch DDP)"}


def strategy_counts(records: Collection[PerfRecord]) -> dict[str, int]:
    """How many of the records ran each strategy ("ps" through a parameter server, else the all-reduce it ran:
    "mirrored", PyTorch's "ddp"), as the recommender tells them apart (algorithms.runs_through_ps)."""
    return dict(Counter("ps" if algorithms.runs_through_ps(r) else algorithms.all_reduce_of(r) for r in records))


def model_figures(records: Sequence[PerfRecord], strategy: str, catalog: str) -> dict:
    """What the recommender's model is worth for a workload's records and a strategy: the very predictor the wizard,
    the API and `fc2 recommend` answer with (the same records, strategy and catalogue: the same memoised fit), its
    cross-validated error and interval coverage written as their explanations write them, how its choice judges a
    time (the sentence its answers carry), and its held-out estimates (RecommendationError when there is no
    predictor)."""
    from recommender import perfmodel  # (lazily: see the imports above)
    from recommender.perfmodel import explanation

    own = algorithms.of_strategy(records, strategy == "ps")
    try:
        model = perfmodel.predictor(own, catalog_specs(catalog))
    except NUMERIC_FAILURES as exc:
        if isinstance(exc, RecommendationError):
            raise
        raise RecommendationError(f"the workload's records give no model: {type(exc).__name__}: {exc}") from exc
    figures = {
        "records": sum(1 for r in own if r.epoch_time_s is not None),
        "family": model.model.family if model.model else "",
        "model_error": model.model_error,
        "cv_mape": None if model.cv_mape is None else explanation.error_text(model.cv_mape),
        "cv_coverage": None if model.cv_coverage is None else explanation.coverage_text(model.cv_coverage),
        "cv": model.cv,
        "choice": explanation.choice_rule_text(model),
        "pairs": [{"measured_s": m, "predicted_s": p, "held_out": g} for m, p, g in model.cv_pairs],
    }
    if where := non_finite(figures):
        raise RecommendationError(f"the workload's records give no finite model ({where})")
    return figures
