"""Bundles, datasets and jobs: what a researcher submits and the job's state machine with its event log; the
personal API tokens scripts use the jobs API with; the Celery workers' heartbeats."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple, Self, TypeVar

from django.conf import settings
from django.db import models, transaction
from django.urls import reverse
from django.utils import timezone

from fc2 import results
from fc2.bundles import (
    DISTRIBUTION_MAX_LENGTH,
    MAIN_SCRIPT_MAX_LENGTH,
    REQUIREMENT_MAX_LENGTH,
    VERSION_MAX_LENGTH,
    module_name,
)
from recommender.types import DEFAULT_CATALOG, workload_key

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

M = TypeVar("M", bound=models.Model)


def is_platform_admin(user: User | AnonymousUser) -> bool:
    """Admins (staff) see every user's bundles, datasets and jobs; researchers only their own."""
    return bool(user.is_authenticated and user.is_staff)


class OwnedQuerySet(models.QuerySet[M]):
    def visible_to(self, user: User) -> Self:
        if is_platform_admin(user):
            return self
        return self.filter(owner=user)


class JobQuerySet(OwnedQuerySet["Job"]):
    def ran_between(self, start: datetime, end: datetime) -> Self:
        """Jobs whose cluster was up at some time in [start, end) (from its launch to the end of its teardown)."""
        return self.filter(launched_at__lt=end).filter(
            models.Q(torn_down_at__isnull=True) | models.Q(torn_down_at__gt=start)
        )

    def spend_between(self, start: datetime, end: datetime, now: datetime | None = None) -> float:
        """$ these jobs' clusters cost inside [start, end): each job's $/h over the part of its cluster's life in the
        window."""
        jobs = self.ran_between(start, end).filter(hourly_cost__isnull=False)
        rows = jobs.only("hourly_cost", "rates", "launched_at", "torn_down_at", "profiling_runs")
        return sum((job.cost_between(start, end, now) for job in rows), 0.0)


class DatasetQuerySet(OwnedQuerySet["Dataset"]):
    def usable_by(self, user: User) -> Self:
        """What `user` may train on: their own datasets and the built-ins."""
        return self.filter(models.Q(owner=user) | models.Q(owner__isnull=True))

    def visible_to(self, user: User) -> Self:
        return self if is_platform_admin(user) else self.usable_by(user)


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def bundle_upload_to(instance: CodeBundle, filename: str) -> str:
    return f"bundles/{instance.owner_id}/{secrets.token_hex(8)}/{PurePosixPath(filename).name}"


class Framework(models.TextChoices):
    """What a bundle's code trains with: how its nodes are told their cluster (TF_CONFIG or torchrun's variables)."""

    TENSORFLOW = "tensorflow", "TensorFlow"
    PYTORCH = "pytorch", "PyTorch"


