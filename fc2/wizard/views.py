"""The wizard's views: /jobs/new/ (start), its steps and the live recommendation (htmx).

They stay thin: checking is the forms' job; what is kept between requests is the Wizard's; storing, recommending and
submitting are the services'. A fault found when the job is run is shown beside its field, on its step.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from fc2 import query
from fc2.bundles import BundleError
from fc2.models import Job
from fc2.services import datasets, jobs, search, submissions
from fc2.templatetags.fc2_ui import duration
from fc2.wizard.forms import ALGORITHMS, STEP_FORMS, CodeForm, DataForm, ResourceForm, StepForm
from fc2.wizard.planning import planned, preview
from fc2.wizard.state import STEPS, Wizard
from recommender.types import RecommendationError

# What answers a resource step posted with `hourly_budget` (taken as `budget`, its `budget` as `total_budget`).
BUDGET_DEPRECATION = {
    "Deprecation": "true",
    "Warning": (
        '299 - "hourly_budget is deprecated and budget now means $/h: send budget ($/h) and total_budget ($ for the '
        'whole job)"'
    ),
}


def _step_url(step: str) -> str:
    return reverse("job-new-step", args=[step])


def _go_on(request: HttpRequest, wizard: Wizard, step: str) -> HttpResponse:
    """On to the next step (where a reload of /jobs/new/ now lands); an htmx upload, which shows its progress, is
    sent there by the browser."""
    wizard.visit(step)
    url = _step_url(step)
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)


def _nav(wizard: Wizard, current: str) -> list[dict]:
    done = wizard.done
    summaries = {}
    if done["code"]:
        bundle = wizard.bundle()
        summaries["code"] = f"{bundle.distribution} {bundle.version}"
    if done["data"]:
        summaries["data"] = wizard.dataset().name
    if done["resource"]:
        resource = wizard.state["resource"]
        summaries["resource"] = f"{dict(ALGORITHMS)[resource['algorithm']]} · {resource['provider']}"
    return [
        {
            "name": step,
            "title": title,
            "number": number,
            "url": _step_url(step),
            "done": done[step],
            "current": step == current,
            "reachable": wizard.reachable(step),
            "summary": summaries.get(step, ""),
        }
        for number, (step, title) in enumerate(STEPS.items(), start=1)
    ]


def _render(request: HttpRequest, wizard: Wizard, step: str, form: StepForm | None = None, **context) -> HttpResponse:
    steps = _nav(wizard, step)
    index = list(STEPS).index(step)
    context = {
        "step": step,
        "step_title": STEPS[step],
        "steps": steps,
        "previous": steps[index - 1] if index else None,
        "next": steps[index + 1] if index + 1 < len(steps) else None,
        "form": form,
        **context,
    }
    failed = bool(form is not None and form.errors) or bool(context.get("run_error"))
    return render(request, f"fc2/wizard/{step}.html", context, status=400 if failed else 200)


class RerunQuery(forms.Form):
    """`/jobs/new/?from=<job id>`: the job a re-run starts from."""

    def __init__(self, data):
        super().__init__(data)
        self.fields["from"] = query.IdField()  # (a Python keyword: not a class attribute)


@login_required
@require_http_methods(["GET", "POST"])
def start(request: HttpRequest) -> HttpResponse:
    """/jobs/new/: on to the step the user was at; `?from=<job id>` pre-fills a re-run; POST starts over."""
    wizard = Wizard(request)
    if request.method == "POST":
        wizard.clear()
        return redirect(_step_url("code"))
    if "from" in request.GET:
        rerun = RerunQuery(request.GET)
        if not rerun.is_valid():  # a link of ours names a job by its id: this one names none
            raise Http404("no such job")
        job = get_object_or_404(
            Job.objects.visible_to(request.user).select_related("dataset"), pk=rerun.cleaned_data["from"]
        )
        wizard.prefill(job)
        messages.info(request, f"The wizard holds job {job.pk}'s code, data and resources: change anything, then run.")
        return redirect(_step_url(wizard.first_open()))
    return redirect(_step_url(wizard.current()))


@login_required
@require_http_methods(["GET", "POST"])
def step(request: HttpRequest, step: str) -> HttpResponse:
    if step not in STEPS:
        raise Http404("no such step")
    wizard = Wizard(request)
    if not wizard.reachable(step):
        return redirect(_step_url(wizard.first_open()))
    wizard.visit(step)
    if step == "review":
        return _review(request, wizard)
    initial = wizard.initial(step)
    if step == "resource" and request.method == "GET":
        initial |= _resource_draft(request)
    form = STEP_FORMS[step](request.POST or None, request.FILES or None, user=request.user, initial=initial)
    response = form.is_bound and form.is_valid() and STEP_SAVES[step](request, wizard, form)
    if not response:
        context = {}
        if step == "resource":  # the recommendation beside the fields: for what they show, or why there is none
            context = (
                {"invalid": form} if form.is_bound else preview(wizard, ResourceForm(form.values(), user=request.user))
            )
        response = _render(request, wizard, step, form, **context)
    if getattr(form, "deprecated", False):
        for name, value in BUDGET_DEPRECATION.items():
            response[name] = value
    return response


def _resource_draft(request: HttpRequest) -> dict:
    """The resource fields the page sends when it asks for itself, as they stand, after the catalogue changed (so
    that the type lists are the new catalogue's)."""
    return {
        name: request.GET.getlist(name) if name == "worker_types" else request.GET[name]
        for name in ResourceForm.base_fields
        if name in request.GET
    }


def _save_code(request: HttpRequest, wizard: Wizard, form: CodeForm) -> HttpResponse | None:
    try:
        bundle = form.save()
    except BundleError as exc:
        form.add_error("wheel", str(exc))
        return None
    if form.cleaned_data["source"] == "upload":
        messages.success(request, f"{bundle.distribution} {bundle.version} is stored in your bundles.")
    wizard.save_code(bundle, form.cleaned_data["parameters"])
    return _go_on(request, wizard, "data")


def _save_data(request: HttpRequest, wizard: Wizard, form: DataForm) -> HttpResponse | None:
    try:
        data = form.save()
    except datasets.DatasetError as exc:
        form.add_error("file", str(exc))
        return None
    wizard.save_data(data)
    return _go_on(request, wizard, "resource")


def _save_resource(request: HttpRequest, wizard: Wizard, form: ResourceForm) -> HttpResponse | None:
    resource = form.state()
    try:
        job_request = wizard.job_request(resource)
        jobs.check_framework(job_request)  # said here, beside the framework or strategy, rather than at review
        planned(job_request, request.user)
    except (RecommendationError, jobs.SubmitError) as exc:
        form.add_error(_recommendation_field(exc, resource), str(exc))
        return None
    wizard.save_resource(resource)
    return _go_on(request, wizard, "review")


STEP_SAVES = {"code": _save_code, "data": _save_data, "resource": _save_resource}


def _review(request: HttpRequest, wizard: Wizard) -> HttpResponse:
    """Everything chosen and the cluster it gets; POST runs the job."""
    job_request = wizard.job_request()
    if request.method == "POST":
        try:
            planned(job_request, request.user)  # a recommender's refusal is shown beside its field
            # Through the one door of every submission: the user's submission limit holds here as in the API.
            job, _ = submissions.submit_once(request.user, lambda: jobs.submit(request.user, job_request))
        except (RecommendationError, jobs.SubmitError) as exc:
            return _fault(request, wizard, exc)
        except submissions.TooManySubmissions as exc:  # the wizard keeps everything: run it again later
            refusal = f"Not submitted: {exc}. You can submit again in {duration(exc.wait)}."
            return _render(request, wizard, "review", run_error=refusal, **_review_context(request, wizard))
        wizard.clear()
        messages.success(request, f"Job {job.pk} submitted.")
        return redirect(job)
    return _render(request, wizard, "review", **_review_context(request, wizard))


def _review_context(request: HttpRequest, wizard: Wizard) -> dict:
    resource = wizard.resource()
    return {
        "job_request": wizard.job_request(),
        "resource": resource,
        "algorithm_label": dict(ALGORITHMS)[resource["algorithm"]],
        "preset_label": search.PRESET_CHOICES.get(resource.get("preset") or "custom", ""),
        "default_search_budget": settings.FC2_EXPLORE_USD,
        "default_search_minutes": settings.FC2_EXPLORE_MINUTES,
        **preview(wizard, ResourceForm(resource, user=request.user)),
    }


def _fault(request: HttpRequest, wizard: Wizard, exc: Exception) -> HttpResponse:
    """Running failed: show why beside the field at fault, on its step, the saved entries filled in."""
    resource = wizard.resource()
    field = exc.field if isinstance(exc, jobs.SubmitError) else None
    if field == "parameters":
        step = "code"
    elif field == "dataset":
        step, field = "data", {"builtin": "builtin", "url": "url"}.get(wizard.state["data"]["source"], "dataset")
    elif isinstance(exc, RecommendationError) or _resource_field(field, resource):
        step, field = "resource", _recommendation_field(exc, resource)
    else:
        return _render(request, wizard, "review", run_error=str(exc), **_review_context(request, wizard))
    form = STEP_FORMS[step](initial=wizard.initial(step), user=request.user).with_error(field, str(exc))
    context = {"invalid": form} if step == "resource" else {}
    return _render(request, wizard, step, form, **context)


def _recommendation_field(exc: Exception, resource: dict) -> str:
    """The resource field a recommender's refusal is shown beside: the budget it cannot buy with, else the algorithm."""
    if isinstance(exc, jobs.SubmitError):
        return _resource_field(exc.field, resource)
    return "budget" if resource["limit"] == "budget" and "budget" in str(exc) else "algorithm"


def _resource_field(field: str | None, resource: dict) -> str | None:
    if field == "workers":
        return "budget" if resource.get("limit") == "budget" else "max_workers"
    return field if field in ResourceForm.base_fields else None


@login_required
@require_GET
def recommendation(request: HttpRequest) -> HttpResponse:
    """The live part of the resource step: the recommendation for the fields as they stand (htmx)."""
    wizard = Wizard(request)
    return render(
        request, "fc2/wizard/_recommendation.html", preview(wizard, ResourceForm(request.GET, user=request.user))
    )
