"""Whether any Celery worker is taking jobs: one rule, decided when asked, from the heartbeats the workers write
(fc2/celery.py's WorkerBeat step, a CeleryWorker row per worker). Every place that shows it reads it here: the banner
of the site's pages (fc2/templatetags/fc2_workers.py), the jobs API's job object, `manage.py submit_job`, and
through the API the `fc2` client.

A worker takes this installation's jobs while it consumes its queue (CELERY_TASK_DEFAULT_QUEUE), has not shut down,
and has beaten within FC2_WORKER_SILENCE_S (it beats every third of that). When none does, `since` is the last
moment one was seen doing so (its last beat, or its shutdown), and None when no worker of the queue ever beat: a
fresh installation with only the web server.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.cache import cache
from django.db.models import QuerySet
from django.utils import timezone

from fc2.models import CeleryWorker, Job

if TYPE_CHECKING:
    from django.contrib.auth.models import User

BEATS_PER_SILENCE = 3  # a worker beats this often within FC2_WORKER_SILENCE_S: two lost beats are no outage
CACHE_KEY = "fc2:worker-status"
# Every page reads the status (the banner): a process reads the table at most once in this many seconds, so a page
# says a worker was lost (or is back) at most this much later than the table does.
CACHE_S = 5
# A worker silent this long is forgotten when a new one first beats: hostnames change with every container or host, and
# the staff's list of workers should not grow with each. The new worker's row keeps `since` right.
FORGOTTEN_AFTER = timedelta(days=7)


@dataclass(frozen=True)
class Worker:
    hostname: str  # Celery's node name, e.g. celery@host
    beat_at: datetime  # its last beat
    task_started_at: datetime | None  # when it last started a task
    stopped_at: datetime | None  # when it shut down, if it did since its last beat
    taking_jobs: bool  # by the rule above, when the status was judged


@dataclass(frozen=True)
class WorkerStatus:
    taking_jobs: bool  # some worker consumes this installation's queue, and beat within FC2_WORKER_SILENCE_S
    since: datetime | None  # not taking jobs: since when (None: no worker ever beat)
    message: str  # what pages, the API and the CLI say; empty while a worker takes jobs
    workers: tuple[Worker, ...]  # those of this installation's queue, by hostname


def judge(rows: Iterable[CeleryWorker], queue: str, now: datetime, silence_s: float) -> WorkerStatus:
    """The workers' status at `now` from their rows: the one rule.

    >>> from datetime import timezone as tz
    >>> now = datetime(2026, 11, 28, 13, 30, tzinfo=tz.utc)
    >>> row = CeleryWorker(hostname="celery@a", queues=["fc2"], beat_at=now - timedelta(seconds=10))
    >>> judge([row], "fc2", now, 30).message, judge([row], "fc2", now + timedelta(minutes=6), 30).message
    ('', 'No worker is taking jobs since 13:29 UTC')
    >>> judge([row], "other", now, 30).message
    'No worker has started yet'
    """
    silence = timedelta(seconds=silence_s)
    workers = tuple(
        Worker(
            row.hostname,
            row.beat_at,
            row.task_started_at,
            row.stopped_at,
            taking_jobs=row.stopped_at is None and now - row.beat_at < silence,
        )
        for row in sorted(rows, key=lambda row: row.hostname)
        if queue in row.queues
    )
    if any(worker.taking_jobs for worker in workers):
        return WorkerStatus(True, None, "", workers)
    since = max((worker.stopped_at or worker.beat_at for worker in workers), default=None)
    if since is None:
        return WorkerStatus(False, None, "No worker has started yet", workers)
    return WorkerStatus(False, since, f"No worker is taking jobs since {moment(since, now)}", workers)


def moment(at: datetime, now: datetime) -> str:
    """A time in the site's time zone, with its day unless that is today's.

    >>> from datetime import timezone as tz
    >>> now = datetime(2026, 11, 28, 13, 30, tzinfo=tz.utc)
    >>> moment(datetime(2026, 11, 28, 13, 24, tzinfo=tz.utc), now), moment(
    ...     datetime(2026, 11, 2, 9, 5, tzinfo=tz.utc), now)
    ('13:24 UTC', '2 Nov 09:05 UTC')
    """
    local = timezone.localtime(at)
    day = "" if local.date() == timezone.localtime(now).date() else f"{local.day} {local:%b} "
    return f"{day}{local:%H:%M} {local.tzname()}"


def status() -> WorkerStatus:
    """The workers' status now, read at most once every CACHE_S seconds in this process."""
    found = cache.get(CACHE_KEY)
    if found is None:
        rows = CeleryWorker.objects.all()
        found = judge(rows, settings.CELERY_TASK_DEFAULT_QUEUE, timezone.now(), settings.FC2_WORKER_SILENCE_S)
        cache.set(CACHE_KEY, found, CACHE_S)
    return found


def waits_on_workers(job: Job) -> bool:
    """Whether the job's next step is a worker's to run: it has not ended, and no process of its own drives it
    (`--inline`; should that process die, the sweep hands the job to the workers, and it then is theirs)."""
    return job.driver == Job.Driver.CELERY and not job.is_terminal


def jobs_waiting(user: User) -> QuerySet[Job]:
    """The user's jobs that a worker has to move on (see waits_on_workers)."""
    return Job.objects.filter(owner=user, driver=Job.Driver.CELERY, state__in=Job.ACTIVE)


def for_job(job: Job) -> WorkerStatus | None:
    """The workers' status where the job waits on them, else None."""
    return status() if waits_on_workers(job) else None


# --- what the workers write (fc2/celery.py) -------------------------------------------------------------------------


def beat(hostname: str, queues: list[str]) -> None:
    """The worker `hostname` is up and consuming `queues`: one UPDATE, and on its first beat its row made and the
    workers silent for FORGOTTEN_AFTER forgotten."""
    now = timezone.now()
    if not CeleryWorker.objects.filter(hostname=hostname).update(beat_at=now, queues=queues, stopped_at=None):
        CeleryWorker.objects.update_or_create(hostname=hostname, defaults={"beat_at": now, "queues": queues})
        CeleryWorker.objects.filter(beat_at__lt=now - FORGOTTEN_AFTER).delete()


def task_started(hostname: str) -> None:
    CeleryWorker.objects.filter(hostname=hostname).update(task_started_at=timezone.now())


def stopped(hostname: str) -> None:
    """The worker shut down: it takes no jobs from now on, without waiting for its beats to go stale."""
    CeleryWorker.objects.filter(hostname=hostname).update(stopped_at=timezone.now())
