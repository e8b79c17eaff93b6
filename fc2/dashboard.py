"""The admin dashboard page: every user's jobs to filter, search and sort, running clusters, failures, spend charts.

Staff only: anonymous visitors go to the login page, researchers get a 403 (the page's existence is no secret; its
contents are). The numbers come from `fc2.services.dashboard`; this module only reads the query string.
"""

from __future__ import annotations

from functools import wraps

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fc2.models import Job, is_platform_admin
from fc2.services import dashboard

PAGE_SIZE = 50

# (sort key, column heading, first click sorts descending, CSS classes): numbers and times biggest/latest first,
# names A→Z.
COLUMNS = [
    ("id", "Job", True, ""),
    ("user", "User", False, ""),
    ("state", "State", False, ""),
    ("provider", "Provider", False, "hide-sm"),
    ("cluster", "Cluster", True, ""),
    ("created", "Submitted", True, "hide-sm"),
    ("duration", "Duration", True, "amount"),
    ("cost", "Est. cost", True, "amount"),
]


def staff_required(view):
    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not is_platform_admin(request.user):
            raise PermissionDenied("The dashboard is for platform admins.")
        return view(request, *args, **kwargs)

    return wrapper


class DashboardFilters(forms.Form):
    state = forms.ChoiceField(required=False)
    provider = forms.ChoiceField(required=False)
    user = forms.ChoiceField(required=False)
    created_from = forms.DateField(
        required=False, label="Submitted from", widget=forms.DateInput(attrs={"type": "date"})
    )
    created_to = forms.DateField(required=False, label="Submitted to", widget=forms.DateInput(attrs={"type": "date"}))
    q = forms.CharField(
        required=False,
        max_length=200,
        label="Search",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "user, failure reason or #id"}),
    )
    sort = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, data, providers: list[str], usernames: list[str]):
        super().__init__(data)
        self.fields["state"].choices = [("", "any"), ("active", "active (not ended)"), *Job.State.choices]
        self.fields["provider"].choices = [("", "any"), *((p, p) for p in providers)]
        self.fields["user"].choices = [("", "anyone"), *((u, u) for u in usernames)]

    def clean_sort(self) -> str:
        # Only our own column links set it: an unknown one is a stale link, not a mistake to report.
        sort = self.cleaned_data["sort"]
        return sort if sort.removeprefix("-") in dashboard.SORTS else dashboard.DEFAULT_SORT

    def clean(self):
        data = super().clean()
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start > end:
            self.add_error("created_to", "Must not be before the start date.")
        return data

    def job_filters(self) -> dashboard.JobFilters:
        """What passed validation; a field with an error filters nothing (and says so on the page)."""
        data = self.cleaned_data
        fields = ("state", "provider", "user", "created_from", "created_to")
        return dashboard.JobFilters(
            **{name: data[name] for name in fields if data.get(name)}, search=data.get("q") or ""
        )


def _columns(sort: str) -> list[dict]:
    """Table headings with the sort each one links to and, for the sorted one, its aria-sort."""
    current, descending = sort.removeprefix("-"), sort.startswith("-")
    columns = []
    for key, label, desc_first, classes in COLUMNS:
        if key == current:
            next_sort = key if descending else f"-{key}"
            aria = "descending" if descending else "ascending"
        else:
            next_sort = f"-{key}" if desc_first else key
            aria = ""
        columns.append({"key": key, "label": label, "sort": next_sort, "aria_sort": aria, "classes": classes})
    return columns


@staff_required
def dashboard_page(request: HttpRequest) -> HttpResponse:
    providers = list(Job.objects.order_by("provider").values_list("provider", flat=True).distinct())
    usernames = list(get_user_model().objects.order_by("username").values_list("username", flat=True))
    form = DashboardFilters(request.GET, providers=providers, usernames=usernames)
    form.is_valid()
    sort = form.cleaned_data.get("sort", dashboard.DEFAULT_SORT)  # (a NUL fails the field before clean_sort)
    now = timezone.now()

    jobs = dashboard.filtered_jobs(form.job_filters(), now)
    totals = dashboard.totals(jobs)
    paginator = Paginator(dashboard.sort_jobs(jobs, sort), PAGE_SIZE)
    paginator.count = totals["jobs"]  # counted with the totals already: one query fewer
    page = paginator.get_page(request.GET.get("page"))
    context = {
        "form": form,
        "page": page,
        "columns": _columns(sort),
        "filtered": any(form.cleaned_data.get(name) for name in form.fields if name != "sort"),
        "totals": totals,
        "burn": dashboard.burn(),
        "running": dashboard.running_clusters(now),
        "failures": dashboard.recent_failures(),
        "reapings": dashboard.recent_reapings(),
        "spend_by_user": dashboard.spend_by_user(jobs, totals["cost"]),
        "spend_by_week": dashboard.spend_by_week(jobs),
    }
    return render(request, "fc2/dashboard.html", context, status=400 if form.errors else 200)
