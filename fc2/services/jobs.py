"""Submitting jobs: the one path the wizard, the jobs API and `manage.py submit_job` all take — the request checked,
planned where a budget or `plan_first` asks (fc2/services/planning.py, the planner the wizard's preview and the
recommend step call too), and the job created with its pipeline started."""

from __future__ import annotations

import math
import re
import unicodedata
from decimal import Decimal
from typing import TYPE_CHECKING, Any, BinaryIO

from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import models, transaction

import provisioner
from common.numbers import usd
from fc2.models import Dataset, Framework, Job
from fc2.services import datasets, pipeline
from fc2.services.bundles import store_bundle
from fc2.services.files import atomic_with_files
from fc2.services.planning import Owner, Plan, check_workers, explore_unavailable, gpu_worker_types, plan
from fc2.services.requests import JobRequest, SubmitError
from recommender.types import ALGORITHMS, RecommendationError, key_framework

if TYPE_CHECKING:
    from django.contrib.auth.models import User

WORKLOAD_NAME_MAX = 100  # PerformanceRecord.workload's length
# What a job's workload name is, said the same by the wizard and `submit_job --help`.
WORKLOAD_NAME_HELP = (
    "The name this code and data's performance records are looked up (Model, Scala-Opt) and stored under; by "
    "default the wheel's distribution name, a colon and the dataset's name, e.g. fc2-digits-cnn:digits; a PyTorch "
    "job's records are filed apart, under the name with @pytorch added. Name another workload to use its records; "
    "add records with: manage.py import_perf_data PATH --workload NAME, with --format anwar2021 for headerless rows "
    "of that one workload (as Anwar et al. give them) or --format csv for rows under a header naming their columns."
)


# The most a job may ask the lab to delay each packet between its nodes, ms one way (a datacentre's latencies are a
# few ms; Anwar et al. emulate up to 100). Not the recommender's bound on a latency it is asked about
# (recommender.types.MAX_LATENCY_MS, a minute), which covers any network records were measured on.
MAX_NODE_DELAY_MS = 1000


def validate(request: JobRequest) -> None:
    if request.provider not in provisioner.PROVIDERS:
        raise SubmitError(
            f"unknown provider {request.provider!r} (available: {', '.join(sorted(provisioner.PROVIDERS))})",
            "provider",
        )
    if request.strategy not in Job.Strategy.values:
        raise SubmitError(
            f"unknown strategy {request.strategy!r} (expected {', '.join(map(repr, Job.Strategy.values))})", "strategy"
        )
    if reason := strategy_unavailable(request.strategy, request.algorithm):
        raise SubmitError(reason, "strategy")
    check_framework(request)
    if request.algorithm != "manual" and request.algorithm not in ALGORITHMS:
        raise SubmitError(
            f"unknown algorithm {request.algorithm!r} (expected manual or {', '.join(ALGORITHMS)})", "algorithm"
        )
    if reason := provider_unavailable(request.provider):
        raise SubmitError(reason, "provider")
    if reason := algorithm_unavailable(request.provider, request.algorithm):
        raise SubmitError(reason, "algorithm")
    check_workload_name(request)
    check_workers(request.provider, request.workers)
    if request.latency_ms and not provisioner.get(request.provider).latency:
        raise SubmitError(f"the {request.provider} provider cannot add latency between its nodes", "latency_ms")
    if not 0 <= request.latency_ms <= MAX_NODE_DELAY_MS:
        raise SubmitError(f"a latency is between 0 and {MAX_NODE_DELAY_MS} ms", "latency_ms")
    check_instance_types(request)
    check_gpu(request)
    check_parameters(request.parameters)
    if request.budget is not None and request.algorithm == "manual":
        raise SubmitError(BUDGET_WITHOUT_ALGORITHM, "budget")
    if request.total_budget is not None:
        check_amount(request.total_budget, Job._meta.get_field("total_budget"), "a job's total budget")
    check_search(request)
    check_managed(request)
    try:
        datasets.ready(request.dataset)
    except datasets.DatasetError as exc:
        raise SubmitError(str(exc), "dataset") from exc


