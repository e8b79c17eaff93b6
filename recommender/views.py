"""Recommender pages: Anwar's batch size + latency → machines page, the catalogue browser, and performance records
with the model's predicted-vs-measured plot."""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from recommender import perfmodel, service
from recommender.models import Catalog, PerformanceRecord
from recommender.types import RecommendationError, RecommendRequest


class LookupForm(forms.Form):
    workload = forms.ChoiceField()
    batch_size = forms.IntegerField(min_value=1, label="Batch size")
    latency_ms = forms.FloatField(min_value=0, label="Network latency (ms)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["workload"].choices = [(w, w) for w in service.workloads()]


@login_required
def anwar(request: HttpRequest) -> HttpResponse:
    """Anwar et al. Fig. 16–18: enter batch size and latency, get the number of machines for the fastest epoch."""
    form = LookupForm(request.GET or None)
    answer, error, options = None, None, {}
    if not form.fields["workload"].choices:  # nothing to recommend from: the page says how to load records
        form = LookupForm()
    elif form.is_bound and form.is_valid():
        data = form.cleaned_data
        lookup = RecommendRequest(
            algorithm="lookup", workload=data["workload"], batch_size=data["batch_size"], latency_ms=data["latency_ms"]
        )
        try:
            answer = service.as_dict(service.recommend(lookup))
        except RecommendationError as exc:
            error = str(exc)
    workload = form.data.get("workload") or (form.fields["workload"].choices or [("", "")])[0][0]
    if workload:
        rows = PerformanceRecord.objects.filter(workload=workload)
        options = {
            "batch_sizes": sorted({b for b in rows.values_list("batch_size", flat=True) if b}),
            "latencies": sorted({lat for lat in rows.values_list("latency_ms", flat=True) if lat is not None}),
        }
    return render(request, "recommender/anwar.html", {"form": form, "answer": answer, "error": error, **options})


@login_required
def catalogs(request: HttpRequest) -> HttpResponse:
    all_catalogs = Catalog.objects.order_by("name")
    chosen = all_catalogs.filter(name=request.GET.get("catalog")).first() or all_catalogs.first()
    types = chosen.types.all() if chosen else []
    if chosen and request.GET.get("gpu") == "1":
        types = types.filter(gpus__gt=0)
    if chosen and (query := request.GET.get("q", "").strip()):
        types = types.filter(name__icontains=query)
    page = Paginator(types, 50).get_page(request.GET.get("page"))
    return render(request, "recommender/catalogs.html", {"catalogs": all_catalogs, "chosen": chosen, "page": page})


@login_required
def records(request: HttpRequest) -> HttpResponse:
    names = service.workloads()
    workload = request.GET.get("workload") or (names[0] if names else "")
    rows = PerformanceRecord.objects.filter(workload=workload)
    report, error = None, None
    if workload:
        try:
            report = perfmodel.calibration_report(service.workload_records(workload), service.catalog_specs())
        except RecommendationError as exc:
            error = str(exc)
    context = {"workloads": names, "workload": workload, "rows": rows, "report": report, "error": error}
    return render(request, "recommender/records.html", context)
