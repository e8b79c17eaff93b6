"""Chart series from a job's node samples and loss points: network rates from cumulative byte counters, per-node
grouping, the chief's loss curve (every loss it printed), and downsampling so a long run still sends at most a few
hundred points per node.

The shaping functions are pure (they take `Sample`s and `Loss`es, not rows); the `load_*` functions are the ones
that query. The monitor knows no job: its caller (fc2.services.monitoring) names a run's nodes as `WatchedNode`s.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce
from typing import TYPE_CHECKING, Any

from django.db.models import Avg, Count, F, FloatField, Func, Max, Min, Q, QuerySet, Subquery, Value
from django.db.models.functions import Floor

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler, _AsSqlType

from monitor.ingest import finite_or_none
from monitor.models import LossPoint, NodeSample

MAX_POINTS = 500  # per node and per curve: more than a chart a few hundred pixels wide can show
SLACK_S = 0.001  # how far apart the database's and Python's seconds of one timestamp may be
KEPT_FROM_LAST = {"at", "step"}  # what a downsampled point takes from its bucket's last point; the rest is averaged


@dataclass(frozen=True)
class WatchedNode:
    """A node of a run as the monitor needs it, made by its caller from its own rows (as SkyPilot's provision layer
    takes dataclasses, never its caller's ORM objects)."""

    id: int  # what its samples and loss points are stored under (NodeSample.node, LossPoint.node)
    name: str
    role: str  # "ps", "chief" or "worker"
    instance_type: str
    chief: bool  # the node whose losses are the run's loss curve


@dataclass(frozen=True)
class Sample:
    """One agent sample, as the series need it."""

    node_id: int
    at: datetime  # when the agent took it
    cpu_percent: float | None = None
    memory_mb: float | None = None
    gpu_percent: float | None = None
    bytes_sent: int | None = None  # cumulative, as the node's counters say; None where not measured per node
    bytes_recv: int | None = None
    received: datetime | None = None  # when the platform got it (the cursor); None: when taken


@dataclass(frozen=True)
class Loss:
    """One loss the chief printed."""

    at: datetime  # when it was printed (or, when the agent did not say, received)
    step: int
    loss: float


def rate_mbps(prev_bytes: int | None, prev_at: datetime, now_bytes: int | None, now_at: datetime) -> float | None:
    """Megabits per second between two readings of a cumulative byte counter; None when it cannot be known.

    A counter that went down was reset (agent restarted, interface re-created): the bytes in between are unknown.

    >>> from datetime import timedelta
    >>> t = datetime(2026, 11, 1, tzinfo=UTC)
    >>> rate_mbps(0, t, 2_500_000, t + timedelta(seconds=2))
    10.0
    >>> rate_mbps(9_000, t, 100, t + timedelta(seconds=2)) is None
    True
    """
    if prev_bytes is None or now_bytes is None or now_bytes < prev_bytes:
        return None
    seconds = (now_at - prev_at).total_seconds()
    if seconds <= 0:
        return None
    return round((now_bytes - prev_bytes) * 8 / seconds / 1e6, 3)


def resource_points(samples: Sequence[Sample]) -> list[dict]:
    """One node's samples (oldest first) as chart points; each point's rates cover the time since the sample before."""
    points = []
    for prev, sample in zip([None, *samples[:-1]], samples, strict=True):
        point = {
            "at": sample.at,
            "cpu_percent": sample.cpu_percent,
            "memory_mb": sample.memory_mb,
            "gpu_percent": sample.gpu_percent,
            "sent_mbps": None,
            "recv_mbps": None,
        }
        if prev is not None:
            point["sent_mbps"] = rate_mbps(prev.bytes_sent, prev.at, sample.bytes_sent, sample.at)
            point["recv_mbps"] = rate_mbps(prev.bytes_recv, prev.at, sample.bytes_recv, sample.at)
        points.append(point)
    return points


def latest_reading(newest_first: Sequence) -> tuple[object | None, float | None, float | None]:
    """The node table's figures from a node's latest two samples (newest first): that sample, and the Mbps sent and
    received between the two."""
    if not newest_first:
        return None, None, None
    latest = newest_first[0]
    if len(newest_first) < 2:
        return latest, None, None
    prev = newest_first[1]
    return (
        latest,
        rate_mbps(prev.bytes_sent, prev.measured_at, latest.bytes_sent, latest.measured_at),
        rate_mbps(prev.bytes_recv, prev.measured_at, latest.bytes_recv, latest.measured_at),
    )


def loss_points(losses: Iterable[Loss]) -> list[dict]:
    """The loss curve: one point per training step (a step printed twice keeps its first loss).

    >>> t = datetime(2026, 11, 1, tzinfo=UTC)
    >>> [p["step"] for p in loss_points([Loss(t, 1, 0.9), Loss(t, 2, 0.8), Loss(t, 2, 0.8), Loss(t, 3, 0.7)])]
    [1, 2, 3]
    """
    points: list[dict] = []
    for item in losses:
        if points and points[-1]["step"] == item.step:
            continue
        points.append({"at": item.at, "step": item.step, "loss": item.loss})
    return points


def downsample(points: Sequence[dict], limit: int = MAX_POINTS) -> list[dict]:
    """At most `limit` points: consecutive buckets of near-equal size, each averaged into one point.

    A bucket's point takes the time (and step) of its last member, so the newest point stays exact; a value is the
    mean of the bucket's known values (None only when none is known), so a gap survives but one missing reading
    does not blank a whole bucket.

    >>> pts = [{"at": i, "cpu_percent": float(i)} for i in range(10)]
    >>> [(p["at"], p["cpu_percent"]) for p in downsample(pts, 4)]
    [(1, 0.5), (4, 3.0), (6, 5.5), (9, 8.0)]
    """
    if len(points) <= limit:
        return list(points)
    if limit < 1:
        return []
    out = []
    for i in range(limit):
        bucket = points[i * len(points) // limit : (i + 1) * len(points) // limit]
        merged = dict(bucket[-1])
        for key in merged.keys() - KEPT_FROM_LAST:
            known = [p[key] for p in bucket if p[key] is not None]
            merged[key] = round(sum(known) / len(known), 3) if known else None
        out.append(merged)
    return out


def shape(samples: Sequence[Sample], since: datetime | None = None, limit: int = MAX_POINTS) -> dict[int, list[dict]]:
    """Per-node resource points of the samples received after `since`, each node's downsampled.

    `samples` are ordered by node then the time they were taken and may include, per node, the last sample received
    at or before `since`: it is the base the first new rate is measured from, and is itself not sent again.
    """
    per_node: dict[int, list[dict]] = {}
    for node_id, grouped in itertools.groupby(samples, key=lambda s: s.node_id):
        group = list(grouped)
        points = resource_points(group)
        new = [p for s, p in zip(group, points, strict=True) if since is None or (s.received or s.at) > since]
        per_node[node_id] = downsample(new, limit)
    return per_node


def load_samples(
    node_ids: Sequence[int], since: datetime | None = None, taken_after: datetime | None = None
) -> list[Sample]:
    """The nodes' samples received after `since`, plus each node's latest one received at or before it (where its
    rates start from); one query, node then the time each was taken. `taken_after`: only those the agents took
    after then."""
    queryset = NodeSample.objects.filter(node_id__in=node_ids)
    if taken_after is not None:
        queryset = queryset.filter(measured_at__gt=taken_after)
    if since is not None:
        bases = (Q(pk=Subquery(_latest_received(node_id, since))) for node_id in node_ids)
        queryset = queryset.filter(reduce(operator.or_, bases, Q(at__gt=since)))
    rows = queryset.order_by("node_id", "measured_at", "pk").values_list(
        "node_id", "measured_at", "cpu_percent", "memory_mb", "gpu_percent", "bytes_sent", "bytes_recv", "at"
    )
    # Rows stored before reports turned NaN and ±inf into unknowns may hold them; JSON cannot carry them.
    return [Sample(*map(finite_or_none, row)) for row in rows]


def _latest_received(node_id: int, moment: datetime) -> QuerySet[NodeSample, Any]:
    """The node's latest sample (by the time it was taken) received at or before `moment`, as a one-row subquery."""
    received = NodeSample.objects.filter(node_id=node_id, at__lte=moment)
    return received.order_by("-measured_at", "-pk").values("pk")[:1]


class Epoch(Func):
    """A timestamp column as seconds since 1970 (a float), in the database."""

    output_field = FloatField()

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)", **extra)

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any) -> _AsSqlType:
        template = "((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        return self.as_sql(compiler, connection, template=template, **extra)


