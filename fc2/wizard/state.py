"""The wizard's session-stored state: the steps, which of them are done, and the JobRequest the answers make.

A half-finished wizard lives in the session under SESSION_KEY as plain JSON — never a file — so a reload, going back,
or a re-run (`Wizard.prefill`) all start from the same small state.
"""

from __future__ import annotations

from decimal import Decimal
from functools import cached_property

from django.http import HttpRequest

import provisioner
from fc2.models import CodeBundle, Dataset, Framework, Job, workload_name
from fc2.services import datasets, jobs, planning, search
from fc2.services.requests import framework_strategy
from recommender import service

SESSION_KEY = "fc2_wizard"
STEPS = {"code": "Code", "data": "Data", "resource": "Resource", "review": "Review"}
ONE_WORKER_TYPE = planning.ONE_WORKER_TYPE
SEARCH_DEFAULTS = ("search_budget", "search_minutes")  # explore's, None: the platform's (FC2_EXPLORE_USD, _MINUTES)


class Wizard:
    """One browser session's half-finished job: {"code": {bundle, parameters}, "data": {source, dataset | url},
    "resource": {ResourceForm fields}, "current": step}."""

    def __init__(self, request: HttpRequest):
        self.session = request.session
        self.user = request.user
        self.state: dict = dict(self.session.get(SESSION_KEY) or {})

    def _save(self) -> None:
        self.session[SESSION_KEY] = self.state
        self.__dict__.pop("done", None)

    def clear(self) -> None:
        self.state = {}
        self.session.pop(SESSION_KEY, None)
        self.__dict__.pop("done", None)

    def bundle(self) -> CodeBundle | None:
        pk = self.state.get("code", {}).get("bundle")
        return CodeBundle.objects.visible_to(self.user).filter(pk=pk).first() if pk else None

    def dataset(self) -> Dataset | None:
        """The chosen dataset (a URL one unsaved until the job is); None when none is chosen or it is gone."""
        data = self.state.get("data", {})
        if data.get("source") == "url":
            try:
                return datasets.resolve(self.user, data["url"])
            except datasets.DatasetError:  # refused since it was chosen (its name now resolves inside): choose again
                return None
        pk = data.get("dataset")
        return Dataset.objects.visible_to(self.user).filter(pk=pk).first() if pk else None

    @property
    def parameters(self) -> dict[str, str]:
        return self.state.get("code", {}).get("parameters", {})

    @cached_property
    def done(self) -> dict[str, bool]:
        """Which steps hold a usable answer (a deleted bundle or dataset reopens its step)."""
        return {
            "code": self.bundle() is not None,
            "data": self.dataset() is not None,
            "resource": "resource" in self.state,
            "review": False,
        }

    def first_open(self) -> str:
        return next(step for step in STEPS if not self.done[step])

    def reachable(self, step: str) -> bool:
        """A step is open once every step before it is done."""
        before = list(STEPS)[: list(STEPS).index(step)]
        return all(self.done[earlier] for earlier in before)

    def current(self) -> str:
        step = self.state.get("current")
        return step if step in STEPS and self.reachable(step) else self.first_open()

    def visit(self, step: str) -> None:
        if self.state.get("current") != step:
            self.state["current"] = step
            self._save()

    def save_code(self, bundle: CodeBundle, parameters: dict[str, str]) -> None:
        """The code step's answer. Another bundle than the one saved takes a saved resource step to its framework
        (`for_bundle`): what the framework was for the old code is no choice the user made for the new."""
        if "resource" in self.state and self.state.get("code", {}).get("bundle") != bundle.pk:
            self.state["resource"] = for_bundle(self.resource(), bundle)
        self.state["code"] = {"bundle": bundle.pk, "parameters": parameters}
        self._save()

    def save_data(self, data: dict) -> None:
        self.state["data"] = data
        self._save()

    def default_workload(self) -> str:
        """The workload this code and data are filed under unless named otherwise ("" until both are chosen)."""
        bundle, dataset = self.bundle(), self.dataset()
        return workload_name(bundle, dataset, bundle.framework or Framework.TENSORFLOW) if bundle and dataset else ""

    def save_resource(self, resource: dict) -> None:
        """The resource step's fields; the default workload name is kept as "" so that it follows the code and
        data if they change."""
        if resource.get("workload_name") == self.default_workload():
            resource = {**resource, "workload_name": ""}
        self.state["resource"] = resource
        self._save()

    def prefill(self, job: Job) -> None:
        """Start again from `job`: its bundle, dataset, parameters and the resources it asked for (a left-open
        strategy, a limit, a budget are asked again). The request these steps make is `JobRequest.of(job)`, what the
        API's re-run submits (tests/test_api_jobs.py)."""
        asked = jobs.JobRequest.of(job)
        self.state = {
            "code": {"bundle": job.bundle_id, "parameters": {str(k): str(v) for k, v in asked.parameters.items()}},
            "data": {
                "source": "builtin" if job.dataset.kind == Dataset.Kind.BUILTIN else "mine",
                "dataset": job.dataset_id,
            },
            "resource": {
                "framework": asked.framework,
                "provider": asked.provider,
                "region": asked.region,
                "latency_ms": asked.latency_ms,
                "strategy": asked.strategy,
                "algorithm": asked.algorithm,
                "catalog": asked.catalog,
                "ps_type": asked.ps_type,
                "worker_type": asked.worker_type,
                "worker_types": list(asked.worker_types),
                "limit": "budget" if asked.budget is not None else "workers",
                "max_workers": asked.workers,
                "budget": _amount(asked.budget),
                "total_budget": _amount(asked.total_budget),
                "workload_name": asked.workload_name,
                "preset": search.preset_of(asked.alpha, asked.beta),
                "alpha": asked.alpha,
                "beta": asked.beta,
                "search_budget": _amount(asked.search_budget),
                "search_minutes": asked.search_minutes,
                "max_restarts": asked.max_restarts,
                "spot": asked.spot,
                "spot_max_price": _amount(asked.spot_max_price),
                "spot_fallback": asked.spot_fallback,
            },
        }
        self._save()

    # What each step's form starts from.

    def initial(self, step: str) -> dict:
        if step == "code":
            code = self.state.get("code")
            if code and self.bundle():
                return {"source": "library", "bundle": code["bundle"], "parameters": code["parameters"]}
            return {"parameters": self.parameters}
        if step == "data":
            data = self.state.get("data", {})
            if data.get("source") == "url":
                return {"source": "url", "url": data["url"]}
            dataset = self.dataset()
            if dataset is None:
                return {"builtin": "digits"}
            if dataset.kind == Dataset.Kind.BUILTIN:
                return {"source": "builtin", "builtin": dataset.builtin_name}
            return {"source": "mine", "dataset": dataset.pk}
        # An explore budget left to the platform (None) shows the platform's default, which it is, filled in.
        resource = {k: v for k, v in self.resource().items() if v is not None or k not in SEARCH_DEFAULTS}
        default = self.default_workload()
        return {
            **self._framework_defaults(),
            **resource,
            "workload_name": resource.get("workload_name") or default,
            "default_workload": default,
        }

    def _framework_defaults(self) -> dict:
        """The framework the bundle requires and its strategy (JobRequest's own defaults), for a resource step not
        answered yet; none while the bundle names no framework."""
        bundle = self.bundle()
        if bundle is None or not bundle.framework:
            return {}
        return {"framework": bundle.framework, "strategy": framework_strategy(bundle.framework, "")}

    def resource(self) -> dict:
        """The saved resource step. One saved before `budget` meant $/h (`hourly_budget`, with `budget` the whole
        job's $) is read in today's names: a session begun before an upgrade goes on as it was."""
        resource = dict(self.state.get("resource", {}))
        if "hourly_budget" in resource:
            resource["total_budget"] = resource.pop("budget", None)
            resource["budget"] = resource.pop("hourly_budget")
        return resource

    def job_request(self, resource: dict | None = None) -> jobs.JobRequest:
        """The JobRequest of the saved state (with `resource` in place of the saved resource step, if given)."""
        r = resource or self.resource()
        one_type = r["algorithm"] in ONE_WORKER_TYPE
        budget = Decimal(r["budget"]) if r["limit"] == "budget" and r["budget"] else None
        return jobs.JobRequest(
            bundle=self.bundle(),
            dataset=self.dataset(),
            parameters=dict(self.parameters),
            provider=r["provider"],
            region=r["region"] if r["provider"] == "aws" else "",
            latency_ms=(r.get("latency_ms") or 0.0) if provisioner.get(r["provider"]).latency else 0.0,
            strategy=r["strategy"],
            # (a session saved before frameworks has none: the bundle's, else TensorFlow)
            framework=r.get("framework") or "",
            # With a budget no count is asked: the recommendation sets it.
            workers=r["max_workers"] if budget is None else 1,
            algorithm=r["algorithm"],
            ps_type=r["ps_type"],
            worker_type=r["worker_type"] if one_type else "",
            worker_types=[] if one_type else list(r["worker_types"]),
            catalog=r["catalog"] or service.DEFAULT_CATALOG,
            budget=budget,
            total_budget=Decimal(r["total_budget"]) if r.get("total_budget") else None,
            workload_name=r.get("workload_name") or "",
            # (a session saved before managed jobs has none of theirs: the defaults)
            max_restarts=r.get("max_restarts") or 0,
            spot=bool(r.get("spot")) and r["provider"] in jobs.SPOT_PROVIDERS,
            spot_max_price=Decimal(r["spot_max_price"]) if r.get("spot") and r.get("spot_max_price") else None,
            spot_fallback=r.get("spot_fallback") or Job.SpotFallback.ON_DEMAND,
            **(_search(r) if r["algorithm"] == "explore" else {}),
        )


