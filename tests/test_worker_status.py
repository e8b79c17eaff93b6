"""Whether any worker is taking jobs (fc2/services/workers.py): the rule, table-driven; the heartbeat a real Celery
worker writes (fc2/celery.py), and what its death and its shutdown do to it; where it shows — the banner of the
pages, the jobs API's job object, `manage.py submit_job --wait`, `fc2 status` — and `fc2` ending quietly when the
reader of its output goes away."""

from __future__ import annotations

import doctest
import io
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from fc2.celery import app
from fc2.models import ApiToken, CeleryWorker, Job
from fc2.services import workers as service
from tests.conftest import make_job
from tests.helpers import Api
from tests.test_client import FC2, Researcher
from tests.test_outages import REDIS_SERVER, Redis

NOW = datetime(2026, 11, 28, 13, 30, tzinfo=UTC)
QUEUE = "fc2"


def row(hostname: str = "celery@a", ago_s: float = 5, queues=(QUEUE,), stopped_ago_s: float | None = None):
    return CeleryWorker(
        hostname=hostname,
        queues=list(queues),
        beat_at=NOW - timedelta(seconds=ago_s),
        stopped_at=None if stopped_ago_s is None else NOW - timedelta(seconds=stopped_ago_s),
    )


# rows | taking jobs | since | message (FC2_WORKER_SILENCE_S = 30)
RULE = [
    ([], False, None, "No worker has started yet"),
    ([row(ago_s=5)], True, None, ""),
    ([row(ago_s=29)], True, None, ""),
    ([row(ago_s=30)], False, NOW - timedelta(seconds=30), "No worker is taking jobs since 13:29 UTC"),
    ([row(ago_s=360)], False, NOW - timedelta(seconds=360), "No worker is taking jobs since 13:24 UTC"),
    ([row(ago_s=3600 * 24 * 3)], False, NOW - timedelta(days=3), "No worker is taking jobs since 25 Nov 13:30 UTC"),
    ([row(ago_s=5, stopped_ago_s=2)], False, NOW - timedelta(seconds=2), "No worker is taking jobs since 13:29 UTC"),
    ([row(ago_s=5, queues=["other"])], False, None, "No worker has started yet"),
    ([row("a@h", 400), row("b@h", 5)], True, None, ""),
    ([row("a@h", 400), row("b@h", 90)], False, NOW - timedelta(seconds=90), "No worker is taking jobs since 13:28 UTC"),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "taking", "since", "message"), RULE)
def test_the_rule(rows, taking, since, message):
    found = service.judge(rows, QUEUE, NOW, 30)

    assert (found.taking_jobs, found.since, found.message) == (taking, since, message)
    assert [w.hostname for w in found.workers] == sorted(r.hostname for r in rows if QUEUE in r.queues)


def test_docstring_examples():
    result = doctest.testmod(service)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.django_db
def test_a_beat_is_one_update_once_the_worker_has_its_row(django_assert_num_queries):
    service.beat("celery@a", [QUEUE])
    first = CeleryWorker.objects.get()
    service.stopped("celery@a")

    with django_assert_num_queries(1):
        service.beat("celery@a", [QUEUE, "other"])

    again = CeleryWorker.objects.get()
    assert again.beat_at > first.beat_at and again.queues == [QUEUE, "other"] and again.stopped_at is None


@pytest.mark.django_db
def test_a_new_worker_forgets_the_workers_silent_for_a_week():
    """Hostnames change with each container: the staff's list of workers keeps last week's, not every one ever."""
    now = timezone.now()
    CeleryWorker.objects.create(hostname="celery@gone", queues=[QUEUE], beat_at=now - timedelta(days=8))
    CeleryWorker.objects.create(hostname="celery@stopped", queues=[QUEUE], beat_at=now - timedelta(days=6))

    service.beat("celery@gone", [QUEUE])  # an old worker back: it keeps its row
    service.beat("celery@new", [QUEUE])

    assert sorted(CeleryWorker.objects.values_list("hostname", flat=True)) == [
        "celery@gone",
        "celery@new",
        "celery@stopped",
    ]
    CeleryWorker.objects.filter(hostname="celery@gone").update(beat_at=now - timedelta(days=8))
    service.beat("celery@newer", [QUEUE])
    assert sorted(CeleryWorker.objects.values_list("hostname", flat=True)) == [
        "celery@new",
        "celery@newer",
        "celery@stopped",
    ]