def load_first(node_ids: Sequence[int], limit: int = MAX_POINTS) -> list[Sample]:
    """The nodes' samples for a first load of their charts: every one where there are few; else, for a long run,
    each node's in at most `limit` time buckets, merged in the database (a day at 1 Hz is 86,400 rows a node, too
    many to carry to Python to draw 500 points). A merged sample is at its bucket's last time, has the mean of its
    readings and the last (largest) value of each cumulative counter, so that the rates between buckets are the
    buckets' mean rates (a counter reset inside a bucket blurs that bucket's rate)."""
    samples = NodeSample.objects.filter(node_id__in=node_ids)
    span = samples.aggregate(rows=Count("pk"), first=Min("measured_at"), last=Max("measured_at"))
    if span["rows"] <= limit * max(len(node_ids), 1):
        return load_samples(node_ids)
    first, seconds = span["first"].timestamp(), (span["last"] - span["first"]).total_seconds()
    # SQLite's julianday is exact to about 20 µs: a millisecond's slack keeps the first sample in the first bucket and
    # the last in the last.
    width = (seconds + 2 * SLACK_S) / limit
    bucket = Floor((Epoch(F("measured_at")) - Value(first - SLACK_S)) / Value(width))
    rows = (
        samples.annotate(bucket=bucket)
        .values("node_id", "bucket")
        .annotate(
            last=Max("measured_at"),
            cpu=Avg("cpu_percent"),
            memory=Avg("memory_mb"),
            gpu=Avg("gpu_percent"),
            sent=Max("bytes_sent"),
            recv=Max("bytes_recv"),
            received=Max("at"),
        )
        .order_by("node_id", "bucket")
        .values_list("node_id", "last", "cpu", "memory", "gpu", "sent", "recv", "received")
    )
    return [Sample(*map(finite_or_none, row)) for row in rows]


