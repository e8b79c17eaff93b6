"""The jobs API (docs/API.md): bundles, datasets and jobs over HTTP, for scripts, notebooks and the `fc2` client.

Thin views over the services the wizard and `manage.py submit_job` use (fc2/services/: jobs, bundles, datasets,
library, pipeline): the views check the shape of a request, the services judge it, and a service's refusal is a 400
naming the field at fault. A researcher sees only their own objects — anyone else's is a 404, as one that does not
exist — and admins see every one. Uploads obey the wizard's limits (fc2/uploads.py) and validation, and a refused
upload stores nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re

from django.db.models import Count, Prefetch, QuerySet
from django.http import FileResponse, QueryDict
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils import html
from rest_framework.views import APIView

import provisioner
from fc2 import jsonbounds
from fc2.api import JsonWhateverAccepted, UploadedFile
from fc2.bundles import MAIN_SCRIPT_MAX_LENGTH, BundleError
from fc2.models import Artifact, CodeBundle, Dataset, Job, JobEvent, Node
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
from fc2.services import datasets, jobs, library, pipeline, pricing, submissions, workers
from fc2.services.bundles import store_bundle
from recommender.types import ALGORITHMS, DEFAULT_CATALOG, MAX_WORKERS

logger = logging.getLogger(__name__)

# The most of a log one answer carries; a client asks again from the offset it was given.
LOG_CHUNK_CHARS = 2**20


# --- what the API answers with ---------------------------------------------------------------------------------------


class Ref(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class BundleOutput(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    main = serializers.CharField(source="main_script", help_text="The main script's path inside the wheel")
    jobs = serializers.IntegerField(source="job_count", help_text="How many jobs ran it (it is deletable at 0)")

    class Meta:
        model = CodeBundle
        fields = ["id", "name", "distribution", "version", "main", "sha256", "size_bytes", "created_at", "jobs"]
        fields += ["owner"]


class BundleList(serializers.Serializer):
    results = BundleOutput(many=True, help_text="The user's bundles, newest first (an admin's: everyone's)")


class DatasetOutput(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", allow_null=True, help_text="None for a built-in")

    class Meta:
        model = Dataset
        fields = ["id", "name", "kind", "url", "size_mb", "features", "rows", "last_error", "created_at", "owner"]


class BuiltinOutput(serializers.Serializer):
    name = serializers.CharField(help_text="What a job's `dataset` names it by")
    description = serializers.CharField()
    ready = serializers.BooleanField(help_text="Materialised on this installation (else loaded on first use)")
    features = serializers.IntegerField()
    rows = serializers.IntegerField()


class DatasetList(serializers.Serializer):
    builtin = BuiltinOutput(many=True)
    results = DatasetOutput(many=True, help_text="The user's own datasets (an admin's: everyone's)")


class HeadlineOutput(serializers.Serializer):
    label = serializers.CharField(help_text='e.g. "test accuracy"')
    text = serializers.CharField(help_text='e.g. "97.3 %"')


class JobSummary(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    active = serializers.SerializerMethodField(help_text="False once the job has ended")
    bundle = Ref()
    dataset = Ref()
    headline = HeadlineOutput(allow_null=True, help_text="The figure its result is compared by, once there is one")

    class Meta:
        model = Job
        fields = ["id", "state", "active", "owner", "bundle", "dataset", "provider", "algorithm", "strategy"]
        fields += ["workers", "worker_type", "ps_type", "headline", "created_at", "finished_at"]

    def get_active(self, job: Job) -> bool:
        return not job.is_terminal


class ProgressOutput(serializers.Serializer):
    percent = serializers.IntegerField(source="progress_percent", allow_null=True)
    epoch = serializers.IntegerField(allow_null=True)
    epochs = serializers.IntegerField(allow_null=True)
    step = serializers.IntegerField(allow_null=True)
    steps = serializers.IntegerField(allow_null=True)
    loss = serializers.FloatField(allow_null=True)


class EventOutput(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "state", "message"]


class NodeOutput(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = ["name", "role", "instance_type", "address", "status", "exit_code", "last_report_at"]


class CostOutput(serializers.Serializer):
    """pricing.cost_summary: $ at the catalogue's prices (estimates, not bills)."""

    hourly_cost = serializers.FloatField(allow_null=True)
    budget = serializers.FloatField(allow_null=True, help_text="$/h: the recommender's budget C")
    total_budget = serializers.FloatField(allow_null=True, help_text="$ for the whole job")
    cost_so_far = serializers.FloatField(allow_null=True)
    projected_total = serializers.FloatField(allow_null=True)
    projected_by = serializers.ChoiceField(
        choices=["prediction", "pace", "time limit", "ended"],
        allow_null=True,
        help_text="What the time to come is from",
    )
    launched_at = serializers.DateTimeField(allow_null=True)
    torn_down_at = serializers.DateTimeField(allow_null=True)


