"""What users see of a managed job (issue 45), on hand-built rows: the job page's Restarts section (each restart's
nodes, reason, work lost, checkpoint and resume; the spot choice; the kept checkpoints with their downloads) live
like the rest of the page, `Job.restarts` read safely whatever it holds; `fc2 status`'s restarts line; the wizard's
spot price and expected saving beside on-demand on aws (moto's spot price history), and none off aws."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.core.files.base import ContentFile
from django.template.loader import render_to_string
from django.urls import reverse

from client.fc2_client import display
from fc2.models import Artifact, Job
from fc2.services import managed
from fc2.services import pricing as fc2_pricing
from harness.ec2lab import REGION
from recommender import pricing
from recommender.pricing import SpotQuote
from tests.helpers import job_row, make_bundle, make_dataset, resource_form, step_url, through_data

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


def checkpoint(job: Job, number: int, seconds: float, content: bytes = b"tgz") -> Artifact:
    """The job's checkpoint artifact `number`, as the checkpoint service keeps one, shipped `seconds` after T0."""
    name = f"checkpoints/{number:06d}.tar.gz"
    artifact = Artifact(job=job, name=name, original_name=f"ckpt-{number}", size_bytes=len(content))
    artifact.created_at = T0 + dt.timedelta(seconds=seconds)
    artifact.file.save(name.rsplit("/", 1)[-1], ContentFile(content), save=True)
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
    # Cancelled during it: it never ran again.
    Job.objects.filter(pk=resumed.pk).update(state=Job.State.CANCELLED)
    ended = client.get(resumed.get_absolute_url()).content.decode()
    assert 'role="status">2 of 3 made' in ended and "under way" not in ended.split('id="restarts"')[1]
    assert '<span class="muted">never</span>' in ended


@pytest.mark.django_db
def test_a_plain_job_has_no_restarts_section_and_one_that_ran_out_says_so(client, alice):
    plain = job_row(alice, state=Job.State.RUNNING)
    assert 'id="restarts"' not in page(client, plain)
    spent = job_row(alice, state=Job.State.FAILED, max_restarts=1, restarts=[{**RESTART, "checkpoint": ""}])
    html = page(client, spent)
    assert "none left: a node lost now fails the job" in html and 'id="restarts-spot"' not in html  # not aws
    assert "the start <span" in html and 'id="checkpoints-none"' in html
    Job.objects.filter(pk=spent.pk).update(provider="aws")
    assert "on-demand instances" in page(client, spent).split('id="restarts-spot">')[1].split("</dd>")[0]


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
    answer = client.get(f"/api/jobs/{job.pk}")  # and the API, which `fc2 status` reads: a null where unreadable
    assert answer.status_code == 200
    restarts = answer.json()["restarts"]
    assert all(set(r) == set(RESTART) - {"state"} for r in restarts)
    assert display.restarts_line(answer.json()).startswith("  restarts  ")
    if isinstance(hostile, list) and isinstance(hostile[0], dict) and "lost_steps" in hostile[0]:
        assert restarts[0]["lost_steps"] is None and restarts[0]["lost_s"] is None and restarts[0]["at"] is None


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
    assert display.restarts_line({**under_way, "state": "cancelled"}).endswith("lost, never resumed")
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


# --- the wizard's spot saving ---------------------------------------------------------------------------------------


def aws_spot_form(**fields) -> dict:
    aws = {"provider": "aws", "catalog": "fc2-2018", "algorithm": "manual", "strategy": "ps", "region": REGION}
    return resource_form(**{**aws, "worker_type": "c4.xlarge", "ps_type": "m4.large", "spot": "on", **fields})


@pytest.mark.django_db
def test_the_wizard_prices_spot_beside_on_demand_from_the_spot_price_history(
    client, alice, bundle, aws_env, fc2_catalog
):
    client.force_login(alice)
    through_data(client, bundle)
    preview = client.get(reverse("job-new-recommendation"), aws_spot_form()).content.decode()
    assert 'id="plan-spot"' in preview, preview
    spot = preview.split('id="plan-spot"')[1].split("</div>")[0]
    assert 'id="plan-spot-saving"' in spot and "on-demand: expected saving" in spot, spot
    quotes = {q.instance_type: q for q in pricing.fetch_spot_quotes(REGION, {"c4.xlarge": 0.199, "m4.large": 0.1})}
    assert set(quotes) == {"c4.xlarge", "m4.large"}
    for name in quotes:
        assert f"{name} " in spot and f" in {quotes[name].zone}" in spot
    assert "raised by 10 % for interruptions" in spot
    # The review says it too; without spot, neither does.
    assert client.post(step_url("resource"), aws_spot_form(spot_max_price="0.5")).status_code == 302
    assert 'id="plan-spot-saving"' in client.get(step_url("review")).content.decode()
    plain = client.get(reverse("job-new-recommendation"), aws_spot_form(spot="")).content.decode()
    assert 'id="plan-spot"' not in plain and 'id="plan-cost"' in plain


@pytest.mark.django_db
def test_the_wizard_shows_no_spot_off_aws(client, alice, bundle):
    client.force_login(alice)
    through_data(client, bundle)
    local = client.get(reverse("job-new-recommendation"), resource_form()).content.decode()
    assert 'id="plan-cost"' in local and 'id="plan-spot"' not in local
    refused = client.get(reverse("job-new-recommendation"), resource_form(spot="on")).content.decode()
    assert "Spot instances are AWS&#x27;s" in refused and 'id="plan-spot"' not in refused


@pytest.mark.django_db
def test_a_spot_saving_says_why_it_is_unknown(aws_env, fc2_catalog, monkeypatch, tmp_path):
    unknown = fc2_pricing.spot_saving({"no.such": 1}, "fc2-2018", REGION)
    assert unknown.saving is None and unknown.unknown == f"{REGION} has no spot price for no.such"
    assert "choose a worker type" in fc2_pricing.spot_saving({}, "fc2-2018", REGION).unknown
    with monkeypatch.context() as blind_env:  # (aws_env's teardown needs them back)
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            blind_env.delenv(name)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            blind_env.setenv(name, str(tmp_path / "none"))
        blind = fc2_pricing.spot_saving({"m4.xlarge": 1}, "fc2-2018", REGION)
    assert blind.spot is None and "the spot price is unknown" in blind.unknown and "no AWS credentials" in blind.unknown


def test_the_spot_panel_says_a_max_price_under_the_market_and_an_unpriced_type():
    quote = SpotQuote("c4.xlarge", 0.05, "ap-southeast-1a", 0.2)
    over = fc2_pricing.SpotSaving((quote,), quote.expected * 2, 0.4, over_max="c4.xlarge")
    shown = render_to_string("fc2/wizard/_spot_saving.html", {"spot": over, "job_request": {"spot_fallback": "wait"}})
    assert "$0.11/h" in shown and "beside $0.40/h on-demand: expected saving" in shown and "72.5 %" in shown
    assert "under the spot price of c4.xlarge: no spot capacity at that price, so the job waits for it" in shown
    unpriced = fc2_pricing.SpotSaving((quote,), quote.expected, unknown="the x catalogue has no on-demand price of y")
    shown = render_to_string("fc2/wizard/_spot_saving.html", {"spot": unpriced, "job_request": {}})
    assert "expected saving" not in shown and "· the x catalogue has no on-demand price of y" in shown
