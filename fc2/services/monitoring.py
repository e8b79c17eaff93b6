"""What the jobs ask of the monitor, and what they tell it: monitor/ knows no job (it imports nothing of fc2), so a
job's nodes go to it as `WatchedNode`s made here from fc2's rows — as SkyPilot's provision layer takes dataclasses,
never its caller's ORM objects.

- The job page's run figures: kept on the job once it ended (`Job.figures`, which pipeline.ended stores), computed —
  at most every LIVE_CACHE_S, over its last hour — while it runs; with the nodes silent too long while it runs. The
  throughput in examples a second wherever the job's batch size is known, while it runs too; and what the page adds
  to them (`page_figures`).
- The job page's charts (monitor/series.py).
- Retention: the samples of jobs that ended more than FC2_SAMPLE_FULL_DAYS days ago, compacted to one per node and
  minute (monitor/retention.py), for the daily beat task and `manage.py compact_samples`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from fc2.models import Job, Node, batch_size_parameter
from monitor import figures, retention, series
from monitor.models import LossPoint
from monitor.series import WatchedNode
from provisioner.types import ALL_REDUCE, is_chief

LIVE_WINDOW = timedelta(hours=1)  # a running job's figures are over its last hour (an ended job's over all of it)
LIVE_CACHE_S = 10  # a running job's figures are computed at most this often


def watched(job: Job, nodes: Iterable[Node]) -> list[WatchedNode]:
    """The job's nodes as the monitor takes them."""
    return [WatchedNode(n.pk, n.name, n.role, n.instance_type, is_chief(job.strategy, n.role, n.index)) for n in nodes]


def last_heard(job: Job, node: Node) -> datetime:
    """When the node last reported (before its first report: when the job started running, or was submitted)."""
    return node.last_report_at or job.started_at or job.created_at


def silent_nodes(job: Job, nodes: Iterable[Node], now: datetime | None = None) -> dict[str, float]:
    """Name → seconds since it last reported, for the nodes of a running job silent past FC2_NODE_SILENCE_S."""
    if job.state != Job.State.RUNNING:
        return {}
    now = now or timezone.now()
    silent = {}
    for node in nodes:
        if node.status in Node.FINISHED:
            continue
        if (quiet := (now - last_heard(job, node)).total_seconds()) > settings.FC2_NODE_SILENCE_S:
            silent[node.name] = quiet
    return silent


def compute_figures(job: Job, since: datetime | None = None) -> dict:
    """The job's run figures and alerts from its nodes' samples taken after `since` (None: all of them)."""
    nodes = list(job.nodes.all())
    steps_per_epoch = job.steps // job.epochs if job.steps and job.epochs else None
    metrics = job.metrics or {}
    computed = figures.compute(
        watched(job, nodes), job.catalog, metrics, silent_nodes(job, nodes), since, steps_per_epoch, job.is_terminal
    )
    if computed["throughput"] is None and computed["steps_per_s"] is not None and (batch := global_batch(job)):
        # Until metrics.json says it: the pace so far in the unit it will say it in.
        computed["throughput"] = computed["steps_per_s"] * batch
    return computed


def global_batch(job: Job) -> int | None:
    """The examples one training step takes (the bundle contract, examples/README.md "Batch and step"): `batch_size`
    from every worker under all-reduce, `batch_size` on a parameter server; None where no batch size was asked.

    >>> [global_batch(Job(parameters={"batch_size": "32"}, strategy=s, workers=3)) for s in ("mirrored", "ddp")]
    [96, 96]
    >>> global_batch(Job(parameters={"batch_size": "32"}, strategy="ps", workers=3)), global_batch(Job(workers=2))
    (32, None)
    """
    batch = batch_size_parameter(job.parameters or {})
    if batch is None or not job.workers:
        return None
    return batch * job.workers if job.strategy in ALL_REDUCE else batch


def job_figures(job: Job) -> dict:
    """The job's run figures and alerts: stored once it has ended (Job.figures), computed — at most every
    LIVE_CACHE_S, over its last hour — while it runs."""
    if job.figures is not None:
        return job.figures
    if job.is_terminal:
        return compute_figures(job)
    key = f"fc2:job-figures:{job.pk}"
    if (cached := cache.get(key)) is None:
        cached = compute_figures(job, since=timezone.now() - LIVE_WINDOW)
        cache.set(key, cached, LIVE_CACHE_S)
    return cached


def page_figures(job: Job) -> dict:
    """job_figures with what the job page adds: `training`, whether there are figures of training yet (it has ended,
    or the chief's progress lines give its pace; before, a node's traffic is its start-up's), and
    `workers_mean_mbps`, the workers' bandwidth as the page's table gives it, the mean of their rows. The record's
    `worker_bandwidth_mbps` counts only a worker that communicated long enough to tell its link (MIN_BUSY_S)."""
    shown = job_figures(job)
    nodes = shown.get("nodes") or []
    has_ps = any(n.get("role") == "ps" for n in nodes)
    rows = [
        n["mean_mbps"]
        for n in nodes
        if (n.get("role") == "worker" or (n.get("role") == "chief" and not has_ps)) and n.get("mean_mbps") is not None
    ]
    return {
        **shown,
        "training": job.is_terminal or shown.get("steps_per_s") is not None,
        "workers_mean_mbps": sum(rows) / len(rows) if rows else None,
    }


def job_series(job: Job, since: datetime | None = None, limit: int = series.MAX_POINTS) -> dict:
    """What the job page's charts need (newer than `since`): monitor.series.run_series of the job's nodes. Three
    queries: the nodes, the samples and the chief's losses."""
    return series.run_series(watched(job, job.nodes.all()), since, limit)


def compact_ended_jobs(days: int | None = None, dry_run: bool = False) -> retention.Compaction:
    """Compact the samples of every node whose job ended more than `days` days ago (default: FC2_SAMPLE_FULL_DAYS),
    a node at a time. A job that has not ended is never touched, however old; nor is one whose end was not recorded
    (`finished_at`, which every transition to an end sets)."""
    days = retention.full_days() if days is None else days
    if days < 0:
        raise ValueError(f"days must be 0 or more, not {days}")
    cutoff = timezone.now() - timedelta(days=days)
    nodes = Node.objects.filter(job__state__in=Job.TERMINAL, job__finished_at__lt=cutoff).order_by("pk")
    return retention.compact_nodes(list(nodes.values_list("pk", "job_id")), days, dry_run)


def steps_since(
    job: Job, chiefs: Iterable[str], began: datetime | None, since: datetime, from_step: int | None = None
) -> int | None:
    """The chief's steps (named in `chiefs`) from `since` to its latest progress line — the work a managed job's
    restart lost (pipeline.node_lost); None when it printed none since training `began`. A progress line's `step`
    counts the whole run (examples/README.md: `steps` is epochs × steps per epoch), so the steps are a difference:
    from `from_step` (a checkpoint's own step) when it is known, else from the last line received by `since` — which
    may be a progress interval before the checkpoint's step, its own line being still on its way."""
    points = LossPoint.objects.filter(node__job=job, node__name__in=list(chiefs), at__gte=began or since)
    latest = points.order_by("-at", "-pk").first()
    if latest is None:
        return None
    if from_step is not None:
        return max(0, latest.step - from_step)
    base = points.filter(at__lte=since).order_by("-at", "-pk").first() or points.order_by("at", "pk").first()
    return max(0, latest.step - base.step) if base else None
