"""What can go wrong when making, starting or removing a cluster, and which of it is worth trying again.

Every provider raises `ProvisionError` or a subclass. `TransientProvisionError` says "the same call may succeed
later" (a node whose SSH is not up yet, a cloud API throttling, capacity that may come back); the pipeline retries
those with backoff (fc2/tasks.py) and fails the job with the message of anything else, at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ProvisionError(RuntimeError):
    """A cluster could not be made, started or removed; the message says why in the user's words."""

    transient = False


class TransientProvisionError(ProvisionError):
    """A failure that may pass: the same call, retried after a while, may succeed."""

    transient = True


class CapacityError(TransientProvisionError):
    """A cloud had no capacity for an instance type (in a zone, or in every zone tried): another zone, or another
    type, may have it."""

    def __init__(self, message: str, instance_type: str, zones: tuple[str, ...] = ()):
        super().__init__(message)
        self.instance_type = instance_type
        self.zones = zones


class NodeError(ProvisionError):
    """One node failed a step: the message names the node, so a user knows which machine and why."""

    def __init__(self, node: str, reason: str, transient: bool = False):
        super().__init__(f"node {node}: {reason}")
        self.node = node
        self.reason = reason
        self.transient = transient


def retry(
    call: Callable[[], T],
    *,
    attempts: int = 4,
    first_delay_s: float = 0.5,
    max_delay_s: float = 10.0,
    what: str = "",
) -> T:
    """`call()`, tried again with exponential backoff while it raises a transient ProvisionError (anything else, and
    the last attempt's error, propagates)."""
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except ProvisionError as error:
            if not error.transient or attempt == attempts:
                raise
            logger.info("%s failed (attempt %d of %d), retrying in %.1f s: %s", what, attempt, attempts, delay, error)
            time.sleep(delay)
            delay = min(delay * 2, max_delay_s)
    raise AssertionError("unreachable")
