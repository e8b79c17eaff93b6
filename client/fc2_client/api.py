"""The platform's HTTP API as the client calls it (docs/API.md): the token on every request, JSON in and out, uploads
streamed as multipart/form-data with their progress, downloads streamed to disk, and every failure turned into one
ApiError whose message a researcher can act on."""

from __future__ import annotations

import json
import mimetypes
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import HTTPRedirectHandler, Request, build_opener

from fc2_client import __version__

# The version of the API this client speaks: its paths' prefix (docs/API.md). A platform keeps serving v1 when a v2
# comes, so this client keeps working against a newer platform.
API = "/api/v1"
CHUNK = 64 * 1024  # bytes read, sent and written at a time
Progress = Callable[[int, int], None]  # called with (bytes done, bytes in all) after each chunk


class ApiError(Exception):
    """A request that did not succeed: refused by the platform (`status` is its HTTP status, `body` its JSON answer)
    or never answered (`status` None)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        body: dict | None = None,
        *,
        retry_after: float | None = None,
        unanswered: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.body = body or {}
        self.retry_after = retry_after  # seconds, as the answer's Retry-After said
        self.unanswered = unanswered  # the connection failed or timed out: the request may or may not have been done

    @property
    def reason(self) -> str:
        """The platform's own words, where it gave some."""
        return str(self.body.get("error") or self.body.get("detail") or self)

    def as_dict(self) -> dict:
        """The error as `--json` prints it: the platform's answer (its `fields` …) with our message and the status."""
        return {**self.body, "ok": False, "error": str(self), "status": self.status}


class _NoRedirects(HTTPRedirectHandler):
    """A redirect is an answer, not followed: urllib would resend a POST as a GET (a submission read back as the job
    list) and carry the token to wherever the redirect points."""

    def redirect_request(self, *args, **kwargs):
        return None


_opener = build_opener(_NoRedirects)


def _quote(value: str) -> str:
    """A name or file name inside a quoted multipart header, with what would end it early percent-encoded, as
    browsers do (WHATWG's multipart/form-data encoding)."""
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


class Multipart:
    """A multipart/form-data body of text fields and one file, produced chunk by chunk: the file is never read into
    memory whole, and its length is known before the first byte is sent (Content-Length, no chunked encoding)."""

    def __init__(self, fields: Mapping[str, str], file_field: str, path: Path, boundary: str | None = None):
        self.path = path
        self.boundary = boundary or uuid.uuid4().hex
        head = b"".join(
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{_quote(name)}"\r\n\r\n{value}\r\n'.encode()
            for name, value in fields.items()
        )
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        head += (
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{_quote(file_field)}"; '
            f'filename="{_quote(path.name)}"\r\nContent-Type: {kind}\r\n\r\n'
        ).encode()
        self._head = head
        self._tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.file_size = path.stat().st_size
        self.length = len(head) + self.file_size + len(self._tail)
        self.content_type = f"multipart/form-data; boundary={self.boundary}"

    def chunks(self) -> Iterator[bytes]:
        yield self._head
        sent = 0
        with self.path.open("rb") as file:
            while block := file.read(CHUNK):
                sent += len(block)
                if sent > self.file_size:
                    break
                yield block
        if sent != self.file_size:  # the Content-Length already sent would be a lie
            raise ApiError(f"{self.path} changed while it was being sent")
        yield self._tail


def _counted(chunks: Iterable[bytes], total: int, progress: Progress) -> Iterator[bytes]:
    done = 0
    for chunk in chunks:
        yield chunk  # resumed once the chunk is sent
        done += len(chunk)
        progress(done, total)


def _field_reasons(fields) -> str:
    """What is wrong with each field, as the platform's `fields` says, in one line.

    >>> _field_reasons({"file": ["not a wheel"], "non_field_errors": ["give a or b", "c"]})
    'file: not a wheel; give a or b; c'
    """
    if not isinstance(fields, dict):
        return str(fields)
    said = []
    for name, reasons in fields.items():
        text = "; ".join(map(str, reasons)) if isinstance(reasons, list) else str(reasons)
        said.append(text if name == "non_field_errors" else f"{name}: {text}")
    return "; ".join(said)


