"""The wizard's step forms (FC² Figs. 3–5) and their widgets: what each step asks for and how its answer is checked.

A form checks and, for the code and data steps, stores an upload through the services (`save`); what the wizard keeps
of its answer is in `fc2.wizard.state`.
"""

from __future__ import annotations

from itertools import zip_longest

from django import forms
from django.conf import settings

import provisioner
from fc2.bundles import BundleError, validate_wheel
from fc2.models import CodeBundle, Dataset, Framework, Job
from fc2.services import datasets, jobs, search
from fc2.services.bundles import store_bundle
from fc2.templatetags.fc2_ui import capacity, gib, per_hour
from provisioner.types import ALL_REDUCE
from recommender import service
from recommender.models import Catalog, InstanceType
from recommender.types import workload_key

ALGORITHMS = [
    ("manual", "Manual"),
    ("cost-opt", "Cost-Opt"),
    ("time-opt", "Time-Opt"),
    ("scala-opt", "Scala-Opt"),
    ("scala-opt-m", "Scala-Opt-M"),
    ("model", "Model"),
    ("lookup", "Lookup"),
    ("explore", "Find the best cluster for me"),
]
SIZED_BY_THE_PS_REASON = (
    "Scala-Opt sizes the cluster by its parameter server's network and an All-Reduce cluster has none: choose the "
    "Parameter server strategy, or another algorithm."
)
# Plain text (no markup): it is shown inside an <option>.
HOW_TO_ADD_RECORDS = (
    "add them with: manage.py import_perf_data PATH --workload {workload} and --format anwar2021 for headerless rows "
    "of this one workload (as Anwar et al. give them), or --format csv for rows under a header naming their "
    "columns (types, workload…)"
)


