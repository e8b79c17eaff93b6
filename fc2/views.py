"""Pages: job list, submission form, job page with its live part, cancel, artifact download, health check."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import connection
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from fc2.bundles import BundleError
from fc2.forms import JobForm
from fc2.models import Artifact, Job, is_platform_admin
from fc2.services import datasets, jobs, pipeline


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


def _visible_job(request: HttpRequest, job_id: int) -> Job:
    # Someone else's job is a 404, not a 403: its existence is not ours to reveal.
    return get_object_or_404(
        Job.objects.visible_to(request.user).select_related("bundle", "dataset", "owner"), pk=job_id
    )


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    queryset = Job.objects.visible_to(request.user).select_related("owner", "dataset", "bundle")
    state = request.GET.get("state")
    if state in Job.State.values:
        queryset = queryset.filter(state=state)
    page = Paginator(queryset, 25).get_page(request.GET.get("page"))
    context = {"page": page, "states": Job.State.values, "state": state, "show_owner": is_platform_admin(request.user)}
    return render(request, "fc2/job_list.html", context)


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    form = JobForm(request.POST or None, request.FILES or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = jobs.submit_upload(
                request.user,
                data["wheel"],
                data["wheel"].name,
                data["main_script"],
                dataset=data.get("dataset"),
                dataset_file=data.get("dataset_file"),
                parameters=data["parameters"],
                provider=data["provider"],
                strategy=data["strategy"],
                workers=data["workers"],
            )
        except (BundleError, datasets.DatasetError, jobs.SubmitError) as exc:
            field = "dataset_file" if isinstance(exc, datasets.DatasetError) else getattr(exc, "field", None) or "wheel"
            form.add_error(field, str(exc))
        else:
            messages.success(request, f"Job {job.pk} submitted.")
            return redirect(job)
    return render(request, "fc2/job_new.html", {"form": form}, status=400 if form.errors else 200)


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _visible_job(request, job_id)
    return render(request, "fc2/job_detail.html", _job_context(job))


@login_required
def job_live(request: HttpRequest, job_id: int) -> HttpResponse:
    """The live part of the job page, polled by htmx while the job is active."""
    job = _visible_job(request, job_id)
    return render(request, "fc2/_job_live.html", _job_context(job))


def _job_context(job: Job) -> dict:
    return {
        "job": job,
        "events": job.events.all(),
        "nodes": job.nodes.all(),
        "artifacts": job.artifacts.all(),
    }


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _visible_job(request, job_id)
    if pipeline.cancel(job, by=request.user.get_username()):
        messages.success(request, f"Job {job.pk} cancelled; its cluster is torn down.")
    else:
        messages.info(request, f"Job {job.pk} had already ended ({job.state}).")
    return redirect(job)


@login_required
def artifact_download(request: HttpRequest, job_id: int, artifact_id: int) -> FileResponse:
    job = _visible_job(request, job_id)
    artifact = get_object_or_404(Artifact, pk=artifact_id, job=job)
    filename = artifact.name.replace("/", "_")
    return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=filename)
