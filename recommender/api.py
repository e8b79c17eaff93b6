"""REST endpoint of the recommender: the same inputs and outputs as `manage.py recommend`, in the OpenAPI schema."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from recommender import service
from recommender.types import ALGORITHMS, MissingProfilesError, RecommendationError, RecommendRequest


class TypeList(serializers.ListField):
    """A list of instance types: a JSON array, or one comma-separated string (handy in a query string)."""

    child = serializers.CharField(max_length=40)

    def to_internal_value(self, data):
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
        required=False, min_value=1, max_value=10_000, help_text="A limit on the worker count; not together with budget"
    )
    ps_type = serializers.CharField(required=False, max_length=40)
    ps_types = TypeList(required=False, default=list, help_text="L^p")
    worker_types = TypeList(required=False, default=list, help_text="L^w")
    worker_type = serializers.CharField(required=False, max_length=40, help_text="Scala-Opt-M's worker type")
    batch_size = serializers.IntegerField(required=False, min_value=1)
    latency_ms = serializers.FloatField(required=False, min_value=0.0)
    saturation = serializers.FloatField(default=0.95, min_value=0.01, max_value=1.0, help_text="p")
    strategy = serializers.ChoiceField(
        choices=["ps", "mirrored"], default="ps", help_text="mirrored: an All-Reduce cluster, no parameter server"
    )
    alpha = serializers.FloatField(default=1.0, min_value=0.0)
    beta = serializers.FloatField(default=0.0, min_value=0.0)

    def validate(self, attrs):
        if attrs.get("budget") is not None and attrs.get("max_workers") is not None:
            raise serializers.ValidationError("give either budget or max_workers, not both")
        return attrs

    def to_request(self) -> RecommendRequest:
        data = dict(self.validated_data)
        data.pop("catalog")
        data["parameter_server"] = data.pop("strategy") == "ps"
        data["ps_types"] = tuple(data["ps_types"])
        data["worker_types"] = tuple(data["worker_types"])
        return RecommendRequest(**data)


class RecommendInputSchema(OpenApiSerializerExtension):
    """RecommendInput as drf-spectacular maps it, plus what validate() refuses: budget and max_workers together."""

    target_class = RecommendInput

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["not"] = {"required": ["budget", "max_workers"]}
        schema["description"] = LIMIT_RULE
        return schema


class CandidateOutput(serializers.Serializer):
    worker_type = serializers.CharField()
    workers = serializers.IntegerField()
    epoch_time_s = serializers.FloatField(allow_null=True)
    hourly_cost = serializers.FloatField()
    source = serializers.ChoiceField(choices=["measured", "predicted", "rule"])


class RecommendationOutput(serializers.Serializer):
    algorithm = serializers.CharField()
    ps_type = serializers.CharField(allow_null=True)
    worker_type = serializers.CharField()
    workers = serializers.IntegerField()
    hourly_cost = serializers.FloatField()
    predicted_epoch_time_s = serializers.FloatField(allow_null=True)
    source = serializers.ChoiceField(choices=["measured", "predicted", "rule"])
    candidates = CandidateOutput(many=True)
    explanation = serializers.CharField()
    pareto = CandidateOutput(many=True, required=False)
    model_error = serializers.FloatField(required=False, help_text="Cross-validated MAPE of the model")
    extra = serializers.DictField(required=False)


class ErrorOutput(serializers.Serializer):
    error = serializers.CharField()
    fields = serializers.DictField(required=False, help_text="What is wrong with each field of an invalid request")
    missing_profiles = serializers.ListField(child=serializers.DictField(), required=False)


BAD_REQUEST = OpenApiResponse(ErrorOutput, description=f"Invalid or infeasible. {LIMIT_RULE}")


class RecommendView(APIView):
    """Recommend a cluster (FC² Cost-Opt / Time-Opt / Scala-Opt / Scala-Opt-M, Anwar's lookup, or the model)."""

    @extend_schema(request=RecommendInput, responses={200: RecommendationOutput, 400: BAD_REQUEST})
    def post(self, request: Request) -> Response:
        return self._answer(request.data)

    @extend_schema(parameters=[RecommendInput], responses={200: RecommendationOutput, 400: BAD_REQUEST})
    def get(self, request: Request) -> Response:
        return self._answer(request.query_params.dict())

    def _answer(self, data) -> Response:
        form = RecommendInput(data=data)
        if not form.is_valid():
            return Response({"error": "invalid request", "fields": form.errors}, status=400)
        try:
            answer = service.recommend(form.to_request(), form.validated_data["catalog"])
        except RecommendationError as exc:
            body = {"error": str(exc)}
            if isinstance(exc, MissingProfilesError):
                body["missing_profiles"] = [vars(p) for p in exc.missing]
            return Response(body, status=400)
        return Response(service.as_dict(answer))
