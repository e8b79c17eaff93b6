"""Instance catalogues: versioned lists of instance types with price and capacity, editable in the admin."""

from django.db import models


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
    hourly_price = models.DecimalField(max_digits=10, decimal_places=4, help_text="On-demand $/h")
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
