"""What can go wrong when making, starting or removing a cluster, and which of it is worth trying again.

Every provider raises `ProvisionError` or a subclass. `TransientProvisionError` says "the same call may succeed
later" (a node whose SSH is not up yet, a cloud API throttling, capacity that may come back; `transient(error)`):
the pipeline retries those with backoff (fc2/tasks.py) and fails the job with the message of anything else, at once.
"""

from __future__ import annotations


class ProvisionError(RuntimeError):
    """A cluster could not be made, started or removed; the message says why in the user's words."""

    transient = False
    waits = False  # tried again without a limit on attempts: waiting its turn, not failing (NoRoomError)


class TransientProvisionError(ProvisionError):
    """A failure that may pass: the same call, retried after a while, may succeed."""

    transient = True


class NoRoomError(TransientProvisionError):
    """This machine has no room for another cluster now (the local provider's admission): one will have room once
    another cluster ends, so the launch waits — tried again for as long as it takes, never counted as a failure."""

    waits = True


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


def transient(error: BaseException) -> bool:
    """Whether `error` is a ProvisionError worth trying again (what common.retry.retry is told to retry)."""
    return isinstance(error, ProvisionError) and error.transient