class ArtifactOutput(serializers.ModelSerializer):
    name = serializers.CharField(help_text="A safe name of its own in the job: a node's under `<node>/`")
    original_name = serializers.CharField(
        help_text="The output's path as its node wrote it, escaped to printable text; empty for the platform's own"
    )
    node = serializers.CharField(source="node.name", allow_null=True)
    not_kept = serializers.CharField(
        help_text="Why the output was not kept (e.g. over the size limit), with no file to download; empty if kept"
    )
    url = serializers.SerializerMethodField(help_text="Where to download it (with the same token); null if not kept")

    class Meta:
        model = Artifact
        fields = ["id", "name", "original_name", "size_bytes", "node", "not_kept", "url"]

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_url(self, artifact: Artifact) -> str | None:
        if artifact.not_kept or not artifact.file:
            return None
        url = reverse("api-job-artifact", args=[artifact.job_id, artifact.pk])
        return self.context["request"].build_absolute_uri(url)


class ArtifactList(serializers.Serializer):
    results = ArtifactOutput(many=True)


class RequestOutput(serializers.Serializer):
    """What the job was submitted with (Job.request), as it came: what a re-run submits again."""

    algorithm = serializers.CharField()
    strategy = serializers.CharField(help_text="ps, mirrored, or auto: left open for the model to choose")
    workers = serializers.IntegerField(help_text="manual: the count; an algorithm: the limit, unless a budget")
    ps_type = serializers.CharField(allow_blank=True)
    worker_type = serializers.CharField(allow_blank=True)
    worker_types = serializers.ListField(child=serializers.CharField())
    budget = serializers.DecimalField(max_digits=10, decimal_places=4, allow_null=True, coerce_to_string=False)
    total_budget = serializers.DecimalField(max_digits=10, decimal_places=4, allow_null=True, coerce_to_string=False)
    catalog = serializers.CharField()
    provider = serializers.CharField()
    region = serializers.CharField(allow_blank=True)
    latency_ms = serializers.FloatField()
    workload_name = serializers.CharField(allow_blank=True)
    parameters = serializers.DictField(child=serializers.CharField(allow_blank=True))


class WorkerOutput(serializers.Serializer):
    """fc2.services.workers.WorkerStatus: whether any Celery worker is taking jobs."""

    taking_jobs = serializers.BooleanField()
    since = serializers.DateTimeField(
        allow_null=True, help_text="Not taking jobs: since when a worker was last seen; null if none ever started"
    )
    message = serializers.CharField(
        allow_blank=True, help_text='e.g. "No worker is taking jobs since 13:24 UTC"; empty while one is'
    )


class JobOutput(JobSummary):
    request = RequestOutput(allow_null=True, help_text="What was asked; the job's own fields are what was chosen")
    parameters = serializers.DictField(child=serializers.CharField(allow_blank=True))
    progress = ProgressOutput(source="*")
    events = EventOutput(source="events.all", many=True)
    nodes = NodeOutput(source="nodes.all", many=True)
    cost = serializers.SerializerMethodField()
    artifacts = ArtifactOutput(source="artifacts.all", many=True)
    url = serializers.SerializerMethodField(help_text="The job's page")
    worker = serializers.SerializerMethodField(
        help_text="Whether a worker is taking jobs, on a job that waits on one (not ended, not run --inline); else null"
    )

    class Meta(JobSummary.Meta):
        fields = [*JobSummary.Meta.fields, "request", "requested_strategy", "parameters", "workload", "region"]
        fields += ["latency_ms"]
        fields += ["catalog", "worker_types", "progress", "events", "nodes", "cost", "metrics", "failure_reason"]
        fields += ["recommendation", "artifacts", "url", "worker"]

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, job: Job) -> str:
        return self.context["request"].build_absolute_uri(job.get_absolute_url())

    @extend_schema_field(CostOutput)
    def get_cost(self, job: Job) -> dict:
        return pricing.cost_summary(job)

    @extend_schema_field(WorkerOutput(allow_null=True))
    def get_worker(self, job: Job) -> dict | None:
        found = workers.for_job(job)
        return None if found is None else WorkerOutput(found).data


