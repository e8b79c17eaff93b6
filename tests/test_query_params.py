"""Every query parameter is input: each GET page and API endpoint answers a hostile value of any parameter it reads
with its page, a 4xx or the value ignored with a message, never a 500.

The walk covers every URL pattern of the site (the test fails on one it cannot fill in), and for each one the
parameters its view reads, found by recording what it asks of the query string (a `?name=` read only after another
one is valid is listed by hand in EXTRA), each sent with every value of HOSTILE and then all at once.
"""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.core.files.base import ContentFile
from django.core.handlers.wsgi import WSGIRequest
from django.http import QueryDict
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from django.utils.http import urlencode

from fc2.models import Artifact, JobEvent, Node
from fc2.services import tokens
from fc2.wizard.state import STEPS
from monitor.models import NodeSample
from tests.helpers import job_row, make_bundle, make_dataset


class RawValue(str):
    """A value sent as it is written, not percent-encoded (`%ff`: a byte that is not UTF-8)."""


# Values no form would send, one of each kind: digits other than ASCII's, NUL, numbers past a bigint and past
# Python's 4,300-digit int conversion, negative, blank, a float past any, dates that do not exist or that cannot be
# moved to UTC, the last day there is, long text, a sort key that sorts nothing; a name given twice; bytes not UTF-8.
HOSTILE = [
    "²", "١٢", "\x00", "9" * 5000, "9" * 40, "-1", "", " ", "1e400", "NaN", "2026-02-30", "2026-02-30T10:00:00",
    "9999-12-31", "0001-01-01T00:00:00+23:59", "x" * 10_000, "-id", ["²", "1"], ["1", "2"], RawValue("%ff"),
]  # fmt: skip
# The admin's pages are Django's own, walked with fewer values: each of them is slow to draw.
ADMIN_HOSTILE = ["²", "\x00", "9" * 40, "", "-1", "2026-02-30", ["1", "2"]]
# The query names the admin reads (its changelists read every name as a filter); the change page's alone.
ADMIN_CHANGELIST = ["q", "o", "p", "e", "all", "_popup", "_to_field", "state__exact"]
ADMIN_CHANGE = ["_popup", "_to_field", "_changelist_filters"]

# Parameters a view reads only in some state, or all at once (`.dict()`): not found by recording what it asks for.
EXTRA = {
    "job-new": ["from"],
    "recommender-catalogs": ["catalog", "gpu", "q", "page"],
    "recommender-records": ["workload", "strategy", "batch_size", "page"],
    "api-recommend": ["algorithm", "catalog", "workload", "budget", "max_workers", "batch_size", "latency_ms"],
}
# Parameters the walk must find for these views, so that a view that stops being read (or a recorder that stops
# recording) cannot pass unnoticed.
EXPECTED = {
    "job-series": {"since"},
    "dashboard": {"q", "sort", "page", "state", "created_from"},
    "job-new-recommendation": {"provider", "worker_types"},
    "job-new-step": {"provider", "worker_types"},
    "job-list": {"state", "page"},
    "home": {"state", "q", "kind", "jobs_page"},
    "api-jobs": {"state", "page", "page_size"},
    "api-job-logs": {"node", "since"},
}


class RecordingQueryDict(QueryDict):
    """A query string that remembers which names were asked of it."""

    asked: set[str]

    def _note(self, key):
        self.__dict__.setdefault("asked", set()).add(key)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def getlist(self, key, default=None):
        self._note(key)
        return super().getlist(key, default)


@pytest.fixture
def recorded(monkeypatch) -> set[str]:
    """The query names views ask for from now on (Django's request, whose `GET` DRF's `query_params` is too)."""
    asked: set[str] = set()

    def get(request):
        if not hasattr(request, "_recorded_get"):
            query = RecordingQueryDict(request.META.get("QUERY_STRING", ""), encoding=request._encoding)
            query.asked = asked
            request._recorded_get = query
        return request._recorded_get

    monkeypatch.setattr(WSGIRequest, "GET", property(get, lambda request, value: None))
    return asked


@pytest.fixture
def site(db, alice, django_user_model):
    """A job of alice's with nodes, samples, events and an artifact; her bundle, dataset and token; an admin."""
    root = django_user_model.objects.create_user("root", "root@example.com", "root-password-1", is_staff=True)
    root.is_superuser = True
    root.save()
    bundle, dataset = make_bundle(alice, "walk"), make_dataset(alice, "walk-data")
    job = job_row(alice, bundle, dataset, state="succeeded", provider="local", workers=1)
    node = Node.objects.create(job=job, name="worker-0", role="worker", index=0, status=Node.Status.SUCCEEDED)
    NodeSample.objects.create(node=node, measured_at=timezone.now(), cpu_percent=50.0)
    JobEvent.objects.create(job=job, state="succeeded", message="walked")
    artifact = Artifact(job=job, node=node, name="worker-0/model.txt", size_bytes=2)
    artifact.file.save("model.txt", ContentFile(b"ok"), save=True)
    token_row, token = tokens.create(alice, "walk")
    return {"root": root, "alice": alice, "job": job, "artifact": artifact, "bundle": bundle, "dataset": dataset,
            "token": token, "token_row": token_row}  # fmt: skip


