"""Request body limits: a body over its endpoint's limit is refused before it costs the server disk or memory.

Each page that takes files names its file fields and the limit of each (the wizard's wheel: FC2_MAX_BUNDLE_MB, its
dataset: FC2_MAX_DATASET_MB, a node report's artifacts: FC2_MAX_ARTIFACT_MB; the jobs API's uploads of wheels and
datasets as the wizard's); its body may be that much plus DATA_UPLOAD_MAX_MEMORY_SIZE, Django's own limit for the
fields that are not files. Every other body, and any body from a client not signed in (on the jobs API: without a
valid personal token either; on the report API: without a bearer token), is held to DATA_UPLOAD_MAX_MEMORY_SIZE and
may hold no file.

`UploadLimitMiddleware` answers 413 with the reason from Content-Length alone, before a byte is read: Django never
reads past Content-Length (a chunked body without one reads as empty), so this bounds what any request can cost. Within
that bound it parses a multipart body itself, before the CSRF check and the view (either would parse it anyway),
with `LimitedUploadHandler` in front of Django's handlers: it stops reading the moment a file passes its field's limit
or turns up in a field the page does not take, so nothing more is spooled, the partial file is deleted, and the view
never runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest, HttpResponse, JsonResponse

from fc2 import tokens
from fc2.bundles import MB, format_bytes


@dataclass(frozen=True)
class FileLimit:
    """The most one file field of a page takes."""

    # Largest size of the field's files together, in bytes.
    max_bytes: int
    # The refusal, in the words the page's own check uses, e.g. "the wheel is larger than the 50 MB limit".
    refusal: str


@dataclass(frozen=True)
class UploadLimit:
    """What a request to one endpoint may send."""

    # Largest request body, judged from Content-Length.
    body_bytes: int
    # The file fields the endpoint takes; a file in any other field is refused.
    files: Mapping[str, FileLimit] = field(default_factory=dict)
    # What the endpoint is, for the refusal: "a wheel".
    what: str = "this page"


def upload_limit(request: HttpRequest) -> UploadLimit:
    """The limit for a request, from the URL it resolved to and who sends it."""
    match = request.resolver_match
    signed_in = request.user.is_authenticated
    if match and match.url_name == "api-job-report":
        # The token itself is the view's to check; a request without one cannot be a node's report. Only a multipart
        # report carries files: a JSON one is all report, which Django reads up to its own limit.
        if not request.headers.get("Authorization", "").lower().startswith("bearer "):
            return UploadLimit(settings.DATA_UPLOAD_MAX_MEMORY_SIZE, what="a report without a bearer token")
        if request.content_type != "multipart/form-data":
            return UploadLimit(settings.DATA_UPLOAD_MAX_MEMORY_SIZE, what="a node report without files")
        mb = settings.FC2_MAX_ARTIFACT_MB
        return _file_upload("artifact", mb * MB, f"artifacts exceed {mb} MB", "a node report")
    if match and match.url_name == "api-job-checkpoint" and request.headers.get("Authorization", ""):
        # A checkpoint is its whole body (the view bounds it again as it reads, and checks the token).
        return UploadLimit(settings.FC2_CHECKPOINT_MAX_MB * MB, what="a checkpoint")
    if not signed_in and request.path.startswith("/api/") and tokens.presented_secret(request) is not None:
        # A valid personal token is as good as a session (looked up once: the view reuses the answer).
        signed_in = tokens.authenticate(request)[0] is not None
    multipart = request.method == "POST" and request.content_type == "multipart/form-data"
    if match and match.url_name in API_UPLOADS and multipart and signed_in:
        return API_UPLOADS[match.url_name]()  # (a JSON body holds no file: Django's limit, below)
    step = match.kwargs.get("step") if match and match.url_name == "job-new-step" and signed_in else None
    if step == "code":
        return _wheel_upload("wheel")
    if step == "data":
        return _dataset_upload("file")
    what = "this page" if signed_in else "a request from someone not signed in"
    return UploadLimit(settings.DATA_UPLOAD_MAX_MEMORY_SIZE, what=what)


def _wheel_upload(field_name: str) -> UploadLimit:
    wheel = settings.FC2_MAX_BUNDLE_MB * MB
    return _file_upload(field_name, wheel, f"the wheel is larger than the {format_bytes(wheel)} limit", "a wheel")


def _dataset_upload(field_name: str) -> UploadLimit:
    mb = settings.FC2_MAX_DATASET_MB
    return _file_upload(field_name, mb * MB, f"the dataset file is larger than {mb} MB", "a dataset upload")


# The jobs API's endpoints that take a file (fc2/jobs_api.py), by URL name, and the field each takes it in.
API_UPLOADS: dict[str, Callable[[], UploadLimit]] = {
    "api-bundles": lambda: _wheel_upload("file"),
    "api-datasets": lambda: _dataset_upload("file"),
    "api-jobs": lambda: _wheel_upload("bundle_file"),
}


def _file_upload(field_name: str, max_bytes: int, refusal: str, what: str) -> UploadLimit:
    """An endpoint taking files in one field: its body holds them and Django's allowance for the other fields."""
    files = {field_name: FileLimit(max_bytes, refusal)}
    return UploadLimit(max_bytes + settings.DATA_UPLOAD_MAX_MEMORY_SIZE, files, what)


