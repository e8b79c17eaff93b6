"""The jobs API's serializers (docs/API.md): what its views (fc2/jobs_api.py) answer with, and what they take.

The shapes the OpenAPI schema is drawn from, and the first check of a request: a field's type and bounds. Whether a
request can be done is the services' to judge (fc2/services/), so nothing here writes a row; the views call both.
"""

from __future__ import annotations

import re

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.utils import html

import provisioner
from fc2 import jsonbounds
from fc2.api import UploadedFile
from fc2.bundles import MAIN_SCRIPT_MAX_LENGTH
from fc2.models import Artifact, CodeBundle, Dataset, Framework, Job, JobEvent, Node
from fc2.query import MAX_ID  # a larger id names nothing (and must not reach the database)
from fc2.services import jobs, managed, pricing, search, workers
from recommender.types import ALGORITHMS, DEFAULT_CATALOG, MAX_WORKERS

# --- what the API answers with ---------------------------------------------------------------------------------------


class Ref(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class BundleOutput(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    main = serializers.CharField(source="main_script", help_text="The main script's path inside the wheel")
    jobs = serializers.IntegerField(source="job_count", help_text="How many jobs ran it (it is deletable at 0)")
    framework = serializers.CharField(
        help_text="What its wheel requires (Requires-Dist): tensorflow or pytorch; empty when neither or both"
    )
    cuda_requirement = serializers.CharField(
        help_text="Its requirement only a CUDA machine installs (e.g. torch==2.3.0+cu121): GPU workers only; or empty"
    )

    class Meta:
        model = CodeBundle
        fields = ["id", "name", "distribution", "version", "main", "sha256", "size_bytes", "created_at", "jobs"]
        fields += ["owner", "framework", "cuda_requirement"]


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


class WorkerOutput(serializers.Serializer):
    """fc2.services.workers.WorkerStatus: whether any Celery worker is taking jobs."""

    taking_jobs = serializers.BooleanField()
    since = serializers.DateTimeField(
        allow_null=True, help_text="Not taking jobs: since when a worker was last seen; null if none ever started"
    )
    message = serializers.CharField(
        allow_blank=True, help_text='e.g. "No worker is taking jobs since 13:24 UTC"; empty while one is'
    )


class JobSummary(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    active = serializers.SerializerMethodField(help_text="False once the job has ended")
    bundle = Ref()
    dataset = Ref()
    headline = HeadlineOutput(allow_null=True, help_text="The figure its result is compared by, once there is one")
    worker = serializers.SerializerMethodField(
        help_text="Whether a worker is taking jobs, on a job that waits on one (not ended, not run --inline); else null"
    )

    class Meta:
        model = Job
        fields = ["id", "state", "active", "owner", "bundle", "dataset", "framework", "provider", "algorithm"]
        fields += ["strategy", "workers", "worker_type", "ps_type", "headline", "created_at", "finished_at", "worker"]

    def get_active(self, job: Job) -> bool:
        return not job.is_terminal

    @extend_schema_field(WorkerOutput(allow_null=True))
    def get_worker(self, job: Job) -> dict | None:
        if not workers.waits_on_workers(job):
            return None
        # Read once per response (a page lists up to 100 jobs): the serializers of a list share its context.
        if "worker" not in self.context:
            self.context["worker"] = WorkerOutput(workers.status()).data
        return self.context["worker"]


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


# A request from before explore weighed nothing: its α and β read as JobRequest's own, the balanced preset's.
BALANCED = search.PRESETS[search.DEFAULT_PRESET]


class RequestOutput(serializers.Serializer):
    """What the job was submitted with (Job.request), as it came: what a re-run submits again."""

    algorithm = serializers.CharField()
    # (a job submitted before frameworks holds none: it was TensorFlow's)
    framework = serializers.CharField(default=Framework.TENSORFLOW, help_text="tensorflow or pytorch")
    strategy = serializers.CharField(
        help_text="ps, mirrored, or auto (left open for the model to choose): TensorFlow's; ddp: PyTorch's"
    )
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
    # explore's (a job submitted before explore holds none: the defaults)
    alpha = serializers.FloatField(default=BALANCED[0], help_text="explore: the weight of time")
    beta = serializers.FloatField(default=BALANCED[1], help_text="explore: the weight of cost")
    search_budget = serializers.DecimalField(
        max_digits=10,
        decimal_places=4,
        allow_null=True,
        coerce_to_string=False,
        help_text="explore: $ its trial runs may cost; null: the platform's default",
    )
    search_minutes = serializers.IntegerField(
        allow_null=True, help_text="explore: minutes its trial runs may take; null: the platform's default"
    )
    # managed jobs' (a job submitted before them holds none: the defaults)
    max_restarts = serializers.IntegerField(default=0, help_text="Times a lost node is replaced and training resumed")
    spot = serializers.BooleanField(default=False, help_text="aws: spot instances")
    spot_max_price = serializers.DecimalField(
        max_digits=10, decimal_places=4, allow_null=True, default=None, coerce_to_string=False, help_text="$/h at most"
    )
    spot_fallback = serializers.ChoiceField(
        choices=Job.SpotFallback.choices, default=Job.SpotFallback.ON_DEMAND, help_text="Without spot capacity"
    )


class RestartOutput(serializers.Serializer):
    """One resume after a lost node (Job.restarts, pipeline.resume)."""

    at = serializers.DateTimeField(help_text="When the loss was seen")
    nodes = serializers.ListField(child=serializers.CharField(), help_text="The nodes lost")
    reason = serializers.CharField()
    lost_steps = serializers.IntegerField(allow_null=True, help_text="Steps trained since the last checkpoint")
    lost_s = serializers.FloatField(help_text="Seconds of training since the last checkpoint")
    lost_dollars = serializers.FloatField(help_text="$ of the cluster over those seconds")
    checkpoint = serializers.CharField(allow_blank=True, help_text="The checkpoint resumed from; empty: the start")
    resumed_at = serializers.DateTimeField(allow_null=True, help_text="When its nodes were started again")

    def to_representation(self, instance: object) -> dict:
        # Read as the job page reads it (fc2/services/managed.py): a value of the wrong kind is null, never a 500.
        return super().to_representation(managed.restart_fields(instance))


class RateOutput(serializers.Serializer):
    """One span of a spot job's cluster billed in one market (Job.rates, pricing.bill)."""

    market = serializers.ChoiceField(choices=[pricing.SPOT, pricing.ON_DEMAND], allow_null=True)
    hourly_cost = serializers.FloatField(
        allow_null=True, help_text="$/h of the cluster: on spot the spot price quoted at its launch; else on-demand's"
    )
    started_at = serializers.DateTimeField(allow_null=True, help_text="From when (the first: the cluster's launch)")
    ended_at = serializers.DateTimeField(allow_null=True, help_text="Until when; null for the market billed now")

    def to_representation(self, instance: object) -> dict:
        # Read as restarts are (RestartOutput, fc2/services/managed.py): a value of the wrong kind is null, never a 500.
        return super().to_representation(managed.rate_fields(instance))


class TrialOutput(serializers.Serializer):
    """One of explore's trial runs (fc2.services.search.TrialRow)."""

    number = serializers.IntegerField()
    worker_type = serializers.CharField()
    ps_type = serializers.CharField(allow_blank=True, help_text='"" for all-reduce')
    workers = serializers.IntegerField()
    strategy = serializers.CharField()
    hourly_cost = serializers.FloatField(help_text="$/h of its cluster, its PS included")
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while it is under way")
    state = serializers.ChoiceField(choices=search.TRIAL_STATES)
    epoch_time_s = serializers.FloatField(allow_null=True, help_text="Its measured steady-state epoch time")
    error = serializers.CharField(allow_blank=True, help_text="Why it failed; empty otherwise")
    cost = serializers.FloatField(help_text="$: its $/h over its span (part of the job's cost)")
    record = serializers.IntegerField(allow_null=True, help_text="The performance record it made")


class SearchClusterOutput(serializers.Serializer):
    worker_type = serializers.CharField()
    ps_type = serializers.CharField(allow_blank=True)
    workers = serializers.IntegerField()
    strategy = serializers.CharField()
    hourly_cost = serializers.FloatField(allow_null=True)
    epoch_time_s = serializers.FloatField(allow_null=True, help_text="Predicted")
    low_s = serializers.FloatField(allow_null=True, help_text="Its 80 % interval's lower end")
    high_s = serializers.FloatField(allow_null=True, help_text="Its 80 % interval's upper end")


class SearchOutput(serializers.Serializer):
    """explore's search once made (Job.search)."""

    before = SearchClusterOutput(allow_null=True, help_text="The cluster believed best before the trials")
    after = SearchClusterOutput(allow_null=True, help_text="The cluster chosen after them")
    reason = serializers.CharField(help_text="Why the search stopped")
    trials = serializers.IntegerField()
    spent_dollars = serializers.FloatField()
    budget_dollars = serializers.FloatField(allow_null=True)
    budget_minutes = serializers.FloatField(allow_null=True)
    no_trial_needed = serializers.BooleanField()


class JobOutput(JobSummary):
    request = RequestOutput(allow_null=True, help_text="What was asked; the job's own fields are what was chosen")
    parameters = serializers.DictField(child=serializers.CharField(allow_blank=True))
    progress = ProgressOutput(source="*")
    events = EventOutput(source="events.all", many=True)
    nodes = NodeOutput(source="nodes.all", many=True)
    cost = serializers.SerializerMethodField()
    artifacts = ArtifactOutput(source="artifacts.all", many=True)
    url = serializers.SerializerMethodField(help_text="The job's page")
    search = serializers.SerializerMethodField(help_text="explore: its search once made; null before, or not explore")
    trials = serializers.SerializerMethodField(help_text="explore: its trial runs so far, in order")
    restarts = RestartOutput(many=True, help_text="Each resume after a lost node, in order")
    rates = serializers.SerializerMethodField(
        help_text="A spot job's cluster's markets and $/h over its life, in order; [] for one billed at hourly_cost "
        "throughout"
    )
    spot_max_price = serializers.DecimalField(max_digits=10, decimal_places=4, allow_null=True, coerce_to_string=False)

    class Meta(JobSummary.Meta):
        fields = [*JobSummary.Meta.fields, "request", "requested_strategy", "parameters", "workload", "region"]
        fields += ["latency_ms"]
        fields += ["catalog", "worker_types", "progress", "events", "nodes", "cost", "metrics", "failure_reason"]
        fields += ["recommendation", "artifacts", "url", "search", "trials"]
        fields += ["max_restarts", "restarts", "spot", "spot_max_price", "spot_fallback", "rates"]

    @extend_schema_field(OpenApiTypes.URI)
    def get_url(self, job: Job) -> str:
        return self.context["request"].build_absolute_uri(job.get_absolute_url())

    @extend_schema_field(CostOutput)
    def get_cost(self, job: Job) -> dict:
        return pricing.cost_summary(job)

    @extend_schema_field(SearchOutput(allow_null=True))
    def get_search(self, job: Job) -> dict | None:
        return job.search

    @extend_schema_field(TrialOutput(many=True))
    def get_trials(self, job: Job) -> list:
        return TrialOutput(search.trials(job), many=True).data

    @extend_schema_field(RateOutput(many=True))
    def get_rates(self, job: Job) -> list:
        return RateOutput(job.rates if isinstance(job.rates, list) else [], many=True).data


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


# The `fc2` client before 0.2 sent the whole job's $ as `budget` (and $/h as `hourly_budget`), whatever it was given.
OLD_CLIENT = re.compile(r"fc2-client/0\.1\.")
# What a job's cluster may be chosen by: by hand, or by one of the recommender's algorithms.
JOB_ALGORITHMS = ("manual", *ALGORITHMS)
JOB_STRATEGIES = Job.Strategy.choices
# Dollars as the Job's columns hold them; a number in the schema (a string such as "1.50" is taken too).
MONEY = {"max_digits": 10, "decimal_places": 4, "min_value": 0, "coerce_to_string": False}
MONEY |= {"required": False, "allow_null": True}


# explore's fields of a submission.
SEARCH_FIELDS = ("preset", "alpha", "beta", "search_budget", "search_minutes")


class JobInput(serializers.Serializer):
    """What a job is submitted with: the wizard's and `submit_job`'s fields (fc2.services.jobs.JobRequest)."""

    parameters = Parameters(default=dict, help_text="Passed to the script as --name=value")
    dataset = serializers.CharField(max_length=1000, help_text="A built-in's name, a dataset's id, or an http(s) URL")
    provider = serializers.ChoiceField(choices=sorted(provisioner.PROVIDERS), default="local")
    region = serializers.CharField(default="", allow_blank=True, max_length=30, help_text="aws: the region")
    latency_ms = serializers.FloatField(
        default=0.0, min_value=0, max_value=jobs.MAX_NODE_DELAY_MS, help_text="lab: delay between the nodes, ms one way"
    )
    framework = serializers.ChoiceField(
        choices=Framework.choices,
        required=False,
        help_text="What the code trains with; default: what the bundle's wheel requires (Requires-Dist), else "
        "tensorflow. A framework the bundle contradicts is refused",
    )
    strategy = serializers.ChoiceField(
        choices=JOB_STRATEGIES,
        required=False,
        help_text="ps, mirrored or auto (left open: model, explore) for TensorFlow; ddp for PyTorch. Default: ps for "
        "TensorFlow, ddp for PyTorch (auto too means ddp there)",
    )
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
    # explore's: what "best" means and what its search may spend
    preset = serializers.ChoiceField(
        choices=list(search.PRESETS), required=False, help_text="explore: fastest, cheapest or balanced (α, β)"
    )
    alpha = serializers.FloatField(required=False, min_value=0, help_text="explore: the weight of time (default 0.5)")
    beta = serializers.FloatField(required=False, min_value=0, help_text="explore: the weight of cost (default 0.5)")
    search_budget = serializers.DecimalField(
        **MONEY, help_text="explore: $ its trial runs may cost together (default: the platform's, FC2_EXPLORE_USD)"
    )
    search_minutes = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="explore: minutes its trial runs may take together (default: FC2_EXPLORE_MINUTES)",
    )
    # managed jobs' (whether each can be used is the service's to say: jobs.check_managed)
    max_restarts = serializers.IntegerField(
        default=0,
        min_value=0,
        max_value=jobs.MAX_RESTARTS,
        help_text="Times a lost node is replaced and training resumed from its latest checkpoint (default 0: fail)",
    )
    spot = serializers.BooleanField(default=False, help_text="aws: spot instances rather than on-demand")
    spot_max_price = serializers.DecimalField(**MONEY, help_text="spot: the most $/h an instance may cost")
    spot_fallback = serializers.ChoiceField(
        choices=Job.SpotFallback.choices,
        default=Job.SpotFallback.ON_DEMAND,
        help_text="spot without capacity: on-demand instances, or wait for spot",
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
        return self._search(data)

    def _search(self, data: dict) -> dict:
        """explore's fields: α and β from the preset or as given (search.weights, as the wizard and submit_job take
        them); refused with any other algorithm, which would ignore them."""
        given = [name for name in SEARCH_FIELDS if data.get(name) is not None]
        if data["algorithm"] != "explore":
            if given:
                raise serializers.ValidationError(
                    {given[0]: f"{given[0]} is explore's (algorithm explore), not {data['algorithm']}'s"}
                )
            return data
        try:  # (whether the weights and the budget can be used is the service's to say: jobs.check_search)
            data["alpha"], data["beta"] = search.weights(data.pop("preset", None), data.get("alpha"), data.get("beta"))
        except jobs.SubmitError as exc:
            raise serializers.ValidationError({exc.field or "algorithm": str(exc)}) from exc
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
