"""Recommender pages: Anwar's batch size + latency → machines page, the catalogue browser, and performance records
with the model's predicted-vs-measured plot and the epoch time against workers chart.

Each page shows the user the platform's records and their own, never another user's (recommender/service.py), and
reads its query string through a form: an invalid value is ignored, and the page says so."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from recommender import service
from recommender.models import Catalog, InstanceType, PerformanceRecord
from recommender.types import (
    MAX_BATCH_SIZE,
    MAX_LATENCY_MS,
    RecommendationError,
    RecommendRequest,
    key_conflict,
    strategy_request,
)


class LookupForm(forms.Form):
    workload = forms.ChoiceField()
    batch_size = forms.IntegerField(min_value=1, max_value=MAX_BATCH_SIZE, label="Batch size")
    latency_ms = forms.FloatField(min_value=0, max_value=MAX_LATENCY_MS, label="Network latency (ms)")
    # Anwar's runs were all-reduce: the answer comes from a workload's all-reduce runs unless the PS's are asked for
    # (a workload measured one way answers from its runs whichever is asked). Left blank, the all-reduce is the
    # workload key's framework's (mirrored, or a PyTorch workload's ddp): the other framework's is refused.
    strategy = forms.ChoiceField(
        choices=[
            ("", "All-reduce"),  # the workload key's framework's
            ("mirrored", "All-reduce (TensorFlow mirrored)"),
            ("ps", "Parameter server"),
            ("ddp", "All-reduce (PyTorch DDP)"),
        ],
        required=False,
        label="Strategy",
    )
    catalog = forms.ChoiceField(
        label="Catalogue", required=False, help_text="Prices the machines; empty: the one that has the records' types"
    )

    def __init__(self, *args: Any, owner: service.Owner = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        workload, catalog = self.fields["workload"], self.fields["catalog"]
        assert isinstance(workload, forms.ChoiceField) and isinstance(catalog, forms.ChoiceField)  # declared above
        self.workloads = service.workloads(owner)  # the owner's and the platform's, as the choices offer them
        workload.choices = [(w, w) for w in self.workloads]
        names = Catalog.objects.order_by("name").values_list("name", flat=True)
        catalog.choices = [("", "the records' own"), *((name, name) for name in names)]


@login_required
def anwar(request: HttpRequest) -> HttpResponse:
    """Anwar et al. Fig. 16–18: enter batch size and latency, get the number of machines for the fastest epoch (the
    `lookup` algorithm; the others answer in the wizard, the API and `fc2 recommend`)."""
    form = LookupForm(request.GET or None, owner=request.user)
    answer, error, options, catalog = None, None, {}, ""
    names = form.workloads
    # The workload asked for where it is one of the user's (the form says why another is refused), else the first.
    workload = form.data.get("workload") if form.data.get("workload") in names else (names or [""])[0]
    records = service.workload_records(workload, request.user) if workload else ()  # what an answer reads
    if not names:  # nothing to recommend from: the page says how to load records
        form = LookupForm(owner=request.user)
    elif form.is_bound and form.is_valid():
        data = form.cleaned_data
        catalog = data["catalog"] or service.records_catalog(records)
        lookup = RecommendRequest(
            algorithm="lookup",
            workload=data["workload"],
            batch_size=data["batch_size"],
            latency_ms=data["latency_ms"],
            **strategy_request(data["strategy"], data["workload"], omitted="mirrored"),
        )
        try:
            answer = service.recommend_as_dict(lookup, catalog, owner=request.user)
        except RecommendationError as exc:
            error = str(exc)
    if records:
        options = {
            "batch_sizes": sorted({r.batch_size for r in records if r.batch_size}),
            "latencies": sorted({r.latency_ms for r in records if r.latency_ms is not None}),
        }
    context = {"form": form, "answer": answer, "error": error, "catalog": catalog, **options}
    return render(request, "recommender/anwar.html", context)


class CatalogQuery(forms.Form):
    """The Catalogues page's query string: a value that is not one of these is ignored, and the page says so."""

    catalog = forms.CharField(required=False, max_length=50)
    q = forms.CharField(required=False, max_length=40)
    gpu = forms.ChoiceField(required=False, choices=[("", "all"), ("1", "with GPUs")])
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000)


def _query(form_class: type[forms.Form], request: HttpRequest) -> tuple[dict[str, Any], list[str]]:
    """The page's query parameters as `form_class` cleans them, each invalid one left out (its default), and what
    was left out and why, for the page to say."""
    form = form_class(request.GET)
    form.is_valid()
    ignored = [f"{name}: {' '.join(map(str, errors))}" for name, errors in form.errors.items()]
    values = {name: form.cleaned_data.get(name) for name in form.fields if name not in form.errors}
    return values, [f"Ignored {reason}" for reason in ignored]