@pytest.mark.skipif(settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql", reason="PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_beats_go_on_after_the_database_dropped_the_workers_connection():
    """A PostgreSQL restart drops the worker's connection under its beats (which run outside any task): the beat that
    meets it warns, the next reconnects, and the worker does not look dead while it works."""
    import psycopg2
    from django.db import connection

    from fc2.celery import _unless_database_down

    _unless_database_down("a heartbeat", service.beat, "celery@a", [QUEUE])
    before = CeleryWorker.objects.get().beat_at
    pid = connection.connection.get_backend_pid()
    db = settings.DATABASES["default"]
    other = psycopg2.connect(dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"])
    try:
        other.autocommit = True
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()

    for _ in range(2):  # the first may meet the dropped connection (a warning, the worker goes on)
        _unless_database_down("a heartbeat", service.beat, "celery@a", [QUEUE])

    assert CeleryWorker.objects.get().beat_at > before


# --- a real worker ----------------------------------------------------------------------------------------------------

SILENCE_S = 3  # the test's FC2_WORKER_SILENCE_S: its workers beat every second


def wait_until(predicate, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.2)


def fresh_status() -> service.WorkerStatus:
    cache.delete(service.CACHE_KEY)
    return service.status()


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_beats_until_it_is_killed(workers, settings):
    """A worker beats while it consumes, notes the tasks it starts, and once SIGKILLed (as a machine is lost) stops
    beating: FC2_WORKER_SILENCE_S later no worker is taking jobs, since its last beat."""
    settings.FC2_WORKER_SILENCE_S = SILENCE_S
    process, _ = workers.start(FC2_WORKER_SILENCE_S=str(SILENCE_S))
    assert fresh_status().message == "No worker has started yet"

    wait_until(lambda: CeleryWorker.objects.exists(), f"a beat\n{workers.logs()}")
    first = CeleryWorker.objects.get()
    assert first.queues == [settings.CELERY_TASK_DEFAULT_QUEUE] and first.task_started_at is None
    assert fresh_status().taking_jobs
    wait_until(lambda: CeleryWorker.objects.get().beat_at > first.beat_at, "a second beat")

    app.send_task("fc2.tasks.sweep", queue=settings.CELERY_TASK_DEFAULT_QUEUE)
    wait_until(lambda: CeleryWorker.objects.get().task_started_at is not None, f"a task started\n{workers.logs()}")

    workers.kill(process)
    last = CeleryWorker.objects.get().beat_at
    time.sleep(SILENCE_S)

    found = fresh_status()
    assert not found.taking_jobs and found.since == last == CeleryWorker.objects.get().beat_at
    assert found.message == f"No worker is taking jobs since {service.moment(last, timezone.now())}"


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_shuts_down_says_so_at_once(workers, settings):
    settings.FC2_WORKER_SILENCE_S = 600  # beats would keep it "taking jobs" for ten minutes
    process, _ = workers.start(hostname="beat-test@here", FC2_WORKER_SILENCE_S="600")
    wait_until(lambda: CeleryWorker.objects.filter(hostname="beat-test@here").exists(), f"a beat\n{workers.logs()}")
    assert fresh_status().taking_jobs

    os.killpg(process.pid, signal.SIGTERM)  # a warm shutdown, as `make run`'s Ctrl-C or `docker-compose stop`
    process.wait(timeout=30)

    stopped = CeleryWorker.objects.get()
    assert stopped.stopped_at is not None and stopped.stopped_at >= stopped.beat_at
    found = fresh_status()
    assert not found.taking_jobs and found.since == stopped.stopped_at


@pytest.mark.heavy  # a Redis of its own, stopped and started again
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_lost_its_broker_stops_beating_until_it_is_back(workers, settings):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    redis = Redis()
    try:
        settings.FC2_WORKER_SILENCE_S = SILENCE_S
        workers.start(REDIS_URL=redis.url, FC2_WORKER_SILENCE_S=str(SILENCE_S))
        wait_until(lambda: CeleryWorker.objects.exists() and fresh_status().taking_jobs, f"a beat\n{workers.logs()}")

        redis.stop()
        wait_until(lambda: not fresh_status().taking_jobs, f"the beats stop\n{workers.logs()}")
        last = CeleryWorker.objects.get().beat_at
        time.sleep(SILENCE_S)
        assert CeleryWorker.objects.get().beat_at == last, "beat without its broker"

        redis.start()  # on the same port: the worker connects again
        wait_until(lambda: fresh_status().taking_jobs, f"the beats come back\n{workers.logs()}")
    finally:
        redis.close()


# --- where it shows ---------------------------------------------------------------------------------------------------


@pytest.fixture
def queued(alice, bundle, digits) -> Job:
    """Alice's job, queued for the workers (make_job makes an --inline one, which no worker has to move on)."""
    job = make_job(alice, bundle, digits)
    Job.objects.filter(pk=job.pk).update(driver=Job.Driver.CELERY)
    job.refresh_from_db()
    return job


def beat(ago_s: float) -> None:
    """A worker of this installation's queue that beat `ago_s` seconds ago (its only one)."""
    CeleryWorker.objects.update_or_create(
        hostname="celery@web-test",
        defaults={"queues": [settings.CELERY_TASK_DEFAULT_QUEUE], "beat_at": timezone.now() - timedelta(seconds=ago_s)},
    )
    cache.delete(service.CACHE_KEY)


@pytest.mark.django_db
def test_the_api_says_whether_a_worker_takes_the_job(client, alice, queued, bundle, digits):
    api = Api(client, alice)
    inline = make_job(alice, bundle, digits)
    ended = make_job(alice, bundle, digits)
    Job.objects.filter(pk=ended.pk).update(driver=Job.Driver.CELERY, state=Job.State.SUCCEEDED)

    def worker(job: Job):
        return api.get(f"/api/jobs/{job.pk}").json()["worker"]

    assert worker(queued) == {"taking_jobs": False, "since": None, "message": "No worker has started yet"}
    assert worker(inline) is None and worker(ended) is None

    beat(ago_s=1)
    assert worker(queued) == {"taking_jobs": True, "since": None, "message": ""}

    beat(ago_s=600)
    answer = worker(queued)
    since = CeleryWorker.objects.get().beat_at
    assert answer["taking_jobs"] is False and datetime.fromisoformat(answer["since"]) == since
    assert answer["message"].startswith("No worker is taking jobs since ")


@pytest.mark.django_db
def test_the_banner_shows_to_whoever_waits_and_to_staff(client, alice, bob, queued, django_user_model):
    charlie = django_user_model.objects.create_user("charlie", "c@example.com", "charlie-password-1", is_staff=True)
    beat(ago_s=600)

    def banner(user) -> str:
        client.force_login(user)
        page = client.get(reverse("home")).content.decode()
        return page[page.find('id="worker-status"') :][:800] if 'id="worker-status"' in page else ""

    assert "No worker is taking jobs since" in banner(alice)  # her job waits
    assert "docs/OPERATIONS.md" not in banner(alice)
    assert banner(bob) == ""  # nothing of his waits
    staff = banner(charlie)
    assert "No worker is taking jobs since" in staff and "docs/OPERATIONS.md" in staff
    assert "celery@web-test: last beat" in staff and "never started a task" in staff

    beat(ago_s=1)
    assert banner(alice) == banner(charlie) == ""


@pytest.mark.django_db
def test_submit_job_wait_says_no_worker_is_taking_jobs(alice, example_wheel, monkeypatch):
    """`--wait` on a job no worker takes: said on stderr once, not at every look; the job then ends (as a worker
    that came back would end it) and the command with it."""
    looks = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 3:
            Job.objects.update(state=Job.State.CANCELLED)

    monkeypatch.setattr("fc2.management.commands.submit_job.time.sleep", sleep)
    err = io.StringIO()
    args = ["--bundle", str(example_wheel), "--dataset", "digits", "--user", "alice", "--wait"]
    with pytest.raises(SystemExit):
        call_command("submit_job", *args, stdout=io.StringIO(), stderr=err)

    job = Job.objects.get()
    said = [line for line in err.getvalue().splitlines() if "worker" in line]
    assert said == [f"job {job.pk} queued: No worker has started yet; it waits until a worker is started"]


@pytest.mark.django_db(transaction=True)
def test_fc2_status_says_it_beside_a_queued_job_and_ends_quietly_in_a_pipe(alice, queued, live_server, tmp_path):
    beat(ago_s=600)
    _, secret = ApiToken.issue(alice, "laptop")
    researcher = Researcher(tmp_path / "alice", FC2_URL=live_server.url, FC2_TOKEN=secret)
    status = [str(FC2), "status", str(queued.pk)]

    shown = subprocess.run(status, capture_output=True, text=True, env=researcher.env, timeout=60)
    first = shown.stdout.splitlines()[0]
    assert shown.returncode == 3 and first.startswith(f"job {queued.pk} queued · No worker is taking jobs since ")

    # A real pipe whose reader has gone before `fc2` writes (`| true`): 141, as a command SIGPIPE ended. One that
    # goes after the first line (`| head -1`): 3 (not ended), or 141 where the rest was written after it had gone.
    for reader, codes in (("true", {141}), ("head -1", {3, 141})):
        piped = subprocess.run(
            ["bash", "-c", f'set -o pipefail; "$@" | {reader}', "fc2", *status],
            capture_output=True, text=True, env=researcher.env, timeout=60,
        )  # fmt: skip
        assert piped.returncode in codes and piped.stderr == "", (reader, piped.returncode, piped.stderr)
        assert piped.stdout == ("" if reader == "true" else f"{first}\n")


def test_fc2_jobs_says_it_under_the_list(alice, queued, live_server, tmp_path):
    _, secret = ApiToken.issue(alice, "laptop")
    researcher = Researcher(tmp_path / "alice", FC2_URL=live_server.url, FC2_TOKEN=secret)

    def listed() -> list[str]:
        cache.delete(service.CACHE_KEY)
        shown = subprocess.run([str(FC2), "jobs"], capture_output=True, text=True, env=researcher.env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.splitlines()

    beat(ago_s=600)
    lines = listed()
    assert lines[-1].startswith("No worker is taking jobs since ") and sum("No worker" in line for line in lines) == 1
    beat(ago_s=0)
    assert not any("No worker" in line for line in listed())


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
def test_fc2_ends_quietly_when_its_reader_has_gone(unbuffered, tmp_path):
    """A pipe whose reader has closed before `fc2` writes (`fc2 logout`, which needs no platform): exit 141, no
    traceback, nothing said on stderr — whether Python writes its output as it comes or as it exits."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "PYTHONUNBUFFERED": unbuffered}
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [str(FC2), "logout"], stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=60
        )
    finally:
        os.close(write)

    assert (done.returncode, done.stderr) == (141, "")
