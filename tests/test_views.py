"""The pages: who sees which job, cancel, downloads (the submission wizard: test_wizard.py)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from fc2.models import Job
from fc2.services import artifacts
from fc2.services.bundles import store_bundle
from tests.conftest import make_job


@pytest.fixture
def bob_job(bob, digits, example_wheel) -> Job:
    with example_wheel.open("rb") as wheel:
        bundle = store_bundle(bob, wheel, example_wheel.name)
    return make_job(bob, bundle, digits)


@pytest.fixture
def artifact(job):
    return artifacts.store_artifact(job, "logs/chief-0.log", b"epoch 1 done\n")


def job_urls(job: Job, artifact) -> dict[str, str]:
    return {
        "detail": reverse("job-detail", args=[job.pk]),
        "live": reverse("job-live", args=[job.pk]),
        "download": reverse("artifact-download", args=[job.pk, artifact.pk]),
    }


# --- who sees what ---


@pytest.mark.parametrize("name", ["job-list", "job-new", "job-detail", "job-live"])
def test_anonymous_is_sent_to_login(client, job, name):
    url = reverse(name, args=[job.pk] if name in ("job-detail", "job-live") else [])

    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


def test_anonymous_cannot_cancel_or_download(client, job, artifact):
    cancel = client.post(reverse("job-cancel", args=[job.pk]))
    download = client.get(job_urls(job, artifact)["download"])

    assert (cancel.status_code, download.status_code) == (302, 302)
    assert cancel["Location"].startswith(reverse("login"))
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


@pytest.mark.parametrize("page", ["detail", "live", "download"])
def test_other_users_job_is_404(client, bob, job, artifact, page):
    client.force_login(bob)

    response = client.get(job_urls(job, artifact)[page])

    assert response.status_code == 404


def test_other_user_cannot_cancel(client, bob, job):
    client.force_login(bob)

    response = client.post(reverse("job-cancel", args=[job.pk]))

    assert response.status_code == 404
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


def test_other_users_artifact_is_404_even_through_own_job(client, alice, job, bob_job):
    """An artifact id is looked up within the job in the URL: bob's job id does not open alice's artifact."""
    theirs = artifacts.store_artifact(bob_job, "metrics.json", b"{}")
    client.force_login(alice)

    response = client.get(reverse("artifact-download", args=[job.pk, theirs.pk]))

    assert response.status_code == 404


@pytest.mark.parametrize("page", ["detail", "live", "download"])
def test_owner_sees_own_job(client, alice, job, artifact, page):
    client.force_login(alice)

    response = client.get(job_urls(job, artifact)[page])

    assert response.status_code == 200
    response.close()


def test_researcher_lists_only_own_jobs(client, alice, job, bob_job):
    client.force_login(alice)

    response = client.get(reverse("job-list"))

    assert response.status_code == 200
    assert list(response.context["page"]) == [job]
    assert response.context["show_owner"] is False
    assert reverse("job-detail", args=[bob_job.pk]) not in response.content.decode()


def test_admin_lists_and_opens_every_job(admin_client, job, bob_job):
    response = admin_client.get(reverse("job-list"))

    assert response.status_code == 200
    assert set(response.context["page"]) == {job, bob_job}
    assert response.context["show_owner"] is True
    for shown in (job, bob_job):
        assert admin_client.get(reverse("job-detail", args=[shown.pk])).status_code == 200


def test_job_list_filters_by_state(client, alice, job, bundle, digits):
    other = make_job(alice, bundle, digits)
    Job.objects.filter(pk=other.pk).update(state=Job.State.FAILED)
    client.force_login(alice)

    response = client.get(reverse("job-list"), {"state": "failed"})

    assert [j.pk for j in response.context["page"]] == [other.pk]


@pytest.mark.parametrize("state", ["nope", "\x00", "²"])
def test_a_filter_that_names_nothing_is_ignored_and_said(client, alice, job, state):
    client.force_login(alice)

    for url in (reverse("job-list"), reverse("home")):
        response = client.get(url, {"state": state})

        assert response.status_code == 200
        assert response.context["state"] == "" and job in list(response.context["jobs" if url == "/" else "page"])
        (message,) = [str(m) for m in response.context["messages"]]
        assert message.startswith("Ignored the state filter: Select a valid choice.")


@pytest.mark.parametrize(("params", "ignored"), [({"q": "a\x00b"}, "bundle search"), ({"kind": "²"}, "dataset filter")])
def test_the_homes_bundle_search_and_dataset_filter_ignore_what_they_cannot_use(client, alice, bundle, params, ignored):
    client.force_login(alice)

    response = client.get(reverse("home"), params)

    assert response.status_code == 200 and list(response.context["bundles"]) == [bundle]
    assert [str(m).split(":")[0] for m in response.context["messages"]] == [f"Ignored the {ignored}"]


@pytest.mark.parametrize(
    "since", ["2026-02-30T10:00:00", "²", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "9" * 5000]
)
def test_series_answers_400_to_a_since_that_is_no_time(client, alice, job, since):
    client.force_login(alice)

    response = client.get(reverse("job-series", args=[job.pk]), {"since": since})

    assert response.status_code == 400 and response.json()["error"].startswith("since: ")


def test_series_takes_since_with_its_offset_as_a_query_string_sends_it(client, alice, job):
    """A `+` left unescaped is a space in a query string: the offset is read as meant, and a naive time is UTC."""
    client.force_login(alice)
    url = reverse("job-series", args=[job.pk])

    sent = [client.get(f"{url}?since={since}") for since in ("2026-01-01T10:00:00+01:00", "2026-01-01T09:00:00")]

    assert [answer.status_code for answer in sent] == [200, 200]
    assert [answer.json()["until"] for answer in sent] == ["2026-01-01T09:00:00.000000Z"] * 2  # (no point: since)


def test_job_list_pager_and_chips_keep_the_filter_and_restart_the_pages(client, alice, job, bundle, digits):
    for _ in range(25):
        make_job(alice, bundle, digits)
    Job.objects.update(state=Job.State.FAILED)
    client.force_login(alice)

    first = client.get(reverse("job-list"), {"state": "failed"}).content.decode()
    second = client.get(reverse("job-list"), {"state": "failed", "page": 2}).content.decode()
    unfiltered = client.get(reverse("job-list")).content.decode()

    assert 'href="?state=failed&amp;page=2#jobs" rel="next"' in first
    assert 'href="?state=failed&amp;page=1#jobs" rel="prev"' in second
    assert 'href="?state=succeeded#jobs" class="chip"' in second  # another state starts on its first page
    assert 'href="?#jobs" class="chip"' in second  # "all" clears the state and the page
    assert 'href="#jobs" class="chip on" aria-current="true">all<' in unfiltered


# --- cancel, health, results ---


def test_owner_cancels_queued_job_once(client, alice, job):
    client.force_login(alice)
    url = reverse("job-cancel", args=[job.pk])

    first = client.post(url)
    second = client.post(url, follow=True)

    assert first.status_code == 302
    assert first["Location"] == reverse("job-detail", args=[job.pk])
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED
    assert job.finished_at is not None
    assert list(job.events.filter(state="cancelled").values_list("message", flat=True)) == ["cancelled by alice"]
    assert second.status_code == 200
    assert f"Job {job.pk} had already ended (cancelled)." in second.content.decode()


def test_cancel_needs_post(client, alice, job):
    client.force_login(alice)

    response = client.get(reverse("job-cancel", args=[job.pk]))

    assert response.status_code == 405


def test_healthz(client, db):
    response = client.get(reverse("healthz"))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"ok": True}


def test_succeeded_job_page_offers_downloads(client, alice, job):
    files = {"model.keras": b"\x00weights\xff" * 50, "logs/chief-0.log": b"epoch 1/1 loss 0.3\n"}
    stored = {name: artifacts.store_artifact(job, name, data) for name, data in files.items()}
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, metrics={"accuracy": 0.93})
    client.force_login(alice)

    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()

    assert "Cancel job" not in page
    assert "accuracy: 0.93" in page
    for name, artifact in stored.items():
        assert name in page
        assert reverse("artifact-download", args=[job.pk, artifact.pk]) in page
    for name, data in files.items():
        response = client.get(reverse("artifact-download", args=[job.pk, stored[name].pk]))
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == data
        expected_name = name.replace("/", "_")
        assert response["Content-Disposition"] == f'attachment; filename="{expected_name}"'
