"""Time series of what each node's agent measured: CPU, memory, GPU, network bytes, and every loss it printed."""

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

    class Meta:
        ordering = ["node", "at"]
        indexes = [models.Index(fields=["node", "at"])]

    def __str__(self) -> str:
        return f"{self.node} @ {self.at:%H:%M:%S}"


class LossPoint(models.Model):
    """A loss the node printed (one `FC2_PROGRESS` line): the loss curve keeps every one, not one per report."""

    node = models.ForeignKey("fc2.Node", on_delete=models.CASCADE, related_name="loss_points")
    at = models.DateTimeField(default=timezone.now, help_text="When the platform received it (the series' cursor)")
    printed_at = models.DateTimeField(null=True, blank=True, help_text="When the node's agent read the line")
    epoch = models.PositiveIntegerField(null=True, blank=True)
    step = models.PositiveIntegerField()
    loss = models.FloatField()

    class Meta:
        ordering = ["node", "at", "pk"]
        indexes = [models.Index(fields=["node", "at"])]

    def __str__(self) -> str:
        return f"{self.node} step {self.step}: {self.loss}"