# The strategies of each framework: TensorFlow's parameter server and MultiWorkerMirroredStrategy (or left open for the
# model to choose between them), PyTorch's DistributedDataParallel.
FRAMEWORK_STRATEGIES = {
    Framework.TENSORFLOW: (Job.Strategy.PS, Job.Strategy.MIRRORED, Job.Strategy.AUTO),
    Framework.PYTORCH: (Job.Strategy.DDP,),
}
# The Python distribution each framework's code requires, for the refusals.
FRAMEWORK_PACKAGES = {Framework.TENSORFLOW: "tensorflow", Framework.PYTORCH: "torch"}


def check_framework(request: JobRequest) -> None:
    """The framework asked is one the platform runs and the bundle does not contradict (what its Requires-Dist
    names, CodeBundle.framework), with a strategy of that framework; a bundle that needs CUDA goes to a provider with
    GPU workers, on GPU workers where the cluster is chosen by hand (an algorithm keeps to them:
    planning.gpu_worker_types, and check_gpu)."""
    if request.framework not in Framework.values:
        raise SubmitError(
            f"unknown framework {request.framework!r} (expected {' or '.join(map(repr, Framework.values))})",
            "framework",
        )
    framework = Framework(request.framework)
    required = request.bundle.framework
    if required and required != framework:
        raise SubmitError(
            f"the bundle {request.bundle.distribution} requires {FRAMEWORK_PACKAGES[Framework(required)]} (its "
            f"wheel's Requires-Dist), so its code trains with {Framework(required).label}, not {framework.label}: "
            f"submit it as framework {required}, or upload a bundle that requires {FRAMEWORK_PACKAGES[framework]}",
            "framework",
        )
    if request.strategy not in FRAMEWORK_STRATEGIES[framework]:
        if framework == Framework.PYTORCH:
            reason = (
                f"a PyTorch job runs DistributedDataParallel, all-reduce with no parameter server: strategy ddp (or "
                f"leave it out), not {request.strategy} — that is TensorFlow's"
            )
        else:
            reason = (
                f"strategy {request.strategy} is PyTorch's DistributedDataParallel: a TensorFlow job runs ps or "
                "mirrored (or submit the job as framework pytorch)"
            )
        raise SubmitError(reason, "strategy")


def check_workload_name(request: JobRequest) -> None:
    """A workload name given fits the records' column once its framework's mark is added
    (recommender.types.workload_key), and is not another framework's key: records of one framework are never read for
    another's job."""
    if not request.workload_name:
        return
    mark = len(request.workload) - len(request.workload_name)
    if len(request.workload) > WORKLOAD_NAME_MAX:
        stored = f" for a {Framework(request.framework).label} job (its records' key adds {mark})" if mark else ""
        raise SubmitError(f"a workload name has at most {WORKLOAD_NAME_MAX - mark} characters{stored}", "workload_name")
    if (named := key_framework(request.workload)) != request.framework:
        raise SubmitError(
            f"workload {request.workload_name!r} is a {Framework(named).label} workload's key, and this is a "
            f"{Framework(request.framework).label} job: name its own",
            "workload_name",
        )


def check_gpu(request: JobRequest) -> None:
    """A bundle that requires a CUDA-only package installs on GPU workers alone: refused where the provider has none,
    or where the worker types asked for (by hand, or L^w) have none."""
    if not request.bundle.cuda_requirement:
        return
    needs = f"the bundle requires {request.bundle.cuda_requirement}, which installs only where CUDA is"
    if not provisioner.get(request.provider).typed_nodes or not gpu_worker_types(request.catalog):
        raise SubmitError(
            f"{needs}, and the {request.provider} provider has no GPU worker type: rebuild the wheel against the CPU "
            "build (e.g. torch without +cu…, from https://download.pytorch.org/whl/cpu), or run it on a provider with "
            "GPU workers",
            "bundle",
        )
    if request.worker_type and not gpu_worker_types(request.catalog, [request.worker_type]):
        raise SubmitError(f"{needs}, and worker type {request.worker_type} has no GPU", "worker_type")
    if request.worker_types and not gpu_worker_types(request.catalog, request.worker_types):
        raise SubmitError(
            f"{needs}, and none of the worker types {', '.join(request.worker_types)} has a GPU", "worker_types"
        )


# A budget in $/h is the recommender's C: Manual, which runs the count given, takes none.
BUDGET_WITHOUT_ALGORITHM = (
    "budget is the recommender's budget C in $/h, which Manual does not take (it runs the workers given); a budget "
    "for the whole job, in $, is total_budget"
)
STRATEGY_LEFT_OPEN_REASON = (
    "A strategy left open is chosen by the Model algorithm, which compares both from the workload's records, or by "
    "explore, which tries both: choose one of them, or name the strategy (Parameter server or All-Reduce)."
)
# The algorithms that choose a strategy left open: the model compares both (recommender.perfmodel.choice); explore's
# configurations have either (recommender/explore_answer.py).
CHOOSE_THE_STRATEGY = ("model", "explore")