class JobPage(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = JobSummary(many=True)


class LogOutput(serializers.Serializer):
    node = serializers.CharField(allow_null=True, help_text="Whose log this is; None while the job has no nodes")
    nodes = serializers.ListField(child=serializers.CharField(), help_text="The job's nodes")
    offset = serializers.IntegerField(help_text="Where the text ends: the next request's `since`")
    text = serializers.CharField(allow_blank=True, help_text="The log from `since` to `offset`")
    complete = serializers.BooleanField(help_text="The job has ended and its log is all here: nothing more will come")


# --- what it takes -----------------------------------------------------------------------------------------------


class Parameters(serializers.DictField):
    """The script's parameters: a JSON object of strings (in a multipart body, that object as a JSON string)."""

    # Bounded by fc2.services.jobs.check_parameters, as at the wizard's and submit_job's doors, in the same words.
    child = serializers.CharField(allow_blank=True)

    def get_value(self, dictionary):
        if html.is_html_input(dictionary) and self.field_name in dictionary:
            return dictionary.get(self.field_name)  # the object as one JSON string
        return super().get_value(dictionary)

    def to_internal_value(self, data):
        if isinstance(data, str):
            try:
                data = jsonbounds.loads(data or "{}")
            except ValueError as exc:
                raise serializers.ValidationError(f"not a JSON object: {exc}") from None
        return super().to_internal_value(data)


class TypeList(serializers.ListField):
    """Instance types: a JSON array, or one comma-separated string (as a multipart field)."""

    child = serializers.CharField(max_length=40)

    def to_internal_value(self, data):
        if isinstance(data, str):
            data = [name.strip() for name in data.split(",") if name.strip()]
        elif isinstance(data, list) and all(isinstance(item, str) for item in data) and len(data) == 1:
            data = [name.strip() for name in data[0].split(",") if name.strip()]
        return super().to_internal_value(data)


class BundleUpload(serializers.Serializer):
    file = UploadedFile(help_text="The wheel (.whl)")
    main = serializers.CharField(
        default="main.py", max_length=MAIN_SCRIPT_MAX_LENGTH, help_text="A file name in the wheel, or its path"
    )
    name = serializers.CharField(required=False, max_length=200, help_text="Default: the wheel's distribution")


class DatasetUrlInput(serializers.Serializer):
    url = serializers.CharField(max_length=1000, help_text="An http(s) URL every node downloads")
    name = serializers.CharField(required=False, max_length=200, help_text="Default: the URL's last part")


class DatasetUpload(serializers.Serializer):
    file = UploadedFile(help_text="The data, e.g. an .npz with x_train, y_train, x_test, y_test")
    name = serializers.CharField(required=False, max_length=200, help_text="Default: the file's name")


# What a job's cluster may be chosen by: by hand, or by one of the recommender's algorithms.
JOB_ALGORITHMS = ("manual", *ALGORITHMS)
JOB_STRATEGIES = Job.Strategy.choices
# Dollars as the Job's columns hold them; a number in the schema (a string such as "1.50" is taken too).
MONEY = {"max_digits": 10, "decimal_places": 4, "min_value": 0, "coerce_to_string": False}
MONEY |= {"required": False, "allow_null": True}


class JobInput(serializers.Serializer):
    """What a job is submitted with: the wizard's and `submit_job`'s fields (fc2.services.jobs.JobRequest)."""

    parameters = Parameters(default=dict, help_text="Passed to the script as --name=value")
    dataset = serializers.CharField(max_length=1000, help_text="A built-in's name, a dataset's id, or an http(s) URL")
    provider = serializers.ChoiceField(choices=sorted(provisioner.PROVIDERS), default="local")
    region = serializers.CharField(default="", allow_blank=True, max_length=30, help_text="aws: the region")
    latency_ms = serializers.FloatField(
        default=0.0, min_value=0, max_value=jobs.MAX_NODE_DELAY_MS, help_text="lab: delay between the nodes, ms one way"
    )
    strategy = serializers.ChoiceField(choices=JOB_STRATEGIES, default=Job.Strategy.PS)
    algorithm = serializers.ChoiceField(
        choices=JOB_ALGORITHMS, default="manual", help_text="manual: the cluster given; else recommended"
    )
    workers = serializers.IntegerField(
        default=2, min_value=1, max_value=MAX_WORKERS, help_text="manual: the count; an algorithm: the limit"
    )
    budget = serializers.DecimalField(
        **MONEY, help_text="$/h: the algorithm's budget C, which then sets the worker count (not with manual)"
    )
    total_budget = serializers.DecimalField(
        **MONEY, help_text="$ for the whole job: stopped before its cost would exceed it"
    )
    hourly_budget = serializers.DecimalField(
        **MONEY,
        help_text="Deprecated: the old name of `budget`. A request with it is read the old way, its `budget` being "
        "the whole job's $ (answered with a Deprecation header)",
    )
    ps_type = serializers.CharField(default="", allow_blank=True, max_length=40)
    worker_type = serializers.CharField(default="", allow_blank=True, max_length=40)
    worker_types = TypeList(default=list, help_text="L^w: the worker types an algorithm considers")
    catalog = serializers.CharField(default=DEFAULT_CATALOG, max_length=50)
    workload_name = serializers.CharField(
        default="", allow_blank=True, max_length=jobs.WORKLOAD_NAME_MAX, help_text=jobs.WORKLOAD_NAME_HELP
    )

    def validate(self, data: dict) -> dict:
        """`budget` was the whole job's $ before it was $/h: a request naming `hourly_budget`, or sent by an `fc2`
        client from before (OLD_CLIENT), is an old client's, read the old way (`deprecated`); `budget` with Manual,
        which takes no $/h, is refused, naming `total_budget` — so that no total is ever read as $/h (docs/API.md,
        *Budgets*)."""
        request = self.context.get("request")
        agent = request.headers.get("User-Agent", "") if request is not None else ""
        self.deprecated = "hourly_budget" in self.initial_data or OLD_CLIENT.match(agent) is not None
        if self.deprecated:
            if "total_budget" in self.initial_data:
                raise serializers.ValidationError(
                    {"hourly_budget": "hourly_budget is the deprecated name of budget: not with total_budget"}
                )
            data["total_budget"], data["budget"] = data.get("budget"), data.pop("hourly_budget", None)
        elif data.get("budget") is not None and data["algorithm"] == "manual":
            raise serializers.ValidationError({"budget": jobs.BUDGET_WITHOUT_ALGORITHM})
        return data


class JobSubmit(JobInput):
    bundle = serializers.IntegerField(min_value=1, max_value=MAX_ID, help_text="The id of one of your bundles")


class JobUpload(JobInput):
    bundle_file = UploadedFile(help_text="The wheel, stored as a bundle with the job (or not at all)")
    main = serializers.CharField(default="main.py", max_length=MAIN_SCRIPT_MAX_LENGTH)


class JobListQuery(serializers.Serializer):
    state = serializers.ChoiceField(choices=Job.State.values, required=False)
    provider = serializers.ChoiceField(choices=sorted(provisioner.PROVIDERS), required=False)
    page = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=100, required=False, help_text="Default 25")


class LogQuery(serializers.Serializer):
    node = serializers.CharField(required=False, max_length=50, help_text="Default: the chief")
    since = serializers.IntegerField(default=0, min_value=0, help_text="The `offset` of the previous answer")


# --- the views -------------------------------------------------------------------------------------------------------


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


# The `fc2` client before 0.2 sent the whole job's $ as `budget` (and $/h as `hourly_budget`), whatever it was given.
OLD_CLIENT = re.compile(r"fc2-client/0\.1\.")
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
