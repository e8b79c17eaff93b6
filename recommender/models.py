"""Instance catalogues: versioned lists of instance types with price and capacity, editable in the admin; and the
performance records the algorithms and the model learn from, each the platform's or one user's."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from recommender.bounds import BOUNDS, out_of_bounds


class Catalog(models.Model):
    name = models.CharField(max_length=50, unique=True)
    version = models.CharField(max_length=50)
    provider = models.CharField(max_length=20, default="aws")
    region = models.CharField(max_length=30, blank=True)
    source = models.TextField(blank=True, help_text="Where the figures come from")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.version})"


class InstanceType(models.Model):
    class Role(models.TextChoices):
        PS = "ps", "Parameter server"
        WORKER = "worker", "Worker"
        ANY = "any", "Any"

    catalog = models.ForeignKey(Catalog, on_delete=models.CASCADE, related_name="types")
    name = models.CharField(max_length=40)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.ANY)
    hourly_price = models.DecimalField(max_digits=12, decimal_places=6, help_text="On-demand $/h")
    vcpu = models.PositiveIntegerField(null=True, blank=True)
    ecu = models.FloatField(null=True, blank=True, help_text="EC2 compute units (empty: variable)")
    memory_gib = models.FloatField(null=True, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    gpu_model = models.CharField(max_length=60, blank=True)
    network_mbps = models.FloatField(null=True, blank=True, help_text="Network capacity")

    class Meta:
        ordering = ["catalog", "hourly_price", "name"]
        constraints = [models.UniqueConstraint(fields=["catalog", "name"], name="unique_type_per_catalog")]

    def __str__(self) -> str:
        return f"{self.name} ({self.catalog.name})"


def within_bounds() -> Q:
    """The rows whose every bounded figure (recommender/bounds.py) is absent or within its bound: the same rule as
    `bounds.out_of_bounds`, as a query, for rows written around the doors that check it (raw SQL, an old row). A NaN
    fails it on every database: PostgreSQL orders NaN above every number, SQLite stores it as NULL."""
    query = Q()
    for name, bound in BOUNDS.items():
        query &= Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__gte": bound.low, f"{name}__lte": bound.high})
    return query


class PerformanceRecordQuerySet(models.QuerySet):
    def readable_by(self, owner_id: int | None) -> PerformanceRecordQuerySet:
        """The records user `owner_id` may see and an answer for them may read: the platform's and that user's own
        (None: the platform's alone)."""
        whose = Q(owner__isnull=True) if owner_id is None else Q(owner__isnull=True) | Q(owner_id=owner_id)
        return self.filter(whose)

    def usable(self) -> PerformanceRecordQuerySet:
        """The records an answer may read: not marked unusable, every figure within its bound."""
        return self.filter(within_bounds(), unusable="")


class PerformanceRecord(models.Model):
    """One measured (or failed) training configuration: what the algorithms and the model learn from.

    A record with no epoch time is a failed run (Anwar's single machine at batch 64000): kept and counted, never used
    as a time.

    Its trust level is its owner. A record with none is the platform's: the shipped grids, what an operator imports,
    and what an admin promotes; every user's answers read it. A record a user's job measured (or that was imported
    for a user) is that user's: only that user's answers read it, so that no user's code can steer another's
    cluster. Deleting the user deletes their records; a promoted record, the platform's now, stays.
    """

    class Source(models.TextChoices):
        IMPORTED = "imported", "Imported"
        PROFILED = "profiled", "Bandwidth profiling run"
        MEASURED = "measured", "Measured by a job"
        TRIAL = "trial", "Trial run of explore"

    workload = models.CharField(max_length=100, db_index=True)
    instance_type = models.CharField(max_length=40, blank=True, help_text="Worker type")
    ps_type = models.CharField(max_length=40, blank=True)
    workers = models.PositiveIntegerField(null=True, blank=True)
    batch_size = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    strategy = models.CharField(max_length=10, blank=True)
    step_time_s = models.FloatField(null=True, blank=True)
    epoch_time_s = models.FloatField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    bandwidth_mbps = models.FloatField(null=True, blank=True, help_text="One worker's network use")
    cpu_util = models.FloatField(null=True, blank=True, help_text="0-100")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.IMPORTED)
    origin = models.CharField(max_length=300, blank=True, help_text="Imported file (name and sha256) or job")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="performance_records",
        help_text="Whose record: empty for the platform's, which every user's answers read; else only its owner's",
    )
    promoted_from = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="Whose it was before an admin made it the platform's",
    )
    unusable = models.CharField(
        max_length=300, blank=True, help_text="Why no answer reads it (a figure out of its bound); empty: usable"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PerformanceRecordQuerySet.as_manager()

    class Meta:
        ordering = ["workload", "instance_type", "workers", "batch_size", "latency_ms"]
        indexes = [models.Index(fields=["workload", "batch_size", "latency_ms"])]

    def __str__(self) -> str:
        what = f"{self.workers or '?'} × {self.instance_type or '?'}"
        return f"{self.workload}: {what}, batch {self.batch_size}, {self.latency_ms} ms → {self.epoch_time_s} s"

    @property
    def failed(self) -> bool:
        return self.epoch_time_s is None and self.bandwidth_mbps is None

    @property
    def trust(self) -> str:
        """The record's trust level: "platform" (every user's answers read it) or "owner" (its owner's alone)."""
        return "platform" if self.owner_id is None else "owner"

    def clean(self) -> None:
        """Every figure within its bound (the admin's door); a record corrected so is usable again."""
        super().clean()
        errors = {name: out_of_bounds({name: getattr(self, name)}) for name in BOUNDS}
        if errors := {name: problems for name, problems in errors.items() if problems}:
            raise ValidationError(errors)
        self.unusable = ""


@receiver([post_save, post_delete], sender=InstanceType)
def _touch_catalog(sender: type[InstanceType], instance: InstanceType, **kwargs: object) -> None:
    """Any change to a type (admin edit, refresh, removal) moves its catalogue's updated_at (the admin's list shows
    when a catalogue last changed)."""
    Catalog.objects.filter(pk=instance.catalog_id).update(updated_at=timezone.now())