class CodeBundle(models.Model):
    """A researcher's training code: one validated wheel and the main script to run on every node."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="bundles")
    name = models.CharField(max_length=200, help_text="The owner's name for it; the distribution unless renamed")
    wheel = models.FileField(upload_to=bundle_upload_to, max_length=300)
    filename = models.CharField(max_length=255)
    distribution = models.CharField(max_length=DISTRIBUTION_MAX_LENGTH, help_text="Name from the wheel's METADATA")
    version = models.CharField(max_length=VERSION_MAX_LENGTH)
    main_script = models.CharField(
        max_length=MAIN_SCRIPT_MAX_LENGTH, help_text="Path of the main script inside the wheel"
    )
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    # Read from the wheel's METADATA at upload (its Requires-Dist); empty when it names neither framework.
    framework = models.CharField(max_length=20, choices=Framework.choices, blank=True)
    # Its first Requires-Dist only a machine with CUDA can install (fc2.bundles.cuda_requirement): such a bundle runs
    # on GPU workers alone. Empty when none.
    cuda_requirement = models.CharField(max_length=REQUIREMENT_MAX_LENGTH, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.distribution} {self.version} ({self.filename})"

    @property
    def main_module(self) -> str:
        """The dotted module the nodes run with `python -m` (relative imports keep working)."""
        return module_name(self.main_script)


def dataset_upload_to(instance: Dataset, filename: str) -> str:
    return f"datasets/{instance.owner_id}/{secrets.token_hex(8)}/{PurePosixPath(filename).name}"


class Dataset(models.Model):
    """Training data as FC² Fig. 4 describes it: a built-in set, an external URL, or an upload."""

    class Kind(models.TextChoices):
        BUILTIN = "builtin", "Built-in"
        URL = "url", "External URL"
        UPLOAD = "upload", "Upload"

    # No owner: a built-in set every user may pick.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="datasets"
    )
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    builtin_name = models.CharField(max_length=50, blank=True)
    url = models.URLField(max_length=1000, blank=True)
    file = models.FileField(upload_to=dataset_upload_to, max_length=300, blank=True)
    path = models.CharField(max_length=1000, help_text="Where the nodes fetch the data from (file path or URL)")
    size_mb = models.FloatField(null=True, blank=True)
    features = models.PositiveIntegerField(null=True, blank=True)
    rows = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Why the nodes last could not fetch a URL dataset; cleared when a job on it succeeds.
    last_error = models.CharField(max_length=500, blank=True)

    objects = DatasetQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["builtin_name"], condition=models.Q(kind="builtin"), name="unique_builtin_dataset"
            )
        ]

    def __str__(self) -> str:
        return self.name


def epochs_parameter(parameters: dict) -> int | None:
    """The `epochs` parameter when it is a whole number of at least 1: the epochs a job asks its script for, before
    its chief reports them (what its cost is estimated by).

    >>> epochs_parameter({"epochs": "5"}), epochs_parameter({"epochs": "0"}), epochs_parameter({"epochs": "1.5"})
    (5, None, None)
    """
    return _whole_parameter(parameters, "epochs")


def batch_size_parameter(parameters: dict) -> int | None:
    """The `batch_size` parameter when it is a whole number of at least 1: the batch size a job asks its script for
    (what its performance is recorded and looked up by).

    >>> batch_size_parameter({"batch_size": "128"}), batch_size_parameter({"batch_size": "big"})
    (128, None)
    """
    return _whole_parameter(parameters, "batch_size")


def _whole_parameter(parameters: dict, name: str) -> int | None:
    value = str(parameters.get(name, ""))
    return int(value) if value.isdigit() and int(value) > 0 else None


class Projection(NamedTuple):
    """What a job will have cost once its cluster is gone (`Job.projection`, `pricing.projection`)."""

    total: float  # $ at the catalogue's prices: the cost so far and the cost of the time still to come
    basis: str  # what the time to come is taken from: "prediction", "pace", "time limit" (an upper bound) or "ended"


def workload_name(bundle: CodeBundle, dataset: Dataset, framework: str = Framework.TENSORFLOW, name: str = "") -> str:
    """The key under which a job's performance is recorded and looked up (recommender.types.workload_key): by default
    `<distribution>:<dataset name>`, the code and the data it trains on, unless the job names another (`name`,
    `Job.workload_name`)."""
    return workload_key(name or f"{bundle.distribution}:{dataset.name}", framework)


class Job(models.Model):
    """One training run: what its user asked (`request`, kept as it came), the cluster its recommend step chose for it
    (the plan: `strategy`, `ps_type`, `worker_type`, `workers`, `hourly_cost`, `recommendation`), and where it is in
    the pipeline. No column changes meaning on the way: the request is written once, at submission; the plan is
    empty until the recommend step writes it."""

    class State(models.TextChoices):
        # Each state but `running` (the nodes' reports drive it) is its step's own -ing form (pipeline.STEPS).
        QUEUED = "queued"
        RECOMMENDING = "recommending"
        PROVISIONING = "provisioning"
        BOOTSTRAPPING = "bootstrapping"
        RUNNING = "running"
        COLLECTING = "collecting"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    TERMINAL = (State.SUCCEEDED, State.FAILED, State.CANCELLED)
    # Not ended yet: every state but the terminal ones (tests/test_pipeline_states.py checks the two cover them all).
    ACTIVE = (
        State.QUEUED, State.RECOMMENDING, State.PROVISIONING, State.BOOTSTRAPPING, State.RUNNING, State.COLLECTING
    )  # fmt: skip

    class Strategy(models.TextChoices):
        PS = "ps", "Parameter server"
        MIRRORED = "mirrored", "All-Reduce (mirrored)"
        # Left open (Model only), in a request: its recommend step compares both and plans the one it chose.
        AUTO = "auto", "Left open (the model chooses)"
        # PyTorch's DistributedDataParallel: all-reduce, no parameter server (provisioner.types.ALL_REDUCE).
        DDP = "ddp", "All-Reduce (PyTorch DDP)"

    class Driver(models.TextChoices):
        CELERY = "celery", "Celery worker"
        INLINE = "inline", "In-process (CLI --inline)"

    class SpotFallback(models.TextChoices):
        ON_DEMAND = "on-demand", "On-demand instances"
        WAIT = "wait", "Wait for spot capacity"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    # What the user asked, as it came (fc2.services.requests.JobRequest.as_json): the algorithm, the strategy (or
    # "auto"), the worker count or limit, the types, the budgets, the catalogue, provider, region, latency, workload
    # name and parameters. Written once, at submission, and never changed: a re-run submits it again.
    request = models.JSONField(default=dict, editable=False, help_text="What the user asked, as it came")

    # The run's settings, copied from the request at submission and never changed: what the code, data and cluster
    # are, where it runs, and what it is held to.
    bundle = models.ForeignKey(CodeBundle, on_delete=models.PROTECT, related_name="jobs")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="jobs")
    parameters = models.JSONField(default=dict, blank=True)
    workload_name = models.CharField(
        max_length=100,
        blank=True,
        help_text="Performance records are looked up and stored under this name (empty: the wheel's distribution name, "
        "a colon and the dataset's name)",
    )

    framework = models.CharField(max_length=20, choices=Framework.choices, default=Framework.TENSORFLOW)
    provider = models.CharField(max_length=20, default="local")
    region = models.CharField(max_length=30, blank=True)
    # Lab clusters (provisioner/lab/): every packet from one node to another arrives this late (Anwar §5.2.3).
    latency_ms = models.FloatField(default=0, help_text="Delay added between the nodes (lab), ms one way")
    algorithm = models.CharField(max_length=20, default="manual")
    budget = models.DecimalField(
        max_digits=10, decimal_places=4, null=True, blank=True, help_text="$/h: the recommender's budget C"
    )
    total_budget = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="$ for the whole job: it is stopped before its cost would exceed it",
    )
    catalog = models.CharField(max_length=50, default=DEFAULT_CATALOG, help_text="Instance catalogue for the algorithm")
    worker_types = models.JSONField(default=list, blank=True, help_text="L^w: worker types the algorithm considers")
    # Managed jobs (issue 45): how often a lost node's cluster is made again and resumed from the latest checkpoint
    # (pipeline.resume) before the job fails; spot instances (aws), at most at a price, and what to do without any.
    max_restarts = models.PositiveSmallIntegerField(
        default=0, help_text="Times a lost node is replaced and training resumed from its latest checkpoint"
    )
    spot = models.BooleanField(default=False, help_text="aws: spot instances rather than on-demand")
    spot_max_price = models.DecimalField(
        max_digits=10, decimal_places=4, null=True, blank=True, help_text="$/h a spot instance may cost at most"
    )
    spot_fallback = models.CharField(
        max_length=10,
        choices=SpotFallback.choices,
        default=SpotFallback.ON_DEMAND,
        help_text="Without spot capacity: on-demand instances, or wait for spot",
    )

    # The plan: the cluster the recommend step chose (for Manual, the one asked); empty until then.
    strategy = models.CharField(max_length=10, choices=Strategy.choices, blank=True)
    ps_type = models.CharField(max_length=40, blank=True)
    worker_type = models.CharField(max_length=40, blank=True)
    workers = models.PositiveIntegerField(null=True, blank=True)
    recommendation = models.JSONField(null=True, blank=True, help_text="The recommender's answer, when one was asked")
    # What its cluster is billed at now: the plan's price — a spot job's at the spot price it pays, to 6 places as
    # EC2 quotes spot (fc2/services/pricing.py: `market_hourly`, `bill`).
    hourly_cost = models.DecimalField(
        max_digits=14,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="$/h its cluster is billed at now (PS + workers): a spot job's at its spot price",
    )
    driver = models.CharField(max_length=10, choices=Driver.choices, default=Driver.CELERY)

    state = models.CharField(max_length=15, choices=State.choices, default=State.QUEUED, db_index=True)
    failure_reason = models.TextField(blank=True)
    # sha256 of the job-scoped secret the nodes report with; the secret itself is only handed to the cluster.
    token_hash = models.CharField(max_length=64, blank=True)
    cluster = models.JSONField(null=True, blank=True, help_text="provisioner.ClusterInfo of the running cluster")
    # The provider's name for this job's cluster: unique per installation and machine (a random part), so that two
    # installations whose job ids collide never touch each other's clusters. Set once, when provisioning starts.
    cluster_name = models.CharField(max_length=40, blank=True)
    # Who is driving the job's current step and until when: the step's runner renews `lease_until` while it works, so
    # the sweep (fc2.services.sweep) knows a step whose worker died from one that is merely slow.
    lease_until = models.DateTimeField(null=True, blank=True)
    # Sweeps in a row that raised on this job (fc2.services.sweep): past FC2_SWEEP_ATTEMPTS the job ends with the
    # reason and its cluster is torn down, so that one job the sweep cannot handle never stays active for good.
    sweep_failures = models.PositiveSmallIntegerField(default=0)
    # Step name -> times the sweep sent it again after its worker (or message) was lost: past FC2_STEP_RESENDS the job
    # fails rather than try once more.
    resends = models.JSONField(default=dict, blank=True)

    epoch = models.PositiveIntegerField(null=True, blank=True)
    epochs = models.PositiveIntegerField(null=True, blank=True)
    step = models.PositiveIntegerField(null=True, blank=True)
    steps = models.PositiveIntegerField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    # What its nodes' samples said once it ended (monitor/figures.py): bandwidth, saturation, idleness, alerts.
    figures = models.JSONField(null=True, blank=True, help_text="The run's figures and alerts, kept once it ended")
    # Scala-Opt's bandwidth profiling runs and explore's trial runs (`"kind": "trial"`, fc2/services/trials.py) made for
    # it: each with its cluster, start, end, $/h and what it measured. Their cost is part of the job's.
    profiling_runs = models.JSONField(default=list, blank=True)
    # explore's search, once made (fc2/services/trials.py): the cluster believed best before its trials and the one
    # chosen after (each with its predicted epoch time and interval), and why the search stopped.
    search = models.JSONField(null=True, blank=True)
    # Each time its cluster was made again after a lost node (pipeline.resume): when, which nodes, why, the work lost
    # since the last checkpoint (steps, seconds, $) and when training ran again.
    restarts = models.JSONField(default=list, blank=True)
    # A spot job's cluster's $/h over its life (fc2/services/pricing.py: `bill`), each span {"market": "spot" or
    # "on-demand", "hourly_cost", "started_at", "ended_at"} from its first launch on: the spot price quoted at each
    # launch, the on-demand price from a fallback on; the current span's "ended_at" is None. Empty: billed at
    # `hourly_cost` throughout (every on-demand job).
    rates = models.JSONField(default=list, blank=True)

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Its cluster is billed from the moment its launch began to the moment its teardown finished, every node of it.
    launched_at = models.DateTimeField(null=True, blank=True, help_text="When the launch of its cluster began")
    torn_down_at = models.DateTimeField(null=True, blank=True, help_text="When the teardown of its cluster finished")

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            # The admin dashboard: its state and provider filters with the default newest-first order, and the
            # latest failures.
            models.Index(fields=["state", "-created_at"], name="job_state_created_idx"),
            models.Index(fields=["provider", "-created_at"], name="job_provider_created_idx"),
            models.Index(fields=["state", "-finished_at"], name="job_state_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.state})"

    def get_absolute_url(self) -> str:
        return reverse("job-detail", args=[self.pk])

    @property
    def workload(self) -> str:
        """Its records' key (`workload_name`): the name it was filed under, or its code's and data's, with its
        framework's mark."""
        return workload_name(self.bundle, self.dataset, self.framework, self.workload_name)

    @property
    def planned(self) -> bool:
        """Its recommend step has chosen its cluster (the plan columns are written)."""
        return self.workers is not None

    @property
    def requested_strategy(self) -> str:
        """The strategy it was submitted with (`auto`: left open for the model to choose)."""
        return self.request.get("strategy", "")

    @property
    def strategy_chosen(self) -> bool:
        """Its strategy was left open and the model has chosen the one it runs."""
        return self.requested_strategy == self.Strategy.AUTO and self.planned

    @property
    def is_terminal(self) -> bool:
        return self.state in self.TERMINAL

    @property
    def tearing_down(self) -> bool:
        """Ended, but its cluster is still recorded: the teardown runs in the background (or is being retried).
        False where the cluster column was deferred (the admin dashboard's long lists) rather than a query per row."""
        return self.is_terminal and "cluster" not in self.get_deferred_fields() and self.cluster is not None

    @property
    def state_label(self) -> str:
        """The state as pages show it: a cancelled job is "cancelling" until its cluster is gone."""
        return "cancelling" if self.state == self.State.CANCELLED and self.tearing_down else self.state

    @property
    def duration_s(self) -> float | None:
        if not self.started_at:
            return None
        return ((self.finished_at or timezone.now()) - self.started_at).total_seconds()

    @property
    def billed_s(self) -> float | None:
        """Seconds its cluster is billed for: from its launch to the end of its teardown, or to now while it is up
        (whatever state the job is in); None while no cluster was launched."""
        if self.launched_at is None:
            return None
        return max(0.0, ((self.torn_down_at or timezone.now()) - self.launched_at).total_seconds())

    @property
    def cost_so_far(self) -> float | None:
        """$ at the catalogue's price (a spot job's at its spot prices): the cluster's hourly cost (every node, the
        PS included) per second it has been up, from its launch to its teardown, plus its profiling runs' (an
        estimate, not a bill); None while nothing of it has been priced and launched."""
        if (self.hourly_cost is None or self.launched_at is None) and not self.profiling_runs:
            return None
        return self.cost_between()

    @property
    def cost_label(self) -> str:
        """What `cost_so_far` is called: the cost so far while the job may still run, its total cost once it ended."""
        return "Total cost" if self.is_terminal else "Cost so far"

    @property
    def budget_so_far(self) -> float | None:
        """$ the budget in $/h allows over the same time, to hold the cost against."""
        if self.budget is None or self.billed_s is None:
            return None
        return float(self.budget) * self.billed_s / 3600

    def run_span(self, run: dict, now: datetime) -> tuple[datetime, datetime, float]:
        """A profiling or trial run's (an entry of `profiling_runs`), or a span of its cluster's `rates`, billed span
        and $/h: from its start to its end; one cut off (its worker lost) ended with its cluster's teardown, and one
        still up is billed to `now`."""
        ended = _moment(run.get("ended_at")) or self.torn_down_at or now
        return datetime.fromisoformat(run["started_at"]), ended, float(run["hourly_cost"])

    def cost_between(
        self, start: datetime | None = None, end: datetime | None = None, now: datetime | None = None
    ) -> float:
        """$ of the parts of its clusters' lives inside [start, end): its cluster's (launched → torn down, or `now`
        while it is up: at `hourly_cost`, or a spot job's at each of its `rates` over its span) and its profiling
        runs' (fc2/services/profiling.py), each at its own $/h."""
        now = now or timezone.now()
        spans = [self.run_span(run, now) for run in [*(self.profiling_runs or []), *(self.rates or [])]]
        if self.hourly_cost is not None and self.launched_at is not None and not self.rates:
            spans.append((self.launched_at, self.torn_down_at or now, float(self.hourly_cost)))
        total = 0.0
        for up_from, up_to, hourly in spans:
            up_from = max(up_from, start) if start else up_from
            up_to = min(up_to, end) if end else up_to
            total += hourly * max(0.0, (up_to - up_from).total_seconds()) / 3600
        return total

    @property
    def time_limit_from(self) -> datetime:
        """Where its time limit (FC2_JOB_TIMEOUT_S) counts from: the start of its run, or its submission before it."""
        return self.started_at or self.created_at

    def projection(self, startup_s: float = 0.0, teardown_s: float = 0.0) -> Projection | None:
        """What the job will have cost once its cluster is gone: the cost so far plus its $/h over the time still to
        be billed — the start-up not spent yet (`startup_s` from the launch until the training's first progress), the
        training to come (the recommender's predicted epoch time × the epochs not done yet, else the pace measured so
        far, and never past its time limit, which bounds it when neither is known) and the teardown (`teardown_s`).
        The overheads are the provider's, as the estimate before the job took them (fc2/services/pricing.py). An ended
        job's is its cost so far. None until it is priced."""
        if self.hourly_cost is None:
            return None
        so_far = self.cost_so_far or 0.0
        if self.is_terminal:
            return Projection(so_far, "ended")
        now = timezone.now()
        limit_s = float(settings.FC2_JOB_TIMEOUT_S)
        left_s = max(0.0, limit_s - (now - self.started_at).total_seconds()) if self.started_at else limit_s
        to_come_s, basis = self._training_to_come_s(now)
        if to_come_s is None or to_come_s > left_s:
            to_come_s, basis = left_s, "time limit"
        if not self.progress:
            spent_s = (now - self.launched_at).total_seconds() if self.launched_at else 0.0
            to_come_s += max(0.0, startup_s - spent_s)
        return Projection(so_far + float(self.hourly_cost) * (to_come_s + teardown_s) / 3600, basis)

    def _training_to_come_s(self, now: datetime) -> tuple[float | None, str]:
        done = self.progress or 0.0
        epoch_s = (self.recommendation or {}).get("predicted_epoch_time_s")
        epochs = self.epochs or epochs_parameter(self.parameters or {})
        if epoch_s and epochs:
            return epoch_s * epochs * (1 - done), "prediction"
        if done > 0 and self.started_at:
            return (now - self.started_at).total_seconds() * (1 - done) / done, "pace"
        return None, ""

    def cost_summary(self, projection: Projection | None) -> dict:
        """Its costs as its JSON gives them: $ at the catalogue's prices (estimates, not bills), its `projection`
        (`pricing.projection`), and when its cluster's billing began and ended."""

        def dollars(value: float | Decimal | None) -> float | None:
            return None if value is None else round(float(value), 6)

        return {
            "hourly_cost": dollars(self.hourly_cost),
            "budget": dollars(self.budget),
            "total_budget": dollars(self.total_budget),
            "cost_so_far": dollars(self.cost_so_far),
            "projected_total": dollars(projection.total) if projection else None,
            "projected_by": projection.basis if projection else None,
            "launched_at": self.launched_at.isoformat() if self.launched_at else None,
            "torn_down_at": self.torn_down_at.isoformat() if self.torn_down_at else None,
        }

    @property
    def headline(self) -> results.Headline | None:
        """The figure the job's result is compared by (test accuracy, else a loss), rounded."""
        return results.headline(self.metrics or {}, self.loss)

    @property
    def failure_summary(self) -> str:
        """Why the job failed, in one line (a node's log reduced to its last meaningful line)."""
        return results.failure_summary(self.failure_reason)

    @property
    def progress(self) -> float | None:
        """How much of its training is done, 0 to 1: the chief's steps, else its epochs; None before it reports."""
        if self.state == self.State.SUCCEEDED:
            return 1.0
        if self.steps and self.step is not None:
            return min(1.0, self.step / self.steps)
        if self.epochs and self.epoch is not None:
            return min(1.0, self.epoch / self.epochs)
        return None

    @property
    def progress_percent(self) -> int | None:
        return None if self.progress is None else round(100 * self.progress)

    def issue_token(self) -> str:
        """A fresh job-scoped secret for the cluster's agents; only its hash is kept."""
        token = secrets.token_urlsafe(32)
        self.token_hash = hashlib.sha256(token.encode()).hexdigest()
        return token

    def token_matches(self, token: str) -> bool:
        if not self.token_hash or not token:
            return False
        return hmac.compare_digest(self.token_hash, hashlib.sha256(token.encode()).hexdigest())

    def transition(self, source: str | tuple[str, ...], target: str, message: str = "", **fields: Any) -> bool:
        """Move from `source` to `target` if the job is still there; record the event. False if another actor won.

        The conditional UPDATE is the claim: a redelivered task, or a cancel racing a step, changes no row and
        so does nothing.
        """
        sources = (source,) if isinstance(source, str) else source
        now = timezone.now()
        if target == self.State.RUNNING:
            fields.setdefault("started_at", now)
        if target in self.TERMINAL:
            fields.setdefault("finished_at", now)
        with transaction.atomic():
            claimed = Job.objects.filter(pk=self.pk, state__in=sources).update(state=target, **fields)
            if claimed:
                JobEvent.objects.create(job_id=self.pk, at=now, state=target, message=message)
        if claimed:
            self.state = target
            for name, value in fields.items():
                setattr(self, name, value)
        return bool(claimed)

    def log(self, message: str) -> None:
        JobEvent.objects.create(job=self, state=self.state, message=message)


