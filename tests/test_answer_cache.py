"""A recommendation given again ahead of Django (fc2/answer_cache.py) must be what Django alone would answer
that request at that moment: the same status, headers and body to a caller Django lets in, and Django's own answer to
anyone else — a session signed out, a password changed, an account deactivated, a token revoked, a host not allowed,
a cookie Django would replace. Each request goes through the WSGI application as a server calls it (Django's
handler, every middleware), in this process, and most are sent to Django alone too and the two answers compared.
How fast it is, benchmarks/lookup_speed.py measures."""

from __future__ import annotations

import io
import json
import re
from typing import NamedTuple
from urllib.parse import urlencode

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from fc2 import answer_cache
from fc2.answer_cache import AnswerCache
from fc2.rest import SubmitThrottle
from fc2.services import tokens
from recommender.api import RecommendView
from recommender.models import PerformanceRecord
from tests.test_recommend_speed import POINT
from tests.test_recommender_interfaces import fc2_catalog, table4  # noqa: F401 -- fixtures, used below

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("table4")]
PATH = "/api/recommend"
JSON, FORM, MULTIPART = "application/json", "application/x-www-form-urlencoded", "multipart/form-data"


@pytest.fixture(autouse=True)
def _in_the_test_s_transaction(request):
    """As Django's test client does, requests leave the test's transaction open rather than close the connection at
    their start and end (which the signals still announce) — in a test that runs in a transaction."""
    if request.node.get_closest_marker("django_db").kwargs.get("transaction"):
        yield
        return
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def connection_checks(monkeypatch) -> list[str]:
    """The checks of the database connections the answers given again make (each would close this test's
    connection, and with it its transaction, as Django's request signals would)."""
    made = []
    monkeypatch.setattr(answer_cache, "close_old_connections", lambda: made.append("checked"))
    return made


@pytest.fixture
def app(connection_checks):
    """The platform's WSGI application as fc2/wsgi.py makes it, fresh (nothing kept)."""
    made = AnswerCache(WSGIHandler())
    assert made.off_because is None
    return made


@pytest.fixture
def session(client, alice) -> str:
    """alice's session cookie, signed in with her password."""
    assert client.login(username="alice", password="alice-password-1")
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def token(alice) -> dict:
    _, secret = tokens.create(alice, "laptop")
    return {"HTTP_AUTHORIZATION": f"Token {secret}"}


class Answer(NamedTuple):
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    queries: int
    by_django: bool  # whether Django's handler answered it


def call(app, params=POINT, method="GET", cookie="", body=None, content_type=JSON, **environ) -> Answer:
    """One request through `app`, as a WSGI server makes it."""
    factory = RequestFactory()
    if body is None:
        request = factory.generic(method, PATH, HTTP_COOKIE=cookie, QUERY_STRING=urlencode(params), **environ)
    elif content_type == MULTIPART:
        request = factory.post(PATH, body, HTTP_COOKIE=cookie, **environ)
    else:
        request = factory.generic(method, PATH, body, content_type, HTTP_COOKIE=cookie, **environ)
    answered, started = [], []
    request_started.connect(noting := lambda sender, **kwargs: started.append(sender), weak=False)
    try:
        with CaptureQueriesContext(connection) as queries:
            response = app(request.environ, lambda status, headers, exc_info=None: answered.append((status, headers)))
            try:
                content = b"".join(response)
            finally:
                getattr(response, "close", lambda: None)()
    finally:
        request_started.disconnect(noting)
    status, headers = answered[-1]
    return Answer(int(status.split()[0]), list(headers), content, len(queries), WSGIHandler in started)


def as_django_alone_answers(app, *args, **kwargs) -> Answer:
    """The request through `app`, checked against the same request to Django alone, just after: status, headers and
    body the same."""
    answer = call(app, *args, **kwargs)
    alone = call(WSGIHandler(), *args, **kwargs)
    assert (answer.status, comparable(answer.headers), answer.body) == (
        alone.status,
        comparable(alone.headers),
        alone.body,
    )
    return answer


