"""What the two job lists (the home page's and /jobs/) share: their filters, here, and their table,
templates/fc2/_job_table.html."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest

from fc2 import query
from fc2.models import Job, JobQuerySet

# The related rows a row of the table shows.
RELATED = ("owner", "bundle", "dataset")


class JobListQuery(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "any"), *Job.State.choices], label="state filter")


def filter_jobs(request: HttpRequest, jobs: JobQuerySet) -> tuple[JobQuerySet, dict]:
    """The jobs the list's filters keep (`?state=`), and the filters as applied: a value that names no state (a stale
    link) filters nothing, and the page says so."""
    state = query.read(request, JobListQuery(request.GET)).get("state", "")
    jobs = jobs.select_related(*RELATED)
    return (jobs.filter(state=state) if state else jobs), {"state": state, "states": Job.State.values}