def strategy_unavailable(strategy: str, algorithm: str) -> str | None:
    """Why `algorithm` cannot run a job whose strategy is `strategy`, or None. Only the model and explore choose a
    strategy left open; every other algorithm sizes a cluster of the strategy it is given."""
    if strategy == Job.Strategy.AUTO and algorithm not in CHOOSE_THE_STRATEGY:
        return STRATEGY_LEFT_OPEN_REASON
    return None


def check_search(request: JobRequest) -> None:
    """explore's weights and its search's budget: each a number it can use, said per field; and a whole-job budget
    that covers the search, whose trials count in the job's cost."""
    for name in ("alpha", "beta"):
        value = getattr(request, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise SubmitError(f"{name} is a weight of at least 0 (not {value!r})", name)
    if request.alpha + request.beta <= 0:
        raise SubmitError("alpha and beta cannot both be 0: one of time and cost must count", "alpha")
    if request.search_budget is not None:
        amount = request.search_budget
        if not amount.is_finite() or amount <= 0:
            raise SubmitError(f"a search budget is an amount of dollars above $0 (not {amount})", "search_budget")
    minutes = request.search_minutes
    # isinstance: a request made from JSON or a form may carry a float or a bool where an int is declared
    if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1):  # type: ignore[redundant-expr]
        raise SubmitError(f"a search's minutes are a whole number of at least 1 (not {minutes!r})", "search_minutes")
    search, _ = request.search_limits
    if request.algorithm == "explore" and request.total_budget is not None and request.total_budget < search:
        raise SubmitError(
            f"the job's total budget of {usd(request.total_budget)} does not cover explore's search budget of "
            f"{usd(search)}, whose trial runs count in the job's cost: raise it, or lower the search budget",
            "total_budget",
        )


# The most restarts a job may ask for: each relaunches its lost nodes, so more would rather hide a broken cluster.
MAX_RESTARTS = 20
# The providers with spot instances.
SPOT_PROVIDERS = ("aws",)


def check_managed(request: JobRequest) -> None:
    """A managed job's restarts and spot settings, each a value it can use, said per field; spot only where the
    provider has spot instances."""
    restarts = request.max_restarts
    # isinstance: a request made from JSON or a form may carry a float or a bool where an int is declared
    whole = not isinstance(restarts, bool) and isinstance(restarts, int)
    if not whole or not 0 <= restarts <= MAX_RESTARTS:
        raise SubmitError(f"max_restarts is a whole number from 0 to {MAX_RESTARTS} (not {restarts!r})", "max_restarts")
    if not isinstance(request.spot, bool):
        raise SubmitError(f"spot is true or false (not {request.spot!r})", "spot")
    if request.spot_fallback not in Job.SpotFallback.values:
        raise SubmitError(
            f"spot_fallback is {' or '.join(Job.SpotFallback.values)} (not {request.spot_fallback!r})", "spot_fallback"
        )
    if request.spot and request.provider not in SPOT_PROVIDERS:
        raise SubmitError(
            f"spot instances are an aws provider's; the {request.provider} provider has none (ask for aws, or no spot)",
            "spot",
        )
    if (price := request.spot_max_price) is not None:
        if not request.spot:
            raise SubmitError("spot_max_price is the most a spot instance may cost: it needs spot", "spot_max_price")
        check_amount(price, Job._meta.get_field("spot_max_price"), "a spot price", "/h")


# Scala-Opt and Scala-Opt-M size the cluster by its parameter server's network capacity (FC² §5.2.4).
SIZED_BY_THE_PS = ("scala-opt", "scala-opt-m")