def comparable(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The headers, sorted, each cookie set by its name and whether it is deleted (a new CSRF secret is random)."""
    return sorted(
        (
            name,
            value.strip().split("=")[0] + (" deleted" if "Max-Age=0" in value else "")
            if name == "Set-Cookie"
            else value,
        )
        for name, value in headers
    )


def test_a_repeated_get_is_given_django_s_own_answer_again_checked_by_two_queries(app, session, connection_checks):
    first = as_django_alone_answers(app, cookie=session)
    again = as_django_alone_answers(app, cookie=session)

    assert first.status == 200 and json.loads(first.body)["workers"] == 4
    assert first.by_django and not again.by_django
    assert again.queries == 2  # the user and the answer's stamps; the session from its cache
    assert connection_checks == ["checked", "checked"]  # before and after, as Django's request signals do


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_database_dropped_is_replaced_before_an_answer_is_given_again(session):
    if connection.vendor != "postgresql":
        pytest.skip("a database server that can drop a connection: PostgreSQL")
    app = AnswerCache(WSGIHandler())
    for _ in range(3):  # Django's answer, then two given again
        call(app, cookie=session)
    pid = connection.connection.get_backend_pid()  # (no query: it would spend the health check)
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()

    again = call(app, cookie=session)

    assert again.status == 200 and not again.by_django


@pytest.mark.django_db(transaction=True)
def test_a_connection_past_its_age_is_closed_after_an_answer_given_again(session, monkeypatch):
    app = AnswerCache(WSGIHandler())
    call(app, cookie=session)
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)  # one connection per request

    again = call(app, cookie=session)

    assert again.status == 200 and not again.by_django
    assert connection.connection is None


def test_the_same_answer_serves_another_signed_in_user(app, session, bob, client):
    kept = call(app, cookie=session)
    client.force_login(bob)
    bob_s = f"sessionid={client.cookies['sessionid'].value}"

    served = as_django_alone_answers(app, cookie=bob_s)

    assert served.body == kept.body and not served.by_django


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
    assert call(app, cookie=session).status == 200
    assert as_django_alone_answers(app).status == 401  # no cookie at all

    end(client, alice)
    refused = call(app, cookie=session)

    assert refused.status == 401 and refused.by_django
    assert b"Authentication credentials were not provided" in refused.body


def test_a_token_is_checked_first_and_its_revocation_counts_at_once(app, session, alice, token):
    as_django_alone_answers(app, **token)
    by_token = as_django_alone_answers(app, **token)
    assert by_token.status == 200 and not by_token.by_django
    wrong = as_django_alone_answers(app, cookie=session, HTTP_AUTHORIZATION="Token fc2_not-a-token")
    assert wrong.status == 401  # never the session then

    alice.api_tokens.get().revoke()

    refused = call(app, **token)
    assert refused.status == 401 and b"revoked" in refused.body


def test_a_session_and_a_token_each_get_the_headers_django_gives_them(app, session, token):
    """Django's answer to a session varies on the cookie; to a token it does not (the session is never read)."""
    for credentials in ({"cookie": session}, token, {"cookie": session}, token):
        as_django_alone_answers(app, **credentials)

    assert len(app.kept) == 2


@pytest.mark.parametrize(
    "cookies",
    ["csrftoken=bad!", "csrftoken=" + "a" * 32, "messages=x", ""],
    ids=["malformed-csrf-cookie", "csrf-cookie", "another-cookie", "none-else"],
)
def test_the_other_cookies_of_a_request_are_answered_as_django_answers_them(app, session, token, cookies):
    for _ in range(2):
        as_django_alone_answers(app, cookie=f"{session}; {cookies}")
        as_django_alone_answers(app, cookie=f"sessionid=x; {cookies}", **token)  # (Django deletes a malformed one)


def test_a_cookie_is_read_as_django_decodes_it(app, token):
    """A server hands the header's UTF-8 bytes over as latin-1; "éééé" is 4 characters to Django, too short a key."""
    cookie = "sessionid=" + "éééé".encode().decode("latin-1")
    for _ in range(2):
        assert as_django_alone_answers(app, cookie=cookie, **token).status == 200


def test_a_host_django_does_not_allow_is_refused_though_its_query_was_answered(app, session):
    assert call(app, cookie=session).status == 200

    assert as_django_alone_answers(app, cookie=session, HTTP_HOST="evil.example").status == 400


@pytest.mark.parametrize("header", [("HTTP_X_FORWARDED_PROTO", "https"), ("HTTP_X_FORWARDED_SSL", "on")])
def test_https_is_answered_as_django_answers_it(session, settings, connection_checks, header):
    settings.SECURE_PROXY_SSL_HEADER = header
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    secured = AnswerCache(WSGIHandler())
    for _ in range(2):
        https = as_django_alone_answers(secured, cookie=session, **{header[0]: header[1]})
        assert as_django_alone_answers(secured, cookie=session).status == 301
    assert https.status == 200 and not https.by_django and "Strict-Transport-Security" in dict(https.headers)


def test_another_accept_header_is_negotiated_by_django_and_only_json_is_kept(app, session):
    json_answer = call(app, cookie=session)
    for _ in range(2):  # (each browsable page holds a CSRF token of its own)
        html = call(app, cookie=session, HTTP_ACCEPT="text/html")
        browsable = call(app, {**POINT, "format": "api"}, cookie=session)
        refused = as_django_alone_answers(app, cookie=session, HTTP_ACCEPT="application/xml")

    assert dict(html.headers)["Content-Type"].startswith("text/html") and html.body != json_answer.body
    assert html.by_django and browsable.by_django and refused.status == 406
    assert len(app.kept) == 1


def test_a_record_added_changes_the_next_answer(app, session):
    before = json.loads(call(app, cookie=session).body)
    PerformanceRecord.objects.create(
        workload="mnist", workers=2, batch_size=6400, latency_ms=0, epoch_time_s=40, strategy="mirrored"
    )

    after = json.loads(as_django_alone_answers(app, cookie=session).body)

    assert (before["workers"], after["workers"]) == (4, 2)
    assert [json.loads(kept.body)["workers"] for kept in app.kept.values()] == [2]  # the old one let go
    assert not call(app, cookie=session).by_django  # and the new answer is the one given again


def test_an_answer_refused_now_is_let_go(app, session):
    call(app, cookie=session)
    PerformanceRecord.objects.filter(workload="mnist").delete()

    refused = as_django_alone_answers(app, cookie=session)

    assert refused.status == 400 and app.kept == {}


def test_a_head_a_refusal_a_body_or_an_ignored_field_goes_through_django_every_time(app, session, token):
    for _ in range(2):
        head = as_django_alone_answers(app, method="HEAD", cookie=session)
        invalid = as_django_alone_answers(app, {**POINT, "batch_size": "many"}, cookie=session)
        ignored = as_django_alone_answers(app, {**POINT, "note": "x"}, cookie=session)
        multipart = call(app, method="POST", body={"batch_size": 6400}, content_type=MULTIPART, **token)
        assert head.status == ignored.status == 200 and invalid.status == 400
        assert b"batch_size" in invalid.body and ignored.by_django and multipart.by_django
    assert app.kept == {}

    call(app, cookie=session)
    with_body = call(app, method="GET", body="{}", **token, QUERY_STRING=urlencode(POINT))  # (DRF ignores it)
    assert with_body.status == 200 and with_body.by_django


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_a_post_by_token_is_given_again_for_the_same_body(app, token, content_type):
    body = json.dumps(POINT) if content_type == "application/json" else urlencode(POINT)
    first = as_django_alone_answers(app, method="POST", body=body, content_type=content_type, **token)
    again = as_django_alone_answers(app, method="POST", body=body, content_type=content_type, **token)
    other = as_django_alone_answers(
        app, method="POST", body=body.replace("6400", "2560"), content_type=content_type, **token
    )
    anonymous = as_django_alone_answers(app, method="POST", body=body, content_type=content_type)
    get = call(app, **token)

    assert first.by_django and not again.by_django and again.body == first.body
    assert other.by_django and json.loads(other.body)["workers"] == 1  # (Table 4: one machine at 2,560)
    assert anonymous.status == 401
    assert get.by_django and get.body == first.body  # a GET is another request


def test_a_post_by_session_is_given_again_only_with_the_csrf_token(app, session):
    csrf = "a" * 32
    cookie = f"{session}; csrftoken={csrf}"
    body = json.dumps(POINT)
    for _ in range(2):
        passed = as_django_alone_answers(app, method="POST", body=body, cookie=cookie, HTTP_X_CSRFTOKEN=csrf)
    wrong = as_django_alone_answers(app, method="POST", body=body, cookie=cookie, HTTP_X_CSRFTOKEN="b" * 32)
    missing = as_django_alone_answers(app, method="POST", body=body, cookie=cookie)
    form = urlencode({**POINT, "csrfmiddlewaretoken": csrf})
    for _ in range(2):
        in_form = as_django_alone_answers(app, method="POST", body=form, cookie=cookie, content_type=FORM)

    assert passed.status == 200 and not passed.by_django
    assert wrong.status == missing.status == 403 and b"CSRF Failed" in wrong.body
    assert in_form.status == 200 and in_form.by_django  # (its CSRF field is one the recommender ignores)


def test_a_post_whose_answer_changed_is_answered_by_django_from_its_body(app, token):
    body = json.dumps(POINT)
    call(app, method="POST", body=body, **token)
    PerformanceRecord.objects.create(
        workload="mnist", workers=2, batch_size=6400, latency_ms=0, epoch_time_s=40, strategy="mirrored"
    )

    after = as_django_alone_answers(app, method="POST", body=body, **token)

    assert after.status == 200 and after.by_django and json.loads(after.body)["workers"] == 2


@pytest.mark.parametrize("charset", ["", "; charset=utf-8", "; charset=utf8", "; charset=latin-1"])
def test_a_session_s_form_post_is_checked_as_drf_reads_its_form(app, session, charset):
    csrf = "a" * 32
    cookie = f"{session}; csrftoken={csrf}"
    for _ in range(2):
        form = as_django_alone_answers(
            app, method="POST", body=urlencode(POINT), content_type=FORM + charset, cookie=cookie, HTTP_X_CSRFTOKEN=csrf
        )
    assert form.status == 200 and not form.by_django


def test_a_session_s_post_whose_answer_changed_reaches_django_with_its_body(app, session):
    csrf = "a" * 32
    post = {"method": "POST", "body": urlencode(POINT), "content_type": FORM, "HTTP_X_CSRFTOKEN": csrf}
    call(app, cookie=f"{session}; csrftoken={csrf}", **post)
    PerformanceRecord.objects.create(
        workload="mnist", workers=2, batch_size=6400, latency_ms=0, epoch_time_s=40, strategy="mirrored"
    )

    after = as_django_alone_answers(app, cookie=f"{session}; csrftoken={csrf}", **post)

    assert after.by_django and json.loads(after.body)["workers"] == 2  # (its form read by the CSRF check's copy)


def test_the_same_bytes_in_another_charset_are_another_request(app, token):
    body = json.dumps(POINT)
    call(app, method="POST", body=body, **token)

    other = as_django_alone_answers(app, method="POST", body=body, content_type=JSON + "; charset=utf-16", **token)

    assert other.status == 400 and other.by_django


@pytest.mark.parametrize("length", ["²", "+5", " 5", "abc"])
def test_a_post_with_an_odd_content_length_is_django_s(app, token, length):
    for _ in range(2):
        odd = as_django_alone_answers(app, method="POST", body=json.dumps(POINT), CONTENT_LENGTH=length, **token)
        assert odd.by_django


class Broken(io.RawIOBase):
    """A request body the client stopped sending."""

    def __init__(self) -> None:
        self.reads = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.reads += 1
        raise OSError("connection reset by peer")


def test_a_body_that_cannot_be_read_is_met_by_django_and_nobody_s_is_not_read(app, token):
    nobody_s, token_s = Broken(), Broken()
    anonymous = call(app, method="POST", body=json.dumps(POINT), **{"wsgi.input": nobody_s})
    by_token = call(app, method="POST", body=json.dumps(POINT), **{"wsgi.input": token_s}, **token)

    assert anonymous.status == 401 and anonymous.by_django and nobody_s.reads == 0  # (Django refuses it unread)
    assert by_token.status == 500 and by_token.by_django  # (Django's own answer to a body it could not read)


def test_a_large_or_unsized_post_goes_to_django_unread(app, token):
    body = json.dumps(POINT, indent=500)  # (the same input, spaced out)
    for _ in range(2):
        large = call(app, method="POST", body=body, **token)
        unsized = call(app, method="POST", body=json.dumps(POINT), HTTP_TRANSFER_ENCODING="chunked", **token)
        assert large.status == 200 and large.by_django and unsized.by_django
    assert len(body) > answer_cache.MAX_BODY_BYTES and app.kept == {}


def test_what_is_kept_is_bounded(app, session, monkeypatch):
    monkeypatch.setattr(answer_cache, "MAX_KEPT", 2)
    for latency in (0, 10, 0, 20):
        assert call(app, {**POINT, "latency_ms": latency}, cookie=session).status == 200

    assert [kept.request.latency_ms for kept in app.kept.values()] == [0, 20]  # the one used longest ago out


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("MIDDLEWARE", ["django.middleware.gzip.GZipMiddleware", *answer_cache.MIDDLEWARE]),
        ("DISALLOWED_USER_AGENTS", [re.compile("bot")]),
        ("CSRF_USE_SESSIONS", True),
        ("SESSION_SAVE_EVERY_REQUEST", True),
        ("SECRET_KEY_FALLBACKS", ["an-old-key"]),
    ],
)
def test_settings_it_was_not_checked_against_turn_it_off(settings, session, setting, value, connection_checks):
    setattr(settings, setting, value)
    app = AnswerCache(WSGIHandler())

    assert app.off_because == f"settings.{setting}"
    assert all(call(app, cookie=session, HTTP_USER_AGENT="a bot").by_django for _ in range(2))


def test_a_throttle_on_the_view_turns_it_off(monkeypatch):
    monkeypatch.setattr(RecommendView, "throttle_classes", [SubmitThrottle])

    assert AnswerCache(WSGIHandler()).off_because == "the view's throttles"


def test_the_platform_s_own_application_gives_answers_again():
    from fc2.wsgi import application

    assert isinstance(application, AnswerCache) and application.off_because is None
