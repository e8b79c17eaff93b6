"""The boto3 adaptor (common/awsapi.py) as the aws provider calls it: the same `call`, `pages` and `wait`, their
failures as the provisioner's errors — a capacity shortage a `CapacityError` (launch fails over on it), anything
else an `AwsError`, a `ProvisionError` that keeps AWS's code (teardown tells a resource already gone by it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from common import awsapi
from provisioner.errors import CapacityError, ProvisionError

T = TypeVar("T")

credentials_missing = awsapi.credentials_missing


class AwsError(ProvisionError):
    """An AWS call failed; `code` is AWS's error code ("" when the call never got an answer)."""

    def __init__(self, message: str, code: str = "", transient: bool = False):
        super().__init__(message)
        self.code = code
        self.transient = transient


@contextmanager
def _as_provision_error() -> Iterator[None]:
    try:
        yield
    except awsapi.AwsError as error:
        if error.capacity:
            raise CapacityError(str(error), error.instance_type, error.zones) from None
        raise AwsError(str(error), error.code, transient=error.transient) from None


def _translated(function: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(function)
    def translated(*args: Any, **kwargs: Any) -> T:
        with _as_provision_error():
            return function(*args, **kwargs)

    return translated


call = _translated(awsapi.call)
pages = _translated(awsapi.pages)
wait = _translated(awsapi.wait)
