"""What the two job lists (the home page's and /jobs/) share: their filters, here, and their table,
templates/fc2/_job_table.html."""

from __future__ import annotations

from django.http import QueryDict

from fc2.models import Job, JobQuerySet

# The related rows a row of the table shows.
RELATED = ("owner", "bundle", "dataset")


def filter_jobs(jobs: JobQuerySet, params: QueryDict) -> tuple[JobQuerySet, dict]:
    """The jobs the list's filters keep (`?state=`), and the filters as applied: a value that names nothing (a stale
    link) filters nothing."""
    state = params.get("state", "")
    if state not in Job.State.values:
        state = ""
    jobs = jobs.select_related(*RELATED)
    return (jobs.filter(state=state) if state else jobs), {"state": state, "states": Job.State.values}
