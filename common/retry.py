"""The one retry helper for the platform's own retries: a call tried again with exponential backoff while what it
raises is worth trying again (the caller says which errors are).

Used by the boto3 adaptor (common/awsapi.py), the bootstrap's steps (provisioner/nodes.py) and SSH's connect
(provisioner/ssh.py). A job's step that fails transiently is retried through Celery instead (fc2/tasks.py), and the
node agent keeps its stdlib-only loop (monitor/agent.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


def retry(
    call: Callable[[], T],
    *,
    retryable: Callable[[BaseException], bool],
    attempts: int | None = 4,
    timeout_s: float | None = None,
    first_delay_s: float = 0.5,
    max_delay_s: float = 10.0,
    what: str = "",
) -> T:
    """`call()`, tried again while it raises an error that `retryable` accepts, waiting `first_delay_s` and twice as
    long each time after (at most `max_delay_s`); it gives up after `attempts` calls, or once `timeout_s` has passed
    (the last wait shortened to end there), and then raises the last error. Anything not retryable is raised at once.

    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise TimeoutError("not yet")
    ...     return "done"
    >>> retry(flaky, retryable=lambda e: isinstance(e, TimeoutError), first_delay_s=0), len(calls)
    ('done', 3)
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    delay = first_delay_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as error:
            if not retryable(error) or (attempts is not None and attempt >= attempts):
                raise
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            if pause <= 0 and deadline is not None:
                raise
            logger.info("%s failed (attempt %d), retrying in %.1f s: %s", what or "a call", attempt, pause, error)
        time.sleep(pause)
        delay = min(delay * 2, max_delay_s)
