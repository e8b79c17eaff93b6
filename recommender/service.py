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
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from decimal import Decimal
from typing import TypeVar

from cachetools import TLRUCache
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from recommender import algorithms, perfmodel
from recommender.models import Catalog, InstanceType, PerformanceRecord
from recommender.perfmodel import explanation
from recommender.types import (
    DEFAULT_CATALOG,
    InstanceSpec,
    PerfRecord,
    Recommendation,
    RecommendationError,
    RecommendRequest,
)

T = TypeVar("T")

# ("answer", catalogue, request) -> (answer, its JSON shape); ("catalog", name) -> specs; ("records", workload) ->
# records; each entry with the time it runs out. A bound, not a policy: a lookup grid is a few hundred points.
_memo = TLRUCache(maxsize=4096, ttu=lambda key, value, now: value[0])
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
def _written(**kwargs) -> None:
    forget()


def _load_specs(name: str) -> tuple[InstanceSpec, ...]:
    specs = tuple(to_spec(t) for t in InstanceType.objects.filter(catalog__name=name))
    if not specs and not Catalog.objects.filter(name=name).exists():
        available = ", ".join(Catalog.objects.order_by("name").values_list("name", flat=True)) or "none loaded"
        raise RecommendationError(f"unknown catalogue {name!r} (available: {available})")
    return specs


def _load_records(workload: str) -> tuple[PerfRecord, ...]:
    fields = [f.name for f in PerfRecord.__dataclass_fields__.values()]
    rows = PerformanceRecord.objects.filter(workload=workload).order_by("pk").values(*fields)
    return tuple(PerfRecord(**row) for row in rows)


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


def workload_records(workload: str) -> tuple[PerfRecord, ...]:
    return _kept(("records", workload), lambda: _load_records(workload))[1]


def cluster_price(catalog: str, workers: int, worker_type: str, ps_type: str = "") -> Decimal:
    """$/h of `workers` workers of `worker_type` and, where named, a `ps_type` PS, at the catalogue's prices (a type it
    does not price costs 0): the one place a cluster is priced from the database."""
    prices = dict(
        InstanceType.objects.filter(catalog__name=catalog, name__in=[worker_type, ps_type]).values_list(
            "name", "hourly_price"
        )
    )
    return algorithms.hourly_cost(workers, prices.get(worker_type, 0), prices.get(ps_type, 0))


def recommend(request: RecommendRequest, catalog: str = DEFAULT_CATALOG) -> Recommendation:
    """Answer `request` from the catalogue and the workload's records (RecommendationError when it cannot).

    The answer may be one given before (see the module's docstring): shared, so not to be changed."""
    return _answer(request, catalog)[0]


def recommend_as_dict(request: RecommendRequest, catalog: str = DEFAULT_CATALOG) -> dict:
    """`as_dict(recommend(request, catalog))`, made once per answer: shared as the answer is, so not to be changed."""
    return _answer(request, catalog)[1]


def _answer(request: RecommendRequest, catalog: str) -> tuple[Recommendation, dict]:
    key = ("answer", catalog, request)
    with _memo_lock:
        found = _memo.get(key)
    if found is None:
        specs_until, specs = _kept(("catalog", catalog), lambda: _load_specs(catalog))
        records_until, every = (
            _kept(("records", request.workload), lambda: _load_records(request.workload))
            if request.workload
            else (math.inf, ())
        )
        found = _kept(key, lambda: _compute(request, specs, every), until=min(specs_until, records_until))
    return found[1]


def _compute(
    request: RecommendRequest, specs: tuple[InstanceSpec, ...], every: tuple[PerfRecord, ...]
) -> tuple[Recommendation, dict]:
    # A strategy asked for: a workload measured both ways answers from that strategy's runs alone (left open, the
    # model compares the two).
    records = every if request.parameter_server is None else algorithms.of_strategy(every, request.parameter_server)

    def predict(req: RecommendRequest) -> Recommendation:
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
    return answer, as_dict(answer)


def as_dict(recommendation: Recommendation) -> dict:
    """The JSON shape of DESIGN.md's `recommend --json` contract (plus the model's frontier and error)."""
    data = {
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
    return data


def workloads() -> list[str]:
    return list(PerformanceRecord.objects.order_by("workload").values_list("workload", flat=True).distinct())


def lacking_records(workload: str) -> dict[str, str]:
    """algorithm -> what `workload`'s records lack for it to answer at all, whatever else is asked (none: absent).

    The model and Lookup learn from measured epoch times. Scala-Opt(-M) sizes the cluster by measured bandwidth, which
    a job lacking it measures first, in a profiling run (fc2/services/profiling.py): never absent for want of records.
    """
    records = workload_records(workload)
    lacking = {}
    if not any(r.epoch_time_s for r in records):
        for algorithm in ("lookup", "model"):
            lacking[algorithm] = f"no performance records with an epoch time for workload {workload!r}"
    return lacking


def records_catalog(records) -> str:
    """The catalogue that knows the most of the records' instance types (the lab's for a lab grid), else the default
    one: what prices a workload's records where the user names no catalogue (the Recommender and Records pages,
    `model_report`)."""
    types = {r.instance_type for r in records if r.instance_type}
    known = Counter(InstanceType.objects.filter(name__in=types).values_list("catalog__name", flat=True)).most_common(1)
    return known[0][0] if known else DEFAULT_CATALOG


STRATEGY_LABELS = {"ps": "parameter server", "mirrored": "all-reduce"}


def strategy_counts(records) -> dict[str, int]:
    """How many of the records ran each strategy ("ps" through a parameter server, else "mirrored"), as the
    recommender tells them apart (algorithms.runs_through_ps)."""
    return dict(Counter("ps" if algorithms.runs_through_ps(r) else "mirrored" for r in records))


def model_figures(records, strategy: str, catalog: str) -> dict:
    """What the recommender's model is worth for a workload's records and a strategy: the very predictor the wizard,
    the API and `fc2 recommend` answer with (the same records, strategy and catalogue: the same memoised fit), its
    cross-validated error and interval coverage written as their explanations write them, how its choice judges a
    time (the sentence its answers carry), and its held-out estimates (RecommendationError when there is no
    predictor)."""
    own = algorithms.of_strategy(records, strategy == "ps")
    model = perfmodel.predictor(own, catalog_specs(catalog))
    return {
        "records": sum(1 for r in own if r.epoch_time_s is not None),
        "family": model.model.family if model.model else "",
        "model_error": model.model_error,
        "cv_mape": None if model.cv_mape is None else explanation.error_text(model.cv_mape),
        "cv_coverage": None if model.cv_coverage is None else explanation.coverage_text(model.cv_coverage),
        "cv": model.cv,
        "choice": explanation.choice_rule_text(model),
        "pairs": [{"measured_s": m, "predicted_s": p, "held_out": g} for m, p, g in model.cv_pairs],
    }
