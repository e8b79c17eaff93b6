"""The recommender's answers to repeated `GET /api/recommend`, given again ahead of Django's request handling.

A recommendation is a pure function of its input, the catalogue and the workload's records, and recommender.service
keeps each answer until either changes. What an answer cost was then mostly the way to it: the middleware, DRF's
dispatch and the input's validation, several times the answer itself. So this WSGI middleware (fc2/wsgi.py) keeps the
status, headers and body of a JSON answer Django gave to a GET with 200 and no cookie set, and gives them again to a
later GET only when

- the request is the same in everything that answer depends on but who sent it (the key `AnswerCache.__call__`
  builds): the path, the query string as sent, Accept, host, scheme and the proxy headers Django reads for them, the
  kind of credentials (a token, or a session cookie, well-formed or not), every other cookie as sent (the CSRF
  middleware answers a malformed one with a new one), and no Content-Length;
- its caller is signed in, as DRF's authentication classes for the API find it (settings.REST_FRAMEWORK): an API
  token checked by fc2.tokens, or else the session through django.contrib.auth.get_user — a token revoked or expired,
  a session signed out or expired, or a user deactivated, or whose password changed, is nobody;
- and the answer still holds: recommender.service, asked the same request again, gives the very answer that was
  rendered (its one stamps query finds the catalogue and the records unchanged); a signed-in caller's request whose
  answer changed drops what was kept for it.

Anything else goes to Django as before: a first request, another method or path, a caller not signed in (Django says
why, 401, after this has looked too: a made-up cookie or token costs its lookup twice), an answer changed or refused,
any error here (logged, but for the database's, which Django meets too). The answers kept are those whose view said
which recommendation it rendered (`RENDERED`, set by recommender.api's view for an input with no field it ignores:
`?format=json` included). An answer names no user, so one kept for one caller may be given to another. The database
connections are looked after before and after each answer given again, as Django's request signals have them looked
after (`close_old_connections`: one past settings.DATABASES' CONN_MAX_AGE closed, and where CONN_HEALTH_CHECKS asks,
the next query checks the connection first and replaces one the database dropped); the signals themselves are not
sent, and none of their other receivers (the debug query log, the caches' and URLconf's resets) is called. Each
process keeps its own answers, at most `MAX_KEPT`, the one used longest ago first out; the same input written another
way (its fields in another order, say) is another key.

What Django would do differently with other settings is checked once, when the application is made
(`settings_it_answers_for`): another middleware, throttle, permission or authentication class, blocked user agents,
sessions saved on every request, the CSRF secret kept in the session, or signing keys being rotated each turn this
off, and every request goes to Django.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module

from django import db
from django.conf import settings
from django.contrib import auth
from django.core.handlers.wsgi import get_str_from_wsgi
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
    "HTTP_X_FORWARDED_PORT",
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
        # A token with a session cookie that names no session: Django's answer deletes the cookie.
        "settings.CSRF_USE_SESSIONS": settings.CSRF_USE_SESSIONS,
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
        self.kept: OrderedDict[tuple, Kept] = OrderedDict()  # the one used longest ago first
        proxy = settings.SECURE_PROXY_SSL_HEADER
        self.key_fields = (*KEY_FIELDS, *((proxy[0],) if proxy and proxy[0] not in KEY_FIELDS else ()))
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
        cookies = parse_cookie(get_str_from_wsgi(environ, "HTTP_COOKIE", ""))  # decoded as Django decodes it
        session_cookie = cookies.pop(self.session_cookie_name, None)
        caller = _Caller(environ, self.session_store(session_cookie))
        by_token = tokens.presented_secret(caller) is not None
        if session_cookie is None:
            cookie = "absent"
        else:  # (Django's answer deletes a malformed one)
            cookie = "malformed" if caller.session.session_key is None else "well-formed"
        key = (*(environ.get(name) for name in self.key_fields), by_token, cookie, tuple(sorted(cookies.items())))
        kept = self.kept.get(key)
        if kept is not None:
            close_old_connections()
            try:
                if self._still_answers(key, kept, environ, caller, by_token):
                    with contextlib.suppress(KeyError):  # (another thread may have let it go meanwhile)
                        self.kept.move_to_end(key)
                    start_response(kept.status, list(kept.headers))
                    return [kept.body]
            finally:
                close_old_connections()
        return self._from_django(key, environ, start_response)

    def _still_answers(self, key: tuple, kept: Kept, environ: dict, caller: _Caller, by_token: bool) -> bool:
        """Whether the caller is signed in and the kept answer still the answer; what was kept for a signed-in
        caller's request whose answer changed is let go."""
        try:
            if by_token:  # checked first, and alone, as DRF does
                signed_in = tokens.authenticate(caller)[0] is not None
            else:
                user = auth.get_user(caller)
                signed_in = user.is_authenticated and user.is_active
            if not signed_in:
                return False
            holds = service.recommend_as_dict(kept.request, kept.catalog) is kept.answer
        except (RecommendationError, db.Error):
            holds = False  # Django says why, or meets the broken connection with its own handling
        except Exception:
            query = environ.get("QUERY_STRING", "")
            logger.exception("a kept recommendation could not be checked; Django answers %s?%s", PATH, query)
            holds = False
        if not holds:
            self.kept.pop(key, None)
        return holds

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
        self.kept[key] = Kept(*rendered, status=status, headers=headers, body=body)
        while len(self.kept) > MAX_KEPT:
            with contextlib.suppress(KeyError):  # (another thread may have emptied it meanwhile)
                self.kept.popitem(last=False)
        return [body]
