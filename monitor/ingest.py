"""Ingestion of node reports into the time series."""

from __future__ import annotations

from monitor.models import NodeSample


def record_sample(node, sample: dict, progress: dict | None = None) -> NodeSample:
    """Store one resource sample of `node` (a fc2.Node), with the training step it was taken at."""
    progress = progress or {}
    return NodeSample.objects.create(
        node=node,
        cpu_percent=sample.get("cpu_percent"),
        memory_mb=sample.get("memory_mb"),
        gpu_percent=sample.get("gpu_percent"),
        bytes_sent=sample.get("bytes_sent"),
        bytes_recv=sample.get("bytes_recv"),
        step=progress.get("step"),
        loss=progress.get("loss"),
    )
