"""The API against its own OpenAPI schema: schemathesis loads /api/schema from the live Django app (its WSGI handler)
with a test user's personal token, and sends every operation bounded, derandomized examples — valid requests and
invalid ones — each answered with no 5xx and as the schema says (status code, content type, body).

Path ids are the ids hypothesis makes up, or, for half the examples, those of the user's own objects (a job with nodes,
a log and an artifact, a bundle, a dataset), and half the job submissions name the user's bundle and a built-in
dataset, so that the happy paths are exercised too. The node agents' report and checkpoint
endpoints are left out: they take a job's own token, not a user's (tests/test_api.py and tests/test_checkpoints.py
cover them).
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from fc2.models import Job, Node
from fc2.services import artifacts, datasets, tokens
from recommender.catalog import load_catalog
from tests.helpers import good_npz

EXAMPLES = 25  # per operation and generation mode
LEFT_OUT = {"/api/v1/jobs/{job_id}/report", "/api/v1/jobs/{job_id}/checkpoint"}
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]


@pytest.fixture
def wsgi_app(db):
    """The project's WSGI application, in the test's transaction: as Django's test client does, it must not close the
    database connection at the end of each request. Each answer is read and closed, as a WSGI server does (the test
    client schemathesis drives leaves a file download open)."""
    application = get_wsgi_application()

    def served(environ, start_response):
        answer = application(environ, start_response)
        try:
            return [b"".join(answer)]
        finally:
            answer.close()

    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield served
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def own_ids(alice, job) -> dict[str, int]:
    """Ids of the user's own objects, by the path parameter that names them."""
    load_catalog("fc2-2018")
    Node.objects.create(job=job, name="chief-0", role="chief", index=0, status=Node.Status.SUCCEEDED)
    # A spot job's two markets (fc2/services/pricing.py, bill), so that the answer's `rates` are checked too.
    spot = {"market": "spot", "hourly_cost": 0.0924, "started_at": "2026-11-03T10:00:00+00:00"}
    on_demand = {"market": "on-demand", "hourly_cost": 0.462, "started_at": "2026-11-03T11:00:00+00:00"}
    rates = [{**spot, "ended_at": on_demand["started_at"]}, {**on_demand, "ended_at": None}]
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED, metrics={"test_accuracy": 0.9}, rates=rates)
    artifacts.store_artifact(job, "logs/chief-0.log", b"epoch 1\n")
    model = artifacts.store_artifact(job, "model.keras", b"weights")
    dataset = datasets.store_upload(alice, good_npz())
    return {"job_id": job.pk, "artifact_id": model.pk, "bundle_id": job.bundle_id, "dataset_id": dataset.pk}


def test_every_operation_answers_as_its_schema_says(wsgi_app, alice, own_ids, settings):
    settings.FC2_API_SUBMIT_RATE = "100000/hour"  # the limit has its own test; here every submission is judged
    headers = {"Authorization": f"Token {tokens.create(alice, 'schemathesis')[1]}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema", wsgi_app, headers=headers)
    operations = [result.ok() for result in schema.get_all_operations()]
    checked = [operation for operation in operations if operation.path not in LEFT_OUT]
    assert len(checked) >= 18, [operation.label for operation in checked]

    for operation in checked:
        _check(operation, GenerationMode.POSITIVE, headers, own_ids)
        try:
            _check(operation, GenerationMode.NEGATIVE, headers, own_ids)
        except Unsatisfiable:
            # Nothing of it can be made invalid (e.g. GET /api/me takes no input).
            assert not _takes_input(operation), operation.label


def _takes_input(operation) -> bool:
    return bool(operation.body or operation.path_parameters or operation.query)


def _check(operation, mode: GenerationMode, headers: dict, own_ids: dict[str, int]) -> None:
    @hypothesis_settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), own=st.booleans())
    def run(case, own: bool) -> None:
        if own and case.path_parameters:
            case.path_parameters = {name: own_ids.get(name, value) for name, value in case.path_parameters.items()}
        if own and isinstance(case.body, dict) and "bundle" in case.body:  # a job that may be submitted
            case.body = {**case.body, "bundle": own_ids["bundle_id"], "dataset": "digits"}
        response = case.call(headers=headers)
        case.validate_response(response, checks=CHECKS, headers=headers)

    run()
