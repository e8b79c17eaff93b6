"""The job submission form (the minimal one; the four-step wizard builds on the same service)."""

from __future__ import annotations

from django import forms

from fc2.bundles import BundleError, validate_wheel
from fc2.models import Dataset, Job
from fc2.services import datasets, jobs
from provisioner import local


class JobForm(forms.Form):
    wheel = forms.FileField(label="Code bundle (.whl)", help_text="A Python wheel with your training code")
    main_script = forms.CharField(initial="main.py", help_text="File name, or its path inside the wheel")
    parameters = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "epochs=2\nbatch_size=32"}),
        help_text="One KEY=VALUE per line; passed to your script as --KEY=VALUE",
    )
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.none(), required=False, empty_label="(use the URL)")
    dataset_url = forms.URLField(required=False, label="…or dataset URL", assume_scheme="https")
    dataset_file = forms.FileField(
        required=False, label="…or upload a dataset", help_text="e.g. an .npz with x_train, y_train, x_test, y_test"
    )
    provider = forms.ChoiceField(choices=[("local", "Local (this machine)")])
    strategy = forms.ChoiceField(choices=Job.Strategy.choices)
    workers = forms.IntegerField(min_value=1, max_value=local.MAX_WORKERS, initial=2)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        datasets.ensure_builtin_rows()
        self.user = user
        self.fields["dataset"].queryset = Dataset.objects.usable_by(user).order_by("kind", "name")

    def clean_wheel(self):
        upload = self.cleaned_data["wheel"]
        try:
            validate_wheel(upload, upload.name, self.data.get("main_script") or "main.py")
        except BundleError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return upload

    def clean_parameters(self):
        lines = [line for line in self.cleaned_data["parameters"].splitlines() if line.strip()]
        try:
            return jobs.parse_parameters(lines)
        except jobs.SubmitError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean(self):
        cleaned = super().clean()
        given = [f for f in ("dataset", "dataset_url", "dataset_file") if cleaned.get(f)]
        if not given and not any(f in self.errors for f in ("dataset_url", "dataset_file")):
            self.add_error("dataset", "Pick a dataset, give its URL or upload it.")
        elif len(given) > 1:
            self.add_error(given[1], "Give one dataset: a choice, a URL or a file.")
        elif given == ["dataset"] or given == ["dataset_url"]:
            try:
                choice = cleaned.get("dataset") or datasets.resolve(self.user, cleaned["dataset_url"])
                cleaned["dataset"] = datasets.ready(choice)
            except datasets.DatasetError as exc:
                self.add_error(given[0], str(exc))
        return cleaned