def for_bundle(resource: dict, bundle: CodeBundle) -> dict:
    """A saved resource step as it stands for `bundle`: the framework the bundle requires (one that names none keeps
    the saved framework), and the saved strategy where that framework offers it, else the framework's own
    (`framework_strategy`, as JobRequest makes it)."""
    framework = Framework(bundle.framework or resource.get("framework") or Framework.TENSORFLOW)
    strategy = resource.get("strategy") or ""
    offered = strategy if strategy in jobs.FRAMEWORK_STRATEGIES[framework] else ""
    return {**resource, "framework": framework.value, "strategy": framework_strategy(framework, offered)}


def _search(resource: dict) -> dict:
    """explore's fields of the request: its weights (the form keeps the preset's) and its search's budget (empty:
    the platform's default)."""
    alpha, beta = search.PRESETS[search.DEFAULT_PRESET]
    return {
        "alpha": resource["alpha"] if resource.get("alpha") is not None else alpha,
        "beta": resource["beta"] if resource.get("beta") is not None else beta,
        "search_budget": Decimal(resource["search_budget"]) if resource.get("search_budget") else None,
        "search_minutes": resource.get("search_minutes") or None,
    }


def _amount(value: Decimal | None) -> str | None:
    """A stored amount as the form shows it: 0.7500 -> "0.75"."""
    return format(value.normalize(), "f") if value is not None else None