class LimitedUploadHandler(FileUploadHandler):
    """Counts each file field's bytes as they stream in and stops the upload as soon as one is over its limit."""

    def __init__(self, request: HttpRequest, limit: UploadLimit) -> None:
        super().__init__(request)
        self.limit = limit
        self.received: dict[str, int] = {}
        # Why the upload was stopped; the parser swallows StopUpload, so the middleware looks here.
        self.refusal: str | None = None

    def new_file(self, field_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, *args, **kwargs)
        if field_name not in self.limit.files:
            self._stop(f"{self.limit.what} takes no file in the field {field_name!r}")

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        file_limit = self.limit.files[self.field_name]
        received = self.received.get(self.field_name, 0) + len(raw_data)
        self.received[self.field_name] = received
        if received > file_limit.max_bytes:
            self._stop(file_limit.refusal)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the handlers after this one make the file

    def _stop(self, reason: str) -> None:
        self.refusal = reason
        # connection_reset: read no more of the body (without it Django reads the rest to throw it away).
        raise StopUpload(connection_reset=True)


class UploadLimitMiddleware:
    """Refuses a request body over its endpoint's limit with 413 and the reason; goes before CsrfViewMiddleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., HttpResponse], args: tuple, kwargs: dict
    ) -> HttpResponse | None:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # Django reads such a body as empty
        multipart = request.method == "POST" and request.content_type == "multipart/form-data"
        if declared <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE and not multipart:
            # Within every endpoint's limit (none is below Django's own), and no file to count: which limit applies
            # is not worth asking, as it costs loading the user, which a request such as /healthz has no use for.
            return None
        limit = upload_limit(request)
        if declared > limit.body_bytes:
            return refuse(
                request,
                f"the request is {format_bytes(declared)}, above the {format_bytes(limit.body_bytes)} limit "
                f"for {limit.what}",
            )
        if not multipart:
            return None
        handler = LimitedUploadHandler(request, limit)
        request.upload_handlers.insert(0, handler)
        try:
            request.POST  # noqa: B018 -- parse now, so that a refused upload never reaches the CSRF check or the view
        except RequestDataTooBig:  # its fields other than files, over Django's own limit
            size = format_bytes(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
            return refuse(request, f"its fields other than files are above the {size} limit for {limit.what}")
        except (TooManyFieldsSent, TooManyFilesSent) as exc:  # Django's own limits on a multipart body's parts
            return refuse(request, str(exc).rstrip("."))
        if handler.refusal:
            return refuse(request, handler.refusal)
        return None


def refuse(request: HttpRequest, reason: str) -> HttpResponse:
    """413 with the reason: JSON for the API, as its other errors are; text for a page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": reason}, status=413)
    return HttpResponse(f"Refused: {reason}.\n", status=413, content_type="text/plain; charset=utf-8")
