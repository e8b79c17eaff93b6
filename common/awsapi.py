"""boto3 behind one adaptor: every AWS call the platform makes — the aws provider's (provisioner/aws/) and the price
refresh's (recommender/pricing.py) — goes through `call`, `pages` or `wait` here.

- boto3 is imported lazily (a platform without AWS never loads it) and each thread has its own session and clients
  (boto3 sessions are not thread-safe; the bootstrap and the sweep run threads).
- Credentials are the standard boto3 chain (environment, shared files, …) without the instance-metadata and container
  endpoints unless `FC2_AWS_INSTANCE_PROFILE` says the platform runs on EC2 or ECS with a role: outside them that
  link-local address answers nobody (a second's wait at each check) or, worse, somebody else. Whether there are
  credentials is found once per environment and kept. `AWS_ENDPOINT_URL` is honoured by boto3 itself, so moto's
  server or LocalStack can stand in for AWS.
- A call is retried with backoff (common/retry.py) only when AWS says the failure is on its side or a matter of rate
  (throttling, 5xx, a dropped connection); botocore's own retries are off so that this is the one policy, and
  `AWS_MAX_ATTEMPTS` sets its attempts as it would botocore's. Anything else is raised at once as an `AwsError` in the
  user's words, with AWS's code; a capacity shortage says so (`capacity`), and the aws provider fails over on it.
- Every API call made (waiters' polls included) is counted in `CALLS`, for benchmarks/aws_launch.py.

No Django and no app here (a leaf: the provider and the price refresh both import it); callers turn `AwsError` into
their own errors (provisioner/aws/api.py, recommender/pricing.py).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from common.retry import retry

if TYPE_CHECKING:  # boto3 is imported lazily, and has no type hints of its own: these name what is meant
    from boto3.session import Session
    from botocore.client import BaseClient
    from botocore.exceptions import ClientError
    from botocore.model import OperationModel

logger = logging.getLogger(__name__)

# Error codes that mean "AWS, not the request": tried again with backoff.
RETRYABLE = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)
# Error codes that mean "no capacity for this type here now": launch tries another zone, then another type.
CAPACITY = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "InsufficientCapacity",
        "Unsupported",  # the type is not offered in this zone
    }
)
# Error codes that mean the credentials or their rights are wrong: no retry helps, and the message says what to fix.
AUTH = frozenset({"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch"})

ATTEMPTS = 6
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 20.0

CALLS: Counter[str] = Counter()  # operation name -> calls made, every thread together
_calls_lock = threading.Lock()
_local = threading.local()


class AwsError(RuntimeError):
    """An AWS call failed; `code` is AWS's error code ("" when the call never got an answer), `detail` AWS's message.
    A capacity shortage has `capacity` set, with the instance type and the zone it was asked in."""

    def __init__(
        self,
        message: str,
        code: str = "",
        transient: bool = False,
        *,
        detail: str = "",
        capacity: bool = False,
        instance_type: str = "",
        zones: tuple[str, ...] = (),
        credentials: bool = False,
    ):
        super().__init__(message)
        self.code = code
        self.transient = transient
        self.detail = detail or message
        self.capacity = capacity
        self.instance_type = instance_type
        self.zones = zones
        self.credentials = credentials  # there were no credentials to sign the call with


def _count(model: OperationModel, **_: object) -> None:
    with _calls_lock:
        CALLS[model.name] += 1


# What the credential chain reads: a change of any of these is a new session and a new answer to credentials_missing.
CREDENTIAL_ENVIRONMENT = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "FC2_AWS_INSTANCE_PROFILE",
)


def _environment() -> tuple[str, ...]:
    return tuple(os.environ.get(name, "") for name in CREDENTIAL_ENVIRONMENT)


def instance_profile_allowed() -> bool:
    """FC2_AWS_INSTANCE_PROFILE=1: the platform runs on EC2 (or ECS) and may take its role's credentials from the
    instance-metadata (or container) endpoint."""
    return os.environ.get("FC2_AWS_INSTANCE_PROFILE", "").strip().lower() in {"1", "true", "yes", "on"}


def _session() -> Session:
    """A boto3 session whose credential chain reaches the instance-metadata and container endpoints only where
    `instance_profile_allowed`."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    if not instance_profile_allowed():
        resolver = core.get_component("credential_provider")
        for name in ("iam-role", "container-role"):
            resolver.remove(name)
    return boto3.session.Session(botocore_session=core)


