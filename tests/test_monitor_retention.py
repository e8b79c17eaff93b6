"""Retention of node samples (monitor/retention.py, fc2/services/monitoring.py): a job that ended long ago keeps one
sample per node and minute, its charts' figures unchanged; a job that has not ended is never touched; compacting
twice changes nothing more."""

from __future__ import annotations

import datetime as dt
import math
import random
import statistics
import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from fc2.models import Job, Node
from fc2.services import monitoring
from monitor import retention
from monitor.ingest import record_samples
from monitor.models import NodeSample
from tests.conftest import call_json
from tests.helpers import job_row, post_report

UTC = dt.UTC


def ended(days_ago: float, **fields) -> dict:
    return {"state": Job.State.SUCCEEDED, "finished_at": timezone.now() - dt.timedelta(days=days_ago), **fields}


def job_with_nodes(owner, *names: str, **fields) -> tuple[Job, list[Node]]:
    job = job_row(owner, strategy=Job.Strategy.MIRRORED, **fields)
    nodes = [Node.objects.create(job=job, name=name, role="worker", index=i) for i, name in enumerate(names)]
    return job, nodes


def every_second(start: dt.datetime, seconds: int, rng: random.Random) -> list[dict]:
    """Samples as the agent takes them at 1 Hz from `start`: varying CPU, byte counters growing by up to 2 MB/s."""
    samples, sent, recv = [], 0, 0
    for i in range(seconds):
        sent, recv = sent + rng.randint(0, 2_000_000), recv + rng.randint(0, 500_000)
        samples.append(
            {
                "at": (start + dt.timedelta(seconds=i)).timestamp(),
                "cpu_percent": round(rng.uniform(50, 390), 1),
                "memory_mb": round(rng.uniform(600, 700), 1),
                "bytes_sent": sent,
                "bytes_recv": recv,
            }
        )
    return samples


def store(node: Node, samples: list[dict]) -> None:
    """As a report received right after the last of them stores them."""
    record_samples(node, samples, dt.datetime.fromtimestamp(samples[-1]["at"], UTC) + dt.timedelta(seconds=1))


def rows(*nodes: Node) -> list[tuple]:
    return list(
        NodeSample.objects.filter(node__in=nodes)
        .order_by("node", "measured_at", "pk")
        .values_list("pk", "node", "at", "measured_at", "cpu_percent", "memory_mb", "bytes_sent", "bytes_recv")
    )


def chart_means(job: Job) -> dict[str, dict[str, float]]:
    """Per node, the mean of each chart line over the whole run, as the job page's series give it."""
    return {
        node["name"]: {
            key: statistics.fmean(p[key] for p in node["points"] if p[key] is not None)
            for key in ("cpu_percent", "sent_mbps", "recv_mbps")
        }
        for node in monitoring.job_series(job)["nodes"]
    }


def test_two_hours_reported_at_1_hz_keep_a_sample_a_minute_and_the_charts_means(client, alice):
    job, nodes = job_with_nodes(alice, "worker-0", "worker-1", state=Job.State.RUNNING)
    token = job.issue_token()
    job.save()
    start = retention.minute_of(timezone.now() - dt.timedelta(hours=2, minutes=1))
    rng = random.Random(11)
    for node in nodes:
        samples = every_second(start, 7200, rng)
        for hour in (samples[:3600], samples[3600:]):  # an hour's buffer a report: the most one may carry
            response = post_report(client, job.pk, {"node": node.name, "status": "running", "samples": hour}, token)
            assert response.status_code == 200, response.content
    Job.objects.filter(pk=job.pk).update(**ended(days_ago=8))
    before = chart_means(job)

    result = monitoring.compact_ended_jobs()

    assert (result.jobs, result.nodes, result.rows_before, result.rows_after) == (1, 2, 14_400, 240)
    after = chart_means(job)
    for name in before:
        for key, mean in before[name].items():
            assert math.isclose(after[name][key], mean, rel_tol=0.005), (name, key, after[name][key], mean)
    last = NodeSample.objects.filter(node=nodes[0]).latest("measured_at")
    assert last.measured_at == start + dt.timedelta(seconds=7199)  # the run's last sample's time, and its counters
    assert last.bytes_sent == NodeSample.objects.filter(node=nodes[0]).order_by("-bytes_sent")[0].bytes_sent


def test_a_minute_is_merged_into_its_readings_known_means_and_its_last_counters_and_times(alice):
    job, (node,) = job_with_nodes(alice, "worker-0", **ended(days_ago=30))
    minute = dt.datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
    record_samples(
        node,
        [
            {"at": minute.timestamp() + 5, "cpu_percent": 10.0, "memory_mb": 500.0, "bytes_sent": 9_000},
            {"at": minute.timestamp() + 20, "cpu_percent": None, "memory_mb": 700.0, "bytes_sent": 100},  # reset
            {"at": minute.timestamp() + 50, "cpu_percent": 30.0, "memory_mb": None, "bytes_sent": 400},
        ],
        received=minute + dt.timedelta(seconds=55),
    )
    store(node, [{"at": minute.timestamp() + 61, "cpu_percent": 70.0, "bytes_sent": 7_000}])  # alone in its minute
    alone = NodeSample.objects.get(measured_at=minute + dt.timedelta(seconds=61))
    store(node, [{"at": minute.timestamp() + s, "cpu_percent": 80.0, "bytes_sent": 8_000 + s} for s in (120, 179)])

    monitoring.compact_ended_jobs()

    merged, kept, later = NodeSample.objects.filter(node=node).order_by("measured_at")
    assert (later.cpu_percent, later.bytes_sent, later.measured_at) == (80.0, 8_179, minute + dt.timedelta(seconds=179))
    assert (merged.cpu_percent, merged.memory_mb, merged.gpu_percent) == (20.0, 600.0, None)
    assert (merged.bytes_sent, merged.bytes_recv) == (400, None)
    assert (merged.measured_at, merged.at) == (minute + dt.timedelta(seconds=50), minute + dt.timedelta(seconds=55))
    assert kept.pk == alone.pk and kept.cpu_percent == 70.0


