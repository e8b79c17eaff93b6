"""The researcher's home: their own jobs, bundles and datasets (each filtered and paged) and this month's spend.

Everyone, admins included, sees only what they own here; the admin's view of everybody is the dashboard.
"""

from __future__ import annotations

from datetime import datetime

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fc2 import query
from fc2.job_lists import filter_jobs
from fc2.models import CodeBundle, Dataset, Job

PER_PAGE = 10


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    """The calendar month (in the site's time zone) that `moment` falls in, as [start, end)."""
    local = timezone.localtime(moment)
    start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def monthly_spend(user, now: datetime | None = None) -> dict:
    """What `user`'s jobs cost this month so far, and how many jobs ran in it."""
    now = now or timezone.now()
    start, end = month_bounds(now)
    jobs = Job.objects.filter(owner=user)
    return {
        "total": jobs.spend_between(start, end, now),
        "jobs": jobs.ran_between(start, end).count(),
        "month": start,
    }


class HomeQuery(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="bundle search")
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *Dataset.Kind.choices], label="dataset filter")


@login_required
def home(request: HttpRequest) -> HttpResponse:
    user = request.user
    params = request.GET

    jobs, job_filters = filter_jobs(request, Job.objects.filter(owner=user))
    asked = query.read(request, HomeQuery(params))

    bundles = CodeBundle.objects.filter(owner=user).annotate(job_count=Count("jobs")).order_by("-created_at", "-pk")
    q = asked.get("q", "")
    if q:
        bundles = bundles.filter(Q(name__icontains=q) | Q(distribution__icontains=q) | Q(filename__icontains=q))

    datasets = Dataset.objects.filter(owner=user)
    if kind := asked.get("kind", ""):
        datasets = datasets.filter(kind=kind)

    context = {
        "jobs": Paginator(jobs, PER_PAGE).get_page(params.get("jobs_page")),
        "bundles": Paginator(bundles, PER_PAGE).get_page(params.get("bundles_page")),
        "datasets": Paginator(datasets, PER_PAGE).get_page(params.get("datasets_page")),
        **job_filters,
        "q": q,
        "kinds": Dataset.Kind.choices,
        "kind": kind,
        "spend": monthly_spend(user),
        "active_jobs": Job.objects.filter(owner=user, state__in=Job.ACTIVE).count(),
    }
    return render(request, "fc2/home.html", context)
