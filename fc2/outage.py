"""The platform's answer while a service it needs is down — its database (PostgreSQL), its broker (Redis): a 503 with
Retry-After, which browsers, API clients and the node agents (which retry any 5xx) understand as "come back shortly",
instead of a 500 and a traceback.

An error of that kind can come from anywhere in a request: the view (DRF re-raises what it does not handle), the
session or authentication middleware reading the database before the view, the session saved after it, a task sent
to the broker once the transaction commits. Django turns an exception into a 500 at the middleware layer it was
raised in (convert_exception_to_response), so an outer middleware never sees it; it does signal
got_request_exception first, with the exception being handled. So `OutageMiddleware`, placed first in MIDDLEWARE,
notes the outage on the request from that signal and turns the 500 that follows into the 503, wherever it came from.
Anything else stays the 500 it was.
"""

from __future__ import annotations

import logging
import sys

from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 10  # what the answer asks a client to wait: the time a database or broker restart takes


def _outage_errors() -> tuple[type[BaseException], ...]:
    """The errors of a service being unreachable: the database's, Redis's, and kombu's for the broker."""
    errors: list[type[BaseException]] = [OperationalError, InterfaceError]
    try:
        import kombu.exceptions
        import redis.exceptions
    except ImportError:  # an installation without Redis has no broker to lose
        return tuple(errors)
    return (*errors, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, kombu.exceptions.OperationalError)


OUTAGE_ERRORS = _outage_errors()
_NOTED = "_fc2_outage"


def service(error: BaseException) -> str:
    """Which service an outage error is of, in the words of the answer."""
    return "database" if isinstance(error, (OperationalError, InterfaceError)) else "broker"


def outage_of(error: BaseException | None) -> BaseException | None:
    """The outage error `error` is, or was raised from (kombu wraps redis's), or None."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, OUTAGE_ERRORS):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def outage_response(request: HttpRequest, error: BaseException) -> HttpResponse:
    what = service(error)
    logger.warning("%s %s: the %s cannot be reached: answered 503 (%s)", request.method, request.path, what, error)
    message = f"the platform's {what} cannot be reached just now: try again in {RETRY_AFTER_S} s"
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"error": message, "retry_after_s": RETRY_AFTER_S}, status=503)
    else:
        page = (
            "<!doctype html><html lang=en><head><meta charset=utf-8><title>FC² — temporarily unavailable</title>"
            f'<meta http-equiv="refresh" content="{RETRY_AFTER_S}"></head><body><h1>Temporarily unavailable</h1>'
            f"<p>{message.capitalize()}. This page reloads itself.</p></body></html>"
        )
        response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    return response


def _note(sender, request: HttpRequest | None = None, **kwargs) -> None:
    """got_request_exception's receiver: the exception being handled, kept on the request if it is an outage."""
    if request is not None and (error := outage_of(sys.exc_info()[1])) is not None:
        setattr(request, _NOTED, error)


got_request_exception.connect(_note, dispatch_uid="fc2.outage")


class OutageMiddleware:
    """First in MIDDLEWARE: a request that failed because the database or the broker is down answers 503."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            response = self.get_response(request)
        except OUTAGE_ERRORS as error:  # raised past Django's own handling (DEBUG_PROPAGATE_EXCEPTIONS)
            return outage_response(request, error)
        if response.status_code >= 500 and (error := getattr(request, _NOTED, None)) is not None:
            return outage_response(request, error)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A view's outage error, answered before Django renders its 500 (and its technical page under DEBUG)."""
        if (error := outage_of(exception)) is not None:
            return outage_response(request, error)
        return None
