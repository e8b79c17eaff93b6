"""The recommender's answers to repeated `GET` and `POST /api/recommend`, given again ahead of Django's request
handling.

A recommendation is a pure function of its input, the catalogue and the workload's records, and recommender.service
keeps each answer until either changes. What an answer cost was then mostly the way to it: the middleware, DRF's
dispatch and the input's validation, several times the answer itself. So this WSGI middleware (fc2/wsgi.py) keeps the
status, headers and body of a JSON answer Django gave with 200 and no cookie set, and gives them again to a later
request only when

- the request is the same in everything that answer depends on but who sent it (the key `AnswerCache.__call__`
  builds): the method, the path, the query string as sent, Accept, host, scheme and the proxy headers Django reads
  for them, the kind of credentials (a token, or a session cookie, well-formed or not), every other cookie as sent
  (the CSRF middleware answers a malformed one with a new one), and the body: none for a GET; for a POST, a form or
  JSON of at most `MAX_BODY_BYTES`, its content type and bytes as sent (read here, and put back for Django);
- a POST signed in by its session passes the CSRF check DRF makes of one (`_csrf_passes`, for every request: the
  CSRF token it sends is in no key);
- its caller is signed in, as DRF's authentication classes for the API find it (settings.REST_FRAMEWORK): an API
  token checked by fc2.tokens, or else the session through django.contrib.auth.get_user — a token revoked or expired,
  a session signed out or expired, or a user deactivated, or whose password changed, is nobody;
- and the answer still holds: recommender.service, asked the same request again, gives the very answer that was
  rendered (its one stamps query finds the catalogue and the records unchanged); a signed-in caller's request whose
  answer changed drops what was kept for it.

These checks read the database (the session, the user, the token, the stamps) and cost more than the rest of an
answer given again. Triggers tell of every change to a table they read (fc2/answer_triggers.py; `_DatabaseVersion`: on
SQLite a version the triggers keep, read again only when the database's own change counter has moved; on PostgreSQL
the notifications the triggers send at each commit), so once the checks have passed for a request's key and
credentials on a connection, that connection trusts them for that very kept answer while none of those tables has
changed (a change committed by any connection, this one's included, or another connection, or anything that could have
let a change go untold, and they are made again; a commit to any other table — a node's samples, a job's events —
changes nothing) and until what they passed by runs out: the session's expiry as stored, the token's, and the minute
after which the token's use is written down again (fc2.models.ApiToken.touch). Unchanged rows would give the same
verdicts, so this is no grace period; what it takes on trust is the session engine's own promise that its cache and
its table are written together (cached_db: a cache write that fails is only logged, and the session read from the
table once that cache entry is gone), and on PostgreSQL that a notification reaches this process within a moment of
its commit (see `_DatabaseVersion` for what it proves, and how often). With more than one database configured, or the
triggers missing, the checks are made for every answer given again.

Anything else goes to Django as before: a first request, another method, path or body, a caller not signed in (Django
says why, 401, after this has looked too: a made-up cookie or token costs its lookup twice), an answer changed or
refused, any error here (logged, but for the database's, which Django meets too). The answers kept are those whose view
said which recommendation it rendered (`RENDERED`, set by recommender.api's view for an input with no field it ignores:
`?format=json` included). An answer names no user, so one kept for one caller may be given to another. The database
connections are looked after before and after each answer given again, as Django's request signals have them looked
after (`close_old_connections`: one past settings.DATABASES' CONN_MAX_AGE closed, and where CONN_HEALTH_CHECKS asks, the
next query checks the connection first and replaces one the database dropped); the signals themselves are not sent, and
none of their other receivers (the debug query log, the caches' and URLconf's resets) is called. Each process keeps its
own answers, at most `MAX_KEPT`, the one used longest ago first out; the same input written another way (its fields in
another order, say) is another key.

What Django would do differently with other settings is checked once, when the application is made
(`settings_it_answers_for`): another middleware, throttle, permission or authentication class, blocked user agents,
sessions saved on every request, the CSRF secret kept in the session, or signing keys being rotated each turn this
off, and every request goes to Django.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import logging
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module

from django import db
from django.conf import settings
from django.contrib import auth
from django.core.handlers.wsgi import WSGIRequest, get_str_from_wsgi
from django.db import close_old_connections, connection, connections
from django.http.cookie import parse_cookie
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request

from fc2 import answer_triggers, tokens
from fc2.models import API_TOKEN_TOUCH_S
from recommender import service
from recommender.api import RENDERED, RecommendView
from recommender.types import RecommendationError, RecommendRequest

logger = logging.getLogger(__name__)

PATH = "/api/recommend"
# What in a request's environ Django's answer depends on, besides the caller, the cookies and the body: which view and
# input (method, content type, path, query string), which renderer (Accept), whether the host is allowed, and what a
# secure request gets (a redirect, HSTS).
KEY_FIELDS = (
    "REQUEST_METHOD",
    "CONTENT_TYPE",
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
MAX_KEY_CHARS = 4000  # a request with a longer key is answered by Django every time
MAX_BODY_BYTES = 2000  # a POST's body (a recommendation's input is a few hundred bytes)
POST_TYPES = ("application/json", "application/x-www-form-urlencoded")  # what a POST's body may be, as DRF parses them
MAX_KEPT = 1024

# The request handling this was checked against (settings.MIDDLEWARE, and the view's DRF classes): what each does to a
# signed-in GET or POST of the API is either in the key or the same for every such request.
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


HEARTBEAT_S = 10.0  # PostgreSQL: how long a connection trusts its channel before it proves it again


class _DatabaseVersion:
    """Which version of what the checks read this thread's connection sees, where the database can say so without a
    round trip for each request; None (the checks made) elsewhere: another database, several configured, no connection
    yet, inside a transaction, any error, or fc2/answer_triggers.py's triggers not all found. Two equal versions mean
    nothing the checks read has changed in between: the triggers tell of every change to a table in
    `watched_tables()`, and a change to any other does not count. A version's first part is the connection's epoch, a
    number no other connection or earlier state of this one had: whatever may have let a change go untold begins a
    new one, and nothing trusted in an older one is trusted again.

    - SQLite: (epoch, the version the triggers keep in their table), read again only when `PRAGMA data_version` (moved
      by a commit of any other connection) or the connection's `total_changes` (by a write of its own) has moved since
      it was last read. Exact: the triggers write in the same transaction as the change. A change of schema
      (`PRAGMA schema_version`: a trigger dropped, a table rebuilt without its triggers, the table made anew) begins a
      new epoch, with the triggers looked for again.
    - PostgreSQL: (epoch, the notifications the triggers have sent it on their channel), each sent at the commit of a
      change, to every connection listening, this one included, and read from what the server has sent without
      waiting. Every HEARTBEAT_S a new epoch: the triggers looked for again, found firing, and a notification of its
      own sent and received back (so a listener a connection pooler or anything else cut off trusts for that long at
      most); the triggers dropped tell every listener at once (answer_triggers.OFF). Not exact to the microsecond: a
      notification reaches a listener a moment after the writer's commit returns (on this machine, most often before
      it returns, within a few ms under load), so a request that arrives within that moment is answered as one that
      arrived just before the commit. A writer whose triggers do not fire (PostgreSQL's session_replication_role =
      replica: a restore, a logical replica) is not told of.

    Read on the DB-API connection itself, outside Django's cursor (no query of a request's)."""

    def __init__(self) -> None:
        self.applies = len(connections.settings) == 1
        self.epochs = itertools.count()
        self.local = threading.local()

    def now(self) -> tuple[int, int] | None:
        raw = connection.connection
        if not self.applies or raw is None or connection.in_atomic_block or connection.vendor not in _VERSIONS:
            return None
        try:
            return _VERSIONS[connection.vendor](raw, self._state(raw))
        except Exception as error:  # (the driver's own, which Django has not wrapped here, or anything else)
            self.local.state = None
            logger.debug("the database's version could not be read (%r): the checks are made", error)
            return None

    def _state(self, raw) -> _Connection:
        """This thread's connection's state, new for a new connection (told from the one before by identity, held)."""
        state = getattr(self.local, "state", None)
        if state is None or state.raw is not raw:
            state = self.local.state = _Connection(raw, self.epochs)
        return state


class _Connection:
    def __init__(self, raw, epochs: itertools.count) -> None:
        self.raw, self.epochs = raw, epochs
        self.epoch: int | None = None  # None: nothing trusted (the triggers not looked for yet, or not all found)
        self.warned = False
        self.seen: tuple | None = None  # SQLite: (data_version, total_changes, schema_version) last read
        self.version = 0  # SQLite: the triggers' version; PostgreSQL: the notifications of changes counted
        self.ping = ""  # PostgreSQL: the payload of the last notification this connection sent itself
        self.pinged = self.proven = -math.inf  # PostgreSQL: when it was sent; when the last one came back

    def begin(self, cursor, vendor: str) -> bool:
        """A new epoch, when every trigger is found (else none, and a warning once)."""
        all_there = answer_triggers.found(cursor, vendor) == answer_triggers.expected(vendor)
        if not all_there and not self.warned:
            self.warned = True
            logger.warning("the answer cache's triggers are missing (migrate): the checks are made")
        self.epoch = next(self.epochs) if all_there else None
        return all_there


def _sqlite_version(raw, state: _Connection) -> tuple[int, int] | None:
    if raw.in_transaction:  # (one Django does not know of: what it reads may yet be rolled back)
        return None
    seen = (raw.execute("PRAGMA data_version").fetchone()[0], raw.total_changes)
    if state.seen is None or seen != state.seen[:2]:
        (schema,) = raw.execute("PRAGMA schema_version").fetchone()
        if state.seen is None or schema != state.seen[2]:
            state.begin(raw.cursor(), "sqlite")
        if state.epoch is not None:
            (state.version,) = raw.execute(f"SELECT version FROM {answer_triggers.NAME}").fetchone()
        state.seen = (*seen, schema)
    return None if state.epoch is None else (state.epoch, state.version)


def _postgresql_version(raw, state: _Connection) -> tuple[int, int] | None:
    if not raw.autocommit:
        return None
    raw.poll()  # (reads what the server has sent, without waiting)
    _told(raw, state)
    now = time.monotonic()
    if (state.epoch is None or now - state.proven >= HEARTBEAT_S) and now - state.pinged >= 1.0:
        # A new epoch, proven by a notification of its own come back: on a connection of its own to the server, it
        # comes back at once, with the answer to the query that sent it.
        state.proven, state.pinged = -math.inf, now
        with raw.cursor() as cursor:
            # Listening before the triggers are looked for: should they be dropped meanwhile, this one is told too.
            cursor.execute(f"LISTEN {answer_triggers.NAME}")
            if state.begin(cursor, "postgresql"):
                state.ping = f"ping:{secrets.token_hex(8)}"
                cursor.execute("SELECT pg_notify(%s, %s)", [answer_triggers.NAME, state.ping])
        _told(raw, state)
    if state.epoch is not None and now - state.proven < HEARTBEAT_S:
        return state.epoch, state.version
    return None  # (the triggers missing, or this epoch's own notification not back yet: looked at again in a second)


def _told(raw, state: _Connection) -> None:
    """What the notifications received on the triggers' channel tell this connection."""
    for notification in raw.notifies:
        if notification.channel != answer_triggers.NAME:
            continue
        if notification.payload == state.ping:
            state.proven = state.pinged
        elif notification.payload == answer_triggers.OFF:
            state.epoch, state.proven, state.pinged = None, -math.inf, -math.inf
        elif not notification.payload.startswith("ping:"):  # (not another connection's own)
            state.version += 1
    raw.notifies.clear()