class Client:
    """The jobs API of one platform, as one user (their token)."""

    def __init__(self, url: str, token: str, timeout: float = 60.0):
        self.url = url  # without a trailing slash
        self.token = token
        self.timeout = timeout  # seconds without an answer (per read, not per request)

    def get(self, path: str, **query) -> dict:
        params = {name: value for name, value in query.items() if value is not None}
        return self._json("GET", f"{path}?{urlencode(params)}" if params else path)

    def post(
        self,
        path: str,
        payload: dict | None = None,
        *,
        idempotency_key: str | None = None,
        retries: int = 0,
        waiting: Callable[[ApiError, float], None] | None = None,
    ) -> dict:
        """POST `payload` as JSON; its JSON answer. With `retries`, a request that was not answered, or answered
        502, 503, 504 or 429 with a short Retry-After, is sent again up to that many times, after a growing pause
        (`waiting` is told of each) — with the same `idempotency_key`, so that the platform does it at most once."""
        body = json.dumps(payload or {}).encode()
        headers = {"Content-Type": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = f'"{idempotency_key}"'  # a Structured Field string, as the draft has it
        attempt = 0
        while True:
            try:
                return self._json("POST", path, body, headers)
            except ApiError as exc:
                pause = retry_pause(exc, attempt) if attempt < retries else None
                if pause is None:
                    raise
                if waiting:
                    waiting(exc, pause)
                time.sleep(pause)
                attempt += 1

    def upload(
        self, path: str, fields: Mapping[str, str], file_field: str, file: Path, progress: Progress | None = None
    ) -> dict:
        """POST `file` as a multipart field `file_field` beside text `fields`, streamed; its JSON answer."""
        body = Multipart(fields, file_field, file)
        chunks = body.chunks() if progress is None else _counted(body.chunks(), body.length, progress)
        headers = {"Content-Type": body.content_type, "Content-Length": str(body.length)}
        return self._json("POST", path, chunks, headers)

    def download(self, path: str, target: Path, progress: Progress | None = None) -> int:
        """GET a file into `target` (written beside it first, renamed when whole); the bytes written."""
        partial = target.with_name(f".{target.name}.part")
        done = 0
        with self._translated("GET", path):
            response = self._open("GET", path)
        # Never through a symlink someone left at the temporary name (nor at the target: os.replace replaces a link).
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        try:
            with response, os.fdopen(os.open(partial, flags, 0o644), "wb") as out:
                total = int(response.headers.get("Content-Length") or 0)
                while True:
                    with self._translated("GET", path):
                        block = response.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return done

    def _json(self, method: str, path: str, body=None, headers: dict | None = None) -> dict:
        with self._translated(method, path), self._open(method, path, body, headers) as response:
            data = response.read()
        if not data:
            return {}
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ApiError(f"{method} {self.url}{path} did not answer with a JSON object: is it an FC² platform?")
        return answer

    def _open(self, method: str, path: str, body=None, headers: dict | None = None):
        request = Request(self.url + path, data=body, method=method)
        for name, value in {
            "Authorization": f"Token {self.token}",
            "Accept": "application/json",
            "User-Agent": f"fc2-client/{__version__}",
            **(headers or {}),
        }.items():
            request.add_header(name, value)
        return _opener.open(request, timeout=self.timeout)

    @contextmanager
    def _translated(self, method: str, path: str):
        """Every way a request can fail, as an ApiError that says what happened and what to do."""
        url = self.url + path
        try:
            yield
        except HTTPError as exc:
            raise self._refusal(exc, method, url) from None
        except URLError as exc:
            raise ApiError(f"cannot reach {self.url}: {exc.reason}", unanswered=True) from None
        except socket.timeout:
            message = f"{self.url} did not answer within {self.timeout:g} s ({method} {path})"
            raise ApiError(message, unanswered=True) from None
        except OSError as exc:  # the connection lost while sending or reading
            message = f"lost the connection to {self.url} ({method} {path}): {exc}"
            raise ApiError(message, unanswered=True) from None

    def _refusal(self, exc: HTTPError, method: str, url: str) -> ApiError:
        status = exc.code
        try:
            body = json.loads(exc.read())
        except (ValueError, OSError):
            body = None
        body = body if isinstance(body, dict) else {}
        reason = body.get("error") or body.get("detail")
        if 300 <= status < 400:
            where = exc.headers.get("Location", "elsewhere")
            message = f"{url} redirects to {where}: log in with the platform's own address (`fc2 login URL`)"
        elif status == 401:
            message = f"{reason or 'not signed in'}: run `fc2 login {self.url}` with a valid token"
        elif status == 429 and (wait := exc.headers.get("Retry-After")):
            message = f"{reason or 'too many requests'} (try again in {wait} s)"
        elif reason:
            message = str(reason) + (f" — {_field_reasons(body['fields'])}" if body.get("fields") else "")
        elif status == 404:
            message = f"{method} {url}: not found (HTTP 404); is {self.url} an FC² platform with the jobs API?"
        else:
            message = f"{method} {url} failed: HTTP {status} {exc.reason}"
        return ApiError(message, status, body, retry_after=_seconds(exc.headers.get("Retry-After")))


# A request sent again (Client.post's `retries`): after BACKOFF_S, then twice as long each time, or after the answer's
# Retry-After if it says longer — but not one that asks for more than MAX_RETRY_AFTER_S (a rate limit's hour).
RETRY_STATUSES = (502, 503, 504)
BACKOFF_S = 1.0
MAX_RETRY_AFTER_S = 60.0


def retry_pause(error: ApiError, attempt: int) -> float | None:
    """Seconds to wait before sending a request again after `error` (its `attempt`-th, from 0), or None when
    sending it again would not help.

    >>> retry_pause(ApiError("lost", unanswered=True), 0), retry_pause(ApiError("busy", 503), 2)
    (1.0, 4.0)
    >>> retry_pause(ApiError("soon", 429, retry_after=7.0), 0), retry_pause(ApiError("later", 429, retry_after=3600), 0)
    (7.0, None)
    >>> retry_pause(ApiError("no", 400), 0), retry_pause(ApiError("limit", 429), 0)
    (None, None)
    """
    backoff = BACKOFF_S * 2**attempt
    if error.unanswered:
        return backoff
    if error.status in RETRY_STATUSES or error.status == 429:
        if error.retry_after is not None:
            return max(backoff, error.retry_after) if error.retry_after <= MAX_RETRY_AFTER_S else None
        return backoff if error.status != 429 else None
    return None


def _seconds(value: str | None) -> float | None:
    """A Retry-After in seconds (an HTTP date is taken as no advice)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