@login_required
def catalogs(request: HttpRequest) -> HttpResponse:
    query, ignored = _query(CatalogQuery, request)
    all_catalogs = Catalog.objects.order_by("name")
    chosen = all_catalogs.filter(name=query.get("catalog") or "").first() or all_catalogs.first()
    types = chosen.types.all() if chosen else InstanceType.objects.none()
    if chosen and query.get("gpu") == "1":
        types = types.filter(gpus__gt=0)
    if chosen and (text := (query.get("q") or "").strip()):
        types = types.filter(name__icontains=text)
    page = Paginator(types, 50).get_page(query.get("page"))
    # EC2 compute units are published for older types only (none of today's AWS catalogues): the column is shown
    # where the catalogue has some, and a type without one reads "not published", never "variable".
    has_ecu = chosen is not None and chosen.types.filter(ecu__isnull=False).exists()
    context = {"catalogs": all_catalogs, "chosen": chosen, "page": page, "has_ecu": has_ecu, "ignored": ignored}
    return render(request, "recommender/catalogs.html", context)


# --- the records page's epoch time against workers chart (Anwar et al. Figs. 11–15, FC² Figs. 8–11) ---------------

NO_BATCH_SIZE = "none"  # the `batch_size` GET value of the records that name no batch size
RECORDS_PER_PAGE = 50
CHART_FIELDS = (
    "workers",
    "batch_size",
    "latency_ms",
    "ps_type",
    "instance_type",
    "strategy",
    "epoch_time_s",
    "bandwidth_mbps",
)


def batch_size_groups(batch_sizes: Iterable[int | None]) -> list[tuple[int | None, int]]:
    """Each batch size among the records with its number of records: sizes ascending, then None (naming none).

    >>> batch_size_groups([64, None, 6400, 64])
    [(64, 2), (6400, 1), (None, 1)]
    """
    counts = Counter(batch_sizes)
    return sorted(counts.items(), key=lambda group: (group[0] is None, group[0] or 0))


def chosen_batch_size(raw: str | None, groups: list[tuple[int | None, int]]) -> int | None:
    """The batch size the `batch_size` GET value names if some record has it, else the one with the most records
    (the smaller on a tie); None for the records that name none, or when there are no records.

    >>> groups = [(64, 2), (6400, 3), (None, 3)]
    >>> [chosen_batch_size(raw, groups) for raw in ("64", NO_BATCH_SIZE, None, "", "abc", "128", "-64")]
    [64, None, 6400, 6400, 6400, 6400, 6400]
    """
    present = [size for size, _ in groups]
    if raw == NO_BATCH_SIZE and None in present:
        return None
    if raw and raw.isascii() and raw.isdecimal() and len(raw) <= len(str(MAX_BATCH_SIZE)) and int(raw) in present:
        return int(raw)
    return max(groups, key=lambda group: group[1], default=(None, 0))[0]


def _series_parts(key: tuple) -> tuple[str, str, str, str]:
    latency_ms, ps_type, instance_type, strategy = key
    return (
        "latency –" if latency_ms is None else f"latency {latency_ms:g} ms",
        f"PS {ps_type or '–'}",
        instance_type or "worker type –",
        strategy or "strategy –",
    )


