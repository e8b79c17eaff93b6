"""`{% worker_status %}`: the banner that says no worker is taking jobs (fc2/services/workers.py), shown to whoever
has a job a worker has to move on, and always to staff (with each worker's last beat and last task)."""

from __future__ import annotations

from django import template
from django.conf import settings

from fc2.models import is_platform_admin
from fc2.services import workers

register = template.Library()


@register.inclusion_tag("fc2/_worker_status.html", takes_context=True)
def worker_status(context: template.Context) -> dict:
    user = context.get("user")
    if user is None or not user.is_authenticated:
        return {"status": None}
    found = workers.status()  # first: cached, and nothing more to read while a worker takes jobs
    staff = is_platform_admin(user)
    if found.taking_jobs or not (staff or workers.jobs_waiting(user).exists()):
        return {"status": None}
    return {"status": found, "staff": staff, "queue": settings.CELERY_TASK_DEFAULT_QUEUE}