class UnavailableChoices:
    """A choice widget some of whose choices cannot be had here: drawn disabled, their reason beside them
    (`unavailable`: value -> reason, set by the form). The choice already made stays enabled even so: a disabled
    choice is not sent, and sent, it is refused beside the field with that reason."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unavailable: dict[str, str] = {}

    def __deepcopy__(self, memo):
        # Each form gets a copy of its class's fields, whose widgets Django copies shallowly: without its own dict,
        # a choice one form marked (a PyTorch job's TensorFlow strategies) stayed marked on every later form.
        copied = super().__deepcopy__(memo)
        copied.unavailable = dict(self.unavailable)
        return copied

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
        self.fields["file"].help_text = f"Up to {settings.FC2_MAX_DATASET_MB} MB; {datasets.CONTRACT}."

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
        """(radio, Dataset row, Builtin) per built-in: whether it is ready or downloaded on first use, and FC² Fig. 4's
        size, features and rows beside each (never the server path it is stored at)."""
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

    provider = forms.ChoiceField(label="Cloud", widget=UnavailableRadioSelect, initial="local")
    region = forms.ChoiceField(required=False, label="AWS region")
    latency_ms = forms.FloatField(
        required=False,
        min_value=0,
        max_value=jobs.MAX_NODE_DELAY_MS,
        initial=0,
        label="Latency between nodes (ms)",
        help_text="Every packet from one node to another arrives this late (a round trip takes twice it).",
    )
    framework = forms.ChoiceField(
        required=False,
        label="Framework",
        choices=Framework.choices,
        widget=forms.RadioSelect,
        initial=Framework.TENSORFLOW,
        help_text="What the code trains with: TensorFlow (TF_CONFIG) or PyTorch (torchrun's variables, DDP). A bundle "
        "whose wheel requires one of them is that one's.",
    )
    strategy = forms.ChoiceField(
        label="Distribution strategy",
        choices=[
            (Job.Strategy.PS, "Parameter server"),
            (Job.Strategy.MIRRORED, "All-Reduce"),
            (Job.Strategy.AUTO, "Left open (Model, explore)"),
            (Job.Strategy.DDP, "All-Reduce (PyTorch DDP)"),
        ],
        widget=UnavailableRadioSelect,
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
    budget = forms.DecimalField(
        required=False, max_digits=10, decimal_places=4, label="Budget ($/h)", help_text="The indicative budget C."
    )
    total_budget = forms.DecimalField(
        required=False,
        max_digits=10,
        decimal_places=4,
        label="Budget for the whole job ($)",
        help_text="Optional. The job is stopped, and its cluster torn down, before its cost at the catalogue's prices "
        "would exceed it; refused at once if the cluster's projected total cost already does.",
    )
    # explore: what "best" means, and what its search of trial runs may spend
    preset = forms.ChoiceField(
        required=False,
        label="Best means",
        choices=list(search.PRESET_CHOICES.items()),
        widget=forms.RadioSelect,
        initial=search.DEFAULT_PRESET,
    )
    alpha = forms.FloatField(
        required=False,
        min_value=0,
        label="α: weight of time",
        help_text="How much a shorter epoch counts.",
    )
    beta = forms.FloatField(
        required=False,
        min_value=0,
        label="β: weight of cost",
        help_text="How much a cheaper epoch counts; only α and β's ratio matters.",
    )
    search_budget = forms.DecimalField(
        required=False,
        max_digits=10,
        decimal_places=4,
        label="Search budget ($)",
        help_text="The most the trial runs may cost together; part of the job's cost.",
    )
    search_minutes = forms.IntegerField(
        required=False,
        min_value=1,
        label="Search time (minutes)",
        help_text="The most the trial runs may take together, before the job itself runs.",
    )

    # Managed jobs: a lost node replaced and training resumed; aws spot instances
    max_restarts = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=jobs.MAX_RESTARTS,
        initial=0,
        label="Restarts after a lost node",
        help_text="A lost node is replaced and training resumed from its latest checkpoint this many times; 0: the "
        "job fails.",
    )
    spot = forms.BooleanField(
        required=False, label="Spot instances (AWS)", help_text="Cheaper, but AWS may take them back at any time."
    )
    spot_max_price = forms.DecimalField(
        required=False,
        max_digits=10,
        decimal_places=4,
        label="Spot price at most ($/h)",
        help_text="Optional; empty: up to the on-demand price.",
    )
    spot_fallback = forms.ChoiceField(
        required=False,
        label="Without spot capacity",
        choices=Job.SpotFallback.choices,
        initial=Job.SpotFallback.ON_DEMAND,
    )

    def __init__(self, data=None, *args, **kwargs):
        # A post from before `budget` meant $/h: `hourly_budget` was $/h and `budget` the whole job's $. Taken in
        # today's names for one release (`deprecated` says so), never with a total read as $/h.
        self.deprecated = data is not None and "hourly_budget" in data
        if self.deprecated:
            data = data.copy()
            data["total_budget"], data["budget"] = data.get("budget", ""), data.get("hourly_budget", "")
            del data["hourly_budget"]
        super().__init__(data, *args, **kwargs)
        alpha, beta = search.PRESETS[search.DEFAULT_PRESET]
        defaults = {"alpha": alpha, "beta": beta}
        defaults |= {"search_budget": settings.FC2_EXPLORE_USD, "search_minutes": settings.FC2_EXPLORE_MINUTES}
        for name, value in defaults.items():
            self.fields[name].initial = value
        catalogs = list(Catalog.objects.order_by("name"))
        names = [c.name for c in catalogs]
        self.fields["catalog"].choices = [
            (c.name, f"{c.name} ({c.region or c.provider}, {c.version})") for c in catalogs
        ] or [("", "No catalogue loaded")]
        default = service.DEFAULT_CATALOG if service.DEFAULT_CATALOG in names else (names or [""])[0]
        self.fields["catalog"].initial = default
        regions = sorted({c.region for c in catalogs if c.provider == "aws" and c.region})
        self.fields["region"].choices = [("", "Choose a region"), *[(r, r) for r in regions]]

        # A provider whose machines are its own catalogue's types (the lab's) has that catalogue chosen for it.
        provider = self.data.get("provider") if self.is_bound else self.initial.get("provider")
        own = provisioner.get(provider).catalog if provider in provisioner.PROVIDERS else ""
        if own in names:
            if self.is_bound:
                self.data = self.data.copy()
                self.data["catalog"] = own
            else:
                self.initial = {**self.initial, "catalog": own}
            label = provisioner.get(provider).label
            self.fields["catalog"].help_text = f"{label}: its machines are the {own} catalogue's types."
        chosen = self.data.get("catalog") if self.is_bound else self.initial.get("catalog")
        # Only a catalogue there is names the types: anything else sent (NUL, which PostgreSQL refuses in a query
        # value) is the field's to refuse, the default catalogue's types shown meanwhile.
        types = list(InstanceType.objects.filter(catalog__name=chosen if chosen in names else default))
        ps_types = [(t.name, self._type_label(t, network=True)) for t in types if t.role in ("ps", "any")]
        worker_types = [(t.name, self._type_label(t)) for t in types if t.role in ("worker", "any")]
        self.fields["ps_type"].choices = [("", "Chosen by the algorithm (Manual: the worker type)"), *ps_types]
        self.fields["worker_type"].choices = [("", "Choose a worker type"), *worker_types]
        self.fields["worker_types"].choices = worker_types
        self.fields["provider"].choices = [(p.name, p.label) for p in provisioner.PROVIDERS.values()]
        self.fields["provider"].widget.unavailable = {
            name: reason for name in provisioner.PROVIDERS if (reason := jobs.provider_unavailable(name))
        }
        unavailable: dict[str, str] = {}
        if workload := self.workload:
            how = HOW_TO_ADD_RECORDS.format(workload=workload)
            unavailable = {
                algorithm: f"{lacking}: {how}"
                for algorithm, lacking in service.lacking_records(workload, self.user).items()
                if algorithm in dict(ALGORITHMS)
            }
        # An algorithm the provider shown can never run beats one that merely lacks records: its reason is shown.
        unavailable |= {
            algorithm: reason
            for algorithm, _ in ALGORITHMS
            if (reason := jobs.algorithm_unavailable(provider or self.fields["provider"].initial, algorithm))
        }
        self.fields["algorithm"].widget.unavailable = unavailable
        # Only the model and explore choose a strategy left open (jobs.CHOOSE_THE_STRATEGY): drawn disabled while
        # neither can answer, with both reasons.
        if all(algorithm in unavailable for algorithm in jobs.CHOOSE_THE_STRATEGY):
            reasons = "; ".join(unavailable[algorithm] for algorithm in jobs.CHOOSE_THE_STRATEGY)
            self.fields["strategy"].widget.unavailable = {
                Job.Strategy.AUTO: f"only Model and explore choose the strategy, and neither can here ({reasons})"
            }
        self._framework_strategies()
        if not self.is_bound:  # types the catalogue shown does not offer are forgotten, not refused
            self.initial = dict(self.initial)
            for name, offered in (("ps_type", ps_types), ("worker_type", worker_types)):
                if self.initial.get(name) not in dict(offered):
                    self.initial[name] = ""
            self.initial["worker_types"] = [t for t in self.initial.get("worker_types", []) if t in dict(worker_types)]

    def _framework_strategies(self) -> None:
        """The strategies of another framework than the one shown (jobs.FRAMEWORK_STRATEGIES), drawn disabled with
        why; the step is drawn again when the framework changes."""
        shown = (self.data.get("framework") if self.is_bound else self.initial.get("framework")) or Framework.TENSORFLOW
        if shown not in Framework.values:
            return  # (the field says why)
        framework = Framework(shown)
        other = f"{Framework.TENSORFLOW.label}'s" if framework == Framework.PYTORCH else f"{Framework.PYTORCH.label}'s"
        unavailable = self.fields["strategy"].widget.unavailable
        for strategy in Job.Strategy.values:
            if strategy not in jobs.FRAMEWORK_STRATEGIES[framework]:
                unavailable[strategy] = f"it is {other}, and this is a {framework.label} job"

    @property
    def workload(self) -> str:
        """The workload the fields name (the default one when left empty), as its framework keys it; "" before the code
        and data are chosen, or while the name given is no workload's name (the field says why)."""
        try:
            name = self.fields["workload_name"].clean(self["workload_name"].value()) or self.initial.get(
                "default_workload", ""
            )
        except forms.ValidationError:
            return ""
        framework = self["framework"].value()
        return workload_key(name, framework) if name and framework in Framework.values else name

    sized_by_the_ps_reason = SIZED_BY_THE_PS_REASON
    strategy_left_open_reason = jobs.STRATEGY_LEFT_OPEN_REASON

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

    def clean_budget(self):
        return self._more_than_nothing("budget", "The budget must be more than $0/h.")

    def clean_total_budget(self):
        return self._more_than_nothing("total_budget", "The budget must be more than $0.")

    def clean_spot_max_price(self):
        return self._more_than_nothing("spot_max_price", "The spot price must be more than $0/h.")

    def clean_search_budget(self):
        return self._more_than_nothing("search_budget", "The search's budget must be more than $0.")

    def _more_than_nothing(self, name: str, message: str):
        amount = self.cleaned_data.get(name)
        if amount is not None and amount <= 0:
            raise forms.ValidationError(message)
        return amount

    def clean(self):
        cleaned = super().clean()
        provider, algorithm = cleaned.get("provider"), cleaned.get("algorithm")
        if provider and (reason := jobs.provider_unavailable(provider)):
            self.add_error("provider", reason)
        if provider == "aws" and not cleaned.get("region"):
            self.add_error("region", "Choose the AWS region.")
        own = provisioner.get(provider).catalog if provider in provisioner.PROVIDERS else ""
        if own and cleaned.get("catalog") and cleaned["catalog"] != own and "catalog" not in self.errors:
            self.add_error("catalog", f"The {provider} provider's machines are the {own} catalogue's types: choose it.")
        if algorithm and algorithm != "manual" and not cleaned.get("catalog") and "catalog" not in self.errors:
            self.add_error(
                "catalog", "No instance catalogue is loaded; an administrator loads them with setup_platform."
            )
        if algorithm and provider and (reason := jobs.algorithm_unavailable(provider, algorithm)):
            self.add_error("algorithm", f"{reason}.")
        elif algorithm in jobs.SIZED_BY_THE_PS and cleaned.get("strategy") in ALL_REDUCE:
            self.add_error("algorithm", SIZED_BY_THE_PS_REASON)
        if algorithm and (reason := jobs.strategy_unavailable(cleaned.get("strategy", ""), algorithm)):
            self.add_error("strategy", reason)
        if algorithm == "scala-opt-m" and not cleaned.get("worker_type"):
            self.add_error("worker_type", "Scala-Opt-M needs your worker type.")
        known = provider in provisioner.PROVIDERS and algorithm and "worker_type" not in self.errors
        if known and (reason := jobs.worker_type_missing(provider, algorithm, cleaned.get("worker_type", ""))):
            self.add_error("worker_type", f"{reason}.")
        if algorithm == "explore" and "preset" not in self.errors:
            self._clean_search(cleaned)
        if cleaned.get("spot") and provider and provider not in jobs.SPOT_PROVIDERS:
            self.add_error("spot", f"Spot instances are AWS's; the {provider} provider has none.")
        cleaned["max_restarts"] = cleaned.get("max_restarts") or 0
        cleaned["spot_fallback"] = cleaned.get("spot_fallback") or Job.SpotFallback.ON_DEMAND
        if cleaned.get("limit") == "budget":
            if algorithm == "manual":
                self.add_error(
                    "limit", "Manual runs the number of workers you give: choose a maximum number of workers."
                )
            elif cleaned.get("budget") is None and "budget" not in self.errors:
                self.add_error("budget", "Give the budget in $/h.")
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

    def _clean_search(self, cleaned: dict) -> None:
        """explore's weights: the preset's (kept in α and β, shown if "My own weights" is chosen next), or as given;
        whether they and the search's budget can be used is the submission's to say (`jobs.check_search`), beside
        their fields too."""
        preset = cleaned.get("preset") or search.DEFAULT_PRESET
        if preset != "custom":
            cleaned["alpha"], cleaned["beta"] = search.weights(preset, None, None)
        elif "alpha" not in self.errors and "beta" not in self.errors:
            cleaned["alpha"], cleaned["beta"] = search.weights(None, cleaned.get("alpha"), cleaned.get("beta"))

    def values(self) -> dict:
        """What the form shows, as data it can be bound to (the recommendation for an unsent page)."""
        return {name: self[name].value() for name in self.fields}

    def state(self) -> dict:
        """Every field as JSON, the ones the current choices do not use included (switching back keeps them)."""
        state = {name: self.cleaned_data[name] for name in self.fields}
        for name in ("budget", "total_budget", "search_budget", "spot_max_price"):
            state[name] = str(state[name]) if state[name] is not None else None
        return state


STEP_FORMS = {"code": CodeForm, "data": DataForm, "resource": ResourceForm}