def epoch_time_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Epoch time against workers, one series per distinct (latency_ms, ps_type, instance_type, strategy) among `rows`
    (one batch size's records as plain values, keyed as PerformanceRecord's fields): the data of Anwar et al.'s
    Figs. 11–15 (a line per network latency) and FC²'s Figs. 8–11 (a line per parameter-server capacity).

    A point averages the measured runs at its worker count; one whose runs all failed has no epoch time (a gap, never
    0) and its worker count is in the series' `failed_workers` (`failed_runs` counts them all). A series' label names
    only what tells it from the others; what every series shares is `common`. Rows with no worker count, and bandwidth
    profiling rows (no epoch time but a bandwidth: not failed runs), make no point. `drawable`: some series has two
    measured worker counts.

    >>> chart = epoch_time_series([
    ...     {"workers": 2, "latency_ms": 0.0, "ps_type": "lab-ps-450", "epoch_time_s": 50.0},
    ...     {"workers": 1, "latency_ms": 0.0, "ps_type": "lab-ps-450", "epoch_time_s": 90.0},
    ...     {"workers": 1, "latency_ms": 40.0, "ps_type": "lab-ps-450", "epoch_time_s": 95.0},
    ...     {"workers": 2, "latency_ms": 40.0, "ps_type": "lab-ps-450", "epoch_time_s": None},
    ... ])
    >>> [(s["label"], [(p["workers"], p["epoch_time_s"]) for p in s["points"]], s["failed_workers"])
    ...  for s in chart["series"]]
    [('latency 0 ms', [(1, 90.0), (2, 50.0)], []), ('latency 40 ms', [(1, 95.0), (2, None)], [2])]
    >>> chart["common"], chart["failed_runs"], chart["drawable"]
    ('PS lab-ps-450', 1, True)
    """
    runs: dict[tuple, dict[int, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        epoch_time_s = row.get("epoch_time_s")
        if row.get("workers") is None or (epoch_time_s is None and row.get("bandwidth_mbps") is not None):
            continue
        key = (row.get("latency_ms"), *(row.get(field) or "" for field in ("ps_type", "instance_type", "strategy")))
        runs[key][row["workers"]].append(epoch_time_s)
    keys = sorted(runs, key=lambda k: (k[0] is None, k[0] or 0.0, *k[1:]))
    parts = [_series_parts(key) for key in keys]
    varying = [len({p[i] for p in parts}) > 1 for i in range(4)]
    if any(varying):  # labels name what tells the series apart; the caption names the rest, when it is known
        shown = varying
        shared = [part for i, part in enumerate(parts[0]) if not varying[i] and keys[0][i] not in (None, "")]
    else:  # one series: its label says all that is known of it
        shown = [key not in (None, "") for key in keys[0]] if keys else []
        shared = []
    series: list[dict[str, Any]] = []
    for key, named in zip(keys, parts, strict=True):
        points = []
        for workers, times in sorted(runs[key].items()):
            measured = [t for t in times if t is not None]
            epoch_time_s = round(fmean(measured), 3) if measured else None
            points.append(
                {
                    "workers": workers,
                    "epoch_time_s": epoch_time_s,
                    "runs": len(times),
                    "failed": len(times) - len(measured),
                }
            )
        label = " · ".join(part for part, show in zip(named, shown, strict=True) if show) or "epoch time"
        failed_workers = [p["workers"] for p in points if p["epoch_time_s"] is None]
        series.append({"label": label, "points": points, "failed_workers": failed_workers})
    return {
        "series": series,
        "common": " · ".join(shared),
        "failed_runs": sum(len(s["failed_workers"]) for s in series),
        "drawable": any(sum(p["epoch_time_s"] is not None for p in s["points"]) >= 2 for s in series),
    }


class RecordsQuery(forms.Form):
    """The Records page's query string. An invalid value is ignored (its default shown) and the page says so: a
    link to the page never fails, however it was edited."""

    workload = forms.CharField(required=False, max_length=PerformanceRecord._meta.get_field("workload").max_length)
    strategy = forms.ChoiceField(required=False, choices=[("", ""), *service.STRATEGY_LABELS.items()])
    batch_size = forms.RegexField(
        required=False,
        regex=rf"^({NO_BATCH_SIZE}|[0-9]{{1,{len(str(MAX_BATCH_SIZE))}}})$",
        error_messages={"invalid": f"a batch size is '{NO_BATCH_SIZE}' or a whole number up to {MAX_BATCH_SIZE}"},
    )
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000)


@login_required
def records(request: HttpRequest) -> HttpResponse:
    """A workload's records that the user may see — the platform's and their own, never another user's — whose each
    is, the model the recommender answers this user with, and epoch time against workers."""
    query, ignored = _query(RecordsQuery, request)
    names = service.workloads(request.user)
    workload = query.get("workload") or ""
    if workload not in names:  # (another user's workload is one the user has no records of, and says nothing more)
        if workload:
            ignored.append(f"No records of workload {workload!r} that you may see.")
        workload = names[0] if names else ""
    rows = PerformanceRecord.objects.filter(workload=workload).readable_by(service.owner_id(request.user))
    read = service.records_of(workload, request.user) if workload else None
    records = read.records if read else ()
    strategies = service.strategy_counts(records)
    strategy = query.get("strategy")
    if strategy and (conflict := key_conflict(workload, strategy)):
        ignored.append(f"Ignored strategy {strategy}: {conflict}.")
    strategy = strategy if strategy in strategies else max(strategies, key=lambda name: strategies[name], default="")
    report, error, catalog = None, None, service.records_catalog(records)
    if records:
        try:
            report = service.model_figures(records, strategy, catalog)
        except RecommendationError as exc:
            error = str(exc)
    if strategy and len(strategies) > 1:
        rows = rows.filter(strategy=strategy)
    # The chart draws what answers read: a figure out of its bound is no point to draw (nor JSON to write).
    values = list(rows.usable().values(*CHART_FIELDS))
    groups = batch_size_groups(v["batch_size"] for v in values)
    batch_size = chosen_batch_size(query.get("batch_size"), groups)
    chart = epoch_time_series(v for v in values if v["batch_size"] == batch_size)
    context = {
        "workloads": names,
        "workload": workload,
        "rows": Paginator(rows.select_related("owner"), RECORDS_PER_PAGE).get_page(query.get("page")),
        "whose": read.counts() if read else None,
        "ignored": ignored,
        "report": report,
        "error": error,
        "batch_sizes": [(NO_BATCH_SIZE if size is None else str(size), size, count) for size, count in groups],
        "batch_size": batch_size,
        "chart": chart,
        "strategies": [(value, service.STRATEGY_LABELS[value], count) for value, count in strategies.items()],
        "strategy": strategy,
        "strategy_label": service.STRATEGY_LABELS.get(strategy, ""),
        "catalog": catalog,
    }
    return render(request, "recommender/records.html", context)