def algorithm_unavailable(provider: str, algorithm: str) -> str | None:
    """Why `algorithm` can never choose a cluster on `provider`, or None. Scala-Opt counts the workers one PS's link
    carries, from the bandwidth each worker was measured to send: a provider whose nodes share the machine's network
    (local) has no such link, and no profile can be measured there, nor would one measured elsewhere describe it.
    explore runs trials on instance types, which such a provider does not have (`planning.explore_unavailable`)."""
    if algorithm == "explore":
        return explore_unavailable(provider)
    if algorithm not in SIZED_BY_THE_PS or provider not in provisioner.PROVIDERS:
        return None
    entry = provisioner.get(provider)
    if entry.own_network:
        return None
    return (
        f"Scala-Opt sizes the cluster by its parameter server's network link, and {entry.label}'s nodes share the "
        "machine's network, with no link of their own to size by or to measure a worker's bandwidth on: choose "
        f"Manual, Cost-Opt, Time-Opt or the model for a {provider} job, or run it on the lab or AWS"
    )


def provider_unavailable(provider: str) -> str | None:
    """Why `provider` cannot make a cluster on this installation, and the way to change that; None when it can."""
    return provisioner.unavailable(provider)


def worker_type_missing(provider: str, algorithm: str, worker_type: str) -> str | None:
    """Why a cluster chosen by hand on `provider` cannot be made without a worker type, or None."""
    if algorithm == "manual" and not worker_type and (chosen := provisioner.get(provider)).needs_worker_type:
        return (
            f"{chosen.label} has no default machine: a cluster chosen by hand needs its worker type "
            "(or a resource configuration that recommends one)"
        )
    return None


def check_instance_types(request: JobRequest) -> None:
    """The PS and worker types asked for exist in the catalogue the job is priced from (for the lab: the only types
    its nodes can have); a provider with no default machine is given its worker type."""
    from recommender.models import InstanceType

    if reason := worker_type_missing(request.provider, request.algorithm, request.worker_type):
        raise SubmitError(reason, "worker_type")

    for name, field_name in ((request.ps_type, "ps_type"), (request.worker_type, "worker_type")):
        if name and not InstanceType.objects.filter(catalog__name=request.catalog, name=name).exists():
            known = InstanceType.objects.filter(catalog__name=request.catalog).values_list("name", flat=True)
            raise SubmitError(
                f"no instance type {name!r} in the {request.catalog} catalogue ({', '.join(sorted(known))})", field_name
            )


def check_amount(amount: Decimal, column: models.DecimalField, what: str, per: str = "") -> None:
    """`amount`, for Job's `column` ("a job's total budget" in words, in $ or $`per`), is above $0 and fits that
    column; else a SubmitError on its field saying why."""
    if not amount.is_finite() or amount <= 0:
        raise SubmitError(f"{what} must be more than $0{per} (not {amount})", column.name)
    try:
        column.run_validators(amount)
    except ValidationError as exc:
        raise SubmitError(f"{what} of ${amount}{per}: {' '.join(exc.messages)}", column.name) from exc


def check_budget(request: JobRequest, plan: Plan) -> None:
    """The whole-job budget covers the plan's own estimate of the whole job's cost (`Plan.estimate`: start-up,
    training and teardown), when the plan has one: a job that could only be stopped for its budget is refused now,
    with the figures."""
    estimate = plan.estimate(request.epochs)
    if request.total_budget is not None and estimate is not None and estimate.total > request.total_budget:
        raise SubmitError(
            f"the cluster's projected total cost, {usd(estimate.total)} for {request.epochs} epoch"
            f"{'s' if request.epochs != 1 else ''}, exceeds the job's total budget of {usd(request.total_budget)}. "
            f"{estimate.basis}",
            "total_budget",
        )


# The script's parameters, bounded so that each passes on a command line as `--NAME=VALUE` (fc2.models.Job.parameters):
# a name is an identifier of ASCII letters, digits, '_' and '-', a value one line of printable text.
MAX_PARAMETERS = 100
MAX_PARAMETER_NAME = 64
MAX_PARAMETER_VALUE = 1000
PARAMETER_NAME = re.compile(r"[A-Za-z0-9_-]+")


