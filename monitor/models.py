"""Time series of what each node's agent measured: CPU, memory, GPU, network bytes, training progress."""

from django.db import models
from django.utils import timezone


class NodeSample(models.Model):
    node = models.ForeignKey("fc2.Node", on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(default=timezone.now)
    cpu_percent = models.FloatField(null=True, blank=True, help_text="Sum over the node's processes (100 = 1 core)")
    memory_mb = models.FloatField(null=True, blank=True)
    gpu_percent = models.FloatField(null=True, blank=True)
    bytes_sent = models.BigIntegerField(null=True, blank=True, help_text="Cumulative, as the node's counters say")
    bytes_recv = models.BigIntegerField(null=True, blank=True)
    step = models.PositiveIntegerField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["node", "at"]
        indexes = [models.Index(fields=["node", "at"])]

    def __str__(self) -> str:
        return f"{self.node} @ {self.at:%H:%M:%S}"
