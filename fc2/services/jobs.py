"""Submitting jobs: the one path the web form, the REST API and `manage.py submit_job` all take."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import BinaryIO

from django.db import transaction

import provisioner
from fc2.models import CodeBundle, Dataset, Job
from fc2.services import datasets, pipeline
from fc2.services.bundles import store_bundle
from fc2.services.files import atomic_with_files
from provisioner import local
from recommender.types import ALGORITHMS


class SubmitError(ValueError):
    """The job cannot be submitted as asked; `field` names the input at fault, when there is one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass
class JobRequest:
    bundle: CodeBundle
    dataset: Dataset
    parameters: dict[str, str] = field(default_factory=dict)
    provider: str = "local"
    strategy: str = Job.Strategy.PS
    workers: int = 2
    algorithm: str = "manual"
    ps_type: str = ""
    worker_type: str = ""
    region: str = ""
    hourly_budget: Decimal | None = None
    catalog: str = "fc2-2018"
    worker_types: list[str] = field(default_factory=list)


def validate(request: JobRequest) -> None:
    if request.provider not in provisioner.PROVIDERS:
        raise SubmitError(
            f"unknown provider {request.provider!r} (available: {', '.join(sorted(provisioner.PROVIDERS))})",
            "provider",
        )
    if request.strategy not in Job.Strategy.values:
        raise SubmitError(f"unknown strategy {request.strategy!r} (expected 'ps' or 'mirrored')", "strategy")
    if request.algorithm != "manual" and request.algorithm not in ALGORITHMS:
        raise SubmitError(
            f"unknown algorithm {request.algorithm!r} (expected manual or {', '.join(ALGORITHMS)})", "algorithm"
        )
    if request.workers < 1:
        raise SubmitError("a cluster needs at least 1 worker", "workers")
    if request.provider == "local" and request.workers > local.MAX_WORKERS:
        raise SubmitError(f"the local provider runs at most {local.MAX_WORKERS} workers", "workers")
    for key in request.parameters:
        if not key or not key.replace("_", "a").replace("-", "a").isalnum():
            raise SubmitError(f"parameter name {key!r} must be letters, digits, '_' or '-'", "parameters")
    try:
        datasets.ready(request.dataset)
    except datasets.DatasetError as exc:
        raise SubmitError(str(exc), "dataset") from exc


def submit(owner, request: JobRequest, driver: str = Job.Driver.CELERY) -> Job:
    """Create the job and start its pipeline (on commit, so the worker sees the row)."""
    validate(request)
    with transaction.atomic():
        if request.dataset.pk is None:
            request.dataset.save()
        job = Job.objects.create(
            owner=owner,
            bundle=request.bundle,
            dataset=request.dataset,
            parameters=request.parameters,
            provider=request.provider,
            strategy=request.strategy,
            workers=request.workers,
            algorithm=request.algorithm,
            ps_type=request.ps_type,
            worker_type=request.worker_type,
            region=request.region,
            hourly_budget=request.hourly_budget,
            catalog=request.catalog,
            worker_types=request.worker_types,
            driver=driver,
        )
        job.events.create(state=job.state, message=f"submitted by {owner}")
        pipeline.enqueue(job, "profile")
    return job


def submit_upload(
    owner,
    wheel: BinaryIO,
    filename: str,
    main_script: str = "main.py",
    *,
    dataset: Dataset | None = None,
    dataset_file=None,
    driver: str = Job.Driver.CELERY,
    **options,
) -> Job:
    """Store the uploaded wheel (and dataset file, if any) and submit the job: all of it, or nothing at all.

    Raises BundleError, DatasetError or SubmitError; `options` are the other JobRequest fields.
    """
    with atomic_with_files():
        bundle = store_bundle(owner, wheel, filename, main_script)
        if dataset_file is not None:
            dataset = datasets.store_upload(owner, dataset_file)
        return submit(owner, JobRequest(bundle=bundle, dataset=dataset, **options), driver=driver)


def parse_parameters(pairs: list[str]) -> dict[str, str]:
    """`["epochs=2", "lr=0.1"]` -> {"epochs": "2", "lr": "0.1"}; a pair without '=' is an error."""
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SubmitError(f"parameter {pair!r} is not KEY=VALUE", "parameters")
        params[key.strip()] = value.strip()
    return params