_VERSIONS = {"sqlite": _sqlite_version, "postgresql": _postgresql_version}


@dataclass(frozen=True)
class _Passed:
    """Checks that passed: at which version of the database, for which kept answer, and until when they hold (a POSIX
    time; None: not read yet)."""

    version: tuple
    kept: Kept
    until: float | None


def _token_holds_until(token) -> float:
    """Until when a token that passed holds without being looked at again (a POSIX time): its expiry, and the end of
    the minute in which its last use is written down (fc2.models.ApiToken.touch: the check after it writes it)."""
    if token.last_used_at is None:
        return 0.0
    until = token.last_used_at.timestamp() + API_TOKEN_TOUCH_S
    return min(until, token.expires_at.timestamp()) if token.expires_at else until


def _session_holds_until(session) -> float:
    """When the session stored in the database expires (a POSIX time; 0 for a session engine without one)."""
    if not hasattr(session, "get_model_class"):
        return 0.0
    expires = (
        session.get_model_class()
        .objects.filter(session_key=session.session_key)
        .values_list("expire_date", flat=True)
        .first()
    )
    return expires.timestamp() if expires else 0.0


def _put_last(kept: OrderedDict, key, value) -> None:
    """`kept[key] = value`, as the one used last, and the ones used longest ago let go past MAX_KEPT."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > MAX_KEPT:
        with contextlib.suppress(KeyError):  # (another thread may have emptied it meanwhile)
            kept.popitem(last=False)


def _body(environ: dict) -> bytes | None:
    """A GET's body (none), or a small POST's of a form or JSON, read here and put back for Django to read as sent;
    None for any other request, which goes to Django unread (or, when reading it failed, with a body whose reading
    fails as it did)."""
    length = environ.get("CONTENT_LENGTH", "")
    if environ.get("REQUEST_METHOD") == "GET":
        return b"" if length in ("", "0") else None
    if _media_type(environ) not in POST_TYPES:
        return None
    if not (length.isascii() and length.isdigit()) or "HTTP_TRANSFER_ENCODING" in environ:
        return None
    size = int(length)
    if not 0 < size <= MAX_BODY_BYTES:
        return None
    try:
        body = environ["wsgi.input"].read(size)
    except Exception as error:  # (a client gone, a timeout: Django meets it where it reads, or answers unread)
        environ["wsgi.input"] = _Unreadable(error)
        return None
    environ["wsgi.input"] = io.BytesIO(body)
    return body if len(body) == size else None


class _Unreadable(io.RawIOBase):
    """A request body whose reading fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise self.error


