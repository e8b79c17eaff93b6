"""The platform's own API: the node agents' reports (POST /api/jobs/<id>/report, job-scoped bearer token), the chief's
checkpoints (POST /api/jobs/<id>/checkpoint, the same token) and GET /api/me for signed-in users, all in the OpenAPI
schema."""

from __future__ import annotations

import tempfile

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.fields import BooleanField, CharField
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fc2 import jsonbounds
from fc2.models import Job, is_platform_admin
from fc2.services import checkpoints
from fc2.services.noderecords import Report
from fc2.services.reports import ReportRejected, receive


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _job_of_token(request: HttpRequest, job_id: int) -> Job | JsonResponse:
    """The job whose token the request bears, or the refusal in the agents' form: 401 no token, 403 another's."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _error(401, "missing bearer token")
    job = Job.objects.filter(pk=job_id).first()
    if job is None or not job.token_matches(token.strip()):
        return _error(403, "this token does not belong to this job")
    return job


class JobTokenAuthentication(BaseAuthentication):
    """The report endpoint's job-scoped bearer token, as the schema shows it.

    It authenticates no user: the token names a job, and ReportView checks it itself so that a refusal answers in the
    agents' `{"error": ...}` form with the status the agent acts on (401 no token, 403 wrong token).
    """

    def authenticate(self, request):
        return None


class JobTokenScheme(OpenApiAuthenticationExtension):
    target_class = JobTokenAuthentication
    name = "jobToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The job-scoped token the platform hands a job's cluster (FC2_AGENT_TOKEN on the nodes).",
        }


class _OpenApi30JsonSchema(GenerateJsonSchema):
    """Pydantic writes JSON Schema 2020-12, where "or null" is `{"type": "null"}`; OpenAPI 3.0 says `nullable`."""

    def nullable_schema(self, schema):
        inner = self.generate_inner(schema["schema"])
        return {"allOf": [inner], "nullable": True} if "$ref" in inner else {**inner, "nullable": True}


class PydanticSchema(OpenApiSerializerExtension):
    """Pydantic models (the report body) in the schema, from the same model that validates them."""

    target_class = BaseModel
    match_subclasses = True
    priority = 1  # over drf-spectacular's own pydantic extension, whose output OpenAPI 3.0 does not accept

    def get_name(self, auto_schema, direction):
        return self.target.__name__

    def map_serializer(self, auto_schema, direction):
        schema = self.target.model_json_schema(
            ref_template="#/components/schemas/{model}", schema_generator=_OpenApi30JsonSchema, mode="validation"
        )
        for name, sub_schema in schema.pop("$defs", {}).items():
            component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=sub_schema)
            auto_schema.registry.register_on_missing(component)
        return schema


class JsonWhateverAccepted(BaseContentNegotiation):
    """JSON (or a view's one kind of answer) whatever the Accept header says: no 406 before the token is even looked at
    (agents' reports), nor for a file download (fc2/jobs_api.py)."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


@extend_schema_field(OpenApiTypes.BINARY)
class UploadedFile(serializers.FileField):
    """A file in a multipart body (drf-spectacular shows a plain FileField as the URL of a download)."""


class ReportError(serializers.Serializer):
    error = serializers.CharField()
    detail = serializers.JSONField(required=False, help_text="What is wrong with the report (400 only)")


def refusals(**described: str) -> dict[int, OpenApiResponse]:
    """The schema's refusals of an agents' endpoint, each an `{"error": ...}` (`_401="No bearer token"`, …)."""
    return {int(status.lstrip("_")): OpenApiResponse(ReportError, description=why) for status, why in described.items()}


class JobTokenView(APIView):
    """An endpoint of the node agents: authenticated by the job's token (checked in the view, `_job_of_token`), so no
    session and no CSRF; answers JSON whatever the Accept header says; OPTIONS is 405, as any method but POST."""

    authentication_classes = [JobTokenAuthentication]
    permission_classes: list = []  # the token is checked in post()
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JsonWhateverAccepted
    metadata_class = None


class ReportView(JobTokenView):
    """A node agent reports its node: status, progress, a resource sample; with its last report, the result files.

    The body is the report as JSON, or multipart/form-data with the report as JSON in the `report` field and result
    files as `artifact` fields. Machine-to-machine, authenticated by the job's token.
    """

    @extend_schema(
        operation_id="job_report",
        request={
            "application/json": Report,
            "multipart/form-data": inline_serializer(
                "ReportUpload",
                {
                    "report": serializers.CharField(help_text="The report as JSON (the application/json body)"),
                    "artifact": serializers.ListField(
                        child=UploadedFile(), required=False, help_text="Result files; one field per file"
                    ),
                },
            ),
        },
        responses={
            200: inline_serializer(
                "ReportAccepted",
                {
                    "ok": BooleanField(),
                    "state": serializers.ChoiceField(choices=Job.State.choices),
                    "interruption_at": CharField(
                        required=False, help_text="When the job's latest interruption notice came (absent: none)"
                    ),
                },
            ),
            **refusals(
                _400="Not a valid report, or it names no node of this job",
                _401="No bearer token",
                _403="The token does not belong to this job",
                _409="The job has ended; no more reports are taken",
                _413="The artifacts exceed FC2_MAX_ARTIFACT_MB",
            ),
        },
    )
    def post(self, drf_request: Request, job_id: int) -> JsonResponse:
        # The plain HttpRequest: the body is read as Django reads it (its upload handlers for multipart, raw bytes for
        # JSON), not through DRF's parsers, whose errors would not answer in the agents' form.
        request = drf_request._request
        job = _job_of_token(request, job_id)
        if isinstance(job, JsonResponse):
            return job
        raw = request.POST.get("report", "") if request.content_type == "multipart/form-data" else request.body
        try:
            data = jsonbounds.loads(raw or b"null")
        except ValueError as exc:  # bad JSON, or nested deeper than a report ever is
            return JsonResponse({"error": "invalid report", "detail": str(exc)}, status=400)
        try:
            job = receive(job, data, request.FILES.getlist("artifact"))
        except ReportRejected as exc:
            body = {"error": str(exc)} if exc.detail is None else {"error": str(exc), "detail": exc.detail}
            response = JsonResponse(body, status=exc.status)
            if exc.status == 409:
                # A node's last report racing the job's end is a normal event, not a warning for django.request's log
                # (which an inline job prints on its terminal): Django's own marker of a response already dealt with.
                response._has_been_logged = True
            return response
        # The job's latest interruption notice (any node's): the chief's agent asks for a checkpoint once for each.
        answer: dict[str, object] = {"ok": True, "state": job.state}
        if interruption_at := checkpoints.latest_interruption(job):
            answer["interruption_at"] = interruption_at
        return JsonResponse(answer)


class CheckpointView(JobTokenView):
    """The chief's agent ships a checkpoint its code wrote: the body is the archive (tar.gz), the headers name the node
    (`X-FC2-Node`) and the checkpoint (`X-FC2-Checkpoint`, e.g. TensorFlow's `ckpt-88`; `X-FC2-Step`, the chief's step
    it was saved at, when its agent knows it). The platform keeps the latest FC2_CHECKPOINTS_KEPT as artifacts
    (`checkpoints/<n>.tar.gz`); a resume restores the newest, and a restart counts the work lost from its step."""

    @extend_schema(
        operation_id="job_checkpoint",
        request={"application/gzip": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter("X-FC2-Node", str, OpenApiParameter.HEADER, required=True, description="The chief's name"),
            OpenApiParameter("X-FC2-Checkpoint", str, OpenApiParameter.HEADER, description="The checkpoint's name"),
            OpenApiParameter(
                "X-FC2-Step", int, OpenApiParameter.HEADER, description="The chief's step it was saved at, if known"
            ),
        ],
        responses={
            200: inline_serializer("CheckpointKept", {"ok": BooleanField(), "artifact": CharField()}),
            **refusals(
                _400="Not a tar.gz of regular files, no node of this job, or a step that is not a whole number",
                _401="No bearer token",
                _403="Not this job's token, or the node is not its chief",
                _409="The job has ended; no more checkpoints are taken",
                _411="No Content-Length",
                _413="Over FC2_CHECKPOINT_MAX_MB",
            ),
        },
    )
    def post(self, drf_request: Request, job_id: int) -> JsonResponse:
        request = drf_request._request
        job = _job_of_token(request, job_id)
        if isinstance(job, JsonResponse):
            return job
        try:
            step = checkpoints.parse_step(request.headers.get("X-FC2-Step", ""))
        except checkpoints.CheckpointRejected as exc:
            return _error(exc.status, str(exc))
        limit = checkpoints.max_bytes()
        over = f"the checkpoint is over the {settings.FC2_CHECKPOINT_MAX_MB} MB limit (FC2_CHECKPOINT_MAX_MB)"
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or "")
        except ValueError:
            return _error(411, "a checkpoint needs a Content-Length")
        if declared > limit:
            return _error(413, over)
        # Read as it streams, never more than the limit (Django reads no further than Content-Length): to a file, so
        # a large checkpoint costs no memory; it is stored from there, or dropped with it.
        with tempfile.TemporaryFile() as spooled:
            size = 0
            while chunk := request.read(2**20):
                size += len(chunk)
                if size > limit:
                    return _error(413, over)
                spooled.write(chunk)
            spooled.seek(0)
            try:
                artifact = checkpoints.receive(
                    job, request.headers.get("X-FC2-Node", ""), request.headers.get("X-FC2-Checkpoint", ""), spooled,
                    size, step,
                )  # fmt: skip
            except checkpoints.CheckpointRejected as exc:
                return _error(exc.status, str(exc))
        return JsonResponse({"ok": True, "artifact": artifact.name})


class MeView(APIView):
    """Who the API sees: the authenticated user and their role."""

    @extend_schema(responses={200: inline_serializer("Me", {"username": CharField(), "is_admin": BooleanField()})})
    def get(self, request: Request) -> Response:
        return Response({"username": request.user.get_username(), "is_admin": is_platform_admin(request.user)})
