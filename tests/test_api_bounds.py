"""Every JSON body the platform reads is bounded in depth (a 400, never a RecursionError's 500), and a job's parameters
are bounded in count and size at every door — the API, the wizard's form, `manage.py submit_job` — with the reason,
instead of failing the job when its nodes start."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from fc2.jsonbounds import MAX_JSON_DEPTH, json_depth, loads
from fc2.models import Job
from fc2.services import jobs
from fc2.wizard.forms import ParametersField
from tests.conftest import call_json
from tests.helpers import Api, post_report, start_running


@pytest.fixture
def api(client, alice) -> Api:
    return Api(client, alice)


def nested(depth: int) -> str:
    """`depth` arrays, one inside the other, around an object (JSON that is valid, however deep)."""
    return "[" * depth + "{}" + "]" * depth


# --- JSON bodies ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "depth"),
    [
        (1, 0),
        ("x", 0),
        ([], 1),
        ({}, 1),
        ({"a": [1, {"b": []}]}, 4),
        ([[], [[[]]], []], 4),
        (json.loads(nested(9)), 10),
    ],
)
def test_json_depth(data, depth):
    assert json_depth(data) == depth


def test_loads_refuses_what_is_too_deep_as_bad_json():
    assert loads(nested(MAX_JSON_DEPTH - 1)) == json.loads(nested(MAX_JSON_DEPTH - 1))
    for depth in (MAX_JSON_DEPTH, 5_000, 100_000):
        with pytest.raises(ValueError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            loads(nested(depth))


ENDPOINTS = ["/api/jobs", "/api/datasets", "/api/recommend", "/api/jobs/{job}/rerun", "/api/jobs/{job}/cancel"]


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("body", [b"[" * 100_000, nested(100_000).encode(), nested(MAX_JSON_DEPTH).encode()])
def test_a_json_body_nested_too_deep_is_400_at_every_endpoint(api, job, path, body):
    response = api.client.post(path.format(job=job.pk), body, content_type="application/json", headers=api.headers)

    if path.endswith(("/rerun", "/cancel")):  # a body these do not read: no parse, no harm
        assert response.status_code in (201, 200), response.json()
        return
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"].startswith("JSON parse error - ")
    if body.startswith(b"[{") or body.count(b"{") == 1:
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in response.json()["error"]


def test_a_json_body_at_the_depth_bound_is_read(api, bundle, digits):
    """64 levels are a body like any other: judged field by field (here `parameters` is no object)."""
    body = f'{{"bundle": {bundle.pk}, "dataset": "digits", "parameters": {nested(MAX_JSON_DEPTH - 2)}}}'

    response = api.client.post("/api/jobs", body, content_type="application/json", headers=api.headers)

    assert response.status_code == 400
    assert response.json()["fields"]["parameters"] == ['Expected a dictionary of items but got type "list".']


def test_multipart_parameters_nested_too_deep_are_a_field_error(api, example_wheel, settings):
    wheel = SimpleUploadedFile(example_wheel.name, example_wheel.read_bytes())
    form = {"dataset": "digits", "parameters": nested(100_000), "bundle_file": wheel}

    response = api.client.post("/api/jobs", form, headers=api.headers)

    assert response.status_code == 400
    assert "nested deeper than 64 levels" in response.json()["fields"]["parameters"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 100_000])
@pytest.mark.parametrize("content_type", ["application/json", "multipart/form-data"])
def test_a_node_report_nested_too_deep_is_400(client, job, depth, content_type):
    token = start_running(job)
    report = {"node": "chief-0", "status": "running", "progress": {"step": 1}, "deep": json.loads(nested(50))}
    text = json.dumps(report).replace('"deep": ' + json.dumps(json.loads(nested(50))), '"deep": ' + nested(depth))
    if content_type == "multipart/form-data":
        response = client.post(
            f"/api/jobs/{job.pk}/report", {"report": text}, headers={"Authorization": f"Bearer {token}"}
        )
    else:
        response = post_report(client, job.pk, text, token)

    assert response.status_code == 400
    assert response.json() == {"error": "invalid report", "detail": f"nested deeper than {MAX_JSON_DEPTH} levels"}


# --- parameters -------------------------------------------------------------------------------------------------------

REFUSED_PARAMETERS = [
    ({f"p{i}": "1" for i in range(101)}, "at most 100 parameters (not 101)"),
    ({"bad name": "1"}, "parameter name 'bad name' must be letters, digits, '_' or '-'"),
    ({"épochs": "1"}, "parameter name 'épochs' must be letters, digits, '_' or '-'"),
    ({"": "1"}, "parameter name '' must be letters, digits, '_' or '-'"),
    ({"x" * 65: "1"}, f"parameter name '{'x' * 64}…' is longer than 64 characters"),
    ({"-x": "1"}, "parameter name '-x' must begin with a letter, a digit or '_'"),
    ({"lr": "1" * 1001}, "parameter 'lr': a value has at most 1,000 characters (not 1,001)"),
    ({"lr": "0.1\0"}, "parameter 'lr': a value may not hold control characters"),
    ({"lr": "0.1\n--epochs=1000"}, "parameter 'lr': a value may not hold control characters"),
    ({"lr": "\x1b[2J"}, "parameter 'lr': a value may not hold control characters"),
]
ACCEPTED_PARAMETERS = [
    {f"p{i}": "1" for i in range(100)},
    {"x" * 64: "y" * 1000, "_private": "", "steps_per_epoch": "3", "2d": "yes", "model-name": "résumé ünïcode"},
]


@pytest.mark.parametrize(("parameters", "reason"), REFUSED_PARAMETERS)
def test_parameters_out_of_bounds_are_refused(parameters, reason):
    with pytest.raises(jobs.SubmitError, match="^" + reason.replace("(", r"\(").replace(")", r"\)")) as refused:
        jobs.check_parameters(parameters)
    assert refused.value.field == "parameters"


@pytest.mark.parametrize("parameters", ACCEPTED_PARAMETERS)
def test_parameters_within_bounds_are_taken(parameters):
    jobs.check_parameters(parameters)


@pytest.mark.parametrize(("parameters", "reason"), REFUSED_PARAMETERS[:2] + REFUSED_PARAMETERS[4:7])
def test_the_api_refuses_them_naming_the_field(api, bundle, digits, parameters, reason):
    response = api.post("/api/jobs", {"bundle": bundle.pk, "dataset": "digits", "parameters": parameters})

    assert response.status_code == 400
    assert response.json()["fields"]["parameters"][0].startswith(reason)
    assert not Job.objects.exists()


def test_the_api_refuses_a_nul_or_a_line_break_in_a_value(api, bundle, digits):
    for value in ("0.1\0", "0.1\n--epochs=1000", "a\tb"):
        response = api.post("/api/jobs", {"bundle": bundle.pk, "dataset": "digits", "parameters": {"lr": value}})
        assert response.status_code == 400, value
        assert response.json()["fields"]["parameters"], value
    assert not Job.objects.exists()


@pytest.mark.parametrize(("parameters", "reason"), REFUSED_PARAMETERS[:1] + REFUSED_PARAMETERS[4:])
def test_the_wizard_refuses_them_beside_the_field(parameters, reason):
    from django import forms

    with pytest.raises(forms.ValidationError) as refused:
        ParametersField().clean(list(parameters.items()))
    assert refused.value.messages[0].startswith(reason)


def test_submit_job_refuses_them(example_wheel, alice, digits):
    code, answer, _ = call_json(
        "submit_job",
        "--bundle",
        str(example_wheel),
        "--dataset",
        "digits",
        "--user",
        "alice",
        "--param",
        f"{'x' * 65}=1",
    )

    assert code != 0 and "is longer than 64 characters" in answer["error"]
    assert not Job.objects.exists()
