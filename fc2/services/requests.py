"""What a user asks for when submitting a job (the wizard, `submit_job`, the jobs API, a re-run): its code, data and
resources, before anything is planned — and the refusal of one (`SubmitError`). Read by the job service
(fc2/services/jobs.py), which checks it, and by the planner (fc2/services/planning.py), which plans it for the wizard,
for submit and for the pipeline's recommend step (from the request a job keeps: `Job.request`, written once at
submission by `as_json`, read back by `of`). A request is made whole as it is made: its framework, unless asked, is
the bundle's (else TensorFlow), and its strategy, unless asked, the framework's (`framework_strategy`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

from django.conf import settings

import provisioner
from fc2.models import CodeBundle, Dataset, Framework, Job, epochs_parameter, workload_name
from recommender.types import DEFAULT_CATALOG


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
    strategy: str = ""  # "": the framework's own (`framework_strategy`)
    workers: int = 2  # Manual: the count; an algorithm: the limit (unless a budget limits it)
    algorithm: str = "manual"
    ps_type: str = ""
    worker_type: str = ""
    region: str = ""
    latency_ms: float = 0.0  # lab: delay between the nodes, ms one way
    budget: Decimal | None = None  # $/h: the recommender's budget C, which then sets the worker count
    total_budget: Decimal | None = None  # $ for the whole job: stopped before its cost would exceed it (sweep.py)
    catalog: str = DEFAULT_CATALOG
    worker_types: list[str] = field(default_factory=list)
    workload_name: str = ""  # the records' name for this code and data; "" for the default (fc2.models.workload_name)
    # explore: what "best" means (α on time, β on cost, as the model weighs them) and its search's budget of trials
    alpha: float = 0.5
    beta: float = 0.5
    search_budget: Decimal | None = None  # $ the trial runs may cost; None: the platform's default (FC2_EXPLORE_USD)
    search_minutes: int | None = None  # minutes they may take; None: FC2_EXPLORE_MINUTES
    # Managed jobs: times a lost node is replaced and training resumed from the latest checkpoint; aws spot instances,
    # at most `spot_max_price` $/h (None: up to the on-demand price), and what to do without spot capacity
    max_restarts: int = 0
    spot: bool = False
    spot_max_price: Decimal | None = None
    spot_fallback: str = Job.SpotFallback.ON_DEMAND
    # What the code trains with; "": what the bundle requires (CodeBundle.framework), else TensorFlow
    framework: str = ""

    def __post_init__(self) -> None:
        self.framework = self.framework or self.bundle.framework or Framework.TENSORFLOW.value
        self.strategy = framework_strategy(self.framework, self.strategy)
        # A provider whose instance types are its own (the lab's) prices and recommends from its own catalogue.
        if self.provider in provisioner.PROVIDERS and (own := provisioner.get(self.provider).catalog):
            self.catalog = own

    @classmethod
    def of(cls, job: Job) -> JobRequest:
        """The request `job` was submitted with (`Job.request`): what its recommend step plans from, what a re-run
        submits again and what the wizard's `?from=<id>` fills its steps with."""
        asked = dict(job.request)
        for name in AMOUNTS:
            asked[name] = None if asked.get(name) is None else Decimal(asked[name])
        return cls(bundle=job.bundle, dataset=job.dataset, **asked)

    def as_json(self) -> dict[str, Any]:
        """The request as `Job.request` keeps it: every field but the code and data (the job's own bundle and
        dataset), amounts as exact decimal strings."""
        asked = {name: getattr(self, name) for name in REQUEST_FIELDS}
        for name in AMOUNTS:
            asked[name] = None if asked[name] is None else str(asked[name])
        return {**asked, "parameters": dict(self.parameters), "worker_types": list(self.worker_types)}

    @property
    def workload(self) -> str:
        return workload_name(self.bundle, self.dataset, self.framework, self.workload_name)

    @property
    def search_limits(self) -> tuple[Decimal, int]:
        """explore's search budget: ($, minutes), the request's or the platform's default (`search_limits`)."""
        return search_limits(self.search_budget, self.search_minutes)

    @property
    def epochs(self) -> int | None:
        """The `epochs` parameter when it is a whole number of at least 1 (what the cost estimate multiplies by)."""
        return epochs_parameter(self.parameters)


def framework_strategy(framework: str, strategy: str) -> str:
    """The strategy a job of `framework` runs when asked for `strategy`: PyTorch's is DistributedDataParallel alone,
    so an omitted or open one is ddp; TensorFlow's omitted one is its parameter server. Any other is kept as asked,
    for the job service to refuse where the framework has no such strategy (jobs.check_framework).

    >>> [framework_strategy(f, s) for f, s in (("pytorch", ""), ("pytorch", "auto"), ("tensorflow", ""),
    ...     ("tensorflow", "auto"), ("pytorch", "ps"))]
    ['ddp', 'ddp', 'ps', 'auto', 'ps']
    """
    if framework == Framework.PYTORCH and strategy in ("", Job.Strategy.AUTO):
        return Job.Strategy.DDP.value
    return strategy or Job.Strategy.PS.value


def search_limits(dollars: Decimal | None, minutes: int | None) -> tuple[Decimal, int]:
    """explore's search budget as asked, ($, minutes), the platform's default (FC2_EXPLORE_USD, FC2_EXPLORE_MINUTES)
    where it names none."""
    return (
        Decimal(settings.FC2_EXPLORE_USD) if dollars is None else dollars,
        settings.FC2_EXPLORE_MINUTES if minutes is None else minutes,
    )


# The request's amounts in $, kept as exact decimal strings.
AMOUNTS = ("budget", "total_budget", "search_budget", "spot_max_price")
# What `Job.request` holds: the fields of a JobRequest beyond its code and data.
REQUEST_FIELDS = tuple(f.name for f in fields(JobRequest) if f.name not in ("bundle", "dataset"))