class JobEvent(models.Model):
    """A timestamped line in a job's timeline: every state transition and notable step."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=15)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.state} {self.message}"


class Node(models.Model):
    """One node of a job's cluster as the platform sees it, updated from its agent's reports."""

    class Status(models.TextChoices):
        PENDING = "pending"
        STARTED = "started"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        STOPPED = "stopped"

    FINISHED = (Status.SUCCEEDED, Status.FAILED)  # a final status its agent reported

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=50)
    role = models.CharField(max_length=10)
    index = models.PositiveIntegerField()
    instance_type = models.CharField(max_length=40, blank=True)
    address = models.CharField(max_length=100, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    exit_code = models.IntegerField(null=True, blank=True)
    epoch = models.PositiveIntegerField(null=True, blank=True)
    step = models.PositiveIntegerField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_report_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "pk"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="unique_node_name_per_job")]

    def __str__(self) -> str:
        return f"{self.name} of job {self.job_id}"


def artifact_upload_to(instance: Artifact, filename: str) -> str:
    return f"artifacts/job-{instance.job_id}/{secrets.token_hex(4)}/{PurePosixPath(filename).name}"


class Artifact(models.Model):
    """A result to download: the trained model, metrics, a node's log."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts")
    name = models.CharField(max_length=255)
    # The output's path as its node wrote it (any bytes Linux allows), escaped to printable text (fc2.services.
    # artifacts.escape); empty for what the platform itself wrote (a node's log).
    original_name = models.TextField(blank=True)
    file = models.FileField(upload_to=artifact_upload_to, max_length=300, blank=True)
    size_bytes = models.BigIntegerField()
    # Why the output was not kept (e.g. over FC2_MAX_ARTIFACT_MB), with no file; empty for an artifact kept.
    not_kept = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    step = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="A checkpoint's: the chief's step it was saved at, as its agent saw it"
    )

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="unique_artifact_name_per_job")]

    def __str__(self) -> str:
        return self.name

    @property
    def written_as(self) -> str:
        """The output's own name, escaped, where the name it is stored under differs from it (made safe, or made
        unique); empty otherwise."""
        own = self.name.rsplit("/", 1)[-1]
        return self.original_name if self.original_name not in ("", own, own.removesuffix(".zip")) else ""


