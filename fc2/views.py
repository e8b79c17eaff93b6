"""Pages: job list, job page with its live part and chart series, cancel, artifact download, health check."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Prefetch
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

import provisioner
from fc2 import query
from fc2.job_lists import filter_jobs
from fc2.models import Artifact, Job, is_platform_admin
from fc2.services import managed, monitoring, pipeline, pricing, profiling, search
from monitor import series
from monitor.models import NodeSample


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


# The job page's charts: `metric` is the key of a point in the series JSON (`loss` is the chief's loss curve).
JOB_CHARTS = [
    {"id": "cpu", "metric": "cpu_percent", "unit": "%", "title": "CPU (%, 100 = one core)",
     "description": "CPU use of each node's training processes over time; 100 % is one full core.",
     "empty": "No CPU samples yet."},
    {"id": "memory", "metric": "memory_mb", "unit": "MB", "title": "Memory (MB)",
     "description": "Resident memory of each node's training processes over time.",
     "empty": "No memory samples yet."},
    {"id": "gpu", "metric": "gpu_percent", "unit": "%", "title": "GPU (%)",
     "description": "GPU utilisation of each node over time, for nodes that have a GPU.",
     "empty": "No GPU reported by these nodes."},
    {"id": "recv", "metric": "recv_mbps", "unit": "Mbps", "title": "Network in (Mbps)",
     "description": "Megabits per second each node received, between consecutive reports.",
     "empty": "Needs two reports from a node."},
    {"id": "sent", "metric": "sent_mbps", "unit": "Mbps", "title": "Network out (Mbps)",
     "description": "Megabits per second each node sent, between consecutive reports.",
     "empty": "Needs two reports from a node."},
    {"id": "loss", "metric": "loss", "unit": "", "title": "Training loss",
     "description": "The chief's training loss by training step.",
     "empty": "No loss reported yet."},
]  # fmt: skip


def job_charts(provider: provisioner.Provider | None) -> list[dict]:
    """The job page's charts, each saying why it is empty as it is on this provider: a provider whose nodes share the
    machine's network (local) measures no node's own traffic, however many reports come."""
    if provider is None or provider.own_network:
        return JOB_CHARTS
    unmeasured = (
        f"Not measured on {provider.label}: its nodes share this machine's network, so no node's own traffic can be "
        "told apart."
    )
    return [{**chart, "empty": unmeasured} if chart["id"] in ("recv", "sent") else chart for chart in JOB_CHARTS]


def _visible_job(request: HttpRequest, job_id: int) -> Job:
    # Someone else's job is a 404, not a 403: its existence is not ours to reveal.
    return get_object_or_404(
        Job.objects.visible_to(request.user).select_related("bundle", "dataset", "owner"), pk=job_id
    )


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    jobs, job_filters = filter_jobs(request, Job.objects.visible_to(request.user))
    page = Paginator(jobs, 25).get_page(request.GET.get("page"))
    context = {"page": page, **job_filters, "show_owner": is_platform_admin(request.user)}
    return render(request, "fc2/job_list.html", context)


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    try:
        job = _visible_job(request, job_id)
    except Http404:
        # The site's own page, DEBUG on too (Django's debug 404 would list every URL pattern): a job that does not
        # exist and one that is someone else's read the same.
        context = {
            "heading": f"No job {job_id}",
            "explanation": f"There is no job {job_id} among the jobs you can see.",
        }
        return render(request, "404.html", context, status=404)
    return render(request, "fc2/job_detail.html", _job_context(job))


@login_required
def job_live(request: HttpRequest, job_id: int) -> HttpResponse:
    """The live part of the job page, polled by htmx while the job is active (results and timeline out of band)."""
    job = _visible_job(request, job_id)
    return render(request, "fc2/_job_live.html", {**_job_context(job), "oob": True})


def _job_context(job: Job) -> dict:
    # A fixed number of queries however many nodes and samples: each node's latest two samples come in one query.
    latest = Prefetch(
        "samples", queryset=NodeSample.objects.order_by("-measured_at", "-pk")[:2], to_attr="latest_samples"
    )
    nodes = list(job.nodes.prefetch_related(latest))
    for node in nodes:
        node.latest, node.sent_mbps, node.recv_mbps = series.latest_reading(node.latest_samples)
    asked = job.requested_strategy
    return {
        "job": job,
        # A Manual job's cluster is its user's from the start: the page shows it before the recommend step copies it.
        "asked_strategy": Job.Strategy(asked).label if asked in Job.Strategy.values else asked,
        "events": job.events.all(),
        "nodes": nodes,
        "logs": [node for node in nodes if node.log_tail],
        "artifacts": job.artifacts.all(),
        "charts": job_charts(provisioner.PROVIDERS.get(job.provider)),
        "can_cancel": job.state in pipeline.CANCELLABLE,
        "provider": provisioner.PROVIDERS.get(job.provider),
        "figures": monitoring.page_figures(job),
        "search": (found := search.of_job(job)),
        # explore's trials are runs of the job too: the one under way is said as the search's, not as a profiling run
        "profiling": None if found else profiling.progress(job),
        "projection": pricing.projection(job),
        "managed": managed.of_job(job),  # restarts, spot, checkpoints: for a job that asked for them
    }


class SeriesQuery(forms.Form):
    since = query.DateTimeField(required=False)


@login_required
def job_series(request: HttpRequest, job_id: int) -> JsonResponse:
    """The charts' data: per-node resource points and the loss curve, newer than `?since=` (the last `until`); the
    job's progress, its costs so far and projected, and its run figures and alerts (monitor/figures.py)."""
    job = _visible_job(request, job_id)
    query = SeriesQuery(request.GET)
    if not query.is_valid():  # the answer depends on it: a chart must not take every point for the new ones
        return JsonResponse({"error": f"since: {' '.join(query.errors['since'])}"}, status=400)
    data = monitoring.job_series(job, query.cleaned_data["since"])
    return JsonResponse(
        {
            "job": job.pk,
            "state": job.state,
            "active": not job.is_terminal,
            **data,
            "progress": {
                "percent": job.progress_percent,
                **{key: getattr(job, key) for key in ("epoch", "epochs", "step", "steps", "loss")},
            },
            "cost": pricing.cost_summary(job),
            "figures": monitoring.job_figures(job),
        }
    )


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    # Answers at once: the teardown runs in the background, the job shown as cancelling until its cluster is gone.
    job = _visible_job(request, job_id)
    if pipeline.cancel(job, by=request.user.get_username()):
        messages.success(request, f"Job {job.pk} cancelled; its cluster is being torn down.")
        return redirect(job)
    job.refresh_from_db()
    if job.state == Job.State.COLLECTING:
        messages.info(request, f"Job {job.pk} has finished training; its results are being collected.")
    else:
        messages.info(request, f"Job {job.pk} had already ended ({job.state}).")
    return redirect(job)


@login_required
def artifact_download(request: HttpRequest, job_id: int, artifact_id: int) -> FileResponse:
    job = _visible_job(request, job_id)
    artifact = get_object_or_404(Artifact, pk=artifact_id, job=job)
    if artifact.not_kept:
        raise Http404(f"{artifact.name} was not kept: {artifact.not_kept}")
    filename = artifact.name.replace("/", "_")
    return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=filename)
