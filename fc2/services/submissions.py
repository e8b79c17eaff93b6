"""Job submissions, made exactly once and at most so often (docs/API.md, *Submitting*): the one door of every
submission — the API's, the wizard's and `manage.py submit_job`'s — each of which calls `submit_once`.

- Exactly once: a client's `Idempotency-Key` (IETF httpapi idempotency-key draft) is stored with the job its first
  use made (fc2.models.IdempotencyKey), in the submission's own transaction; the same key from the same user within
  IDEMPOTENCY_WINDOW answers that job again, and with another request it is refused.
- At most so often: FC2_API_SUBMIT_RATE jobs per user, whatever token, session or command submits them — the jobs the
  user submitted in the last period, counted in the database.

Both are judged under a lock on the user's row, held until the job is committed: a user's submissions are made one
after the other (on SQLite every write transaction already is), so two requests at once with the same key make one
job, and two at the limit make one job between them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError
from django.utils import timezone

from common.columns import max_length
from fc2.models import IdempotencyKey, Job
from fc2.services.files import atomic_with_files

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# How long a key answers the job it made; an older key is forgotten (deleted) and may be used again.
IDEMPOTENCY_WINDOW = timedelta(hours=24)
MAX_KEY_LENGTH = max_length(IdempotencyKey, "key")
# FC2_API_SUBMIT_RATE's periods, in seconds (as DRF's throttles read them: the first letter counts).
PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
PERIOD_WORDS = {1: "a second", 60: "a minute", 3600: "an hour", 86400: "a day"}


class KeyReused(Exception):
    """The key was used for another request (422)."""


class KeyInUse(Exception):
    """Another request with the key is being submitted just now (409)."""


class TooManySubmissions(Exception):
    """The user's submissions have reached FC2_API_SUBMIT_RATE (429); `wait` is the whole seconds until the next."""

    def __init__(self, limit: int, period_s: int, wait: int):
        super().__init__(f"too many job submissions: {limit} {PERIOD_WORDS[period_s]} per user")
        self.wait = wait


def key_refusal(key: str) -> str | None:
    """Why `key` is no idempotency key (1 to MAX_KEY_LENGTH printable ASCII characters), or None.

    >>> key_refusal("8e03978e-40d5-43e8-bc93-6894a57f9324") is None
    True
    >>> key_refusal("naïve")
    'an Idempotency-Key is 1 to 255 printable ASCII characters'
    """
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= char <= "~" for char in key):
        return f"an Idempotency-Key is 1 to {MAX_KEY_LENGTH} printable ASCII characters"
    return None


def submission_rate() -> tuple[int, int]:
    """FC2_API_SUBMIT_RATE as (submissions, period in seconds): "30/hour" -> (30, 3600)."""
    count, _, period = settings.FC2_API_SUBMIT_RATE.partition("/")
    return int(count), PERIODS[period[0]]


def wait_before_next(user: User, now: datetime | None = None) -> int | None:
    """Whole seconds until `user` may submit again (at least 1), or None while they may now: one indexed query."""
    limit, period_s = submission_rate()
    now = now or timezone.now()
    since = now - timedelta(seconds=period_s)
    recent = Job.objects.filter(owner=user, created_at__gt=since).order_by("-created_at")
    # The limit-th newest job in the period: once it is older than the period, there is room for one more.
    oldest_counted = recent.values_list("created_at", flat=True)[limit - 1 : limit].first() if limit else now
    if oldest_counted is None:
        return None
    return max(1, math.ceil((oldest_counted + timedelta(seconds=period_s) - now).total_seconds()))


def stored_job(user: User, key: str, now: datetime | None = None) -> IdempotencyKey | None:
    """The key's row (with its job) while it is within IDEMPOTENCY_WINDOW, else None."""
    since = (now or timezone.now()) - IDEMPOTENCY_WINDOW
    return IdempotencyKey.objects.filter(user=user, key=key, created_at__gte=since).select_related("job").first()


def submit_once(
    user: User, make: Callable[[], Job], key: str | None = None, request_hash: str = ""
) -> tuple[Job, bool]:
    """The job `make()` submits, and True; or, for a key `user` used within IDEMPOTENCY_WINDOW for the same request
    (`request_hash`), the job that use made, and False.

    Raises KeyReused (the key came with another request), TooManySubmissions (FC2_API_SUBMIT_RATE reached; a
    request answered again does not count) and KeyInUse (the key was stored meanwhile by a submission that did not
    take the user's lock); whatever `make` raises goes through, and then nothing is stored — the key neither.
    """
    try:
        with atomic_with_files():
            # Every submission of the user waits here for the one before to commit (PostgreSQL: the row's lock).
            get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
            now = timezone.now()
            if key is not None:
                IdempotencyKey.objects.filter(user=user, created_at__lt=now - IDEMPOTENCY_WINDOW).delete()
                if (found := stored_job(user, key, now)) is not None:
                    if found.request_hash != request_hash:
                        raise KeyReused(
                            f"this Idempotency-Key was used for another request (job {found.job_id}): "
                            "use a new key for a new request"
                        )
                    assert found.job is not None  # a key is stored with its job, and goes with it (CASCADE)
                    return found.job, False
            if (wait := wait_before_next(user, now)) is not None:
                limit, period_s = submission_rate()
                raise TooManySubmissions(limit, period_s, wait)
            job = make()
            if key is not None:
                IdempotencyKey.objects.create(user=user, key=key, request_hash=request_hash, job=job)
            return job, True
    except IntegrityError as exc:  # (the lock makes this one that cannot happen; if it does, nothing was stored)
        if key is not None and IdempotencyKey.objects.filter(user=user, key=key).exists():
            raise KeyInUse("a request with this Idempotency-Key is in progress: try again in a moment") from exc
        raise


def forget_expired_keys(now: datetime | None = None) -> int:
    """Delete every idempotency key older than IDEMPOTENCY_WINDOW (they answer nothing any more); how many. For the
    sweep: a submission with a key deletes its own user's anyway."""
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=(now or timezone.now()) - IDEMPOTENCY_WINDOW).delete()
    return deleted
