"""What a run's samples say about it: each node's bandwidth (mean and peak) and CPU, the parameter server's
saturation, the workers' idleness, the run's epoch time and throughput — and the alerts they call for (FC² §4.4, §6;
Jia et al. on idle workers and a loaded PS).

Definitions (the job page says them too):

- A node's **bandwidth** is the busier of its two directions (in or out), since a link is full duplex and the
  parameter server's saturates in whichever direction fills first: n workers send it n gradients and receive n
  copies of the parameters. Its **mean** is over the seconds the node was communicating (above BUSY_MBPS: start-up,
  evaluation and waiting for the others are not communication), its **peak** the highest one-interval rate.
- **PS saturation** is the PS's mean bandwidth over its type's network capacity (the catalogue's figure: on the lab,
  the rate its link is shaped to).
- A worker's **idleness** is the share of the CPU it can use that it did not use during the training (the chief's
  first to last progress line): 1 − mean CPU ÷ the CPU it used at its busiest (its 95th percentile over the whole run,
  start-up included, capped at its type's vCPUs). A worker waiting on the PS or the network computes nothing.

The functions that shape are pure (dataclasses in, dicts out); `compute` is the one that queries. The monitor knows no
job: its caller (fc2.services.monitoring) names the run's nodes as `WatchedNode`s and says which are silent.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from django.conf import settings

from common.numbers import percent
from monitor.series import Loss, Sample, WatchedNode, load_losses, load_samples, rate_mbps

BUSY_MBPS = 1.0  # a node moving less than this (either way) is not communicating
MIN_INTERVAL_S = 0.5  # a peak is a rate over at least this long: two samples closer than that are not a rate
# The PS's mean bandwidth at or over this share of its capacity: its link is the bottleneck. TCP through a shaped link
# carries less than its rate, and a mean over the seconds it communicated takes in the partial first and last ones:
# flat out through a 100 Mbit/s link, a lab PS measured 88 Mbps (tests/test_lab.py).
SATURATED = 0.85
IDLE = 0.5  # workers idle for at least this share of their CPU on average: they mostly wait
MIN_BUSY_S = 5.0  # fewer seconds of traffic than this say nothing about a link


@dataclass(frozen=True)
class NodeFigures:
    name: str
    role: str
    instance_type: str
    mean_mbps: float | None  # busier direction, over the seconds it communicated; None: not measured per node
    peak_mbps: float | None
    mean_sent_mbps: float | None
    mean_recv_mbps: float | None
    busy_s: float  # seconds it communicated
    cpu_percent: float | None  # mean over the training (100 = one core)
    capacity_mbps: float | None = None  # its type's network capacity, where the catalogue gives one
    idleness: float | None = None  # workers only (0–1)

    @property
    def saturation(self) -> float | None:
        if self.mean_mbps is None or not self.capacity_mbps:
            return None
        return self.mean_mbps / self.capacity_mbps


@dataclass(frozen=True)
class Alert:
    code: str  # "ps-saturated", "workers-idle", "node-silent"
    message: str


def node_figures(
    name: str,
    role: str,
    instance_type: str,
    samples: Sequence[Sample],
    window: tuple[datetime, datetime] | None = None,
    capacity_mbps: float | None = None,
    vcpu: int | None = None,
) -> NodeFigures:
    """One node's figures from its samples (oldest first); `window` is the training's span (None: all of them)."""
    busy_s = sent_bytes_s = recv_bytes_s = 0.0
    peak = None
    measured = False
    for prev, now in itertools.pairwise(samples):
        seconds = (now.at - prev.at).total_seconds()
        sent = rate_mbps(prev.bytes_sent, prev.at, now.bytes_sent, now.at)
        recv = rate_mbps(prev.bytes_recv, prev.at, now.bytes_recv, now.at)
        if sent is None or recv is None or seconds < MIN_INTERVAL_S:
            continue
        measured = True
        if max(sent, recv) >= BUSY_MBPS:
            busy_s += seconds
            sent_bytes_s += sent * seconds
            recv_bytes_s += recv * seconds
            peak = max(peak or 0.0, sent, recv)
    mean_sent = sent_bytes_s / busy_s if busy_s else (0.0 if measured else None)
    mean_recv = recv_bytes_s / busy_s if busy_s else (0.0 if measured else None)

    cpu_all = [s.cpu_percent for s in samples if s.cpu_percent is not None]
    training = [s for s in samples if window is None or window[0] <= s.at <= window[1]]
    in_window = [s.cpu_percent for s in training if s.cpu_percent is not None]
    cpu = statistics.fmean(in_window) if in_window else None
    idleness = None
    if role == "worker" and cpu is not None and len(cpu_all) >= 2:
        busiest = statistics.quantiles(cpu_all, n=20)[-1] if len(cpu_all) >= 20 else max(cpu_all)
        if vcpu:
            busiest = min(busiest, vcpu * 100.0)
        idleness = min(1.0, max(0.0, 1 - cpu / busiest)) if busiest > 0 else None
    return NodeFigures(
        name=name,
        role=role,
        instance_type=instance_type,
        mean_mbps=None if mean_sent is None or mean_recv is None else max(mean_sent, mean_recv),
        peak_mbps=peak if peak is not None else (0.0 if measured else None),
        mean_sent_mbps=mean_sent,
        mean_recv_mbps=mean_recv,
        busy_s=busy_s,
        cpu_percent=cpu,
        capacity_mbps=capacity_mbps,
        idleness=idleness,
    )


def steps_per_s(losses: Sequence[Loss]) -> float | None:
    """Training steps a second between the chief's first and last progress lines (their steps count the whole run);
    None before two lines a moment apart.

    >>> from datetime import UTC, timedelta
    >>> t = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    >>> steps_per_s([Loss(t, 10, 2.0), Loss(t + timedelta(seconds=4), 30, 1.5)])
    5.0
    >>> steps_per_s([Loss(t, 10, 2.0)]) is None
    True
    """
    if len(losses) < 2:
        return None
    seconds = (losses[-1].at - losses[0].at).total_seconds()
    steps = losses[-1].step - losses[0].step
    return steps / seconds if seconds > 0 and steps > 0 else None


def run_figures(
    nodes: Iterable[NodeFigures],
    metrics: Mapping,
    silent: Mapping[str, float] | None = None,
    progress: tuple[float | None, int | None] = (None, None),
) -> dict:
    """The run's figures and alerts from its nodes' figures, the chief's metrics.json and the nodes silent for
    longer than they should be (name → seconds). `progress` is (steps a second from the chief's progress lines, steps
    per epoch): until metrics.json says them, the epoch time and the pace come from there ("so far")."""
    nodes = list(nodes)
    rate, steps_per_epoch = progress
    ps = next((n for n in nodes if n.role == "ps"), None)
    workers = [n for n in nodes if n.role == "worker" or (n.role == "chief" and not ps)]
    idle = [n.idleness for n in workers if n.idleness is not None]
    worker_mbps = [n.mean_mbps for n in workers if n.mean_mbps is not None and n.busy_s >= MIN_BUSY_S]
    epoch_s = epoch_time_s(metrics)
    so_far = epoch_s is None and rate is not None
    if so_far and steps_per_epoch and rate:
        epoch_s = steps_per_epoch / rate
    idleness = statistics.fmean(idle) if idle else None
    figures = {
        "epoch_time_s": epoch_s,
        "throughput": throughput(metrics),
        # Training steps a second, from the chief's progress lines, while metrics.json has not said the run's pace.
        "steps_per_s": rate if so_far else None,
        "ps": _node_dict(ps) if ps else None,
        "worker_bandwidth_mbps": statistics.fmean(worker_mbps) if worker_mbps else None,
        "worker_cpu_percent": _mean(n.cpu_percent for n in workers),
        "worker_idleness": idleness,
        "nodes": [_node_dict(n) for n in nodes],
    }
    alerts = []
    if ps and ps.saturation is not None and ps.saturation >= SATURATED and ps.busy_s >= MIN_BUSY_S:
        alerts.append(
            Alert(
                "ps-saturated",
                f"The parameter server's link is saturated: {ps.name} moved {ps.mean_mbps:.0f} Mbps on average "
                f"while communicating, {percent(ps.saturation)} of the {ps.capacity_mbps:.0f} Mbps its "
                f"{ps.instance_type} has. "
                "More workers would wait on it: choose a PS type with more network capacity, or fewer workers "
                "(Scala-Opt sizes the cluster to the PS's capacity).",
            )
        )
    if idleness is not None and idleness >= IDLE:
        alerts.append(
            Alert(
                "workers-idle",
                f"The workers were idle {percent(idleness)} of the time they could compute: they "
                "mostly wait on communication (the parameter server, the network, or each other). Fewer or "
                "faster-linked workers, or a larger batch size, would cost less for about the same time.",
            )
        )
    for name, seconds in sorted((silent or {}).items()):
        alerts.append(
            Alert(
                "node-silent",
                f"{name} has not reported for {seconds:.0f} s. Its kept result is looked for; silent for "
                f"{settings.FC2_NODE_LOST_S} s, it fails the job and the cluster is torn down.",
            )
        )
    return {**figures, "alerts": [asdict(a) for a in alerts]}


def epoch_time_s(metrics: Mapping) -> float | None:
    """The run's epoch time from its metrics, or None when they do not say.

    >>> epoch_time_s({"epoch_time_s": 2.5})
    2.5
    >>> epoch_time_s({"duration_s": 6.0, "epochs": 3})
    2.0
    >>> epoch_time_s({"duration_s": 6.0}) is None
    True
    """
    if isinstance(value := metrics.get("epoch_time_s"), int | float) and value > 0:
        return float(value)
    duration, epochs = metrics.get("duration_s"), metrics.get("epochs")
    if isinstance(duration, int | float) and isinstance(epochs, int) and duration > 0 and epochs > 0:
        return float(duration) / float(epochs)
    return None


def throughput(metrics: Mapping) -> float | None:
    """Training examples a second, as the chief's metrics.json says (`examples_per_s`), else its steps × global batch
    over its training time.

    >>> throughput({"examples_per_s": 812.5}), throughput({"steps": 100, "global_batch_size": 64, "duration_s": 8})
    (812.5, 800.0)
    >>> throughput({}) is None
    True
    """
    if isinstance(value := metrics.get("examples_per_s"), int | float) and value > 0:
        return float(value)
    keys = ("steps", "global_batch_size", "duration_s")
    given = [v for k in keys if isinstance(v := metrics.get(k), int | float) and v > 0]
    if len(given) == len(keys):
        steps, batch, duration = given
        # In floats: PostgreSQL gives 1e308 back as an integer, whose products no float holds. Past a float (the
        # code's figures are anything), the throughput is unknown.
        value = float(steps) * float(batch) / float(duration)
        return value if math.isfinite(value) else None
    return None


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _node_dict(node: NodeFigures) -> dict:
    return {**asdict(node), "saturation": node.saturation}


def compute(
    nodes: Sequence[WatchedNode],
    catalog: str,
    metrics: Mapping,
    silent: Mapping[str, float] | None = None,
    since: datetime | None = None,
    steps_per_epoch: int | None = None,
    ended: bool = True,
) -> dict:
    """A run's figures from its nodes' samples taken after `since` (None: all of them), their types' capacities in
    `catalog`, the chief's metrics.json and the nodes silent too long (name → seconds); `steps_per_epoch` (from the
    progress lines' totals) turns the pace of training so far into an epoch time. A run not `ended` whose chief has not
    printed two progress lines has not begun training: its workers' idleness, a share of the training, is not said
    (over start-up alone it would read as idle)."""
    from recommender.models import InstanceType

    types = {n.instance_type for n in nodes}
    specs = dict(
        (name, (mbps, vcpu))
        for name, mbps, vcpu in InstanceType.objects.filter(catalog__name=catalog, name__in=types).values_list(
            "name", "network_mbps", "vcpu"
        )
    )
    samples = load_samples([n.id for n in nodes], taken_after=since)
    losses, _ = load_losses(n.id for n in nodes if n.chief)
    window = (losses[0].at, losses[-1].at) if len(losses) >= 2 else None
    not_begun = window is None and not ended
    per_node = {node_id: list(group) for node_id, group in itertools.groupby(samples, key=lambda s: s.node_id)}
    figures = [
        node_figures(n.name, n.role, n.instance_type, per_node.get(n.id, []), window, *specs.get(n.instance_type, ()))
        for n in nodes
    ]
    if not_begun:
        figures = [replace(f, idleness=None) for f in figures]
    return run_figures(figures, metrics, silent, (steps_per_s(losses), steps_per_epoch))
