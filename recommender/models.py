"""Instance catalogues: versioned lists of instance types with price and capacity, editable in the admin."""

from django.db import models
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone


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


class PerformanceRecord(models.Model):
    """One measured (or failed) training configuration: what the algorithms and the model learn from.

    A record with no epoch time is a failed run (Anwar's single machine at batch 64000): kept and counted, never used
    as a time.
    """

    class Source(models.TextChoices):
        IMPORTED = "imported", "Imported"
        PROFILED = "profiled", "Bandwidth profiling run"
        MEASURED = "measured", "Measured by a job"

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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workload", "instance_type", "workers", "batch_size", "latency_ms"]
        indexes = [models.Index(fields=["workload", "batch_size", "latency_ms"])]

    def __str__(self) -> str:
        what = f"{self.workers or '?'} × {self.instance_type or '?'}"
        return f"{self.workload}: {what}, batch {self.batch_size}, {self.latency_ms} ms → {self.epoch_time_s} s"

    @property
    def failed(self) -> bool:
        return self.epoch_time_s is None and self.bandwidth_mbps is None


@receiver([post_save, post_delete], sender=InstanceType)
def _touch_catalog(sender, instance: InstanceType, **kwargs) -> None:
    """Any change to a type (admin edit, refresh, removal) moves its catalogue's updated_at (the admin's list shows
    when a catalogue last changed)."""
    Catalog.objects.filter(pk=instance.catalog_id).update(updated_at=timezone.now())
