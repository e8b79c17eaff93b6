"""The jobs API (docs/API.md): bundles, datasets and jobs over HTTP, for scripts, notebooks and the `fc2` client.

Thin views over the services the wizard and `manage.py submit_job` use (fc2/services/: jobs, bundles, datasets,
library, pipeline): the views check the shape of a request through its serializers (fc2/jobs_serializers.py), the
services judge it, and a service's refusal is a 400 naming the field at fault. A researcher sees only their own
objects — anyone else's is a 404, as one that does not exist — and admins see every one. Uploads obey the wizard's
limits (fc2/uploads.py) and validation, and a refused upload stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re

from django.db.models import Count, Prefetch, QuerySet
from django.http import FileResponse, QueryDict
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

import provisioner
from fc2.api import JsonWhateverAccepted
from fc2.bundles import BundleError
from fc2.jobs_serializers import (
    ArtifactList,
    ArtifactOutput,
    BundleList,
    BundleOutput,
    BundleUpload,
    DatasetList,
    DatasetOutput,
    DatasetUpload,
    DatasetUrlInput,
    JobListQuery,
    JobOutput,
    JobPage,
    JobSubmit,
    JobSummary,
    JobUpload,
    LogOutput,
    LogQuery,
)
from fc2.models import Artifact, CodeBundle, Dataset, Job
from fc2.query import MAX_ID  # a larger id in a URL names nothing (and must not reach the database)
from fc2.rest import (
    BoundedJSONParser,
    Refused,
    SubmitThrottle,
    idempotency_key,
    invalid,
    refusals,
    too_many_submissions,
)
from fc2.services import datasets, jobs, library, pipeline, submissions
from fc2.services.bundles import store_bundle

logger = logging.getLogger(__name__)

# The most of a log one answer carries; a client asks again from the offset it was given.
LOG_CHUNK_CHARS = 2**20


def _one(objects: QuerySet, pk: int, what: str):
    """The object `pk` among those the user may see, else a 404 that does not say whether it exists."""
    found = objects.filter(pk=pk).first() if pk <= MAX_ID else None
    if found is None:
        raise NotFound(f"no {what} {pk}")
    return found


def _bundles(request: Request) -> QuerySet:
    return CodeBundle.objects.visible_to(request.user).select_related("owner").annotate(job_count=Count("jobs"))


def _jobs(request: Request) -> QuerySet:
    return Job.objects.visible_to(request.user).select_related("bundle", "dataset", "owner")


def _job(request: Request, job_id: int) -> Job:
    return _one(_jobs(request), job_id, "job")


def _job_output(request: Request, job_id: int) -> dict:
    """A job as the API shows it, in a fixed number of queries however many events, nodes and artifacts it has."""
    related = ("events", "nodes", Prefetch("artifacts", Artifact.objects.select_related("node")))
    return JobOutput(_one(_jobs(request).prefetch_related(*related), job_id, "job"), context={"request": request}).data


def _query(serializer_class: type[serializers.Serializer], request: Request) -> dict:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return query.validated_data


def _delete(request: Request, item: CodeBundle | Dataset) -> Response:
    if item.owner_id != request.user.pk:
        raise PermissionDenied("a built-in dataset cannot be deleted" if item.owner_id is None else "it is not yours")
    try:
        library.delete(item)
    except library.LibraryError as exc:
        raise Refused(409, str(exc)) from exc
    return Response(status=204)


class BundlesView(APIView):
    """The user's code bundles; upload a wheel (validated as the wizard's upload is)."""

    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(operation_id="bundles_list", summary="Your bundles", responses={200: BundleList, **refusals()})
    def get(self, request: Request) -> Response:
        bundles = _bundles(request).order_by("-created_at", "-pk")
        return Response({"results": BundleOutput(bundles, many=True).data})

    @extend_schema(
        operation_id="bundles_upload",
        summary="Upload a wheel",
        request={"multipart/form-data": BundleUpload},
        responses={
            201: BundleOutput,
            200: OpenApiResponse(BundleOutput, description="The same wheel and main script were already stored"),
            **refusals(400, 413, 415),
        },
    )
    def post(self, request: Request) -> Response:
        form = BundleUpload(data=request.data)
        form.is_valid(raise_exception=True)
        upload, started = form.validated_data["file"], timezone.now()
        try:
            bundle = store_bundle(request.user, upload, upload.name, form.validated_data["main"])
        except BundleError as exc:
            raise invalid("file", str(exc)) from exc
        if name := form.validated_data.get("name"):
            library.rename(bundle, name)  # (the name's length was checked above: it cannot be refused now)
        # store_bundle answers with the bundle already stored for the same wheel and main script: one made earlier.
        created = bundle.created_at >= started
        return Response(BundleOutput(_bundles(request).get(pk=bundle.pk)).data, status=201 if created else 200)


class BundleView(APIView):
    @extend_schema(operation_id="bundles_get", summary="A bundle", responses={200: BundleOutput, **refusals(404)})
    def get(self, request: Request, bundle_id: int) -> Response:
        return Response(BundleOutput(_one(_bundles(request), bundle_id, "bundle")).data)

    @extend_schema(
        operation_id="bundles_delete",
        summary="Delete a bundle no job used",
        responses={204: None, **refusals(403, 404, s409="A job used it: the job's record keeps what it ran")},
    )
    def delete(self, request: Request, bundle_id: int) -> Response:
        return _delete(request, _one(CodeBundle.objects.visible_to(request.user), bundle_id, "bundle"))


class DatasetsView(APIView):
    """The built-in datasets and the user's own; register a URL or upload a file."""

    parser_classes = [BoundedJSONParser, MultiPartParser, FormParser]

    @extend_schema(
        operation_id="datasets_list",
        summary="The built-in datasets and yours",
        responses={200: DatasetList, **refusals()},
    )
    def get(self, request: Request) -> Response:
        builtin = [
            {
                "name": b.name,
                "description": b.title,
                "ready": datasets.builtin_path(b.name).exists(),
                "features": b.features,
                "rows": b.rows,
            }
            for b in datasets.BUILTINS.values()
        ]
        own = Dataset.objects.visible_to(request.user).exclude(kind=Dataset.Kind.BUILTIN).select_related("owner")
        return Response(
            {"builtin": builtin, "results": DatasetOutput(own.order_by("-created_at", "-pk"), many=True).data}
        )

    @extend_schema(
        operation_id="datasets_create",
        summary="Register a dataset's URL, or upload a file",
        request={"application/json": DatasetUrlInput, "multipart/form-data": DatasetUpload},
        responses={
            201: DatasetOutput,
            200: OpenApiResponse(DatasetOutput, description="The URL is already one of the user's datasets"),
            **refusals(400, 413, 415),
        },
    )
    def post(self, request: Request) -> Response:
        if "file" in request.FILES or request.content_type.startswith("multipart/"):
            form = DatasetUpload(data=request.data)
            form.is_valid(raise_exception=True)
            try:
                dataset = datasets.store_upload(
                    request.user, form.validated_data["file"], form.validated_data.get("name", "")
                )
            except datasets.DatasetError as exc:
                raise invalid("file", str(exc)) from exc
            return Response(DatasetOutput(dataset).data, status=201)
        form = DatasetUrlInput(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            dataset, created = datasets.store_url(
                request.user, form.validated_data["url"], form.validated_data.get("name", "")
            )
        except datasets.DatasetError as exc:
            raise invalid("url", str(exc)) from exc
        return Response(DatasetOutput(dataset).data, status=201 if created else 200)


class DatasetView(APIView):
    @extend_schema(operation_id="datasets_get", summary="A dataset", responses={200: DatasetOutput, **refusals(404)})
    def get(self, request: Request, dataset_id: int) -> Response:
        objects = Dataset.objects.visible_to(request.user).select_related("owner")
        return Response(DatasetOutput(_one(objects, dataset_id, "dataset")).data)

    @extend_schema(
        operation_id="datasets_delete",
        summary="Delete a dataset no job used",
        responses={204: None, **refusals(403, 404, s409="A job used it: the job's record keeps what it ran on")},
    )
    def delete(self, request: Request, dataset_id: int) -> Response:
        return _delete(request, _one(Dataset.objects.visible_to(request.user), dataset_id, "dataset"))


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    location=OpenApiParameter.HEADER,
    required=False,
    description="Any 1 to 255 printable ASCII characters, new for each submission (e.g. a UUID): the same key with the "
    "same request within 24 h answers the job it made (`Idempotent-Replayed: true`) instead of a second one",
)
KEY_IN_USE = "A request with this Idempotency-Key is in progress"


