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
    """The instance type the PS of a parameter-server cluster runs on: the chosen PS type, else the workers' type (a
    PS cluster always has its PS node). "" for a cluster with no PS, or of no types."""
    if job.strategy != Job.Strategy.PS:
        return ""
    return job.ps_type or job.worker_type


def hourly_cost(job: Job | JobRequest) -> Decimal:
    """$/h of the job's (or job request's) cluster from its catalogue: the PS (see `ps_node_type`) plus its workers
    (0 for a local cluster of no types)."""
    return service.cluster_price(job.catalog, job.workers, job.worker_type, ps_node_type(job))


def recommend_request(job: Job | JobRequest) -> RecommendRequest:
    """What the recommender is asked for a job (or a job request): its workers is the limit when it has no budget; a
    strategy left open is the model's to choose."""
    return RecommendRequest(
        algorithm=job.algorithm,
        workload=job.workload,
        budget=float(job.hourly_budget) if job.hourly_budget is not None else None,
        max_workers=None if job.hourly_budget is not None else job.workers,
        ps_type=job.ps_type or None,
        worker_types=tuple(job.worker_types),
        worker_type=job.worker_type or None,
        parameter_server=None if job.strategy == Job.Strategy.AUTO else job.strategy == Job.Strategy.PS,
        batch_size=batch_size_parameter(job.parameters),
        # The delay its nodes will have where the provider adds one (the lab); elsewhere not the job's to say.
        latency_ms=job.latency_ms if provisioner.get(job.provider).latency else None,
    )


def chosen_strategy(job: Job | JobRequest, answer: Recommendation) -> str:
    """The strategy the job's cluster runs once the recommender answered: its own, or for one left open the one the
    model chose (its answer's `extra["strategy"]`)."""
    if job.strategy != Job.Strategy.AUTO:
        return job.strategy
    chosen = answer.extra.get("strategy")
    if chosen not in (Job.Strategy.PS, Job.Strategy.MIRRORED):
        raise ValueError(f"the {answer.algorithm} recommender did not choose a strategy for a job that left it open")
    return chosen