def test_jobs_that_have_not_ended_or_ended_lately_are_never_touched(alice):
    start = dt.datetime(2026, 9, 1, tzinfo=UTC)
    rng = random.Random(3)
    running, (busy,) = job_with_nodes(alice, "worker-0", state=Job.State.RUNNING, started_at=start)
    lately, (recent,) = job_with_nodes(alice, "worker-0", **ended(days_ago=2))
    undated, (legacy,) = job_with_nodes(alice, "worker-0", state=Job.State.FAILED)  # ended, no finishing time kept
    old, (done,) = job_with_nodes(alice, "worker-0", **ended(days_ago=8))
    for node in (busy, recent, legacy, done):
        store(node, every_second(start, 180, rng))
    untouched = rows(busy, recent, legacy)

    result = monitoring.compact_ended_jobs()

    assert (result.jobs, result.nodes, result.rows_before, result.rows_after) == (1, 1, 180, 3)
    assert rows(busy, recent, legacy) == untouched
    assert NodeSample.objects.filter(node=done).count() == 3


def test_compacting_twice_changes_nothing_more(alice):
    job, nodes = job_with_nodes(alice, "worker-0", "worker-1", **ended(days_ago=9))
    rng = random.Random(5)
    for node in nodes:
        store(node, every_second(dt.datetime(2026, 9, 1, 8, 0, 30, tzinfo=UTC), 300, rng))
    monitoring.compact_ended_jobs()
    once = rows(*nodes)

    again = monitoring.compact_ended_jobs()

    assert (again.nodes, again.rows_before, again.rows_after) == (0, 0, 0)
    assert rows(*nodes) == once
    assert len(once) == 2 * 6  # a partial first minute (8:00:30-59), four whole ones, a partial last (8:05:00-29)


def test_command_dry_run_counts_without_changing_and_days_choose_the_jobs(alice, settings):
    settings.FC2_SAMPLE_FULL_DAYS = 3
    job, (node,) = job_with_nodes(alice, "worker-0", **ended(days_ago=5))
    store(node, every_second(dt.datetime(2026, 9, 1, tzinfo=UTC), 240, random.Random(7)))
    before = rows(node)

    code, dry, _ = call_json("compact_samples", "--dry-run")
    assert (code, rows(node)) == (0, before)
    assert dry == {"ok": True, "days": 3, "dry_run": True, "jobs": 1, "nodes": 1, "rows_before": 240, "rows_after": 4}

    code, later, _ = call_json("compact_samples", "--days", "6")
    assert (code, later["nodes"], rows(node)) == (0, 0, before)

    code, done, _ = call_json("compact_samples")
    assert (code, done["dry_run"], done["nodes"], done["rows_after"]) == (0, False, 1, 4)
    assert NodeSample.objects.filter(node=node).count() == 4


def test_command_refuses_a_negative_number_of_days(db):
    code, out, err = call_json("compact_samples", "--days", "-1")

    assert code == 1
    assert out == {"ok": False, "error": "days must be 0 or more, not -1"}
    assert "error: days must be 0 or more" in err


@pytest.mark.parametrize("dry", [True, False])
def test_command_says_what_it_did(alice, dry):
    job, (node,) = job_with_nodes(alice, "worker-0", **ended(days_ago=8))
    store(node, every_second(dt.datetime(2026, 9, 1, tzinfo=UTC), 120, random.Random(1)))
    out = StringIO()

    call_command("compact_samples", *(["--dry-run"] if dry else []), stdout=out)

    verb = "would compact (dry run)" if dry else "compacted"
    assert out.getvalue().strip() == f"{verb} 1 node of 1 job that ended more than 7 days ago: 120 samples → 2"


@pytest.mark.django_db(transaction=True)
def test_two_compactions_at_once_compact_each_minute_once(alice):
    """A beat tick and an operator's command on the same node at the same moment: the second waits for the node's
    first sample, then finds its minutes done (without that, both would write each minute's merged sample)."""
    job, nodes = job_with_nodes(alice, "worker-0", "worker-1", **ended(days_ago=8))
    for node in nodes:
        store(node, every_second(dt.datetime(2026, 9, 1, tzinfo=UTC), 600, random.Random(node.pk)))
    start = threading.Barrier(2)
    results = []

    def compact() -> None:
        try:
            start.wait()
            results.append(monitoring.compact_ended_jobs())
        finally:
            connection.close()

    threads = [threading.Thread(target=compact) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(r.nodes for r in results) == 2  # each node by one of them
    assert [NodeSample.objects.filter(node=node).count() for node in nodes] == [10, 10]
