"""The platform's own API: the node agents' reports (POST /api/jobs/<id>/report, job-scoped bearer token) and
GET /api/me for signed-in users."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.utils import extend_schema, inline_serializer
from pydantic import ValidationError
from rest_framework.fields import BooleanField, CharField
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fc2.models import Job, is_platform_admin
from fc2.services.reports import Report, ReportRejected, apply_report


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@csrf_exempt  # machine-to-machine: authenticated by the job's token, not a session cookie
@require_POST
def report(request: HttpRequest, job_id: int) -> JsonResponse:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _error(401, "missing bearer token")
    job = Job.objects.filter(pk=job_id).first()
    if job is None or not job.token_matches(token.strip()):
        return _error(403, "this token does not belong to this job")
    if job.is_terminal:
        return _error(409, f"job {job.pk} is {job.state}; no more reports are taken")

    files = request.FILES.getlist("artifact")
    limit = settings.FC2_MAX_ARTIFACT_MB * 2**20
    if sum(f.size for f in files) > limit:
        return _error(413, f"artifacts exceed {settings.FC2_MAX_ARTIFACT_MB} MB")
    raw = request.POST.get("report", "") if request.content_type == "multipart/form-data" else request.body
    try:
        data = Report.model_validate(json.loads(raw or b"null"))
    except (ValueError, RecursionError) as exc:  # bad JSON (or nested too deep to parse), ValidationError
        detail = exc.errors(include_url=False, include_context=False) if isinstance(exc, ValidationError) else str(exc)
        return JsonResponse({"error": "invalid report", "detail": detail}, status=400)
    try:
        job = apply_report(job, data, files)
    except ReportRejected as exc:
        return _error(exc.status, str(exc))
    return JsonResponse({"ok": True, "state": job.state})


class MeView(APIView):
    """Who the API sees: the authenticated user and their role."""

    @extend_schema(responses={200: inline_serializer("Me", {"username": CharField(), "is_admin": BooleanField()})})
    def get(self, request: Request) -> Response:
        return Response({"username": request.user.get_username(), "is_admin": is_platform_admin(request.user)})
