"""What a run's samples say (monitor/figures.py) — bandwidth, PS saturation, idleness, alerts — on the job page and in
its JSON, and what an ended job leaves: its figures and a performance record the recommender reads at once."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from fc2.models import Job, Node
from fc2.services import pipeline
from monitor import figures
from monitor.models import LossPoint, NodeSample
from monitor.series import Sample
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests.conftest import make_job
from tests.helpers import plan_as_asked

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def traffic(mbps_each_second: list[float], cpu: list[float] | None = None, both_ways: bool = False) -> list[Sample]:
    """Samples one second apart of a node sending (and, `both_ways`, receiving) at these rates."""
    samples, sent = [], 0
    for i, mbps in enumerate([0.0, *mbps_each_second]):
        sent += int(mbps * 1e6 / 8)
        samples.append(
            Sample(
                node_id=1,
                at=T0 + timedelta(seconds=i),
                cpu_percent=(cpu[i] if cpu else None),
                bytes_sent=sent,
                bytes_recv=sent if both_ways else 0,
            )
        )
    return samples


def test_bandwidth_is_the_busier_direction_over_the_seconds_a_node_communicated():
    # 3 s of start-up, 4 s at 80 Mbps out, a 2 s pause, 2 s at 40 Mbps out.
    node = figures.node_figures("ps-0", "ps", "lab-ps-450", traffic([0, 0, 0, 80, 80, 80, 80, 0, 0, 40, 40]), None, 450)

    assert node.busy_s == pytest.approx(6)
    assert node.mean_mbps == pytest.approx((4 * 80 + 2 * 40) / 6, rel=1e-3)
    assert node.peak_mbps == pytest.approx(80, rel=1e-3)
    assert node.mean_recv_mbps == 0
    assert node.saturation == pytest.approx(node.mean_mbps / 450)


def test_a_node_without_its_own_counters_has_no_bandwidth_rather_than_zero():
    samples = [Sample(node_id=1, at=T0 + timedelta(seconds=i), cpu_percent=50.0) for i in range(5)]

    node = figures.node_figures("worker-0", "worker", "", samples)

    assert (node.mean_mbps, node.peak_mbps, node.saturation) == (None, None, None)


def test_a_saturated_ps_and_idle_workers_raise_their_alerts():
    ps = figures.node_figures("ps-0", "ps", "lab-w-100", traffic([97] * 10), None, 100)
    # Busy at start-up (100 % of a core), then mostly waiting at 20 %.
    worker = figures.node_figures(
        "worker-0", "worker", "lab-w-1g", traffic([40] * 10, [100] * 4 + [20] * 7), None, 1000
    )

    run = figures.run_figures([ps, worker], {"examples_per_s": 500.0, "epoch_time_s": 2.0})

    assert [a["code"] for a in run["alerts"]] == ["ps-saturated", "workers-idle"]
    assert "97 % of the 100 Mbps its lab-w-100 has" in run["alerts"][0]["message"]
    assert run["ps"]["saturation"] == pytest.approx(0.97, rel=1e-3)
    assert run["worker_idleness"] == pytest.approx(1 - (4 * 100 + 7 * 20) / 11 / 100, rel=1e-3)
    assert (run["epoch_time_s"], run["throughput"]) == (2.0, 500.0)


def test_a_ps_below_its_capacity_or_too_briefly_busy_raises_no_alert():
    calm = figures.node_figures("ps-0", "ps", "lab-ps-450", traffic([200] * 20), None, 450)
    brief = figures.node_figures("ps-0", "ps", "lab-w-100", traffic([99] * 3), None, 100)

    assert figures.run_figures([calm], {})["alerts"] == []
    assert figures.run_figures([brief], {})["alerts"] == []


@pytest.fixture
def lab_types(db):
    return load_catalog("lab")


def running_lab_job(alice, bundle, digits, **fields) -> Job:
    """A running lab job of 1 PS shaped to 100 Mbit/s and 1 worker, whose PS and worker moved 98 Mbps for 12 s."""
    job = make_job(
        alice, bundle, digits, provider="lab", catalog="lab", strategy="ps", workers=1, worker_type="lab-w-1g",
        ps_type="lab-w-100", workload_name="digits-lab", parameters={"batch_size": "16"},
    )  # fmt: skip
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        **{"state": Job.State.RUNNING, "started_at": now, **plan_as_asked(job), **fields}
    )
    job.refresh_from_db()
    for role, kind in (("ps", "lab-w-100"), ("chief", "lab-w-1g"), ("worker", "lab-w-1g")):
        node = Node.objects.create(
            job=job, name=f"{role}-0", role=role, index=0, instance_type=kind, last_report_at=now
        )
        rates = {"ps": [98] * 12, "chief": [1] * 12, "worker": [98] * 12}[role]
        NodeSample.objects.bulk_create(
            NodeSample(node=node, at=now, measured_at=now - (T0 + timedelta(seconds=12) - s.at), cpu_percent=60.0,
                       bytes_sent=s.bytes_sent, bytes_recv=0)
            for s in traffic(rates)
        )  # fmt: skip
        if role == "chief":
            # Two progress lines a few seconds apart: training has begun, so the page shows its figures.
            LossPoint.objects.bulk_create(
                LossPoint(node=node, step=i, loss=1.0 / i, printed_at=T0 + timedelta(seconds=4 * i)) for i in (1, 2)
            )
    return job


def test_the_job_page_and_its_json_show_the_figures_and_the_saturation_alert(client, alice, bundle, digits, lab_types):
    job = running_lab_job(alice, bundle, digits)
    client.force_login(alice)

    page = client.get(job.get_absolute_url()).content.decode()
    data = client.get(reverse("job-series", args=[job.pk])).json()

    assert 'data-alert="ps-saturated"' in page and 'id="figure-ps-saturation">98 %' in page
    assert [a["code"] for a in data["figures"]["alerts"]] == ["ps-saturated"]
    assert data["figures"]["ps"]["capacity_mbps"] == 100
    assert data["figures"]["worker_bandwidth_mbps"] == pytest.approx(98, rel=1e-3)


def lookup(workers: int) -> dict:
    """Alice's lookup: the platform's records and her own jobs' (no one else's)."""
    out = StringIO()
    call_command(
        "recommend", "--algorithm", "lookup", "--catalog", "lab", "--workload", "digits-lab", "--max-workers",
        str(workers), "--batch-size", "16", "--latency-ms", "0", "--user", "alice", "--json", stdout=out,
    )  # fmt: skip
    return json.loads(out.getvalue())


def test_an_ended_job_keeps_its_figures_and_its_record_changes_the_next_lookup(alice, bundle, digits, lab_types):
    """FC² §4.2: past executions are what the recommender learns from — at once, with nobody importing anything."""
    PerformanceRecord.objects.create(
        workload="digits-lab", instance_type="lab-w-1g", ps_type="lab-w-100", workers=2, batch_size=16,
        latency_ms=0, strategy="ps", epoch_time_s=9.0,
    )  # fmt: skip
    before = lookup(2)
    job = running_lab_job(alice, bundle, digits, metrics={"epoch_time_s": 3.5, "batch_size": 16}, state="collecting")

    assert pipeline.collect(job.pk)

    job.refresh_from_db()
    record = PerformanceRecord.objects.get(job_link__job=job)
    assert job.state == Job.State.SUCCEEDED and job.figures["alerts"][0]["code"] == "ps-saturated"
    assert (record.source, record.workers, record.instance_type, record.ps_type) == (
        "measured",
        1,
        "lab-w-1g",
        "lab-w-100",
    )
    assert (record.batch_size, record.epoch_time_s) == (16, 3.5)
    assert record.bandwidth_mbps == pytest.approx(98, rel=1e-3)
    assert (before["workers"], lookup(2)["workers"]) == (2, 1)  # the measured single worker is now the faster


def test_a_local_job_is_no_record_of_the_types_it_named(alice, bundle, digits):
    """Local nodes are processes on the platform's machine, whatever type the job named: not that type's figure."""
    load_catalog("fc2-2018")
    job = make_job(alice, bundle, digits, worker_type="c4.xlarge")
    Job.objects.filter(pk=job.pk).update(state=Job.State.COLLECTING, metrics={"epoch_time_s": 1})

    assert pipeline.collect(job.pk)

    assert not PerformanceRecord.objects.exists()
    assert Job.objects.get(pk=job.pk).figures is not None
