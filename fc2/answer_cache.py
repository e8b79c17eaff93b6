"""The recommender's answers to repeated `GET /api/recommend`, given again ahead of Django's request handling.

A recommendation is a pure function of its input, the catalogue and the workload's records, and recommender.service
keeps each answer until either changes. What an answer cost was then mostly the way to it: the middleware, DRF's
dispatch and the input's validation, several times the answer itself. So this WSGI middleware (fc2/wsgi.py) keeps the
status, headers and body of a JSON answer Django gave to a GET with 200 and no cookie set, and gives them again to a
later GET only when

- the request is the same in everything that answer depends on but who sent it (`key`): the path, query string,
  Accept, host and scheme, the kind of credentials (a token, or a session cookie, well-formed or not), every other
  cookie (the CSRF middleware answers a malformed one with a new one), and no body;
- its caller is signed in, as DRF's authentication classes for the API find it (settings.REST_FRAMEWORK): an API
  token checked by fc2.tokens, or else the session through django.contrib.auth.get_user — a token revoked or expired,
  a session signed out or expired, or a user deactivated, or whose password changed, is nobody;
- and the answer still holds: recommender.service, asked the same request again, gives the very answer that was
  rendered (its one stamps query finds the catalogue and the records unchanged).

Anything else goes to Django as before: a first request, another method or path, a caller not signed in (Django says
why, 401, after this has looked too), an answer changed or refused, any error here (logged). The answers kept are
those whose view said which recommendation it rendered (`RENDERED`, set by recommender.api's view for an input with
no field it ignores). An answer names no user, so one kept for one caller may be given to another. The database
connections are looked after as Django's request signals have them looked after (`close_old_connections`, after each
answer: one past settings.DATABASES' CONN_MAX_AGE closed, and the next request's first query checks the connection
first where CONN_HEALTH_CHECKS asks it, replacing one that broke meanwhile); the signals themselves, whose other
receivers (the debug query log, the caches' and URLconf's resets) have nothing to do here, cost a fifth of the
answer, and are not sent. Each process keeps its own answers, at most `MAX_KEPT`, the oldest
first out.

What Django would do differently with other settings is checked once, when the application is made
(`settings_it_answers_for`): another middleware, throttle, permission or authentication class, blocked user agents,
sessions saved on every request or signing keys being rotated each turn this off, and every request goes to Django.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module

from django.conf import settings
from django.contrib import auth
from django.db import Error as DatabaseError
from django.db import close_old_connections
from django.http.cookie import parse_cookie
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated

from fc2 import tokens
from recommender import service
from recommender.api import RENDERED, RecommendView
from recommender.types import RecommendationError, RecommendRequest

logger = logging.getLogger(__name__)

PATH = "/api/recommend"
# What in a GET's environ Django's answer depends on, besides the caller and the cookies: which view and input (path,
# query string), which renderer (Accept), whether the host is allowed, and what a secure request gets (a redirect,
# HSTS).
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
MAX_KEY_CHARS = 2000  # a request with a longer key is answered by Django every time
MAX_KEPT = 1024

# The request handling this was checked against (settings.MIDDLEWARE, and the view's DRF classes): what each does to a
# signed-in GET of the API is either in the key or the same for every such request.
MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "fc2.uploads.UploadLimitMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)
AUTHENTICATION = (tokens.ApiTokenAuthentication, SessionAuthentication)


def settings_it_answers_for() -> str | None:
    """None when this process's settings are the ones this was checked against; else which is not."""
    view = RecommendView()
    differences = {
        "settings.MIDDLEWARE": tuple(settings.MIDDLEWARE) != MIDDLEWARE,
        "the view's authentication classes": tuple(type(a) for a in view.get_authenticators()) != AUTHENTICATION,
        "the view's permission classes": [type(p) for p in view.get_permissions()] != [IsAuthenticated],
        "the view's throttles": bool(view.get_throttles()),
        "settings.DISALLOWED_USER_AGENTS": bool(settings.DISALLOWED_USER_AGENTS),
        "settings.SESSION_SAVE_EVERY_REQUEST": settings.SESSION_SAVE_EVERY_REQUEST,
        # get_user may move a session signed with an old key to a new one, which only Django's answer sends back.
        "settings.SECRET_KEY_FALLBACKS": bool(settings.SECRET_KEY_FALLBACKS),
    }
    return next((name for name, differs in differences.items() if differs), None)


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
        self.session_cookie_name = settings.SESSION_COOKIE_NAME
        self.off_because = settings_it_answers_for()
        if self.off_because:
            logger.warning("recommendations are not given again ahead of Django: %s differs", self.off_because)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if (
            self.off_because
            or environ.get("REQUEST_METHOD") != "GET"
            or environ.get("PATH_INFO") != PATH
            or environ.get("CONTENT_LENGTH", "0") not in ("", "0")
        ):
            return self.app(environ, start_response)
        cookies = parse_cookie(environ.get("HTTP_COOKIE", ""))
        session_cookie = cookies.pop(self.session_cookie_name, None)
        caller = _Caller(environ, self.session_store(session_cookie))
        by_token = tokens.presented_secret(caller) is not None
        if session_cookie is None:
            cookie = "absent"
        else:  # (Django's answer deletes a malformed one)
            cookie = "malformed" if caller.session.session_key is None else "well-formed"
        key = (*(environ.get(name) for name in KEY_FIELDS), by_token, cookie, tuple(sorted(cookies.items())))
        kept = self.kept.get(key)
        if kept is not None and self._still_answers(kept, environ, caller, by_token):
            start_response(kept.status, list(kept.headers))
            return [kept.body]
        return self._from_django(key, environ, start_response)

    def _still_answers(self, kept: Kept, environ: dict, caller: _Caller, by_token: bool) -> bool:
        try:
            if by_token:  # checked first, and alone, as DRF does
                signed_in = tokens.authenticate(caller)[0] is not None
            else:
                user = auth.get_user(caller)
                signed_in = user.is_authenticated and user.is_active
            return signed_in and service.recommend_as_dict(kept.request, kept.catalog) is kept.answer
        except (RecommendationError, DatabaseError):
            return False  # Django says why, or meets the broken connection with its own handling
        except Exception:
            logger.exception("a kept recommendation could not be checked; Django answers %s", environ.get("PATH_INFO"))
            return False
        finally:
            close_old_connections()

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
        names = {name.lower(): value for name, value in headers}
        if not status.startswith("200 ") or "set-cookie" in names or names.get("content-type") != "application/json":
            return response
        try:
            body = b"".join(response)
        finally:
            response.close()  # Django's request_finished, as the server would have sent it
        if len(self.kept) >= MAX_KEPT:
            self.kept.pop(next(iter(self.kept), None), None)
        self.kept[key] = Kept(*rendered, status=status, headers=headers, body=body)
        return [body]
