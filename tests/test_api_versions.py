"""The API's version in its URL (docs/API.md): every route of the API answers at /api/v1/ and, the same, at the
unversioned /api/ (v1's aliases, which clients and node agents of earlier releases call); the schema documents v1."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.helpers import Api, job_row

ALIASES, V1 = "api/", "api/v1/"


def routes(patterns=None, prefix: str = "") -> dict[str, URLPattern]:
    """Every route of the site by its full pattern (e.g. `api/v1/jobs/<int:job_id>`), walking the resolver."""
    found = {}
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        pattern = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            found.update(routes(entry.url_patterns, pattern))
        else:
            found[pattern] = entry
    return found


def api_routes() -> dict[str, URLPattern]:
    """The API's routes, by their pattern after the version prefix (the catch-all 404 is no route of its own)."""
    return {pattern.removeprefix(V1): entry for pattern, entry in routes().items() if pattern.startswith(V1)}


def test_every_route_under_api_has_its_v1_twin_and_back():
    """A route added under /api/ alone (or under /api/v1/ alone) fails here: the aliases are v1, route for route."""
    every = routes()
    aliases = {
        pattern.removeprefix(ALIASES): entry
        for pattern, entry in every.items()
        if pattern.startswith(ALIASES) and not pattern.startswith(V1)
    }
    versioned = api_routes()

    assert aliases, "no route under /api/"
    assert set(aliases) == set(versioned)
    for rest, entry in aliases.items():
        assert (entry.callback, entry.name) == (versioned[rest].callback, versioned[rest].name), rest
    assert not [p for p in every if p.startswith("^api/") and "(?P<rest>" not in p], "a regex route under the API"


def concrete(route: str, ids: dict[str, int]) -> str:
    """The route's pattern with its parameters filled in (`jobs/<int:job_id>` → `jobs/7`)."""
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(ids[m.group(1)]), route)


@pytest.mark.django_db
def test_every_route_answers_the_same_on_both_paths(client, alice):
    api = Api(client, alice)
    job = job_row(alice)
    ids = {"job_id": job.pk, "bundle_id": job.bundle_id, "dataset_id": job.dataset_id, "artifact_id": 1}
    routes_ = api_routes()
    assert {"me", "recommend", "bundles", "datasets", "jobs", "jobs/<int:job_id>/report", "schema", "docs"} <= set(
        routes_
    )

    for route in routes_:
        path = concrete(route, ids)
        aliased, versioned = api.get(f"/{ALIASES}{path}"), api.get(f"/{V1}{path}")

        assert aliased.status_code == versioned.status_code, path
        assert aliased.get("Location") == versioned.get("Location"), path
        assert aliased.content == versioned.content, path


@pytest.mark.django_db
def test_a_path_of_no_version_is_the_apis_404(client, alice):
    api = Api(client, alice)

    for path in ("/api/v2/me", "/api/v1/no-such", "/api/v1/jobs/x"):
        response = api.get(path)
        assert (response.status_code, response.json()) == (404, {"error": f"no API endpoint {path}"})


@pytest.mark.django_db
def test_the_schema_documents_the_v1_paths(client, alice):
    schema = Api(client, alice).get("/api/v1/schema", format="json").json()

    documented = set(schema["paths"])
    assert documented == {"/" + V1 + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", r) for r in api_routes()} - {
        "/api/v1/schema",
        "/api/v1/docs",
    }
    assert reverse("api-schema") == "/api/v1/schema"  # the reference page loads the v1 schema