def load_losses(node_ids: Iterable[int], since: datetime | None = None) -> tuple[list[Loss], datetime | None]:
    """The losses the nodes printed, received after `since`, in the order they were printed; and when the newest of
    them was received (the cursor: the time a node printed a line may be older than a report received before it)."""
    queryset = LossPoint.objects.filter(node_id__in=list(node_ids))
    if since is not None:
        queryset = queryset.filter(at__gt=since)
    rows = list(queryset.order_by("at", "pk").values_list("at", "printed_at", "step", "loss"))
    losses = [Loss(printed_at or at, step, loss) for at, printed_at, step, loss in rows]
    return losses, max((row[0] for row in rows), default=None)


def run_series(nodes: Sequence[WatchedNode], since: datetime | None = None, limit: int = MAX_POINTS) -> dict:
    """What a run's charts need (newer than `since`): every node with its points, the loss curve, and the cursor to
    ask from next time. Two queries: the samples and the chief's losses."""
    node_ids = [n.id for n in nodes]
    samples = load_samples(node_ids, since) if since is not None else load_first(node_ids, limit)
    per_node = shape(samples, since, limit)
    losses, losses_until = load_losses((n.id for n in nodes if n.chief), since)
    loss = downsample(loss_points(losses), limit)
    # The cursor never goes back: a node's base sample is at or before `since`.
    latest = max([s.received or s.at for s in samples] + [t for t in (since, losses_until) if t], default=None)
    return {
        "until": iso(latest, "microseconds") if latest else None,
        "nodes": [
            {
                "name": n.name,
                "role": n.role,
                "instance_type": n.instance_type,
                "points": [{**p, "at": iso(p["at"])} for p in per_node.get(n.id, [])],
            }
            for n in nodes
        ],
        "loss": [{**p, "at": iso(p["at"])} for p in loss],
    }


def iso(moment: datetime, timespec: str = "milliseconds") -> str:
    """UTC ISO 8601 with a Z, as browsers parse it (`microseconds` for a cursor sent back as `since`)."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
