"""The recommender's service layer: loads catalogues and performance records from the database into the
algorithms' dataclasses, runs the algorithm, and shapes the answer for the CLI, the REST API and the pages."""

from __future__ import annotations

from dataclasses import asdict, replace
from decimal import Decimal

from django.db import connection

from recommender import algorithms, perfmodel
from recommender.models import Catalog, InstanceType, PerformanceRecord
from recommender.types import (
    DEFAULT_CATALOG,
    InstanceSpec,
    PerfRecord,
    Recommendation,
    RecommendationError,
    RecommendRequest,
)

# What the recommender answers from is read from the database once per change, not once per request. Whether it
# changed is one query (`_stamps`): a catalogue's row id and updated_at (moved by any change to its types, see
# recommender.models), and a workload's records' count and latest updated_at (a record added, saved or deleted moves
# one of them; an import replaces its rows with new ones). Each process keeps its own copy; the stamp, read from the
# database every time, is what keeps the copies of several processes right.

# name -> (stamp, specs)
_catalog_cache: dict[str, tuple[object, tuple[InstanceSpec, ...]]] = {}
# workload -> (stamp, records)
_records_cache: dict[str, tuple[object, tuple[PerfRecord, ...]]] = {}
# (catalogue, request) -> (catalogue stamp, records stamp, answer, its JSON shape): every algorithm is a pure function
# of the request, the catalogue and the workload's records, so an answer holds until either changes. The lookup's
# answers for one workload are its prepared table; the model's spare a fit per repeated request.
_answers: dict[tuple[str, RecommendRequest], tuple[object, object, Recommendation, dict]] = {}
MAX_CACHED_ANSWERS = 4096  # the oldest go first: a bound, not a policy (a lookup grid is a few hundred points)


def _stamps(catalog: str | None, workload: str | None) -> tuple[object, object]:
    """The catalogue's (id, updated_at), None when there is no such catalogue, and the workload's records' (count,
    latest updated_at), in one round trip. Plain SQL: the ORM would take longer to build the query than the database
    takes to answer it, on the path of every recommendation."""
    quote = connection.ops.quote_name
    catalogs, records = quote(Catalog._meta.db_table), quote(PerformanceRecord._meta.db_table)
    sql = (
        f"SELECT (SELECT id FROM {catalogs} WHERE name = %s), (SELECT updated_at FROM {catalogs} WHERE name = %s), "
        f"(SELECT COUNT(*) FROM {records} WHERE workload = %s), "
        f"(SELECT MAX(updated_at) FROM {records} WHERE workload = %s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [catalog, catalog, workload, workload])
        catalog_id, updated_at, count, latest = cursor.fetchone()
    return (None if catalog_id is None else (catalog_id, updated_at)), (count, latest)


def _specs(name: str, stamp: object) -> tuple[InstanceSpec, ...]:
    if stamp is None:
        available = ", ".join(Catalog.objects.order_by("name").values_list("name", flat=True)) or "none loaded"
        raise RecommendationError(f"unknown catalogue {name!r} (available: {available})")
    cached = _catalog_cache.get(name)
    if cached is None or cached[0] != stamp:
        cached = (stamp, tuple(to_spec(t) for t in InstanceType.objects.filter(catalog_id=stamp[0])))
        _catalog_cache[name] = cached
    return cached[1]


def _records(workload: str, stamp: object) -> tuple[PerfRecord, ...]:
    cached = _records_cache.get(workload)
    if cached is None or cached[0] != stamp:
        fields = [f.name for f in PerfRecord.__dataclass_fields__.values()]
        rows = PerformanceRecord.objects.filter(workload=workload).order_by("pk").values(*fields)
        cached = (stamp, tuple(PerfRecord(**row) for row in rows))
        _records_cache[workload] = cached
    return cached[1]


def catalog_specs(name: str = DEFAULT_CATALOG) -> tuple[InstanceSpec, ...]:
    return _specs(name, _stamps(name, None)[0])


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
    return _records(workload, _stamps(None, workload)[1])


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

    The answer may be one given before, from the same catalogue and records: shared, so not to be changed."""
    return _answer(request, catalog)[0]


def recommend_as_dict(request: RecommendRequest, catalog: str = DEFAULT_CATALOG) -> dict:
    """`as_dict(recommend(request, catalog))`, made once per answer: shared as the answer is, so not to be changed."""
    return _answer(request, catalog)[1]


def _answer(request: RecommendRequest, catalog: str) -> tuple[Recommendation, dict]:
    catalog_stamp, records_stamp = _stamps(catalog, request.workload or None)
    key = (catalog, request)
    cached = _answers.get(key)
    if cached is not None and cached[0] == catalog_stamp and cached[1] == records_stamp:
        return cached[2], cached[3]
    specs = _specs(catalog, catalog_stamp)
    every = _records(request.workload, records_stamp) if request.workload else ()
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
    shape = as_dict(answer)
    if len(_answers) >= MAX_CACHED_ANSWERS:
        _answers.pop(next(iter(_answers), None), None)
    _answers[key] = (catalog_stamp, records_stamp, answer, shape)
    return answer, shape


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
    a job lacking it measures first, in a profiling run (monitor/profiling.py): never absent for want of records.
    """
    records = workload_records(workload)
    lacking = {}
    if not any(r.epoch_time_s for r in records):
        for algorithm in ("lookup", "model"):
            lacking[algorithm] = f"no performance records with an epoch time for workload {workload!r}"
    return lacking
