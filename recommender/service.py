"""The recommender's service layer: loads catalogues and performance records from the database into the
algorithms' dataclasses, runs the algorithm, and shapes the answer for the CLI, the REST API and the pages."""

from __future__ import annotations

from dataclasses import asdict

from django.db.models import Count, Max

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

# name -> (updated_at, specs): a catalogue is read once per change, not once per request.
_catalog_cache: dict[str, tuple[object, tuple[InstanceSpec, ...]]] = {}


def catalog_specs(name: str = DEFAULT_CATALOG) -> tuple[InstanceSpec, ...]:
    stamp = Catalog.objects.filter(name=name).values_list("pk", "updated_at").first()
    if stamp is None:
        available = ", ".join(Catalog.objects.order_by("name").values_list("name", flat=True)) or "none loaded"
        raise RecommendationError(f"unknown catalogue {name!r} (available: {available})")
    cached = _catalog_cache.get(name)
    if cached is None or cached[0] != stamp:
        cached = (stamp, tuple(to_spec(t) for t in InstanceType.objects.filter(catalog_id=stamp[0])))
        _catalog_cache[name] = cached
    return cached[1]


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


# workload -> (stamp, records), the stamp being the records' count and latest change.
_records_cache: dict[str, tuple[object, tuple[PerfRecord, ...]]] = {}


def workload_records(workload: str) -> tuple[PerfRecord, ...]:
    rows = PerformanceRecord.objects.filter(workload=workload)
    stamp = rows.aggregate(count=Count("pk"), latest=Max("updated_at"))
    cached = _records_cache.get(workload)
    if cached is None or cached[0] != stamp:
        fields = [f.name for f in PerfRecord.__dataclass_fields__.values()]
        cached = (stamp, tuple(PerfRecord(**row) for row in rows.order_by("pk").values(*fields)))
        _records_cache[workload] = cached
    return cached[1]


def recommend(request: RecommendRequest, catalog: str = DEFAULT_CATALOG) -> Recommendation:
    """Answer `request` from the catalogue and the workload's records (RecommendationError when it cannot)."""
    specs = catalog_specs(catalog)
    records = workload_records(request.workload) if request.workload else []

    def predict(req: RecommendRequest) -> Recommendation:
        if req.algorithm == "lookup":
            return perfmodel.predict_fallback(req, specs, records)
        return perfmodel.recommend_model(req, specs, records)

    return algorithms.recommend(request, specs, records, predict=predict)


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