class SubmitView(APIView):
    """A submission (a re-run too): FC2_API_SUBMIT_RATE per user on POST, and made once for an Idempotency-Key
    (fc2.services.submissions)."""

    def get_throttles(self):
        return [SubmitThrottle()] if self.request.method == "POST" else []

    def throttled(self, request: Request, wait: float) -> None:
        raise too_many_submissions(submissions.TooManySubmissions(*submissions.submission_rate(), math.ceil(wait)))

    def submit(
        self, request: Request, job_request: jobs.JobRequest | None = None, deprecated: bool = False, **upload
    ) -> Response:
        """Submit `job_request`, or store the wheel in `upload` and submit with it (all or nothing): 201 and the
        job, or the service's refusal as a 400 naming the field. With an Idempotency-Key the user used for the same
        request, 201 and the job it made (`Idempotent-Replayed: true`): nothing is submitted. A request in
        deprecated names is answered with a Deprecation header and a Warning saying which."""
        key = idempotency_key(request)

        def make() -> Job:
            try:
                if job_request is not None:
                    return jobs.submit(request.user, job_request, plan_first=True)
                return jobs.submit_upload(request.user, plan_first=True, **upload)
            except BundleError as exc:
                raise invalid("bundle_file", str(exc)) from exc
            except datasets.DatasetError as exc:
                raise invalid("dataset", str(exc)) from exc
            except jobs.SubmitError as exc:
                raise invalid(exc.field, str(exc)) from exc

        try:
            job, made = submissions.submit_once(request.user, make, key, request_hash(request) if key else "")
        except submissions.KeyReused as exc:
            raise Refused(422, str(exc)) from exc
        except submissions.KeyInUse as exc:
            raise Refused(409, str(exc)) from exc
        except submissions.TooManySubmissions as exc:
            raise too_many_submissions(exc) from exc
        response = Response(_job_output(request, job.pk), status=201)
        if not made:
            response["Idempotent-Replayed"] = "true"
        if deprecated:
            for name, value in BUDGET_DEPRECATION.items():
                response[name] = value
        return response