def check_parameters(parameters: dict[str, str]) -> None:
    """Parameters the nodes can pass on as `--NAME=VALUE`: refused here, at every door (the API, the wizard,
    `submit_job`), with the reason, rather than failing the job when its nodes start."""
    if len(parameters) > MAX_PARAMETERS:
        raise SubmitError(f"at most {MAX_PARAMETERS} parameters (not {len(parameters)})", "parameters")
    for key, value in parameters.items():
        shown = repr(key if len(key) <= MAX_PARAMETER_NAME else key[:MAX_PARAMETER_NAME] + "…")
        if not PARAMETER_NAME.fullmatch(key):
            raise SubmitError(f"parameter name {shown} must be letters, digits, '_' or '-'", "parameters")
        if len(key) > MAX_PARAMETER_NAME:
            raise SubmitError(f"parameter name {shown} is longer than {MAX_PARAMETER_NAME} characters", "parameters")
        if key.startswith("-"):
            raise SubmitError(f"parameter name {shown} must begin with a letter, a digit or '_'", "parameters")
        if not isinstance(value, str):
            raise SubmitError(f"parameter {shown}: its value must be text", "parameters")
        if len(value) > MAX_PARAMETER_VALUE:
            raise SubmitError(
                f"parameter {shown}: a value has at most {MAX_PARAMETER_VALUE:,} characters (not {len(value):,})",
                "parameters",
            )
        if any(unicodedata.category(char) == "Cc" for char in value):
            raise SubmitError(
                f"parameter {shown}: a value may not hold control characters (a NUL, a tab, a line break…)",
                "parameters",
            )


def planned(request: JobRequest, owner: Owner = None) -> Plan:
    """The request's cluster (RecommendationError, SubmitError — also when the plan's projected total cost exceeds
    the whole-job budget)."""
    cluster = plan(request, owner)
    check_budget(request, cluster)
    return cluster


def submit(owner: User, request: JobRequest, driver: str = Job.Driver.CELERY, *, plan_first: bool = False) -> Job:
    """Create the job and start its pipeline (on commit, so the worker sees the row).

    With `plan_first`, a recommender that cannot answer (e.g. `model` for a workload with no records) refuses the job
    now, with its reason, instead of failing it in its recommend step. A job with a budget, or explore's, is planned
    first too: refused when its plan's projected total cost already exceeds its total budget, when its budget in $/h
    cannot buy a cluster, or when explore's search cannot start (`planned`). The job keeps the request as it came
    (`Job.request`); its recommend step writes the plan.
    """
    validate(request)
    # explore is planned too: a search its budget cannot start, or too wide to weigh, is refused now, with the reason
    if plan_first or request.total_budget is not None or request.budget is not None or request.algorithm == "explore":
        try:
            planned(request, owner)
        except RecommendationError as exc:
            raise SubmitError(str(exc), "algorithm") from exc
    with transaction.atomic():
        if request.dataset.pk is None:
            request.dataset.save()
        job = Job.objects.create(
            owner=owner,
            request=request.as_json(),
            bundle=request.bundle,
            dataset=request.dataset,
            parameters=request.parameters,
            provider=request.provider,
            algorithm=request.algorithm,
            region=request.region,
            latency_ms=request.latency_ms,
            budget=request.budget,
            total_budget=request.total_budget,
            catalog=request.catalog,
            worker_types=request.worker_types,
            workload_name=request.workload_name,
            max_restarts=request.max_restarts,
            spot=request.spot,
            spot_max_price=request.spot_max_price,
            spot_fallback=request.spot_fallback,
            framework=request.framework,
            driver=driver,
        )
        job.events.create(state=job.state, message=f"submitted by {owner}")
        pipeline.enqueue(job, "recommend")
    return job


def submit_upload(
    owner: User,
    wheel: BinaryIO,
    filename: str,
    main_script: str = "main.py",
    *,
    dataset: Dataset | None = None,
    dataset_file: UploadedFile | None = None,
    driver: str = Job.Driver.CELERY,
    plan_first: bool = False,
    **options: Any,
) -> Job:
    """Store the uploaded wheel (and dataset file, if any) and submit the job: all of it, or nothing at all.

    Raises BundleError, DatasetError or SubmitError; `options` are the other JobRequest fields.
    """
    with atomic_with_files():
        bundle = store_bundle(owner, wheel, filename, main_script)
        if dataset_file is not None:
            dataset = datasets.store_upload(owner, dataset_file)
        if dataset is None:
            raise SubmitError("a job needs a dataset: a stored one or a file")
        request = JobRequest(bundle=bundle, dataset=dataset, **options)
        return submit(owner, request, driver=driver, plan_first=plan_first)


def parse_parameters(pairs: list[str]) -> dict[str, str]:
    """`["epochs=2", "lr=0.1"]` -> {"epochs": "2", "lr": "0.1"}; a pair without '=' is an error."""
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SubmitError(f"parameter {pair!r} is not KEY=VALUE", "parameters")
        params[key.strip()] = value.strip()
    return params