class ReapedCluster(models.Model):
    """A leftover cluster the platform found and removed (fc2.services.sweep.reap): made for a job no row records
    any more (its row deleted, or a database restored from before it), or by hand and reaped with `cluster reap
    --all`. What its provider removed is kept, so that an operator can tell what was running and since when it is
    gone."""

    class By(models.TextChoices):
        SWEEP = "sweep", "the sweep"
        COMMAND = "command", "cluster reap"

    provider = models.CharField(max_length=20)
    region = models.CharField(max_length=40, blank=True)
    cluster_name = models.CharField(max_length=100)
    job_number = models.PositiveIntegerField(null=True, blank=True, help_text="the job it was made for, from its name")
    resources = models.JSONField(default=list, help_text="what its provider removed, one line each")
    reaped_at = models.DateTimeField(default=timezone.now, db_index=True)
    by = models.CharField(max_length=10, choices=By.choices)

    class Meta:
        ordering = ["-reaped_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.provider} cluster {self.cluster_name}"


# What every personal API token starts with, so that a token pasted where it should not be is recognisable (and found
# by secret scanners); the rest is 32 random bytes, which is why one round of SHA-256 is the right hash to keep.
API_TOKEN_PREFIX = "fc2_"
# How much of a token its lists show (the prefix and a few random characters): enough to tell two tokens apart.
API_TOKEN_SHOWN_CHARS = 12
# A token's last use is written at most this often: one request a minute per token pays for an UPDATE.
API_TOKEN_TOUCH_S = 60


def api_token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def find(self, secret: str) -> ApiToken | None:
        """The token whose secret this is, with its user, in one indexed query; None if there is none."""
        if not secret.startswith(API_TOKEN_PREFIX):
            return None
        try:  # (get, not first: no ORDER BY for a unique key)
            return self.select_related("user").get(token_hash=api_token_hash(secret))
        except ApiToken.DoesNotExist:
            return None


class ApiToken(models.Model):
    """A personal API token: its owner's name for it and its metadata. The secret is shown once, when it is made
    (`ApiToken.issue`); only its SHA-256 is kept."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the owner calls it, e.g. the machine or script using it")
    prefix = models.CharField(max_length=API_TOKEN_SHOWN_CHARS, help_text="Its first characters, to recognise it by")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True, help_text="To the minute")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: it does not expire")
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # A user's live tokens have names of their own, so that `api_token revoke USER --name NAME` names one.
            models.UniqueConstraint(
                fields=["user", "name"], condition=models.Q(revoked_at__isnull=True), name="unique_live_token_name"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user: User, name: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
        """A new token for `user` and its secret, which is not kept anywhere: show it once."""
        secret = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user,
            name=name,
            prefix=secret[:API_TOKEN_SHOWN_CHARS],
            token_hash=api_token_hash(secret),
            expires_at=expires_at,
        )
        return token, secret

    @property
    def status(self) -> str:
        """ "active", "revoked" or "expired"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "expired"
        return "active"

    def refusal(self) -> str | None:
        """Why a request with this token is refused (its status, or its user's), or None."""
        if self.status != "active":
            return f"this API token is {self.status}"
        if not self.user.is_active:
            return "this API token's user is inactive"
        return None

    def touch(self) -> None:
        """Record a use, at most once every API_TOKEN_TOUCH_S: a conditional update, so that concurrent requests
        write it once."""
        now = timezone.now()
        stale = now - timedelta(seconds=API_TOKEN_TOUCH_S)
        if self.last_used_at is not None and self.last_used_at > stale:
            return
        fresh = models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lte=stale)
        if ApiToken.objects.filter(fresh, pk=self.pk).update(last_used_at=now):
            self.last_used_at = now

    def revoke(self) -> bool:
        """Revoke it for good; False if it already was."""
        now = timezone.now()
        if not ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=now):
            return False
        self.revoked_at = now
        return True


