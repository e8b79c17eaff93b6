"""What a job's (or a job request's) cluster costs and what the recommender is asked for it — shared by the job
service (planning, before a job exists) and the pipeline (its recommend step)."""

from __future__ import annotations

from decimal import Decimal

import provisioner
from fc2.models import Job, batch_size_parameter
from fc2.services.requests import JobRequest
from recommender import service
from recommender.types import Recommendation, RecommendRequest


def ps_node_type(job: Job | JobRequest) -> str:
    """The instance type the PS of a parameter-server cluster (a job's plan, or a request's) runs on: the chosen PS
    type, else the workers' type (a PS cluster always has its PS node). "" for a cluster with no PS, or of no
    types."""
    if job.strategy != Job.Strategy.PS:
        return ""
    return job.ps_type or job.worker_type


def hourly_cost(job: Job | JobRequest) -> Decimal:
    """$/h of the job's (or job request's) cluster from its catalogue: the PS (see `ps_node_type`) plus its workers
    (0 for a local cluster of no types)."""
    return service.cluster_price(job.catalog, job.workers, job.worker_type, ps_node_type(job))


def recommend_request(request: JobRequest) -> RecommendRequest:
    """What the recommender is asked for a job request: its workers is the limit when it has no budget; a strategy
    left open is the model's to choose."""
    return RecommendRequest(
        algorithm=request.algorithm,
        workload=request.workload,
        budget=float(request.budget) if request.budget is not None else None,
        max_workers=None if request.budget is not None else request.workers,
        ps_type=request.ps_type or None,
        worker_types=tuple(request.worker_types),
        worker_type=request.worker_type or None,
        parameter_server=None if request.strategy == Job.Strategy.AUTO else request.strategy == Job.Strategy.PS,
        batch_size=batch_size_parameter(request.parameters),
        # The delay its nodes will have where the provider adds one (the lab); elsewhere not the job's to say.
        latency_ms=request.latency_ms if provisioner.get(request.provider).latency else None,
    )


def chosen_strategy(request: JobRequest, answer: Recommendation) -> str:
    """The strategy a request's cluster runs once the recommender answered: the one asked, or for one left open the
    one the model chose (its answer's `extra["strategy"]`)."""
    if request.strategy != Job.Strategy.AUTO:
        return request.strategy
    chosen = answer.extra.get("strategy")
    if chosen not in (Job.Strategy.PS, Job.Strategy.MIRRORED):
        raise ValueError(f"the {answer.algorithm} recommender did not choose a strategy for a job that left it open")
    return chosen
