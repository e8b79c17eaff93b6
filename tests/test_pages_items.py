"""The job page's figures as its nodes' samples give them (before training, while training, at the end), a Manual
job's cluster, Scala-Opt's profiling under way, the site's own 404 for a job that is not there, the admin's read-only
samples, and the recommender pages' times and sources — plain views over real rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from fc2.models import Artifact, Job, Node
from fc2.services import monitoring
from monitor.models import LossPoint, NodeSample
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests.helpers import job_row

pytestmark = pytest.mark.django_db


def running_lab_job(owner, bundle, dataset, worker_mbps: list[float]) -> tuple[Job, Node]:
    """A running lab job of 1 PS (lab-w-100) and 1 worker, batch size 16, whose worker sent at these rates, one a
    second, ending now; its chief (returned) has printed nothing yet."""
    load_catalog("lab")
    now = timezone.now()
    job = job_row(
        owner, bundle, dataset, provider="lab", catalog="lab", strategy=Job.Strategy.PS, workers=1,
        worker_type="lab-w-1g", ps_type="lab-w-100", state=Job.State.RUNNING, started_at=now - timedelta(minutes=1),
        parameters={"batch_size": "16"},
    )  # fmt: skip
    nodes = {}
    for role, kind in (("ps", "lab-w-100"), ("chief", "lab-w-1g"), ("worker", "lab-w-1g")):
        nodes[role] = Node.objects.create(
            job=job, name=f"{role}-0", role=role, index=0, instance_type=kind, last_report_at=now
        )
    sent = 0
    for second, mbps in enumerate([0.0, *worker_mbps]):
        sent += int(mbps * 1e6 / 8)
        at = now - timedelta(seconds=len(worker_mbps) - second)
        for role in ("ps", "worker"):
            NodeSample.objects.create(node=nodes[role], measured_at=at, cpu_percent=60.0, bytes_sent=sent, bytes_recv=0)
    return job, nodes["chief"]


def job_page(client, job: Job) -> str:
    cache.clear()  # a running job's figures are kept a few seconds
    return client.get(job.get_absolute_url()).content.decode()


def test_a_lab_jobs_figures_wait_for_training_then_read_in_examples_a_second(client, alice, bundle, digits):
    job, chief = running_lab_job(alice, bundle, digits, [40.0] * 3)  # 3 s of traffic: too little for a record
    client.force_login(alice)

    before = job_page(client, job)

    assert 'id="figure-ps-saturation"><span class="small muted">once training has begun</span>' in before
    assert 'id="figure-worker-bandwidth"><span class="small muted">once training has begun</span>' in before
    assert 'id="node-figures"' not in before and 'id="node-figures-waiting"' in before

    start = timezone.now() - timedelta(seconds=4)
    for step, second in ((10, 0), (30, 4)):  # 5 steps a second × a batch of 16 (PS: one worker's batch a step)
        LossPoint.objects.create(node=chief, step=step, loss=1 / step, printed_at=start + timedelta(seconds=second))
    during = job_page(client, job)

    assert 'id="figure-throughput">80 examples/s <span class="small muted">so far</span>' in during
    assert 'id="figure-ps-saturation">40 %' in during  # the PS's 40 Mbps of its 100
    assert 'id="node-figures"' in during
    # The workers' bandwidth is their rows' mean, though too short a run for a performance record to keep.
    assert monitoring.job_figures(job)["worker_bandwidth_mbps"] is None
    assert 'id="figure-worker-bandwidth">40.0 Mbps <span class="small muted">(too little traffic' in during


def test_without_a_batch_size_the_pace_stays_in_steps(client, alice, bundle, digits):
    job, chief = running_lab_job(alice, bundle, digits, [40.0] * 8)
    Job.objects.filter(pk=job.pk).update(parameters={})
    start = timezone.now() - timedelta(seconds=4)
    for step, second in ((10, 0), (30, 4)):
        LossPoint.objects.create(node=chief, step=step, loss=1 / step, printed_at=start + timedelta(seconds=second))
    client.force_login(alice)

    page = job_page(client, job)

    assert 'id="figure-throughput">5 steps/s <span class="small muted">so far (no batch size asked)</span>' in page
    assert 'id="figure-worker-bandwidth">40.0 Mbps</dd>' in page  # 8 s of traffic: the record's figure too


def test_an_ended_jobs_throughput_and_its_metric_pills_read_alike(client, alice, bundle, digits):
    metrics = {"examples_per_s": 1143.6, "input_shape": [8, 8, 1], "epoch_time_s": 0.0412}
    job = job_row(alice, bundle, digits, state=Job.State.SUCCEEDED, metrics=metrics, strategy="ps", workers=1)
    Node.objects.create(job=job, name="chief-0", role="chief", index=0, status=Node.Status.SUCCEEDED)
    Artifact.objects.create(job=job, name="metrics.json", size_bytes=10, not_kept="a test's")
    client.force_login(alice)

    page = job_page(client, job)

    assert 'id="figure-throughput">1144 examples/s</dd>' in page
    assert '<span class="badge">examples_per_s: 1144</span>' in page
    assert '<span class="badge">input_shape: [8, 8, 1]</span>' in page
    assert 'id="figure-epoch-time">41.2 ms</dd>' in page


def test_a_manual_jobs_cluster_is_the_one_its_user_chose_before_it_is_planned(client, alice, bundle, digits):
    job = job_row(
        alice, bundle, digits, algorithm="manual", strategy=Job.Strategy.PS, workers=2, worker_type="c4.xlarge",
        ps_type="m4.large",
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(strategy="", workers=None, worker_type="", ps_type="")  # not planned yet
    client.force_login(alice)

    page = job_page(client, job)

    assert "chosen by its recommend step" not in page
    assert (
        'Parameter server · 2 workers of c4.xlarge, PS m4.large <span class="muted">(the cluster you chose)</span>'
        in page
    )


@pytest.mark.parametrize(
    ("window_ends_in", "shown"),
    [(None, "starting its cluster"), (timedelta(seconds=81), "at most 1 min 20 s left")],
)
def test_scala_opts_profiling_says_which_run_and_how_long_it_may_take(
    client, alice, bundle, digits, window_ends_in, shown
):
    now = timezone.now()
    runs = [
        {"number": 1, "runs": 3, "worker_type": "lab-w-1g", "hourly_cost": 0.1,
         "started_at": (now - timedelta(minutes=3)).isoformat(),
         "window_ends_at": (now - timedelta(minutes=1)).isoformat(), "ended_at": now.isoformat()},
        {"number": 2, "runs": 3, "worker_type": "lab-w-100", "hourly_cost": 0.1, "started_at": now.isoformat(),
         "window_ends_at": None if window_ends_in is None else (now + window_ends_in).isoformat(), "ended_at": None},
    ]  # fmt: skip
    job = job_row(alice, bundle, digits, algorithm="scala-opt", provider="lab", state=Job.State.RECOMMENDING)
    Job.objects.filter(pk=job.pk).update(profiling_runs=runs)
    client.force_login(alice)

    page = job_page(client, job)

    assert "waiting for the first progress report" not in page
    assert "profiling <strong>2 of 3</strong>: the bandwidth one lab-w-100 worker uses · " + shown in page


def test_a_job_that_is_not_there_is_the_sites_own_404_with_debug_on(client, settings, alice, bob, bundle, digits):
    settings.DEBUG = True
    alices = job_row(alice, bundle, digits)
    client.force_login(bob)

    missing = client.get("/jobs/999/")
    hers = client.get(alices.get_absolute_url())

    assert missing.status_code == hers.status_code == 404
    page = missing.content.decode()
    assert "<h1>No job 999</h1>" in page and "URLconf" not in page and "Using the URLconf" not in page
    assert f"<h1>No job {alices.pk}</h1>" in hers.content.decode()


def test_samples_and_loss_points_are_read_only_in_the_admin(admin_client, alice, bundle, digits):
    job = job_row(alice, bundle, digits)
    node = Node.objects.create(job=job, name="chief-0", role="chief", index=0)
    sample = NodeSample.objects.create(node=node, cpu_percent=50.0)
    loss = LossPoint.objects.create(node=node, step=1, loss=0.5)

    index = admin_client.get("/admin/").content.decode()

    assert "<h1>Site administration</h1>" in index and "<h1>Records</h1>" not in index
    for model, row in (("nodesample", sample), ("losspoint", loss)):
        assert admin_client.get(f"/admin/monitor/{model}/add/").status_code == 403
        assert f'href="/admin/monitor/{model}/add/"' not in index
        change = admin_client.get(f"/admin/monitor/{model}/{row.pk}/change/")
        assert change.status_code == 200 and 'name="_save"' not in change.content.decode()
        assert admin_client.post(f"/admin/monitor/{model}/{row.pk}/change/", {"step": 9}).status_code == 403


def test_the_records_show_short_epochs_in_milliseconds_and_the_catalogue_its_code(client, alice):
    load_catalog("aws-us-east-1")
    PerformanceRecord.objects.create(workload="tiny", instance_type="c4.xlarge", workers=1, epoch_time_s=0.0412)
    client.force_login(alice)

    records = client.get(reverse("recommender-records") + "?workload=tiny").content.decode()
    catalogue = client.get(reverse("recommender-catalogs") + "?catalog=aws-us-east-1").content.decode()

    assert "41.2 ms" in records and "0.0 s" not in records
    assert "<code>manage.py refresh_catalog --region us-east-1</code>" in catalogue and "`manage.py" not in catalogue


def test_any_other_missing_page_is_the_sites_own_404_with_debug_off(client, settings, alice):
    settings.DEBUG = False
    client.force_login(alice)

    response = client.get("/no-such-page/")

    assert response.status_code == 404
    page = response.content.decode()
    assert "<h1>Not found</h1>" in page and "There is nothing at <code>/no-such-page/</code>." in page
    assert 'href="/jobs/">Your jobs</a>' in page