def _csrf_passes(environ: dict, body: bytes) -> bool:
    """Whether the request passes the CSRF check DRF makes of a request signed in by its session: on a copy of it (the
    check may read the body, and marks what it reads); a form's fields as DRF's parsers read them (JSON has none, for
    DRF as for Django's request, which then reads nothing)."""
    try:
        request = WSGIRequest({**environ, "wsgi.input": io.BytesIO(body)})
        if _media_type(environ) == "application/x-www-form-urlencoded":
            request = Request(request, parsers=RecommendView().get_parsers())
        SessionAuthentication().enforce_csrf(request)
    except PermissionDenied:
        return False
    except Exception:
        logger.exception("a kept recommendation's CSRF check failed; Django answers %s", PATH)
        return False
    return True


def _media_type(environ: dict) -> str:
    return environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower()


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
        # (key, the credentials' digest, the connection's serial) -> the checks passed there
        self.checked: OrderedDict[tuple, _Passed] = OrderedDict()
        self.database = _DatabaseVersion()
        proxy = settings.SECURE_PROXY_SSL_HEADER
        self.key_fields = (*KEY_FIELDS, *((proxy[0],) if proxy and proxy[0] not in KEY_FIELDS else ()))
        self.session_store = import_module(settings.SESSION_ENGINE).SessionStore
        self.session_cookie_name = settings.SESSION_COOKIE_NAME
        self.off_because = settings_it_answers_for()
        if self.off_because:
            logger.warning("recommendations are not given again ahead of Django: %s differs", self.off_because)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD")
        if self.off_because or environ.get("PATH_INFO") != PATH or method not in ("GET", "POST"):
            return self.app(environ, start_response)
        cookies = parse_cookie(get_str_from_wsgi(environ, "HTTP_COOKIE", ""))  # decoded as Django decodes it
        session_cookie = cookies.pop(self.session_cookie_name, None)
        caller = _Caller(environ, self.session_store(session_cookie))
        secret = tokens.presented_secret(caller)
        by_token = secret is not None
        if session_cookie is None:
            cookie = "absent"
        else:  # (Django's answer deletes a malformed one)
            cookie = "malformed" if caller.session.session_key is None else "well-formed"
        if method == "POST" and not by_token and cookie != "well-formed":
            return self.app(environ, start_response)  # (nobody: Django refuses it without reading its body)
        body = _body(environ)
        if body is None:
            return self.app(environ, start_response)
        key = (
            *(environ.get(name) for name in self.key_fields),
            body,
            by_token,
            cookie,
            tuple(sorted(cookies.items())),
        )
        kept = self.kept.get(key)
        # A POST signed in by its session passes DRF's CSRF check, every time (its token is in no key).
        if kept is not None and (method == "GET" or by_token or _csrf_passes(environ, body)):
            close_old_connections()
            try:
                credentials = hashlib.sha256(
                    f"{by_token}:{secret if by_token else session_cookie}".encode("utf-8", "surrogatepass")
                ).digest()
                if self._still_answers(key, kept, environ, caller, by_token, credentials):
                    with contextlib.suppress(KeyError):  # (another thread may have let it go meanwhile)
                        self.kept.move_to_end(key)
                    start_response(kept.status, list(kept.headers))
                    return [kept.body]
            finally:
                close_old_connections()
        return self._from_django(key, environ, start_response)

    def _still_answers(
        self, key: tuple, kept: Kept, environ: dict, caller: _Caller, by_token: bool, credentials: bytes
    ) -> bool:
        """Whether the caller is signed in and the kept answer still the answer; what was kept for a signed-in
        caller's request whose answer changed is let go.

        Where the database can say it has not changed since these credentials passed these checks for this very
        answer on this connection, and nothing they passed by has run out since, they pass again without being made
        (`_trusted`). The version is read before the checks: a write while they are made, theirs (a token's use) or
        anyone's, moves it, and the next request makes them again."""
        version = self.database.now()
        trust = None if version is None else (key, credentials, version[0])  # (each epoch's its own)
        if trust is not None and self._trusted(trust, version, kept, caller):
            return True
        try:
            if by_token:  # checked first, and alone, as DRF does
                token = tokens.authenticate(caller)[0]
                signed_in = token is not None
            else:
                user = auth.get_user(caller)
                signed_in = user.is_authenticated and user.is_active
            if not signed_in:
                return False
            holds = service.recommend_as_dict(kept.request, kept.catalog) is kept.answer
            if holds and trust is not None:
                # A token's limits are on the row just read; a session's expiry takes a query, made only once the
                # checks are about to be trusted.
                _put_last(self.checked, trust, _Passed(version, kept, _token_holds_until(token) if by_token else None))
        except (RecommendationError, db.Error):
            holds = False  # Django says why, or meets the broken connection with its own handling
        except Exception:
            query = environ.get("QUERY_STRING", "")
            logger.exception("a kept recommendation could not be checked; Django answers %s?%s", PATH, query)
            holds = False
        if not holds:
            self.kept.pop(key, None)
        return holds

    def _trusted(self, trust: tuple, version: tuple, kept: Kept, caller: _Caller) -> bool:
        """Whether the checks passed on this connection at this version of the database for this very kept answer
        (one stored meanwhile by a slower request, from older rows, is checked anew), and what they passed by has
        not run out."""
        passed = self.checked.get(trust)
        if passed is None or passed.version != version or passed.kept is not kept:
            return False
        if passed.until is None:
            try:
                passed = self.checked[trust] = _Passed(version, kept, _session_holds_until(caller.session))
            except db.Error:
                return False  # the checks are made, as without this
        if time.time() >= passed.until:
            return False
        with contextlib.suppress(KeyError):
            self.checked.move_to_end(trust)
        return True

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
        _put_last(self.kept, key, Kept(*rendered, status=status, headers=headers, body=body))
        return [body]