# What answers a submission in the old names (RFC 9745's Deprecation header, and a Warning that says which).
BUDGET_DEPRECATION = {
    "Deprecation": "true",
    "Warning": (
        '299 - "hourly_budget is deprecated and budget now means $/h: send budget ($/h) and total_budget ($ for the '
        'whole job)"'
    ),
}


def request_hash(request: Request) -> str:
    """SHA-256 of the request as parsed: its method and path, its fields (a JSON body, or a form's), and the SHA-256
    of each file it uploads — what an Idempotency-Key's request is compared by."""
    files = {name: [_sha256(upload) for upload in request.FILES.getlist(name)] for name in request.FILES}
    data = request.data
    if isinstance(data, QueryDict):
        data = {name: data.getlist(name) for name in data if name not in files}
    as_parsed = json.dumps([request.method, request.path, data, files], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(as_parsed.encode()).hexdigest()


def _sha256(upload) -> str:
    digest = hashlib.sha256()
    for chunk in upload.chunks():
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


class JobsView(SubmitView):
    """The user's jobs, newest first; submit one."""

    parser_classes = [BoundedJSONParser, MultiPartParser, FormParser]
    pagination_class = PageNumberPagination

    @extend_schema(
        operation_id="jobs_list",
        summary="Your jobs, newest first",
        parameters=[JobListQuery],
        responses={200: JobPage, **refusals(400, 404)},
    )
    def get(self, request: Request) -> Response:
        query = _query(JobListQuery, request)
        found = _jobs(request).filter(**{name: query[name] for name in ("state", "provider") if name in query})
        paginator = self.pagination_class()
        paginator.page_size = query.get("page_size", 25)
        page = paginator.paginate_queryset(found.order_by("-created_at", "-pk"), request, view=self)
        return paginator.get_paginated_response(JobSummary(page, many=True).data)

    @extend_schema(
        operation_id="jobs_submit",
        summary="Submit a job",
        request={"application/json": JobSubmit, "multipart/form-data": JobUpload},
        parameters=[IDEMPOTENCY_KEY],
        responses={201: JobOutput, **refusals(400, 409, 413, 415, 422, 429, s409=KEY_IN_USE)},
    )
    def post(self, request: Request) -> Response:
        if "bundle_file" in request.FILES or request.content_type.startswith("multipart/"):
            form = JobUpload(data=request.data, context={"request": request})
            form.is_valid(raise_exception=True)
            options = dict(form.validated_data)
            wheel = options.pop("bundle_file")
            dataset = _dataset(request, options.pop("dataset"))
            upload = {"wheel": wheel, "filename": wheel.name, "main_script": options.pop("main"), "dataset": dataset}
            return self.submit(request, deprecated=form.deprecated, **upload, **options)
        form = JobSubmit(data=request.data, context={"request": request})
        form.is_valid(raise_exception=True)
        options = dict(form.validated_data)
        bundle = CodeBundle.objects.visible_to(request.user).filter(pk=options.pop("bundle")).first()
        if bundle is None:
            raise invalid("bundle", f"no bundle {form.validated_data['bundle']}")
        dataset = _dataset(request, options.pop("dataset"))
        job_request = jobs.JobRequest(bundle=bundle, dataset=dataset, **options)
        return self.submit(request, job_request, deprecated=form.deprecated)


def _dataset(request: Request, name_or_url: str) -> Dataset:
    """The dataset a job names — one the user may use by id, a built-in by name (materialised now, before the
    submission's transaction), one of theirs by name, or an http(s) URL — else a 400."""
    try:
        if re.fullmatch(r"\s*[0-9]+\s*", name_or_url):
            pk = int(name_or_url)
            found = Dataset.objects.visible_to(request.user).filter(pk=pk).first() if pk <= MAX_ID else None
            if found is None:
                raise datasets.DatasetError(f"no dataset {pk}")
            return datasets.ready(found)
        return datasets.ready(datasets.resolve(request.user, name_or_url))
    except datasets.DatasetError as exc:
        raise invalid("dataset", str(exc)) from exc


class JobView(APIView):
    @extend_schema(
        operation_id="jobs_get",
        summary="A job: state, events, progress, nodes, cost",
        responses={200: JobOutput, **refusals(404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(_job_output(request, job_id))


class JobCancelView(APIView):
    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        request=None,
        responses={200: JobOutput, **refusals(404, s409="It has already ended, or finished training")},
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = _job(request, job_id)
        if not pipeline.cancel(job, by=request.user.get_username()):
            job.refresh_from_db()
            if job.state == Job.State.COLLECTING:
                raise Refused(409, f"job {job.pk} has finished training; its results are being collected")
            raise Refused(409, f"job {job.pk} has already ended ({job.state})")
        return Response(_job_output(request, job_id))


class JobRerunView(SubmitView):
    @extend_schema(
        operation_id="jobs_rerun",
        summary="Run a job again",
        request=None,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: OpenApiResponse(JobOutput, description="The new job: the same code, data and resources"),
            **refusals(
                400,
                404,
                422,
                429,
                s400="It cannot run again as it was, and why (e.g. its provider is gone)",
                s409=KEY_IN_USE,
            ),
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        return self.submit(request, jobs.JobRequest.of(_job(request, job_id)))


class JobLogsView(APIView):
    @extend_schema(
        operation_id="jobs_logs",
        summary="A node's log, from an offset",
        parameters=[LogQuery],
        responses={200: LogOutput, **refusals(400, 404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = _job(request, job_id)
        query = _query(LogQuery, request)
        nodes = list(job.nodes.values_list("name", flat=True))
        since = query["since"]
        if not nodes:
            return Response({"node": None, "nodes": [], "offset": since, "text": "", "complete": job.is_terminal})
        name = query.get("node") or _chief(job, nodes)
        if name not in nodes:
            raise invalid("node", f"job {job.pk} has no node {name!r} (its nodes: {', '.join(nodes)})")
        log, whole = node_log(job, name)
        text = log[since : since + LOG_CHUNK_CHARS]
        offset = since + len(text)  # never back: a log that cannot be read just now is not a log begun again
        complete = whole and offset >= len(log)
        return Response({"node": name, "nodes": nodes, "offset": offset, "text": text, "complete": complete})


def _chief(job: Job, nodes: list[str]) -> str:
    chiefs = pipeline.chief_names(job)
    return next((name for name in nodes if name in chiefs), nodes[0])


def node_log(job: Job, name: str) -> tuple[str, bool]:
    """A node's log as far as it is known, and whether that is all of it: read from its node while the cluster is
    up, from the log kept as an artifact once it is gone (the job has then ended, or it never had a cluster)."""
    if job.cluster is not None:
        try:
            return provisioner.fetch_logs(pipeline.cluster_info(job), only=[name]).get(name, ""), False
        except provisioner.ProvisionError as exc:  # a node not answering, or the cluster going meanwhile
            logger.info("job %s: the log of %s could not be read: %s", job.pk, name, exc)
            return "", False
    kept = job.artifacts.filter(name=f"logs/{name}.log").first()
    if kept is None or not kept.file:  # none, or one not kept (it has no file)
        return "", job.is_terminal
    try:
        with kept.file.open("rb") as stored:
            return stored.read().decode(errors="replace"), job.is_terminal
    except FileNotFoundError:
        return "", job.is_terminal


class JobArtifactsView(APIView):
    @extend_schema(
        operation_id="jobs_artifacts", summary="A job's artifacts", responses={200: ArtifactList, **refusals(404)}
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = _job(request, job_id)
        found = job.artifacts.select_related("node")
        return Response({"results": ArtifactOutput(found, many=True, context={"request": request}).data})


class ArtifactDownloadView(APIView):
    content_negotiation_class = JsonWhateverAccepted  # a file, whatever the Accept header asks; errors in JSON

    @extend_schema(
        operation_id="jobs_artifact_download",
        summary="Download an artifact",
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The file"),
            **refusals(s404="No such artifact (or it is someone else's), or it was not kept: the reason"),
        },
    )
    def get(self, request: Request, job_id: int, artifact_id: int):
        job = _job(request, job_id)
        artifact = job.artifacts.filter(pk=artifact_id).first() if artifact_id <= MAX_ID else None
        if artifact is None:
            raise NotFound(f"job {job.pk} has no artifact {artifact_id}")
        if artifact.not_kept or not artifact.file:
            raise NotFound(f"artifact {artifact.name} was not kept: {artifact.not_kept or 'it has no file'}")
        try:
            stored = artifact.file.open("rb")
        except FileNotFoundError:
            raise NotFound(f"the file of artifact {artifact.name} is missing") from None
        filename = artifact.name.replace("/", "_")
        return FileResponse(stored, as_attachment=True, filename=filename, content_type="application/octet-stream")
