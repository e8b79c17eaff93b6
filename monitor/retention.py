"""Retention of node samples: those of a job that ended more than `FC2_SAMPLE_FULL_DAYS` days ago (default 7) are
compacted to one sample per node and minute, so that tens of nodes × 1 Hz × days of runs do not stay in the table at
full rate (a 60-fold cut).

A minute's compacted sample holds the mean of each reading over the minute's known values (unknown only when none is
known), and the cumulative byte counters, `measured_at` and `at` of the minute's last sample: the rate the charts
(monitor/series.py) draw between two compacted samples is then the mean rate over that minute, so the mean over a run
is what it was. A counter reset inside a minute leaves that minute's rate unknown, as the charts treat any reset.

Compaction goes a node at a time, each in a transaction of its own that holds the node's first sample (a second
compaction of the same node waits, then finds nothing to do), and only on nodes of jobs that have ended: no report is
taken for them any more (fc2.services.reports), so no sample arrives meanwhile. It is idempotent: a minute that holds
one sample is left as it is. The monitor knows no job: which nodes' jobs ended long enough ago is its caller's to say
(fc2.services.monitoring.compact_ended_jobs, which the daily beat task fc2.tasks.compact_samples and `manage.py
compact_samples` call).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.db.models.functions import TruncMinute

from monitor.ingest import READINGS
from monitor.models import NodeSample

logger = logging.getLogger(__name__)

DEFAULT_FULL_DAYS = 7  # days after its job ended that a node's samples stay at full rate
FIELDS = ("at", "measured_at", *READINGS, "bytes_sent", "bytes_recv")  # what a compacted sample is made of
KEPT_FROM_LAST = {"at", "measured_at", "bytes_sent", "bytes_recv"}  # the rest (the readings) is averaged
MINUTE = timedelta(minutes=1)
MINUTES_PER_BATCH = 120  # minutes read, merged and rewritten at once: a bounded number of rows in memory


@dataclass(frozen=True)
class Compaction:
    """What a compaction did (or, dry, would do)."""

    days: int  # samples of jobs that ended more than this many days ago
    dry_run: bool
    jobs: int  # ended jobs with at least one node compacted
    nodes: int  # nodes compacted (those that had a minute with more than one sample)
    rows_before: int  # those nodes' samples before
    rows_after: int  # and after


def full_days() -> int:
    return getattr(settings, "FC2_SAMPLE_FULL_DAYS", DEFAULT_FULL_DAYS)


def minute_of(moment: datetime) -> datetime:
    """The UTC minute a sample was taken in, as TruncMinute computes it in the database.

    >>> from zoneinfo import ZoneInfo
    >>> minute_of(datetime(2026, 11, 1, 9, 30, 59, 999_000, tzinfo=ZoneInfo("Asia/Singapore")))
    datetime.datetime(2026, 11, 1, 1, 30, tzinfo=datetime.timezone.utc)
    """
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def merge(samples: Sequence[dict]) -> dict:
    """One sample for a minute's samples (oldest first): each reading the mean of its known values, the rest (times,
    cumulative byte counters) the last sample's.

    >>> merged = merge([
    ...     {"at": 1, "measured_at": 0, "cpu_percent": 10.0, "gpu_percent": None, "bytes_sent": 100},
    ...     {"at": 1, "measured_at": 1, "cpu_percent": None, "gpu_percent": None, "bytes_sent": 250},
    ...     {"at": 3, "measured_at": 2, "cpu_percent": 30.0, "gpu_percent": None, "bytes_sent": 400},
    ... ])
    >>> merged == {"at": 3, "measured_at": 2, "cpu_percent": 20.0, "gpu_percent": None, "bytes_sent": 400}
    True
    """
    merged = dict(samples[-1])
    for key in merged.keys() - KEPT_FROM_LAST:
        known = [s[key] for s in samples if s[key] is not None]
        merged[key] = sum(known) / len(known) if known else None
    return merged


def crowded_minutes(node_id: int) -> dict[datetime, int]:
    """The minutes in which `node_id` has more than one sample, and how many it has in each (one grouped query)."""
    rows = (
        NodeSample.objects.filter(node_id=node_id)
        .order_by()
        .annotate(minute=TruncMinute("measured_at", tzinfo=UTC))
        .values("minute")
        .annotate(samples=Count("pk"))
        .filter(samples__gt=1)
        .values_list("minute", "samples")
    )
    return {minute_of(minute): samples for minute, samples in rows}


def compact_node(node_id: int, dry_run: bool = False) -> tuple[int, int]:
    """Compact one node's samples to one per minute, in a transaction; (rows before, rows after). The caller
    decides that the node's job has ended."""
    with transaction.atomic():
        # The node's first sample, held until the end: a concurrent compaction of this node waits here, then finds
        # every minute done. Should this one delete that sample, the waiting one goes on once this one has committed:
        # with nothing left to do all the same.
        list(NodeSample.objects.select_for_update().filter(node_id=node_id).order_by("pk").values_list("pk")[:1])
        before = NodeSample.objects.filter(node_id=node_id).count()
        crowded = crowded_minutes(node_id)
        after = before - sum(samples - 1 for samples in crowded.values())
        minutes = sorted(crowded)
        if not dry_run:
            for i in range(0, len(minutes), MINUTES_PER_BATCH):
                _compact_minutes(node_id, minutes[i : i + MINUTES_PER_BATCH])
    return before, after


