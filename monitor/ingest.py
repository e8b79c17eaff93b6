"""Ingestion of node reports into the time series."""

from __future__ import annotations

import math

from monitor.models import NodeSample


def finite_or_none(value):
    """A reading as a chart can draw it and JSON can carry it: NaN and ±inf (which json.loads reads, and a diverging
    run or a broken counter produces) are unknown; anything else is returned as it is.

    >>> [finite_or_none(v) for v in (1.5, float("inf"), float("nan"), None, 7)]
    [1.5, None, None, None, 7]
    """
    return None if isinstance(value, float) and not math.isfinite(value) else value


def record_sample(node, sample: dict, progress: dict | None = None) -> NodeSample:
    """Store one resource sample of `node` (a fc2.Node), with the training step it was taken at."""
    progress = progress or {}
    return NodeSample.objects.create(
        node=node,
        cpu_percent=finite_or_none(sample.get("cpu_percent")),
        memory_mb=finite_or_none(sample.get("memory_mb")),
        gpu_percent=finite_or_none(sample.get("gpu_percent")),
        bytes_sent=sample.get("bytes_sent"),
        bytes_recv=sample.get("bytes_recv"),
        step=progress.get("step"),
        loss=finite_or_none(progress.get("loss")),
    )