def patterns(resolvers=None, prefix="", namespace=""):
    """(name, route, pattern) of every URL pattern, admin's included."""
    for entry in resolvers if resolvers is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from patterns(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            yield f"{namespace}{entry.name}" if entry.name else None, prefix + str(entry.pattern), entry


# The site's URL patterns by name (the unnamed by route), and the admin's pages of our apps' models by model: each is
# walked in a test of its own.
ROUTES = {
    **{name or route: entry for name, route, entry in patterns() if not route.startswith("admin/")},
    **{f"admin:{model._meta.label_lower}": model for model in admin.site._registry if model._meta.app_label != "auth"},
    "admin:index": None,
}
PAGES_FOR_ADMINS = {"dashboard"}


def paths(route: str, site: dict) -> list[tuple[str, list[str]]]:
    """The paths of URL pattern `route`, its arguments filled with the site's rows (the test fails on a pattern it
    cannot fill), each with the query names known to be read there besides those recorded."""
    entry = ROUTES[route]
    if route == "admin:index":
        return [(reverse(route), [])]
    if route.startswith("admin:"):
        prefix, first = f"admin:{entry._meta.app_label}_{entry._meta.model_name}", entry.objects.order_by("pk").first()
        change = [(reverse(f"{prefix}_change", args=[first.pk]), ADMIN_CHANGE)] if first else []
        return [(reverse(f"{prefix}_changelist"), ADMIN_CHANGELIST), *change]
    if route == "^api/(?P<rest>.*)$":  # the API's answer to a path it does not have
        return [("/api/nothing", [])]
    if route == "job-new-step":
        return [(reverse(route, args=[step]), []) for step in STEPS]
    arguments = {
        "job_id": site["job"].pk, "artifact_id": site["artifact"].pk, "token_id": site["token_row"].pk,
        "bundle_id": site["bundle"].pk, "dataset_id": site["dataset"].pk, "uidb64": "MQ", "token": "set-password",
    }  # fmt: skip
    if "kind" in entry.default_args:
        arguments["pk"] = site[entry.default_args["kind"]].pk
    keys = (entry.pattern.converters.keys() | set(entry.pattern.regex.groupindex)) - set(entry.default_args)
    assert keys <= arguments.keys(), f"the walk cannot fill in {route}'s {keys - arguments.keys()}"
    return [(reverse(route, kwargs={key: arguments[key] for key in keys}), EXTRA.get(route, []))]


def answer(client: Client, path: str, query: dict, headers: dict) -> str | None:
    """None when the answer is not a server error, else what went wrong."""
    raw = {name: value for name, value in query.items() if isinstance(value, RawValue)}
    encoded = urlencode({name: value for name, value in query.items() if name not in raw}, doseq=True)
    url = f"{path}?{'&'.join([encoded, *(f'{name}={value}' for name, value in raw.items())]).strip('&')}"
    try:
        response = client.get(url, headers=headers)
    except Exception as exc:  # the test client raises what the view raised: that is a 500
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    if response.streaming:  # read to its end, which closes the file it holds open
        b"".join(response.streaming_content)
    if response.status_code >= 500:
        return f"HTTP {response.status_code}"
    return None


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_no_query_value_makes_a_server_error(route, site, client, recorded):
    admin_page = route.startswith("admin:")
    client.force_login(site["root"] if admin_page or route in PAGES_FOR_ADMINS else site["alice"])
    if route.startswith("job-new"):
        client.get(reverse("job-new") + f"?from={site['job'].pk}")  # the wizard holds a job: its every step is open
    headers = {"Authorization": f"Token {site['token']}"} if route.startswith("api") else {}
    failures, read = [], set()
    for path, known in paths(route, site):
        recorded.clear()
        if error := answer(client, path, {}, headers):
            failures.append((path, "", "", error))
        names = sorted(set(known) if admin_page else recorded | set(known))
        read |= set(names)
        for name in names:
            for value in ADMIN_HOSTILE if admin_page else HOSTILE:
                if error := answer(client, path, {name: value}, headers):
                    failures.append((path, name, repr(value)[:40], error))
        for value in ("²", "\x00", "9" * 5000) if names else ():  # every name at once
            if error := answer(client, path, dict.fromkeys(names, value), headers):
                failures.append((path, "all", repr(value)[:40], error))
    assert EXPECTED.get(route, set()) - read == set()
    assert not failures, "\n".join(" | ".join(failure) for failure in failures)
