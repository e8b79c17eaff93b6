"""A recommendation given again ahead of Django (recommender/answer_cache.py) must be what Django would answer that
caller at that moment: the same status, headers and body to a caller Django would let in, and whatever Django says to
anyone else — a session signed out, a password changed, an account deactivated, a token revoked, a host not allowed.
Requests go through the WSGI application as a server calls it (Django's handler, every middleware), in this process.
How fast it is, benchmarks/lookup_speed.py measures."""

from __future__ import annotations

import json
from typing import NamedTuple
from urllib.parse import urlencode

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from fc2.services import tokens
from recommender import answer_cache
from recommender.answer_cache import AnswerCache
from recommender.models import PerformanceRecord
from tests.test_recommend_speed import POINT
from tests.test_recommender_interfaces import fc2_catalog, table4  # noqa: F401 -- fixtures, used below

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("table4")]
PATH = "/api/recommend"


@pytest.fixture
def app():
    """The platform's WSGI application as fc2/wsgi.py makes it, fresh (nothing kept). As Django's test client does,
    the requests leave the test's transaction open rather than closing the connection at their start and end."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield AnswerCache(WSGIHandler())
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def session(client, alice) -> str:
    """alice's session cookie, signed in with her password."""
    assert client.login(username="alice", password="alice-password-1")
    return f"sessionid={client.cookies['sessionid'].value}"


class Answer(NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    queries: int
    by_django: bool  # whether Django's handler answered it (its request_started was sent)


def call(app, params=POINT, method="GET", cookie="", body=None, **environ) -> Answer:
    """One request through `app`, as a WSGI server makes it."""
    factory = RequestFactory()
    if body is None:
        request = factory.generic(method, PATH, HTTP_COOKIE=cookie, QUERY_STRING=urlencode(params), **environ)
    else:
        request = factory.generic(method, PATH, body, "application/json", HTTP_COOKIE=cookie, **environ)
    answered, started = [], []
    request_started.connect(receiver := lambda **kwargs: started.append(True), weak=False)
    with CaptureQueriesContext(connection) as queries:
        response = app(request.environ, lambda status, headers, exc_info=None: answered.append((status, headers)))
        try:
            content = b"".join(response)
        finally:
            getattr(response, "close", lambda: None)()
            request_started.disconnect(receiver)
    status, headers = answered[-1]
    return Answer(int(status.split()[0]), headers, content, len(queries), bool(started))


def test_a_repeated_get_is_given_django_s_own_answer_again_with_two_queries(app, session):
    first = call(app, cookie=session)
    again = call(app, cookie=session)

    assert first[0] == 200 and json.loads(first[2])["workers"] == 4
    assert again[:3] == first[:3]  # status, every header, body
    assert first.by_django and not again.by_django
    assert again.queries == 2  # the user and the answer's stamps; the session from its cache


def test_the_same_answer_serves_another_signed_in_user(app, session, bob, client):
    kept = call(app, cookie=session)
    client.force_login(bob)

    assert call(app, cookie=f"sessionid={client.cookies['sessionid'].value}")[:3] == kept[:3]


@pytest.mark.parametrize(
    "end",
    [
        lambda client, alice: client.logout(),
        lambda client, alice: (alice.set_password("another-password-2"), alice.save()),
        lambda client, alice: (setattr(alice, "is_active", False), alice.save()),
    ],
    ids=["signed-out", "password-changed", "deactivated"],
)
def test_a_session_that_ended_gets_django_s_refusal_not_the_kept_answer(app, session, client, alice, end):
    assert call(app, cookie=session)[0] == 200
    refused_before = call(app)  # no cookie at all: Django's 401, as the kept answer is never given without a caller

    end(client, alice)
    refused = call(app, cookie=session)

    assert refused_before[0] == refused[0] == 401
    assert b"Authentication credentials were not provided" in refused[2]


def test_a_token_is_checked_first_and_its_revocation_counts_at_once(app, session, alice):
    token, secret = tokens.create(alice, "laptop")
    bearer = {"HTTP_AUTHORIZATION": f"Token {secret}"}
    kept = call(app, cookie=session)

    by_token = call(app, **bearer)
    assert by_token[:3] == kept[:3] and not by_token.by_django
    assert call(app, cookie=session, HTTP_AUTHORIZATION="Token fc2_not-a-token")[0] == 401  # never the session then

    token.revoke()

    refused = call(app, **bearer)
    assert refused[0] == 401 and b"revoked" in refused[2]


def test_a_host_django_does_not_allow_is_refused_though_its_query_was_answered(app, session):
    assert call(app, cookie=session)[0] == 200

    assert call(app, cookie=session, HTTP_HOST="evil.example")[0] == 400


def test_another_accept_header_is_negotiated_by_django(app, session):
    json_answer = call(app, cookie=session)
    html = call(app, cookie=session, HTTP_ACCEPT="text/html")
    refused = call(app, cookie=session, HTTP_ACCEPT="application/xml")

    assert dict(html[1])["Content-Type"].startswith("text/html") and html[2] != json_answer[2]
    assert refused[0] == 406


def test_a_record_added_changes_the_next_answer(app, session):
    before = json.loads(call(app, cookie=session)[2])
    PerformanceRecord.objects.create(
        workload="mnist", workers=2, batch_size=6400, latency_ms=0, epoch_time_s=40, strategy="mirrored"
    )

    after = json.loads(call(app, cookie=session)[2])

    assert (before["workers"], after["workers"]) == (4, 2)
    assert not call(app, cookie=session).by_django  # and the new answer is the one given again


def test_a_post_a_refusal_or_a_get_with_a_body_goes_through_django_every_time(app, session, alice):
    _, secret = tokens.create(alice, "script")
    bearer = {"HTTP_AUTHORIZATION": f"Token {secret}"}
    for _ in range(2):
        posted = call(app, method="POST", body=json.dumps(POINT), **bearer)
        invalid = call(app, {**POINT, "batch_size": "many"}, cookie=session)
        assert posted[0] == 200 and invalid[0] == 400 and b"batch_size" in invalid[2]
    assert app.kept == {}

    call(app, cookie=session)
    with_body = call(app, method="GET", body="{}", **bearer, QUERY_STRING=urlencode(POINT))  # (DRF ignores it)
    assert with_body.status == 200 and with_body.by_django


def test_what_is_kept_is_bounded(app, session, monkeypatch):
    monkeypatch.setattr(answer_cache, "MAX_KEPT", 2)
    for latency in (0, 10, 20):
        assert call(app, {**POINT, "latency_ms": latency}, cookie=session)[0] == 200

    assert [kept.request.latency_ms for kept in app.kept.values()] == [10, 20]  # the oldest out
