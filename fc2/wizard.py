"""The job wizard (FC² §6, Figs. 3–5): Code → Data → Resource → Review, then Run.

A half-finished wizard lives in the session under SESSION_KEY as plain JSON: the id of the chosen bundle, the dataset
(its id, or the URL of one not stored yet), the parameters and the resource fields — never a file. An upload is
validated and stored as soon as its step is submitted and joins the user's library, so a reload, going back, or a
re-run (`?from=<job id>`) all start from the same small state. The views stay thin: checking is the forms' job;
storing, recommending and submitting are the services'.
"""

from __future__ import annotations

from decimal import Decimal
from functools import cached_property
from itertools import zip_longest

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

import provisioner
from fc2.bundles import BundleError, validate_wheel
from fc2.models import CodeBundle, Dataset, Job, workload_name
from fc2.services import datasets, jobs
from fc2.services.bundles import store_bundle
from fc2.templatetags.fc2_ui import capacity, gib, per_hour
from recommender import service
from recommender.models import Catalog, InstanceType
from recommender.types import RecommendationError

SESSION_KEY = "fc2_wizard"
STEPS = {"code": "Code", "data": "Data", "resource": "Resource", "review": "Review"}

PROVIDERS = [("local", "Local (this machine)"), ("aws", "AWS EC2")]
ALGORITHMS = [
    ("manual", "Manual"),
    ("cost-opt", "Cost-Opt"),
    ("time-opt", "Time-Opt"),
    ("scala-opt", "Scala-Opt"),
    ("scala-opt-m", "Scala-Opt-M"),
    ("model", "Model"),
]
# The algorithms that run one worker type the user picks; the others choose among the worker types (L^w).
ONE_WORKER_TYPE = ("manual", "scala-opt-m")
HOW_TO_ADD_RECORDS = "add them with `manage.py import_perf_data PATH --format csv --workload {workload}`"


# --- forms -----------------------------------------------------------------------------------------------------------


