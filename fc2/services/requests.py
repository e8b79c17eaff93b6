"""What a user asks for when submitting a job (the wizard, `submit_job`, the jobs API, a re-run): its code, data and
resources, before anything is planned. Read by the job service (fc2/services/jobs.py) and by pricing, which prices
a request as it prices a job."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

import provisioner
from fc2.models import CodeBundle, Dataset, Job, epochs_parameter, workload_name
from recommender.types import DEFAULT_CATALOG


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
    latency_ms: float = 0.0  # lab: delay between the nodes, ms one way
    hourly_budget: Decimal | None = None
    budget: Decimal | None = None  # $ for the whole job: stopped before its cost would exceed it (sweep.py)
    catalog: str = DEFAULT_CATALOG
    worker_types: list[str] = field(default_factory=list)
    workload_name: str = ""  # the records' name for this code and data; "" for the default (fc2.models.workload_name)

    def __post_init__(self):
        # A provider whose instance types are its own (the lab's) prices and recommends from its own catalogue.
        if self.provider in provisioner.PROVIDERS and (own := provisioner.get(self.provider).catalog):
            self.catalog = own

    @property
    def workload(self) -> str:
        return self.workload_name or workload_name(self.bundle, self.dataset)

    @property
    def epochs(self) -> int | None:
        """The `epochs` parameter when it is a whole number of at least 1 (what the cost estimate multiplies by)."""
        return epochs_parameter(self.parameters)
