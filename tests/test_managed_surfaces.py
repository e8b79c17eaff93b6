"""What users see of a managed job (issue 45), on hand-built rows: the job page's Restarts section (each restart's
nodes, reason, work lost, checkpoint and resume; the spot choice; the kept checkpoints with their downloads) live
like the rest of the page, `Job.restarts` read safely whatever it holds; `fc2 status`'s restarts line; the wizard's
spot price and expected saving beside on-demand on aws (moto's spot price history), and none off aws."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core.files.base import ContentFile
from django.urls import reverse

from client.fc2_client import display
from fc2.models import Artifact, Job
from fc2.services import managed
from tests.helpers import job_row, make_bundle, make_dataset

T0 = dt.datetime(2026, 11, 3, 10, 0, tzinfo=dt.UTC)


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


RESTART = {
    "at": at(600),
    "nodes": ["worker-1"],
    "reason": "worker-1 is lost: its machine answers nothing for 40 s",
    "state": "running",
    "lost_steps": 4,
    "lost_s": 95.5,
    "lost_dollars": 0.0166,
    "checkpoint": "000002.tar.gz",
    "resumed_at": at(618),
}


@pytest.fixture
def resumed(alice) -> Job:
    """A running job that lost a worker once and resumed from its second checkpoint; its third shipped since."""
    bundle, dataset = make_bundle(alice, "digits-cnn"), make_dataset(alice, "mine.npz")
    job = job_row(
        alice, bundle, dataset, state=Job.State.RUNNING, started_at=T0, launched_at=T0, strategy=Job.Strategy.PS,
        workers=2, ps_type="m4.large", worker_type="m4.xlarge", hourly_cost=Decimal("0.625"), provider="aws",
        max_restarts=3, spot=True, spot_max_price=Decimal("0.2"), spot_fallback=Job.SpotFallback.WAIT,
        restarts=[RESTART],
    )  # fmt: skip
    for number, seconds in ((2, 500), (3, 700)):
        checkpoint(job, number, seconds)
    return job


def checkpoint(job: Job, number: int, seconds: float) -> Artifact:
    name = f"checkpoints/{number:06d}.tar.gz"
    artifact = Artifact(job=job, name=name, original_name=f"ckpt-{number}", size_bytes=3, created_at=T0)
    artifact.created_at = T0 + dt.timedelta(seconds=seconds)
    artifact.file.save(name.rsplit("/", 1)[-1], ContentFile(b"tgz"), save=True)
    return artifact


def page(client, job: Job) -> str:
    client.force_login(job.owner)
    response = client.get(job.get_absolute_url())
    assert response.status_code == 200
    return response.content.decode()


# --- the job page ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_page_shows_each_restart_its_work_lost_checkpoint_and_resume(client, resumed):
    html = page(client, resumed)
    assert 'id="restarts-title">Restarts</h2>' in html
    assert "<strong>1</strong> made of 3 allowed" in html
    row = html.split('data-restart="1"')[1].split("</tr>")[0]
    assert "worker-1" in row and "its machine answers nothing for 40 s" in row
    assert "4 steps" in row and "1 min 35 s" in row and "≈ $0.0166" in row
    second = Artifact.objects.get(job=resumed, name="checkpoints/000002.tar.gz")
    assert reverse("artifact-download", args=[resumed.pk, second.pk]) in row and "checkpoint 000002.tar.gz" in row
    assert "18 s after the loss" in row
    spot = html.split('id="restarts-spot">')[1].split("</dd>")[0]
    assert "spot instances at most $0.20/h" in spot and "wait for spot capacity" in spot


@pytest.mark.django_db
def test_the_checkpoints_are_listed_newest_first_and_labelled_in_the_results(client, resumed):
    html = page(client, resumed)
    listed = html.split('id="checkpoints">')[1].split("</ul>")[0]
    assert listed.index("000003") < listed.index("000002") and "the latest: a restart resumes from it" in listed
    for artifact in Artifact.objects.filter(job=resumed):
        assert reverse("artifact-download", args=[resumed.pk, artifact.pk]) in listed
    results = html.split('id="job-results"')[1]
    assert results.count('<span class="badge">checkpoint</span>') == 2
    downloaded = client.get(reverse("artifact-download", args=[resumed.pk, artifact.pk]))
    assert downloaded.status_code == 200 and b"".join(downloaded.streaming_content) == b"tgz"


@pytest.mark.django_db
def test_the_restarts_section_is_live_with_the_rest_of_the_page(client, resumed):
    client.force_login(resumed.owner)
    Job.objects.filter(pk=resumed.pk).update(restarts=[RESTART, {**RESTART, "at": at(900), "resumed_at": None}])
    live = client.get(reverse("job-live", args=[resumed.pk])).content.decode()
    assert 'id="restarts-status" role="status">restart 2 under way' in live
    assert 'data-restart="2"' in live and '<span class="badge running">under way</span>' in live


@pytest.mark.django_db
def test_a_plain_job_has_no_restarts_section_and_one_that_ran_out_says_so(client, alice):
    plain = job_row(alice, state=Job.State.RUNNING)
    assert 'id="restarts"' not in page(client, plain)
    spent = job_row(alice, state=Job.State.FAILED, max_restarts=1, restarts=[{**RESTART, "checkpoint": ""}])
    html = page(client, spent)
    assert "none left: a node lost now fails the job" in html and "on-demand instances" in html
    assert "the start <span" in html and 'id="checkpoints-none"' in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    "hostile",
    [
        "not a list",
        ["not a dict", 7, None],
        [{"at": "yesterday", "nodes": "worker-1", "lost_steps": "many", "lost_s": [1], "resumed_at": 3}],
        [{"at": "2026-11-03T10:00:00", "resumed_at": at(5), "lost_dollars": True, "checkpoint": ["x"]}],
        [{"nodes": ["<script>alert(1)</script>"], "reason": "<img src=x onerror=alert(1)>", "checkpoint": "../../x"}],
    ],
)
def test_hostile_restarts_render_safely(client, alice, hostile):
    job = job_row(alice, state=Job.State.RUNNING, max_restarts=2)
    Job.objects.filter(pk=job.pk).update(restarts=hostile)
    html = page(client, job)
    assert 'id="restarts-title"' in html
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    if "<script>" in str(hostile):
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "checkpoint ../../x" in html


def test_a_naive_or_unreadable_moment_is_unknown_not_a_failure():
    row = managed._restart(1, {"at": "2026-11-03T10:00:00", "resumed_at": at(5), "lost_steps": 2.0}, {})
    assert row.at is None and row.back_after_s is None and row.lost_steps == 2


# --- fc2 status -----------------------------------------------------------------------------------------------------


def test_the_status_line_says_the_restarts_and_the_last_interruption():
    job = {"id": 7, "state": "running", "max_restarts": 3, "restarts": [RESTART]}
    assert display.restarts_line(job) == (
        "  restarts  1 of 3 · last: worker-1 lost at 2026-11-03 10:10:00 (worker-1 is lost: its machine answers "
        "nothing for 40 s), 4 steps, 96 s, $0.0166 lost, resumed from checkpoint 000002.tar.gz"
    )
    assert "restarts  1 of 3" in display.job_report(job)
    under_way = {**job, "restarts": [{**RESTART, "resumed_at": None, "checkpoint": ""}]}
    assert display.restarts_line(under_way).endswith("restart under way")
    assert display.restarts_line({"id": 7, "state": "running", "max_restarts": 2, "restarts": []}) == (
        "  restarts  0 of 2"
    )
    assert display.restarts_line({"id": 7, "state": "running"}) is None  # a plain job, or an older platform
    spot = {"id": 7, "state": "running", "spot": True, "spot_max_price": 0.2, "spot_fallback": "wait"}
    assert display.restarts_line(spot) == "  restarts  0 of 0 · spot at most $0.20/h, without capacity: wait"


def test_the_status_line_survives_hostile_restarts():
    for hostile in ("x", [None, 3], [{"nodes": "w", "lost_s": "x", "at": 5}], [{}]):
        line = display.restarts_line({"id": 7, "state": "running", "max_restarts": 1, "restarts": hostile})
        assert line.startswith("  restarts  ")


@pytest.mark.django_db
def test_the_api_output_carries_the_restarts_as_status_reads_them(client, resumed):
    client.force_login(resumed.owner)
    job = client.get(f"/api/jobs/{resumed.pk}").json()
    assert job["max_restarts"] == 3 and job["spot"] is True and job["spot_fallback"] == "wait"
    (restart,) = job["restarts"]
    assert restart["nodes"] == ["worker-1"] and restart["lost_steps"] == 4 and restart["checkpoint"] == "000002.tar.gz"
    assert "restarts  1 of 3 · last: worker-1 lost" in display.job_report(job)