class UnavailableChoices:
    """A choice widget some of whose choices cannot be had here: drawn disabled, their reason beside them
    (`unavailable`: value -> reason, set by the form). The choice already made stays enabled even so: a disabled
    choice is not sent, and sent, it is refused beside the field with that reason."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unavailable: dict[str, str] = {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        if reason := self.unavailable.get(str(value)):
            option["reason"] = reason
            if not selected:
                option["attrs"]["disabled"] = True
        return option


class UnavailableRadioSelect(UnavailableChoices, forms.RadioSelect):
    pass


class UnavailableSelect(UnavailableChoices, forms.Select):
    pass


class StepForm(forms.Form):
    """A wizard step's form: made for one user; a later step's fault can be shown on it (`with_error`)."""

    def __init__(self, *args, user, **kwargs):
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        self.user = user

    def with_error(self, field: str | None, message: str) -> StepForm:
        """This form, filled from the saved state, with `message` beside `field` (found when the job was run)."""
        self.full_clean()  # unbound: no errors and nothing cleaned
        self.cleaned_data = {}
        self.add_error(field, message)
        return self


class ParametersWidget(forms.Widget):
    """Key/value rows, posted as the lists `<name>_key` and `<name>_value` (the step's template draws them)."""

    def value_from_datadict(self, data, files, name):
        return list(zip_longest(data.getlist(f"{name}_key"), data.getlist(f"{name}_value"), fillvalue=""))

    def value_omitted_from_data(self, data, files, name):
        return f"{name}_key" not in data


class ParametersField(forms.Field):
    """The training script's parameters: rows of name and value, blank rows ignored, names as jobs.submit takes."""

    widget = ParametersWidget

    def to_python(self, value) -> dict[str, str]:
        rows = value.items() if isinstance(value, dict) else value or []
        params: dict[str, str] = {}
        for key, val in rows:
            key, val = str(key).strip(), str(val).strip()
            if not key and not val:
                continue
            if not key:
                raise forms.ValidationError(f"the parameter with value {val!r} has no name")
            if key in params:
                raise forms.ValidationError(f"parameter {key!r} is given twice")
            params[key] = val
        try:
            jobs.check_parameters(params)
        except jobs.SubmitError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return params


class CodeForm(StepForm):
    """FC² Fig. 3: a wheel bundle and its main script, or a bundle already in the user's library; parameters."""

    source = forms.ChoiceField(
        label="Code",
        choices=[("upload", "Upload a wheel"), ("library", "Use one of my bundles")],
        widget=forms.RadioSelect,
        initial="upload",
    )
    wheel = forms.FileField(
        required=False,
        label="Wheel bundle (.whl)",
        help_text="Your training code packaged as a Python wheel (python -m build --wheel).",
        widget=forms.FileInput(attrs={"accept": ".whl"}),
    )
    main_script = forms.CharField(
        required=False,
        initial="main.py",
        max_length=300,
        label="Main script",
        help_text="The default main script is main.py; give another file name, or its path inside the wheel.",
    )
    bundle = forms.ModelChoiceField(
        queryset=CodeBundle.objects.none(), required=False, label="Bundle", empty_label="Choose a bundle"
    )
    parameters = ParametersField(
        required=False, label="Parameters", help_text="Passed to your script as --name=value, e.g. epochs = 5."
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        field = self.fields["bundle"]
        field.queryset = CodeBundle.objects.visible_to(self.user).select_related("owner")
        field.label_from_instance = self._bundle_label

    def _bundle_label(self, bundle: CodeBundle) -> str:
        owner = f" · {bundle.owner}" if bundle.owner_id != self.user.pk else ""
        name = bundle.name or bundle.distribution
        return f"{name} {bundle.version} · {bundle.main_script} · {bundle.created_at:%Y-%m-%d}{owner}"

    def _source(self) -> str:
        return self.cleaned_data.get("source", "")

    def clean_wheel(self):
        upload = self.cleaned_data.get("wheel")
        if self._source() != "upload":
            return None
        if upload is None:
            raise forms.ValidationError("Choose the wheel to upload.")
        try:
            validate_wheel(upload, upload.name, self.data.get("main_script") or "main.py")
        except BundleError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return upload

    def clean_bundle(self):
        bundle = self.cleaned_data.get("bundle")
        if self._source() == "library" and bundle is None:
            raise forms.ValidationError("Choose one of your bundles.")
        return bundle

    @property
    def parameter_rows(self) -> list[tuple[str, str]]:
        """The rows to draw: what was posted (kept on an error), else the saved parameters; one blank row to add."""
        value = self["parameters"].value()
        rows = list(value.items()) if isinstance(value, dict) else [tuple(row) for row in value or []]
        return [row for row in rows if any(row)] + [("", "")]

    def save(self) -> CodeBundle:
        """The bundle chosen, or the upload stored (BundleError if the store refuses it)."""
        if self._source() == "library":
            return self.cleaned_data["bundle"]
        upload = self.cleaned_data["wheel"]
        return store_bundle(self.user, upload, upload.name, self.cleaned_data["main_script"] or "main.py")


class DataForm(StepForm):
    """FC² Fig. 4: a built-in dataset, one of the user's datasets, an external URL, or an upload."""

    source = forms.ChoiceField(
        label="Training data",
        choices=[
            ("builtin", "Built-in dataset"),
            ("mine", "My datasets"),
            ("url", "External URL"),
            ("upload", "Upload a file"),
        ],
        widget=forms.RadioSelect,
        initial="builtin",
    )
    builtin = forms.ChoiceField(
        required=False,
        label="Built-in dataset",
        choices=[(b.name, b.title) for b in datasets.BUILTINS.values()],
        widget=forms.RadioSelect,
    )
    dataset = forms.ModelChoiceField(
        queryset=Dataset.objects.none(), required=False, label="Dataset", empty_label="Choose a dataset"
    )
    url = forms.URLField(
        required=False,
        max_length=1000,
        assume_scheme="https",
        label="Dataset URL",
        help_text="An http(s) URL every node downloads, e.g. an .npz with x_train, y_train, x_test, y_test.",
    )
    file = forms.FileField(required=False, label="Data file")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.builtin_rows = {row.builtin_name: row for row in datasets.ensure_builtin_rows()}
        field = self.fields["dataset"]
        field.queryset = Dataset.objects.visible_to(self.user).exclude(kind=Dataset.Kind.BUILTIN)
        field.label_from_instance = self._dataset_label
        self.fields["file"].help_text = (
            f"Up to {settings.FC2_MAX_DATASET_MB} MB. An .npz with x_train, y_train, x_test and y_test gets its rows "
            "and features filled in."
        )

    @staticmethod
    def _dataset_label(dataset: Dataset) -> str:
        facts = [dataset.get_kind_display()]
        if dataset.size_mb is not None:
            facts.append(f"{dataset.size_mb:g} MB")
        if dataset.rows:
            facts.append(f"{dataset.rows} rows")
        if dataset.last_error:
            facts.append("last download failed")
        return f"{dataset.name} ({', '.join(facts)})"

    @property
    def builtin_cards(self) -> list[tuple]:
        """(radio, Dataset row, Builtin) per built-in: FC² Fig. 4's path, size, features and rows beside each."""
        return [
            (radio, self.builtin_rows.get(radio.data["value"]), datasets.BUILTINS[radio.data["value"]])
            for radio in self["builtin"]
        ]

    def clean(self):
        cleaned = super().clean()
        source = cleaned.get("source")
        field = {"builtin": "builtin", "mine": "dataset", "url": "url", "upload": "file"}.get(source)
        if field is None or field in self.errors:
            return cleaned
        value = cleaned.get(field)
        if not value:
            missing = {
                "builtin": "Pick a built-in dataset.",
                "dataset": "Choose one of your datasets.",
                "url": "Give the dataset's URL.",
                "file": "Choose the file to upload.",
            }
            self.add_error(field, missing[field])
            return cleaned
        try:
            if source == "builtin":
                cleaned["chosen"] = datasets.ready(datasets.resolve(self.user, value))
            elif source == "mine":
                cleaned["chosen"] = datasets.ready(value)
            elif source == "url":
                cleaned["chosen"] = datasets.resolve(self.user, value)
        except datasets.DatasetError as exc:
            self.add_error(field, str(exc))
        return cleaned

    def save(self) -> dict:
        """The step's state: the dataset's id, or the URL of one stored with the job (DatasetError if an upload is
        refused)."""
        source = self.cleaned_data["source"]
        if source == "url":
            return {"source": "url", "url": self.cleaned_data["url"]}
        if source == "upload":
            return {"source": "mine", "dataset": datasets.store_upload(self.user, self.cleaned_data["file"]).pk}
        return {"source": source, "dataset": self.cleaned_data["chosen"].pk}


class ResourceForm(StepForm):
    """FC² Fig. 5: where the job runs and how its cluster is chosen — by hand or by a recommendation algorithm."""

    provider = forms.ChoiceField(label="Cloud", choices=PROVIDERS, widget=UnavailableRadioSelect, initial="local")
    region = forms.ChoiceField(required=False, label="AWS region")
    strategy = forms.ChoiceField(
        label="Distribution strategy",
        choices=[(Job.Strategy.PS, "Parameter server"), (Job.Strategy.MIRRORED, "All-Reduce")],
        widget=forms.RadioSelect,
        initial=Job.Strategy.PS,
    )
    workload_name = forms.CharField(
        required=False,
        max_length=jobs.WORKLOAD_NAME_MAX,
        label="Workload",
        help_text=jobs.WORKLOAD_NAME_HELP,
    )
    algorithm = forms.ChoiceField(
        label="Resource configuration", choices=ALGORITHMS, initial="manual", widget=UnavailableSelect
    )
    catalog = forms.ChoiceField(
        required=False, label="Instance catalogue", help_text="Instance types and their prices."
    )
    ps_type = forms.ChoiceField(required=False, label="PS type")
    worker_type = forms.ChoiceField(required=False, label="Worker type")
    worker_types = forms.MultipleChoiceField(
        required=False,
        label="Worker types",
        help_text="The types the algorithm chooses from; none selected: every worker type of the catalogue.",
        widget=forms.SelectMultiple(attrs={"size": 6}),
    )
    limit = forms.ChoiceField(
        label="Limit by",
        choices=[("workers", "Maximum number of workers"), ("budget", "Budget in $/h")],
        widget=forms.RadioSelect,
        initial="workers",
    )
    max_workers = forms.IntegerField(required=False, min_value=1, initial=2, label="Maximum number of workers")
    hourly_budget = forms.DecimalField(
        required=False, max_digits=10, decimal_places=4, label="Budget ($/h)", help_text="The indicative budget C."
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        catalogs = list(Catalog.objects.order_by("name"))
        names = [c.name for c in catalogs]
        self.fields["catalog"].choices = [
            (c.name, f"{c.name} ({c.region or c.provider}, {c.version})") for c in catalogs
        ] or [("", "No catalogue loaded")]
        default = service.DEFAULT_CATALOG if service.DEFAULT_CATALOG in names else (names or [""])[0]
        self.fields["catalog"].initial = default
        regions = sorted({c.region for c in catalogs if c.provider == "aws" and c.region})
        self.fields["region"].choices = [("", "Choose a region"), *[(r, r) for r in regions]]

        chosen = self.data.get("catalog") if self.is_bound else self.initial.get("catalog")
        types = list(InstanceType.objects.filter(catalog__name=chosen or default))
        ps_types = [(t.name, self._type_label(t, network=True)) for t in types if t.role in ("ps", "any")]
        worker_types = [(t.name, self._type_label(t)) for t in types if t.role in ("worker", "any")]
        self.fields["ps_type"].choices = [("", "Chosen by the algorithm (Manual: the worker type)"), *ps_types]
        self.fields["worker_type"].choices = [("", "Choose a worker type"), *worker_types]
        self.fields["worker_types"].choices = worker_types
        self.fields["provider"].widget.unavailable = {
            name: reason for name, _ in PROVIDERS if (reason := jobs.provider_unavailable(name))
        }
        if workload := self.workload:
            how = HOW_TO_ADD_RECORDS.format(workload=workload)
            self.fields["algorithm"].widget.unavailable = {
                algorithm: f"{lacking}: {how}"
                for algorithm, lacking in service.lacking_records(workload).items()
                if algorithm in dict(ALGORITHMS)
            }
        if not self.is_bound:  # types the catalogue shown does not offer are forgotten, not refused
            self.initial = dict(self.initial)
            for name, offered in (("ps_type", ps_types), ("worker_type", worker_types)):
                if self.initial.get(name) not in dict(offered):
                    self.initial[name] = ""
            self.initial["worker_types"] = [t for t in self.initial.get("worker_types", []) if t in dict(worker_types)]

    @property
    def workload(self) -> str:
        """The workload the fields name (the default one when left empty); "" before the code and data are chosen."""
        return self["workload_name"].value() or self.initial.get("default_workload", "")

    @property
    def unavailable_algorithms(self) -> list[tuple[str, str]]:
        """(label, reason) of each algorithm drawn disabled: those that cannot answer for this workload."""
        reasons = self.fields["algorithm"].widget.unavailable
        return [(label, reasons[value]) for value, label in ALGORITHMS if value in reasons]

    @staticmethod
    def _type_label(row: InstanceType, network: bool = False) -> str:
        facts = [per_hour(row.hourly_price)]
        if row.gpus:
            facts.append(f"{row.gpus} GPU")
        if row.memory_gib:
            facts.append(gib(row.memory_gib))
        if network and row.network_mbps:
            facts.append(capacity(row.network_mbps))
        return f"{row.name} · {' · '.join(facts)}"

    def clean_hourly_budget(self):
        budget = self.cleaned_data.get("hourly_budget")
        if budget is not None and budget <= 0:
            raise forms.ValidationError("The budget must be more than $0/h.")
        return budget

    def clean(self):
        cleaned = super().clean()
        provider, algorithm = cleaned.get("provider"), cleaned.get("algorithm")
        if provider and (reason := jobs.provider_unavailable(provider)):
            self.add_error("provider", reason)
        if provider == "aws" and not cleaned.get("region"):
            self.add_error("region", "Choose the AWS region.")
        if algorithm and algorithm != "manual" and not cleaned.get("catalog") and "catalog" not in self.errors:
            self.add_error(
                "catalog", "No instance catalogue is loaded; an administrator loads them with setup_platform."
            )
        if algorithm == "scala-opt-m" and not cleaned.get("worker_type"):
            self.add_error("worker_type", "Scala-Opt-M needs your worker type.")
        if cleaned.get("limit") == "budget":
            if algorithm == "manual":
                self.add_error(
                    "limit", "Manual runs the number of workers you give: choose a maximum number of workers."
                )
            elif cleaned.get("hourly_budget") is None and "hourly_budget" not in self.errors:
                self.add_error("hourly_budget", "Give the budget in $/h.")
        elif cleaned.get("limit") == "workers" and "max_workers" not in self.errors:
            workers = cleaned.get("max_workers")
            if workers is None:
                self.add_error("max_workers", "Give the number of workers.")
            elif provider in provisioner.PROVIDERS:
                try:
                    jobs.check_workers(provider, workers)
                except jobs.SubmitError as exc:
                    self.add_error("max_workers", str(exc))
        return cleaned

    def values(self) -> dict:
        """What the form shows, as data it can be bound to (the recommendation for an unsent page)."""
        return {name: self[name].value() for name in self.fields}

    def state(self) -> dict:
        """Every field as JSON, the ones the current choices do not use included (switching back keeps them)."""
        state = {name: self.cleaned_data[name] for name in self.fields}
        budget = state["hourly_budget"]
        state["hourly_budget"] = str(budget) if budget is not None else None
        return state


STEP_FORMS = {"code": CodeForm, "data": DataForm, "resource": ResourceForm}


# --- the wizard's state ----------------------------------------------------------------------------------------------


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
        self.state["code"] = {"bundle": bundle.pk, "parameters": parameters}
        self._save()

    def save_data(self, data: dict) -> None:
        self.state["data"] = data
        self._save()

    def default_workload(self) -> str:
        """The workload this code and data are filed under unless named otherwise ("" until both are chosen)."""
        bundle, dataset = self.bundle(), self.dataset()
        return workload_name(bundle, dataset) if bundle and dataset else ""

    def save_resource(self, resource: dict) -> None:
        """The resource step's fields; the default workload name is kept as "" so that it follows the code and
        data if they change."""
        if resource.get("workload_name") == self.default_workload():
            resource = {**resource, "workload_name": ""}
        self.state["resource"] = resource
        self._save()

    def prefill(self, job: Job) -> None:
        """Start again from `job`: its bundle, dataset, parameters and resources (the cluster it ran on)."""
        self.state = {
            "code": {"bundle": job.bundle_id, "parameters": {str(k): str(v) for k, v in job.parameters.items()}},
            "data": {
                "source": "builtin" if job.dataset.kind == Dataset.Kind.BUILTIN else "mine",
                "dataset": job.dataset_id,
            },
            "resource": {
                "provider": job.provider,
                "region": job.region,
                "strategy": job.strategy,
                "algorithm": job.algorithm,
                "catalog": job.catalog,
                "ps_type": job.ps_type,
                "worker_type": job.worker_type,
                "worker_types": list(job.worker_types),
                "limit": "budget" if job.hourly_budget is not None else "workers",
                "max_workers": job.workers,
                "hourly_budget": format(job.hourly_budget.normalize(), "f") if job.hourly_budget is not None else None,
                "workload_name": job.workload_name,
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
        resource = dict(self.state.get("resource", {}))
        default = self.default_workload()
        return {**resource, "workload_name": resource.get("workload_name") or default, "default_workload": default}

    def job_request(self, resource: dict | None = None) -> jobs.JobRequest:
        """The JobRequest of the saved state (with `resource` in place of the saved resource step, if given)."""
        r = resource or self.state["resource"]
        one_type = r["algorithm"] in ONE_WORKER_TYPE
        budget = Decimal(r["hourly_budget"]) if r["limit"] == "budget" and r["hourly_budget"] else None
        return jobs.JobRequest(
            bundle=self.bundle(),
            dataset=self.dataset(),
            parameters=dict(self.parameters),
            provider=r["provider"],
            region=r["region"] if r["provider"] == "aws" else "",
            strategy=r["strategy"],
            # With a budget the recommendation sets the count (see `planned`).
            workers=r["max_workers"] if budget is None else 1,
            algorithm=r["algorithm"],
            ps_type=r["ps_type"],
            worker_type=r["worker_type"] if one_type else "",
            worker_types=[] if one_type else list(r["worker_types"]),
            catalog=r["catalog"] or service.DEFAULT_CATALOG,
            hourly_budget=budget,
            workload_name=r.get("workload_name") or "",
        )


def planned(request: jobs.JobRequest) -> jobs.Plan:
    """The request's cluster (RecommendationError, SubmitError); a budget-limited request takes its worker count."""
    plan = jobs.plan(request)
    if request.hourly_budget is not None:
        request.workers = plan.workers
    return plan


def _recommendation_field(exc: Exception, resource: dict) -> str:
    """The resource field a recommender's refusal is shown beside: the budget it cannot buy with, else the algorithm."""
    if isinstance(exc, jobs.SubmitError):
        return _resource_field(exc.field, resource)
    return "hourly_budget" if resource["limit"] == "budget" and "budget" in str(exc) else "algorithm"


def _resource_field(field: str | None, resource: dict) -> str | None:
    if field == "workers":
        return "hourly_budget" if resource.get("limit") == "budget" else "max_workers"
    return field if field in ResourceForm.base_fields else None


def preview(wizard: Wizard, form: ResourceForm) -> dict:
    """The live recommendation for the resource fields of `form`: the plan and its total cost, or why there is none."""
    if not form.is_valid():
        return {"invalid": form}
    if not wizard.reachable("resource"):
        return {"error": "Complete the Code and Data steps first: the recommendation is for your code and data."}
    request = wizard.job_request(form.state())
    try:
        plan = planned(request)
    except (RecommendationError, jobs.SubmitError) as exc:
        return {"error": str(exc)}
    return {
        "plan": plan,
        "job_request": request,
        "epochs": request.epochs,
        "total_cost": plan.total_cost(request.epochs),
    }


# --- views -----------------------------------------------------------------------------------------------------------


def _step_url(step: str) -> str:
    return reverse("job-new-step", args=[step])


def _go_on(request: HttpRequest, wizard: Wizard, step: str) -> HttpResponse:
    """On to the next step (where a reload of /jobs/new/ now lands); an htmx upload, which shows its progress, is
    sent there by the browser."""
    wizard.visit(step)
    url = _step_url(step)
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)


def _nav(wizard: Wizard, current: str) -> list[dict]:
    done = wizard.done
    summaries = {}
    if done["code"]:
        bundle = wizard.bundle()
        summaries["code"] = f"{bundle.distribution} {bundle.version}"
    if done["data"]:
        summaries["data"] = wizard.dataset().name
    if done["resource"]:
        resource = wizard.state["resource"]
        summaries["resource"] = f"{dict(ALGORITHMS)[resource['algorithm']]} · {resource['provider']}"
    return [
        {
            "name": step,
            "title": title,
            "number": number,
            "url": _step_url(step),
            "done": done[step],
            "current": step == current,
            "reachable": wizard.reachable(step),
            "summary": summaries.get(step, ""),
        }
        for number, (step, title) in enumerate(STEPS.items(), start=1)
    ]


def _render(request: HttpRequest, wizard: Wizard, step: str, form: StepForm | None = None, **context) -> HttpResponse:
    steps = _nav(wizard, step)
    index = list(STEPS).index(step)
    context = {
        "step": step,
        "step_title": STEPS[step],
        "steps": steps,
        "previous": steps[index - 1] if index else None,
        "next": steps[index + 1] if index + 1 < len(steps) else None,
        "form": form,
        **context,
    }
    failed = bool(form is not None and form.errors) or bool(context.get("run_error"))
    return render(request, f"fc2/wizard/{step}.html", context, status=400 if failed else 200)


@login_required
@require_http_methods(["GET", "POST"])
def start(request: HttpRequest) -> HttpResponse:
    """/jobs/new/: on to the step the user was at; `?from=<job id>` pre-fills a re-run; POST starts over."""
    wizard = Wizard(request)
    if request.method == "POST":
        wizard.clear()
        return redirect(_step_url("code"))
    if "from" in request.GET:
        job_id = request.GET["from"]
        if not job_id.isdigit():
            raise Http404("no such job")
        job = get_object_or_404(Job.objects.visible_to(request.user).select_related("dataset"), pk=job_id)
        wizard.prefill(job)
        messages.info(request, f"The wizard holds job {job.pk}'s code, data and resources: change anything, then run.")
        return redirect(_step_url(wizard.first_open()))
    return redirect(_step_url(wizard.current()))


@login_required
@require_http_methods(["GET", "POST"])
def step(request: HttpRequest, step: str) -> HttpResponse:
    if step not in STEPS:
        raise Http404("no such step")
    wizard = Wizard(request)
    if not wizard.reachable(step):
        return redirect(_step_url(wizard.first_open()))
    wizard.visit(step)
    if step == "review":
        return _review(request, wizard)
    initial = wizard.initial(step)
    if step == "resource" and request.method == "GET":
        initial |= _resource_draft(request)
    form = STEP_FORMS[step](request.POST or None, request.FILES or None, user=request.user, initial=initial)
    if form.is_bound and form.is_valid():
        done_response = STEP_SAVES[step](request, wizard, form)
        if done_response is not None:
            return done_response
    context = {}
    if step == "resource":  # the recommendation beside the fields: for what they show, or why there is none
        context = (
            {"invalid": form} if form.is_bound else preview(wizard, ResourceForm(form.values(), user=request.user))
        )
    return _render(request, wizard, step, form, **context)


def _resource_draft(request: HttpRequest) -> dict:
    """The resource fields the page sends when it asks for itself, as they stand, after the catalogue changed (so
    that the type lists are the new catalogue's)."""
    return {
        name: request.GET.getlist(name) if name == "worker_types" else request.GET[name]
        for name in ResourceForm.base_fields
        if name in request.GET
    }


def _save_code(request: HttpRequest, wizard: Wizard, form: CodeForm) -> HttpResponse | None:
    try:
        bundle = form.save()
    except BundleError as exc:
        form.add_error("wheel", str(exc))
        return None
    if form.cleaned_data["source"] == "upload":
        messages.success(request, f"{bundle.distribution} {bundle.version} is stored in your bundles.")
    wizard.save_code(bundle, form.cleaned_data["parameters"])
    return _go_on(request, wizard, "data")


def _save_data(request: HttpRequest, wizard: Wizard, form: DataForm) -> HttpResponse | None:
    try:
        data = form.save()
    except datasets.DatasetError as exc:
        form.add_error("file", str(exc))
        return None
    wizard.save_data(data)
    return _go_on(request, wizard, "resource")


def _save_resource(request: HttpRequest, wizard: Wizard, form: ResourceForm) -> HttpResponse | None:
    resource = form.state()
    try:
        planned(wizard.job_request(resource))
    except (RecommendationError, jobs.SubmitError) as exc:
        form.add_error(_recommendation_field(exc, resource), str(exc))
        return None
    wizard.save_resource(resource)
    return _go_on(request, wizard, "review")


STEP_SAVES = {"code": _save_code, "data": _save_data, "resource": _save_resource}


def _review(request: HttpRequest, wizard: Wizard) -> HttpResponse:
    """Everything chosen and the cluster it gets; POST runs the job."""
    job_request = wizard.job_request()
    if request.method == "POST":
        try:
            planned(job_request)
            job = jobs.submit(request.user, job_request)
        except (RecommendationError, jobs.SubmitError) as exc:
            return _fault(request, wizard, exc)
        wizard.clear()
        messages.success(request, f"Job {job.pk} submitted.")
        return redirect(job)
    return _render(request, wizard, "review", **_review_context(request, wizard))


def _review_context(request: HttpRequest, wizard: Wizard) -> dict:
    resource = wizard.state["resource"]
    return {
        "job_request": wizard.job_request(),
        "resource": resource,
        "algorithm_label": dict(ALGORITHMS)[resource["algorithm"]],
        **preview(wizard, ResourceForm(resource, user=request.user)),
    }


def _fault(request: HttpRequest, wizard: Wizard, exc: Exception) -> HttpResponse:
    """Running failed: show why beside the field at fault, on its step, the saved entries filled in."""
    resource = wizard.state["resource"]
    field = exc.field if isinstance(exc, jobs.SubmitError) else None
    if field == "parameters":
        step = "code"
    elif field == "dataset":
        step, field = "data", {"builtin": "builtin", "url": "url"}.get(wizard.state["data"]["source"], "dataset")
    elif isinstance(exc, RecommendationError) or _resource_field(field, resource):
        step, field = "resource", _recommendation_field(exc, resource)
    else:
        return _render(request, wizard, "review", run_error=str(exc), **_review_context(request, wizard))
    form = STEP_FORMS[step](initial=wizard.initial(step), user=request.user).with_error(field, str(exc))
    context = {"invalid": form} if step == "resource" else {}
    return _render(request, wizard, step, form, **context)


@login_required
@require_GET
def recommendation(request: HttpRequest) -> HttpResponse:
    """The live part of the resource step: the recommendation for the fields as they stand (htmx)."""
    wizard = Wizard(request)
    return render(
        request, "fc2/wizard/_recommendation.html", preview(wizard, ResourceForm(request.GET, user=request.user))
    )