class IdempotencyKey(models.Model):
    """A client's `Idempotency-Key` on `POST /api/jobs` (IETF httpapi draft): the same key from the same user within
    IDEMPOTENCY_WINDOW answers the job its first use made, never a second one; the same key with another body is
    refused. Stored in the submission's own transaction, so a key exists exactly when its job does."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="idempotency_keys")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64, help_text="SHA-256 of the request as it came (method, path, body)")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="unique_idempotency_key_per_user")]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.key}"


class JobRecord(models.Model):
    """A performance record a job measured: its run's (feedback.record_job) or a profiling run's of its recommend step
    (profiling.measure). The link lives here, in the app above, so that the recommender knows nothing of jobs;
    deleting the job leaves the record, deleting the record its link."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="record_links")
    record = models.OneToOneField("recommender.PerformanceRecord", on_delete=models.CASCADE, related_name="job_link")

    def __str__(self) -> str:
        return f"job {self.job_id} → record {self.record_id}"


class CeleryWorker(models.Model):
    """A Celery worker's heartbeat, one row per worker hostname: its consumer writes `beat_at` every third of
    FC2_WORKER_SILENCE_S while it is connected to the broker and consuming (fc2/celery.py's WorkerBeat step), so a
    worker that died, hangs or lost its broker stops beating. Whether any worker is taking jobs is decided when read
    (fc2/services/workers.py)."""

    hostname = models.CharField(max_length=255, unique=True, help_text="Celery's node name, e.g. celery@host")
    queues = models.JSONField(default=list, help_text="The queues it consumes from")
    beat_at = models.DateTimeField(help_text="When it last said it was up and consuming")
    task_started_at = models.DateTimeField(null=True, blank=True, help_text="When it last started a task")
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="When it last shut down (until its next beat)")

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname
