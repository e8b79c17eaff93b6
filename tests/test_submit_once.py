"""Submitting is exactly-once: `POST /api/jobs` (and a re-run) with an `Idempotency-Key` makes one job, however often
and however concurrently the request is sent; the limit on submissions holds per user under parallel requests too.

The concurrent tests send real requests from real threads, each on its own database connection, against the test
database (SQLite here; PostgreSQL with DATABASE_URL=postgres://…)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from fc2.models import IdempotencyKey, Job
from fc2.services import submissions, tokens
from fc2.services.bundles import store_bundle
from tests.helpers import Api, wheel_upload

JOBS = "/api/jobs"


@pytest.fixture
def api(client, alice) -> Api:
    return Api(client, alice)


def post(api: Api, body: dict, key: str | None, path: str = JOBS):
    headers = {**api.headers, **({"Idempotency-Key": key} if key is not None else {})}
    return api.client.post(path, json.dumps(body), content_type="application/json", headers=headers)


@pytest.fixture
def body(bundle, digits) -> dict:
    return {"bundle": bundle.pk, "dataset": "digits", "parameters": {"epochs": "1"}}


# --- one job per key --------------------------------------------------------------------------------------------------


def test_the_same_key_answers_the_first_job_again(api, client, alice, body):
    first = post(api, body, "a1b2")
    again = post(api, body, "a1b2")
    from_another_token = post(Api(client, alice), body, "a1b2")  # the same user's, e.g. a retry from another shell

    assert first.status_code == again.status_code == from_another_token.status_code == 201
    assert again.json()["id"] == from_another_token.json()["id"] == first.json()["id"]
    assert again.json() == first.json()
    assert "Idempotent-Replayed" not in first and again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1
    assert IdempotencyKey.objects.get().job_id == first.json()["id"]


def test_without_a_key_each_request_is_a_job(api, body):
    assert post(api, body, None).json()["id"] != post(api, body, None).json()["id"]
    assert Job.objects.count() == 2 and not IdempotencyKey.objects.exists()


def test_the_same_key_with_another_request_is_422(api, body):
    first = post(api, body, "k")
    other = post(api, {**body, "parameters": {"epochs": "2"}}, "k")

    assert other.status_code == 422
    assert other.json() == {
        "error": f"this Idempotency-Key was used for another request (job {first.json()['id']}): use a new key for "
        "a new request"
    }
    assert Job.objects.count() == 1


def test_keys_are_each_users_own(api, client, bob, body, example_wheel):
    with example_wheel.open("rb") as wheel:
        bobs_bundle = store_bundle(bob, wheel, example_wheel.name)

    assert post(api, body, "shared").status_code == 201
    assert post(Api(client, bob), {**body, "bundle": bobs_bundle.pk}, "shared").status_code == 201
    assert Job.objects.filter(owner__username="bob").count() == 1 and Job.objects.count() == 2


@pytest.mark.parametrize(
    ("key", "accepted"),
    [
        ("x", True),
        ("k" * 255, True),
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', True),  # a Structured Field string, as the draft writes it
        ("with spaces and ~!@#$%^&*()", True),
        ("", False),
        ('""', False),
        ("k" * 256, False),
        ("naïve", False),
        ("tab\there", False),
    ],
)
def test_a_key_is_1_to_255_printable_ascii_characters(api, body, key, accepted):
    response = post(api, body, key)

    if accepted:
        assert response.status_code == 201, response.json()
    else:
        assert response.status_code == 400
        assert response.json() == {"error": "an Idempotency-Key is 1 to 255 printable ASCII characters"}
        assert not Job.objects.exists()


def test_a_quoted_key_is_the_bare_key(api, body):
    assert post(api, body, '"abc"').json()["id"] == post(api, body, "abc").json()["id"]


def test_a_refused_request_stores_no_key(api, body):
    refused = post(api, {**body, "workers": 99}, "k")
    made = post(api, body, "k")  # the same key, the request put right

    assert refused.status_code == 400 and made.status_code == 201
    assert Job.objects.count() == 1


def test_a_key_older_than_24_hours_is_forgotten(api, alice, body):
    old_job = post(api, body, "k").json()["id"]
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=24, seconds=1))

    new_job = post(api, body, "k")

    assert new_job.status_code == 201 and new_job.json()["id"] != old_job
    assert list(IdempotencyKey.objects.values_list("job_id", flat=True)) == [new_job.json()["id"]]


def test_the_sweep_can_forget_expired_keys(api, body):
    post(api, body, "old")
    post(api, body, "new")
    IdempotencyKey.objects.filter(key="old").update(created_at=timezone.now() - timedelta(hours=25))

    assert submissions.forget_expired_keys() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


def test_a_rerun_honours_the_key(api, alice, job):
    first = post(api, {}, "r", f"{JOBS}/{job.pk}/rerun")
    again = post(api, {}, "r", f"{JOBS}/{job.pk}/rerun")
    elsewhere = post(api, {"bundle": job.bundle_id, "dataset": "digits"}, "r")

    assert first.status_code == again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert elsewhere.status_code == 422  # the key of a re-run, sent with a submission
    assert Job.objects.count() == 2


def test_an_upload_with_a_key_is_stored_once(api, example_wheel, tmp_path, settings):
    def send(wheel_path, key="u"):
        form = {"dataset": "digits", "workers": "2", "bundle_file": wheel_upload(wheel_path)}
        return api.client.post(JOBS, form, headers={**api.headers, "Idempotency-Key": key})

    first, again = send(example_wheel), send(example_wheel)
    changed = tmp_path / example_wheel.name
    changed.write_bytes(example_wheel.read_bytes() + b"\0")  # the same name and fields, another file

    assert first.status_code == again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert send(changed).status_code == 422
    assert Job.objects.count() == 1 and api.user.bundles.count() == 1


def test_a_request_answered_again_is_not_limited(api, body, settings):
    """The client that lost the answer to its last allowed submission still learns its job."""
    settings.FC2_API_SUBMIT_RATE = "1/hour"
    first = post(api, body, "k")

    assert post(api, body, "k").json()["id"] == first.json()["id"]
    assert post(api, body, "another").status_code == 429
    assert Job.objects.count() == 1


# --- at once, from threads --------------------------------------------------------------------------------------------


def at_once(count: int, send) -> list:
    """`send(i)` from `count` threads released together; their answers."""
    barrier, answers = threading.Barrier(count), [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait()
            answers[i] = send(i)
        finally:
            connection.close()  # each thread's own connection

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answers


@pytest.mark.django_db(transaction=True)
def test_requests_at_once_with_one_key_make_one_job(alice, bundle, digits):
    secrets = [tokens.create(alice, f"shell-{i}")[1] for i in range(6)]
    body = json.dumps({"bundle": bundle.pk, "dataset": "digits"})

    def send(i: int):
        headers = {"Authorization": f"Token {secrets[i]}", "Idempotency-Key": "once"}
        return Client().post(JOBS, body, content_type="application/json", headers=headers)

    answers = at_once(6, send)

    assert [a.status_code for a in answers] == [201] * 6, [a.content[:200] for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert sum(a.has_header("Idempotent-Replayed") for a in answers) == 5
    assert Job.objects.count() == 1 and IdempotencyKey.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_requests_at_once_from_many_tokens_stay_within_the_limit(alice, bundle, digits, settings):
    settings.FC2_API_SUBMIT_RATE = "3/hour"
    secrets = [tokens.create(alice, f"shell-{i}")[1] for i in range(8)]
    body = json.dumps({"bundle": bundle.pk, "dataset": "digits"})

    def send(i: int):
        headers = {"Authorization": f"Token {secrets[i]}", "Idempotency-Key": f"key-{i}"}
        return Client().post(JOBS, body, content_type="application/json", headers=headers)

    answers = at_once(8, send)

    assert sorted(a.status_code for a in answers) == [201] * 3 + [429] * 5, [a.content[:200] for a in answers]
    assert all(1 <= int(a["Retry-After"]) <= 3600 for a in answers if a.status_code == 429)
    assert Job.objects.filter(owner=alice).count() == 3 and IdempotencyKey.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_tokens_made_at_once_stay_within_the_bound(alice, settings):
    settings.FC2_MAX_API_TOKENS_PER_USER = 3

    def make(i: int):
        try:
            return tokens.create(alice, f"t{i}")[0].pk
        except tokens.TokenError as exc:
            return str(exc)

    made = at_once(8, make)

    assert sum(isinstance(m, int) for m in made) == 3
    assert alice.api_tokens.count() == 3
