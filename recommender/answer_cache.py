"""The recommender's answers to repeated `GET /api/recommend`, given again ahead of Django's request handling.

A recommendation is a pure function of its input, the catalogue and the workload's records, and recommender.service
keeps each answer until either changes. What an answer cost was then mostly the way to it: the middleware, DRF's
dispatch and the input's validation, several times the answer itself. So this WSGI middleware (fc2/wsgi.py) keeps the
status, headers and body that Django's whole path produced for a GET, and gives them again to a later GET only when

- the request is the same in everything that answer depends on (`KEY_FIELDS`: path, query string, Accept, host and
  scheme), with no body;
- its caller is signed in, as DRF's authentication classes for the API would find (settings.REST_FRAMEWORK): an API
  token checked by fc2.tokens, or else the session through django.contrib.auth.get_user — a token revoked or expired,
  a session signed out or expired, or a user deactivated, or whose password changed, is nobody;
- and the answer still holds: recommender.service, asked the same request again, gives the very answer that was
  rendered (its one stamps query finds the catalogue and the records unchanged).

Anything else goes to Django as before: a first request, another method or path, a caller not signed in (Django says
why, 401), an answer changed or refused, a database error. The answers kept are those Django gave with 200 and set no
cookie in, for a request whose view said which recommendation it rendered (`RENDERED`, set by recommender.api). The
answer names no user, so one kept for one caller may be given to another. Each process keeps its own, at most
`MAX_KEPT`, the oldest first out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module

from django.conf import settings
from django.contrib import auth
from django.db import DatabaseError
from django.http.cookie import parse_cookie

from fc2 import tokens
from recommender import service
from recommender.types import RecommendationError, RecommendRequest

PATH = "/api/recommend"
# What in a GET's environ Django's answer depends on, besides the caller: which view and input (path, query string),
# which renderer (Accept), whether the host is allowed, and what a secure request gets (a redirect, HSTS).
KEY_FIELDS = (
    "SCRIPT_NAME",
    "QUERY_STRING",
    "HTTP_ACCEPT",
    "HTTP_HOST",
    "SERVER_NAME",
    "SERVER_PORT",
    "wsgi.url_scheme",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_FORWARDED_HOST",
)
MAX_KEY_CHARS = 2000  # a longer query string is answered by Django every time
MAX_KEPT = 1024
RENDERED = "fc2.recommender.rendered"  # the environ key: (request, catalogue, the answer's dict) the view rendered


@dataclass(frozen=True)
class Kept:
    request: RecommendRequest
    catalog: str
    answer: dict  # the very dict recommender.service gave, compared by identity
    status: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


class _Caller:
    """What the authentication functions read of a request: its META and, for django.contrib.auth, its session.
    fc2.tokens keeps its lookup on it, as it does on a Django request."""

    def __init__(self, environ: dict, session) -> None:
        self.META = environ
        self.session = session


class AnswerCache:
    def __init__(self, app: Callable) -> None:
        self.app = app
        self.kept: dict[tuple, Kept] = {}
        self.session_store = import_module(settings.SESSION_ENGINE).SessionStore

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if (
            environ.get("REQUEST_METHOD") != "GET"
            or environ.get("PATH_INFO") != PATH
            or environ.get("CONTENT_LENGTH", "0") not in ("", "0")
        ):
            return self.app(environ, start_response)
        key = tuple(environ.get(name) for name in KEY_FIELDS)
        kept = self.kept.get(key)
        if kept is not None and self._signed_in(environ) and self._holds(kept):
            start_response(kept.status, list(kept.headers))
            return [kept.body]
        return self._from_django(key, environ, start_response)

    def _signed_in(self, environ: dict) -> bool:
        cookie = parse_cookie(environ.get("HTTP_COOKIE", "")).get(settings.SESSION_COOKIE_NAME)
        caller = _Caller(environ, self.session_store(cookie))
        try:
            if tokens.presented_secret(caller) is not None:  # a token is checked first, and alone (settings)
                return tokens.authenticate(caller)[0] is not None
            if cookie is None or settings.SECRET_KEY_FALLBACKS:
                # No session; or one get_user may move to a new key, which only Django's answer can send back.
                return False
            user = auth.get_user(caller)
        except DatabaseError:
            return False  # Django's own handling of the request replaces a broken connection
        return user.is_authenticated and user.is_active

    @staticmethod
    def _holds(kept: Kept) -> bool:
        try:
            return service.recommend_as_dict(kept.request, kept.catalog) is kept.answer
        except (RecommendationError, DatabaseError):
            return False  # Django says why, or meets the broken connection with its own handling

    def _from_django(self, key: tuple, environ: dict, start_response: Callable) -> Iterable[bytes]:
        answered = []

        def keep_status(status: str, headers: list[tuple[str, str]], exc_info=None):
            answered.append((status, tuple(headers)))
            return start_response(status, headers, exc_info)

        response = self.app(environ, keep_status)
        rendered = environ.get(RENDERED)
        if rendered is None or len(repr(key)) > MAX_KEY_CHARS:
            return response
        status, headers = answered[-1]
        if not status.startswith("200 ") or any(name.lower() == "set-cookie" for name, _ in headers):
            return response
        try:
            body = b"".join(response)
        finally:
            response.close()  # Django's request_finished, as the server would have sent it
        if len(self.kept) >= MAX_KEPT:
            self.kept.pop(next(iter(self.kept)), None)
        self.kept[key] = Kept(*rendered, status=status, headers=headers, body=body)
        return [body]