def _compact_minutes(node_id: int, minutes: list[datetime]) -> None:
    """Merge each of `minutes` (sorted; each holds more than one sample of the node) into one sample."""
    wanted = set(minutes)
    rows = NodeSample.objects.filter(
        node_id=node_id, measured_at__gte=minutes[0], measured_at__lt=minutes[-1] + MINUTE
    ).order_by("measured_at", "pk")
    groups: dict[datetime, list[dict]] = {}
    for values in rows.values_list(*FIELDS):
        minute = minute_of(values[1])
        if minute in wanted:
            groups.setdefault(minute, []).append(dict(zip(FIELDS, values, strict=True)))
    # Every sample in a run of crowded minutes is merged: a range, which the (node, measured_at) index serves.
    for start, end in runs(minutes):
        NodeSample.objects.filter(node_id=node_id, measured_at__gte=start, measured_at__lt=end).delete()
    NodeSample.objects.bulk_create(NodeSample(node_id=node_id, **merge(group)) for group in groups.values())


def runs(minutes: Sequence[datetime]) -> list[tuple[datetime, datetime]]:
    """Sorted minutes as the fewest [start, end) ranges that cover them and nothing else.

    >>> t = datetime(2026, 11, 1, tzinfo=UTC)
    >>> [(a.minute, b.minute) for a, b in runs([t, t + MINUTE, t + 2 * MINUTE, t + 5 * MINUTE])]
    [(0, 3), (5, 6)]
    """
    ranges: list[tuple[datetime, datetime]] = []
    for minute in minutes:
        if ranges and ranges[-1][1] == minute:
            ranges[-1] = (ranges[-1][0], minute + MINUTE)
        else:
            ranges.append((minute, minute + MINUTE))
    return ranges


def compact_nodes(nodes: Iterable[tuple[int, int]], days: int, dry_run: bool = False) -> Compaction:
    """Compact the samples of `nodes`, (node id, job id) pairs of jobs that ended more than `days` days ago as the
    caller found them, a node at a time."""
    jobs, compacted, rows_before, rows_after = set(), 0, 0, 0
    for node_id, job_id in nodes:
        before, after = compact_node(node_id, dry_run)
        if after < before:
            jobs.add(job_id)
            compacted += 1
            rows_before += before
            rows_after += after
    result = Compaction(days, dry_run, len(jobs), compacted, rows_before, rows_after)
    if compacted:
        logger.info(
            "%s the samples of %d nodes of %d jobs that ended more than %d days ago: %d samples to %d",
            "would compact" if dry_run else "compacted", compacted, len(jobs), days, rows_before, rows_after,
        )  # fmt: skip
    return result
