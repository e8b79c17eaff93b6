"""What every endpoint of the REST API shares (docs/API.md): refusals as `{"error": reason}` with the fields at fault,
their place in the OpenAPI schema, JSON bodies bounded in depth, the rate limit on job submissions per user and their
Idempotency-Key."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, serializers
from rest_framework.parsers import JSONParser
from rest_framework.throttling import BaseThrottle

from fc2.jsonbounds import MAX_JSON_DEPTH, check_json_depth
from fc2.services import submissions


def exception_handler(exc, context):
    """DRF's answer to an exception, in the API's shape: `{"error": reason}`, plus `"fields"` for invalid input."""
    # Not imported with the module: rest_framework.views loads the negotiation class the settings name, this module's.
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        data = response.data
        fields = data if isinstance(data, dict) else {"non_field_errors": data}
        response.data = {"error": "invalid request", "fields": fields}
    else:
        detail = response.data.get("detail") if isinstance(response.data, dict) else response.data
        response.data = {"error": str(detail)}
    return response


@csrf_exempt  # it changes nothing, whatever the method
def no_such_endpoint(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any other path under /api/ (e.g. an id that is not a number): a 404 in the API's shape, not a web page."""
    return JsonResponse({"error": f"no API endpoint {request.path}"}, status=404)


def invalid(field: str | None, reason: str) -> exceptions.ValidationError:
    """A service's refusal of one field (or of the request as a whole), as a 400 in the API's shape."""
    return exceptions.ValidationError({field or "non_field_errors": [reason]})


class Refused(exceptions.APIException):
    """A refusal with its own status (e.g. 409: the job has already ended) and the reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status_code = status


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser (settings.REST_FRAMEWORK's default), a body nested deeper than MAX_JSON_DEPTH a 400 too."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # the decoder's own recursion, well past the bound
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
        try:
            return check_json_depth(data)
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None


class ApiError(serializers.Serializer):
    error = serializers.CharField(help_text="Why the request was refused")
    fields = serializers.DictField(required=False, help_text="What is wrong with each field of an invalid request")


def refusals(*statuses: int, **described: str) -> dict[int, OpenApiResponse]:
    """The schema's responses for refusals: every authenticated endpoint may answer 401; `described` adds a status
    with its own description (`s409="…"`)."""
    words = {
        400: "Invalid input: the reason, and what is wrong with each field",
        401: "No API token or session, or the token is unknown, revoked or expired",
        403: "Not allowed, e.g. to delete what is someone else's",
        404: "No such object, or it is someone else's",
        409: "Conflicts with the object's state",
        413: "The upload is over its limit",
        415: "The body is not of a type the endpoint takes",
        422: "The Idempotency-Key was used for another request",
        429: "Too many job submissions by this user: see Retry-After",
    }
    return {
        status: OpenApiResponse(ApiError, description=described.get(f"s{status}", words[status]))
        for status in sorted({401, *statuses, *(int(name[1:]) for name in described)})
    }


def idempotency_key(request) -> str | None:
    """The request's `Idempotency-Key` (a Structured Field string, `"…"`, or the bare key), or None without one; a
    key that is none is a 400."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    key = key.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if refusal := submissions.key_refusal(key):
        raise Refused(400, refusal)
    return key


def too_many_submissions(limited: submissions.TooManySubmissions) -> exceptions.Throttled:
    """The 429, its Retry-After in whole seconds."""
    return exceptions.Throttled(limited.wait, detail=f"{limited}.")


class SubmitThrottle(BaseThrottle):
    """FC2_API_SUBMIT_RATE job submissions per user, whatever token or session they come with: refused here, before
    the body is read, when the user's period is full already; fc2.services.submissions judges it again as the job is
    made, under the user's lock, so that requests at once cannot pass it together. A request whose Idempotency-Key
    answers a job already made is let through: it makes nothing."""

    limited: submissions.TooManySubmissions | None = None

    def allow_request(self, request, view) -> bool:
        wait = submissions.wait_before_next(request.user)
        if wait is None:
            return True
        try:
            key = idempotency_key(request)
        except Refused:
            return True  # the view says why
        if key is not None and submissions.stored_job(request.user, key) is not None:
            return True
        self.limited = submissions.TooManySubmissions(*submissions.submission_rate(), wait)
        return False

    def wait(self) -> int | None:
        return self.limited.wait if self.limited else None


def v1_endpoints(endpoints, **kwargs):
    """The schema's endpoints (drf-spectacular's preprocessing hook): the API as /api/v1/ serves it, each route once;
    the same routes at the unversioned /api/ are v1's aliases (fc2/urls.py)."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith("/api/v1/")]
