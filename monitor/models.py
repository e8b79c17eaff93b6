"""Time series of what each node's agent measured: CPU, memory, GPU, network bytes, and every loss it printed."""

from django.db import models
from django.utils import timezone


class NodeSample(models.Model):
    """One resource sample of a node. `at` is when the platform received it (the charts' cursor: a sample the agent
    kept while the platform was unreachable arrives late), `measured_at` when the agent took it (what rates and
    charts are drawn against). Bytes are unknown (null) where the node shares the machine's network."""

    node = models.ForeignKey("fc2.Node", on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(default=timezone.now)
    measured_at = models.DateTimeField(default=timezone.now)
    cpu_percent = models.FloatField(null=True, blank=True, help_text="Sum over the node's processes (100 = 1 core)")
    node_cpu_percent = models.FloatField(null=True, blank=True, help_text="The whole machine's, where it is the node's")
    memory_mb = models.FloatField(null=True, blank=True)
    gpu_percent = models.FloatField(null=True, blank=True)
    gpu_memory_mb = models.FloatField(null=True, blank=True)
    bytes_sent = models.BigIntegerField(null=True, blank=True, help_text="Cumulative, as the node's counters say")
    bytes_recv = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["node", "measured_at"]
        indexes = [
            models.Index(fields=["node", "at"]),
            models.Index(fields=["node", "measured_at"], name="monitor_sample_measured_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.node} @ {self.measured_at:%H:%M:%S}"


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
