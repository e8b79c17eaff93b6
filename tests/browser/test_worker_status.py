"""The banner that says no worker is taking jobs, in real Chromium: a real Celery worker beats, is killed, and the
job page of a queued job and the admin dashboard say so; a worker started again takes the banner away."""

from __future__ import annotations

import re
import time

import pytest
from django.core.cache import cache
from django.urls import reverse
from playwright.sync_api import expect

from fc2.models import CeleryWorker, Job
from fc2.services import workers as workers_service
from tests.browser.conftest import log_in
from tests.conftest import make_job
from tests.test_worker_status import SILENCE_S, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_job_page_and_the_dashboard_say_no_worker_is_taking_jobs(
    page, shot, workers, settings, alice, bundle, digits, django_user_model
):
    django_user_model.objects.create_user("charlie", "c@example.com", "charlie-password-1", is_staff=True)
    job = make_job(alice, bundle, digits)
    Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY)  # queued for the workers, none of whom has it
    settings.FC2_WORKER_SILENCE_S = SILENCE_S
    process, _ = workers.start(FC2_WORKER_SILENCE_S=str(SILENCE_S))
    wait_until(lambda: CeleryWorker.objects.exists(), f"a beat\n{workers.logs()}")
    workers.kill(process)
    time.sleep(SILENCE_S)
    cache.delete(workers_service.CACHE_KEY)  # (the pages' status, a few seconds old: the live server is this process)
    last = CeleryWorker.objects.get().beat_at

    log_in(page, "alice", "alice-password-1")
    page.goto(job.get_absolute_url())
    banner = page.locator("#worker-status")
    expect(banner).to_contain_text(f"No worker is taking jobs since {last:%H:%M} UTC")
    expect(banner).to_contain_text("queued jobs wait until a worker is started")
    shot("job-page")

    page.get_by_role("button", name="Log out").click()
    log_in(page, "charlie", "charlie-password-1")
    page.goto(reverse("dashboard"))
    expect(banner).to_contain_text("No worker is taking jobs since")
    banner.get_by_text(re.compile("Workers of queue")).click()
    expect(banner).to_contain_text(f"{CeleryWorker.objects.get().hostname}: last beat")
    shot("dashboard")

    workers.start(FC2_WORKER_SILENCE_S=str(SILENCE_S))
    wait_until(lambda: CeleryWorker.objects.get().beat_at > last, f"a new beat\n{workers.logs()}")
    cache.delete(workers_service.CACHE_KEY)
    page.reload()
    expect(banner).to_have_count(0)
    shot("dashboard-worker-back")
