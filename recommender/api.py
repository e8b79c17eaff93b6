"""REST endpoint of the recommender: the same inputs and outputs as `manage.py recommend`, in the OpenAPI schema,
answered from the platform's performance records and the caller's own."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from django.http import QueryDict
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recommender import service
from recommender.explore import DEFAULT_WEIGHTS, PRESETS, weights
from recommender.types import (
    ALGORITHMS,
    MAX_BATCH_SIZE,
    MAX_LATENCY_MS,
    MAX_WORKERS,
    STRATEGIES,
    MissingProfilesError,
    RecommendationError,
    RecommendRequest,
    TrialsNeeded,
    strategy_request,
)

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema
    from drf_spectacular.utils import Direction


class TypeList(serializers.ListField):
    """A list of instance types: a JSON array, or one comma-separated string (handy in a query string)."""

    child = serializers.CharField(max_length=40)

    def to_internal_value(self, data: Any) -> list[Any]:
        if isinstance(data, str):
            data = [t.strip() for t in data.split(",") if t.strip()]
        return super().to_internal_value(data)


# Said once for the body's schema, the query's and the 400 answer (recommender.algorithms._check_limit enforces it).
LIMIT_RULE = (
    "Give at most one of budget and max_workers: both together are a 400. Cost-Opt, Time-Opt, Scala-Opt and "
    "Scala-Opt-M need one of them; lookup and model take either or neither."
)


class RecommendInput(serializers.Serializer):
    algorithm = serializers.ChoiceField(choices=ALGORITHMS)
    catalog = serializers.CharField(default=service.DEFAULT_CATALOG, max_length=50)
    workload = serializers.CharField(default="", allow_blank=True, max_length=100)
    budget = serializers.FloatField(
        required=False, min_value=0.0, help_text="Indicative budget C in $/h; not together with max_workers"
    )
    max_workers = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_WORKERS,
        help_text="A limit on the worker count; not together with budget",
    )
    ps_type = serializers.CharField(required=False, max_length=40)
    ps_types = TypeList(required=False, default=list, help_text="L^p")
    worker_types = TypeList(required=False, default=list, help_text="L^w")
    worker_type = serializers.CharField(required=False, max_length=40, help_text="Scala-Opt-M's worker type")
    batch_size = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BATCH_SIZE)
    latency_ms = serializers.FloatField(required=False, min_value=0.0, max_value=MAX_LATENCY_MS)
    saturation = serializers.FloatField(default=0.95, min_value=0.01, max_value=1.0, help_text="p")
    strategy = serializers.ChoiceField(
        choices=list(STRATEGIES),
        required=False,
        help_text="ps (the default): with a parameter server; mirrored: an All-Reduce cluster, no parameter server; "
        "auto: the model algorithm compares both; ddp: PyTorch's All-Reduce (DistributedDataParallel), the one "
        "strategy of a PyTorch workload (its key ends in @pytorch), and its default; the other framework's strategy "
        "is a 400",
    )
    alpha = serializers.FloatField(
        required=False, min_value=0.0, help_text="Weight of time (model, explore); default 1, explore's 0.5"
    )
    beta = serializers.FloatField(
        required=False, min_value=0.0, help_text="Weight of cost (model, explore); default 0, explore's 0.5"
    )
    preset = serializers.ChoiceField(
        choices=list(PRESETS), required=False, help_text="explore: what best means, instead of alpha and beta"
    )
    search_budget = serializers.FloatField(
        required=False, min_value=0.0, max_value=1e6, help_text="explore: $ its trial runs may cost"
    )
    search_minutes = serializers.FloatField(
        required=False, min_value=0.0, max_value=1e6, help_text="explore: minutes its trial runs may take"
    )
    epochs = serializers.IntegerField(
        required=False, min_value=1, max_value=1_000_000, help_text="explore: the job's epochs"
    )
    provider = serializers.CharField(
        required=False,
        max_length=40,
        help_text="explore: where its trials would run (lab, aws): a trial's minutes count that provider's start-up "
        "and teardown as this installation measured them; without it, a trial is its training window alone",
    )

    def validate_provider(self, provider: str) -> str:
        if service.trial_minutes(provider) is None:
            raise serializers.ValidationError(f"unknown provider {provider!r}")
        return provider

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("budget") is not None and attrs.get("max_workers") is not None:
            raise serializers.ValidationError("give either budget or max_workers, not both")
        if attrs.get("preset") is not None and (attrs.get("alpha") is not None or attrs.get("beta") is not None):
            raise serializers.ValidationError("give either preset or alpha and beta, not both")
        return attrs

    def to_request(self) -> RecommendRequest:
        data = dict(self.validated_data)
        data.pop("catalog")
        data.pop("provider", None)  # (a trial's length on it is counted at each answer: `trial_length`)
        default = DEFAULT_WEIGHTS.get(data["algorithm"], DEFAULT_WEIGHTS["model"])
        alpha, beta = weights(data.pop("preset", None), data.get("alpha"), data.get("beta"), default)
        data["alpha"], data["beta"] = alpha, beta
        data["search_dollars"] = data.pop("search_budget", None)
        data |= strategy_request(data.pop("strategy", ""), data["workload"])
        data["ps_types"] = tuple(data["ps_types"])
        data["worker_types"] = tuple(data["worker_types"])
        return RecommendRequest(**data)


class RecommendInputSchema(OpenApiSerializerExtension):
    """RecommendInput as drf-spectacular maps it, plus what validate() refuses: budget and max_workers together."""

    target_class = RecommendInput

    def map_serializer(self, auto_schema: AutoSchema, direction: Direction) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["not"] = {"required": ["budget", "max_workers"]}
        schema["description"] = LIMIT_RULE
        return schema


class CandidateOutput(serializers.Serializer):
    worker_type = serializers.CharField()
    workers = serializers.IntegerField()
    epoch_time_s = serializers.FloatField(allow_null=True)
    hourly_cost = serializers.FloatField()
    source = serializers.ChoiceField(choices=["measured", "predicted", "rule"])  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class


class RecordsOutput(serializers.Serializer):
    platform = serializers.IntegerField(help_text="The platform's records read (shipped, imported, promoted)")
    own = serializers.IntegerField(help_text="The caller's own records read (their jobs' measurements)")
    unusable = serializers.IntegerField(help_text="Records not read: a figure out of its physical bound")
    text = serializers.CharField(help_text='e.g. "12 platform records, 3 of yours"')


class RecommendationOutput(serializers.Serializer):
    algorithm = serializers.CharField()
    ps_type = serializers.CharField(allow_null=True)
    worker_type = serializers.CharField()
    workers = serializers.IntegerField()
    hourly_cost = serializers.FloatField()
    predicted_epoch_time_s = serializers.FloatField(allow_null=True)
    source = serializers.ChoiceField(choices=["measured", "predicted", "rule"])  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class
    candidates = CandidateOutput(many=True)
    explanation = serializers.CharField()
    pareto = CandidateOutput(many=True, required=False)
    model_error = serializers.FloatField(required=False, help_text="Cross-validated MAPE of the model")
    extra = serializers.DictField(required=False)
    records = RecordsOutput(required=False, help_text="Whose performance records the answer read")


class ErrorOutput(serializers.Serializer):
    error = serializers.CharField()
    fields = serializers.DictField(required=False, help_text="What is wrong with each field of an invalid request")  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class
    missing_profiles = serializers.ListField(child=serializers.DictField(), required=False)
    search = serializers.DictField(
        required=False,
        help_text="explore: the trial runs its search needs first — `next` (the trial to run now), the expected and "
        "the most $ and minutes, the predicted epoch time of the cluster believed best now",
    )


BAD_REQUEST = OpenApiResponse(ErrorOutput, description=f"Invalid or infeasible. {LIMIT_RULE}")


# Validating an input costs about a third of a lookup's answer (DRF builds the serializer's fields anew for each
# request; benchmarks/lookup_speed.py), and it is a pure function of the input: a valid input's request and catalogue
# are kept by the input's JSON text, which tells 1, 1.0, true and "1" apart as the serializer does. Invalid input is
# validated every time (the serializer words its errors), and so is a long one.
_valid_inputs: LRUCache[str, tuple[RecommendRequest, str, str | None]] = LRUCache(maxsize=1024)
_valid_inputs_lock = threading.Lock()
MAX_INPUT_CHARS = 2000


def input_key(data: object) -> str | None:
    """The input's key in `_valid_inputs` (a query string or form: every value of each field), or None.

    >>> input_key(QueryDict("algorithm=lookup&batch_size=64")) == input_key(QueryDict("batch_size=64&algorithm=lookup"))
    True
    >>> input_key({"max_workers": 1}) == input_key({"max_workers": True}), input_key({"note": "x" * 5000})
    (False, None)
    """
    try:
        key = json.dumps(sorted(data.lists()) if isinstance(data, QueryDict) else data, sort_keys=True)
    except (TypeError, ValueError):  # (a form's uploaded file)
        return None
    return key if len(key) <= MAX_INPUT_CHARS else None


def trial_length(request: RecommendRequest, provider: str | None) -> RecommendRequest:
    """explore's request with one trial's minutes on `provider` (its start-up and teardown as measured now), where
    one was named."""
    if request.algorithm != "explore" or provider is None:
        return request
    return replace(request, trial_minutes=service.trial_minutes(provider))


class RecommendView(APIView):
    """Recommend a cluster (FC² Cost-Opt / Time-Opt / Scala-Opt / Scala-Opt-M, Anwar's lookup, the model, or explore:
    a 400 with its search's estimate while the workload needs trial runs first)."""

    @extend_schema(request=RecommendInput, responses={200: RecommendationOutput, 400: BAD_REQUEST})
    def post(self, request: Request) -> Response:
        return self._answer(request.data)

    @extend_schema(parameters=[RecommendInput], responses={200: RecommendationOutput, 400: BAD_REQUEST})
    def get(self, request: Request) -> Response:
        return self._answer(request.query_params.dict())

    def _answer(self, data: Any) -> Response:
        key = input_key(data)
        with _valid_inputs_lock:
            valid = None if key is None else _valid_inputs.get(key)
        if valid is None:
            form = RecommendInput(data=data)
            if not form.is_valid():
                return Response({"error": "invalid request", "fields": form.errors}, status=400)
            valid = (form.to_request(), form.validated_data["catalog"], form.validated_data.get("provider"))
            if key is not None:
                with _valid_inputs_lock:
                    _valid_inputs[key] = valid
        try:
            # From the platform's records and the caller's own, never another user's (answer["records"] says whose).
            asked, catalog, provider = valid
            answer = service.recommend_as_dict(trial_length(asked, provider), catalog, owner=self.request.user)
        except RecommendationError as exc:
            body: dict[str, Any] = {"error": str(exc)}
            if isinstance(exc, MissingProfilesError):
                body["missing_profiles"] = [vars(p) for p in exc.missing]
            if isinstance(exc, TrialsNeeded):
                body["search"] = asdict(exc.search)
            return Response(body, status=400)
        return Response(answer)