def client(service: str, region: str) -> BaseClient:
    """This thread's boto3 client for `service` in `region` (botocore's retries off: `call` retries). A change of
    endpoint or credentials in the environment gets a new session."""
    environment = _environment()
    if getattr(_local, "environment", None) != environment:
        _local.session = _session()
        _local.clients = {}
        _local.environment = environment
    clients = _local.clients
    if (service, region) not in clients:
        from botocore.config import Config

        config = Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60)
        made = _local.session.client(service, region_name=region, config=config)
        made.meta.events.register("before-call", _count)
        clients[service, region] = made
    return clients[service, region]


def credentials_missing() -> str | None:
    """Why boto3 has no credentials here (and how to give it some), or None when it has: found once per environment
    (pages ask at every render)."""
    return _credentials_missing(_environment())


@functools.lru_cache(maxsize=8)
def _credentials_missing(environment: tuple[str, ...]) -> str | None:
    try:
        session = _session()
    except ImportError:
        return "boto3 is not installed"
    if session.get_credentials() is None:
        return (
            "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a shared "
            "credentials file, or run the platform on EC2 with an instance profile and FC2_AWS_INSTANCE_PROFILE=1"
        )
    return None


def _send(service: str, region: str, operation: str, params: dict[str, Any]) -> dict:
    """The one place a request leaves for AWS (tests inject AWS's own errors here, and nowhere else)."""
    return getattr(client(service, region), operation)(**params)


def call(service: str, region: str, operation: str, **params: Any) -> dict:
    """`client.operation(**params)`, retried with backoff while AWS says it is its fault or a matter of rate."""
    return retry(
        lambda: _answer(service, region, operation, params),
        retryable=lambda error: isinstance(error, AwsError) and error.transient and not error.capacity,
        attempts=int(os.environ.get("AWS_MAX_ATTEMPTS") or ATTEMPTS),
        first_delay_s=FIRST_DELAY_S,
        max_delay_s=MAX_DELAY_S,
        what=f"AWS {operation}",
    )


def _answer(service: str, region: str, operation: str, params: dict[str, Any]) -> dict:
    """One try of the call, its failure as an AwsError."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

    try:
        return _send(service, region, operation, params)
    except (NoCredentialsError, PartialCredentialsError):
        raise AwsError(credentials_missing() or "no AWS credentials", credentials=True) from None
    except ClientError as error:
        raise classify(error, operation, params) from None
    except BotoCoreError as error:  # no answer at all: connection refused or dropped, a response not parsed
        raise AwsError(f"AWS {operation} got no answer: {error}", transient=True, detail=str(error)) from None


def classify(error: ClientError, operation: str, params: dict[str, Any]) -> AwsError:
    """A botocore ClientError as the platform's error: capacity, retryable, credentials or anything else."""
    info = error.response.get("Error", {})
    code = info.get("Code", "")
    message = info.get("Message", "") or str(error)
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    if code in CAPACITY:
        zone = params.get("Placement", {}).get("AvailabilityZone", "")
        instance_type = params.get("InstanceType", "")
        where = f" in {zone}" if zone else ""
        return AwsError(
            f"no capacity for {instance_type}{where}: {message}",
            code,
            transient=True,
            detail=message,
            capacity=True,
            instance_type=instance_type,
            zones=(zone,) if zone else (),
        )
    if code in AUTH:
        return AwsError(f"AWS refused the credentials for {operation} ({code}): {message}", code, detail=message)
    transient = code in RETRYABLE or status >= 500
    return AwsError(f"AWS {operation} failed ({code or status}): {message}", code, transient=transient, detail=message)


def pages(service: str, region: str, operation: str, key: str, **params: Any) -> list[Any]:
    """Every item under `key` of every page of a paginated call (each page through `call`, so retried alike): dicts,
    or the Pricing API's JSON strings."""
    items: list[Any] = []
    while True:
        page = call(service, region, operation, **params)
        items.extend(page.get(key, []))
        if not page.get("NextToken"):
            return items
        params = {**params, "NextToken": page["NextToken"]}


def wait(region: str, waiter: str, *, timeout_s: float, delay_s: float = 5, **params: Any) -> None:
    """Wait with boto3's EC2 waiter `waiter` (instance_running, instance_status_ok, instance_terminated, …) for at most
    `timeout_s`; a waiter that gives up, or meets a failure state, is an AwsError naming what it waited for."""
    from botocore.exceptions import ClientError, WaiterError

    attempts = max(1, int(timeout_s / delay_s))
    try:
        client("ec2", region).get_waiter(waiter).wait(
            **params, WaiterConfig={"Delay": delay_s, "MaxAttempts": attempts}
        )
    except WaiterError as error:
        last = error.last_response or {}
        reason = last.get("Error", {}).get("Message") or error.kwargs.get("reason") or str(error)
        raise AwsError(f"waiting for {waiter.replace('_', ' ')} gave up: {reason}", transient=True) from None
    except ClientError as error:
        raise classify(error, waiter, params) from None
