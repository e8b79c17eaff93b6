"""Ingestion of node reports into the time series: resource samples and loss points."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Model

from monitor.models import LossPoint, NodeSample


def finite_or_none(value: Any) -> Any:
    """A reading as a chart can draw it and JSON can carry it: NaN and ±inf (which json.loads reads, and a diverging
    run or a broken counter produces) are unknown; anything else is returned as it is.

    >>> [finite_or_none(v) for v in (1.5, float("inf"), float("nan"), None, 7)]
    [1.5, None, None, None, 7]
    """
    return None if isinstance(value, float) and not math.isfinite(value) else value


READINGS = ("cpu_percent", "node_cpu_percent", "memory_mb", "gpu_percent", "gpu_memory_mb")  # a sample's floats
# How far an agent's clock may be from the platform's before its sample times are taken as received instead.
CLOCK_SLACK = timedelta(days=1)


def record_samples(node: Model, samples: Sequence[dict], received: datetime) -> list[NodeSample]:
    """Store resource samples of `node` (a fc2.Node) received at `received`, in one insert; each sample's `at` is
    the unix time the agent took it (never later than received)."""
    rows = []
    for sample in samples:
        measured = received
        if sample.get("at") is not None:
            measured = min(datetime.fromtimestamp(sample["at"], UTC), received)
            if received - measured > CLOCK_SLACK:
                measured = received
        rows.append(
            NodeSample(
                node_id=node.pk,  # a fc2.Node, which the monitor does not import
                at=received,
                measured_at=measured,
                **{name: finite_or_none(sample.get(name)) for name in READINGS},
                bytes_sent=sample.get("bytes_sent"),
                bytes_recv=sample.get("bytes_recv"),
            )
        )
    return NodeSample.objects.bulk_create(rows)


def record_losses(node: Model, progress_lines: Iterable[dict]) -> list[LossPoint]:
    """Store each progress line of `node` that has a step and a finite loss as a loss point; `at` in a line is the
    unix time the agent read it."""
    points = [
        LossPoint(
            node_id=node.pk,
            printed_at=datetime.fromtimestamp(line["at"], UTC) if line.get("at") is not None else None,
            epoch=line.get("epoch"),
            step=line["step"],
            loss=line["loss"],
        )
        for line in progress_lines
        if line.get("step") is not None and finite_or_none(line.get("loss")) is not None
    ]
    return LossPoint.objects.bulk_create(points)
