"""A job's framework (issue 46) at every door: read from the wheel's Requires-Dist at upload, asked for by the API,
the wizard, `submit_job` and `fc2 submit`, refused with its reason where the bundle or the strategy contradicts it or
a CUDA-only dependency meets a cluster with no GPU; and the workload key that keeps each framework's records apart."""

from __future__ import annotations

import copy
import io

import pytest
from django.core.management import call_command
from django.urls import reverse
from fc2_client import cli

from fc2.bundles import validate_wheel
from fc2.models import CodeBundle, Job, workload_name
from fc2.services import jobs, planning
from fc2.services.bundles import store_bundle
from fc2.wizard.forms import ResourceForm
from harness.wheels import DIST_INFO, FILENAME, GOOD, METADATA, make_wheel
from recommender.catalog import load_catalog
from recommender.types import RecommendationError
from tests.helpers import Api, code_form, resource_form, step_url, through_data, wheel_upload

JOBS = "/api/jobs"


def requiring(*requirements: str) -> dict[str, bytes]:
    """The good wheel's members, its METADATA requiring `requirements` (Requires-Dist lines, as a build writes them)."""
    lines = b"".join(b"Requires-Dist: " + r.encode() + b"\n" for r in requirements)
    head, _, body = METADATA.partition(b"\n\n")
    return {**GOOD, f"{DIST_INFO}/METADATA": head + b"\n" + lines + b"\n" + body}


def bundle_requiring(tmp_path, owner, *requirements: str) -> CodeBundle:
    path = make_wheel(tmp_path, requiring(*requirements))
    with path.open("rb") as wheel:
        return store_bundle(owner, wheel, FILENAME)


@pytest.fixture
def api(client, alice) -> Api:
    return Api(client, alice)


# --- 1. the framework read from the wheel -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requires", "framework", "cuda"),
    [
        ((), "", ""),
        (("numpy>=1.26",), "", ""),
        (("torch>=2", "numpy"), "pytorch", ""),
        (("tensorflow-cpu==2.21.0",), "tensorflow", ""),
        (("tensorflow",), "tensorflow", ""),
        (("tf-keras", "tensorflow"), "tensorflow", ""),
        (("keras>=3", "tensorflow-cpu"), "tensorflow", ""),
        (("keras>=3",), "", ""),  # Keras 3 runs on either framework's backend
        (("keras>=3", "torch"), "pytorch", ""),
        (("torch", "tensorflow-cpu"), "", ""),  # both: the job says which
        (("Torch>=2",), "pytorch", ""),  # names compared as pip compares them
        (("torch; extra == 'gpu'", "tensorflow"), "tensorflow", ""),  # an extra is not installed
        (("torch; sys_platform == 'win32'",), "", ""),  # nor what a Linux node leaves out
        (("torch==2.3.0+cu121",), "pytorch", "torch==2.3.0+cu121"),
        (("torch", "nvidia-cudnn-cu12>=9"), "pytorch", "nvidia-cudnn-cu12>=9"),
        (("tensorflow", "nvidia-cublas-cu11"), "tensorflow", "nvidia-cublas-cu11"),
        (("torch @ https://download.pytorch.org/whl/cu121/torch-2.3.0%2Bcu121-cp311-cp311-linux_x86_64.whl",),
         "pytorch", "torch @ https://download.pytorch.org/whl/cu121/torch-2.3.0%2Bcu121-cp311-cp311-linux_x86_64.whl"),
        (("torch==2.13.0+cpu",), "pytorch", ""),  # the CPU build is no CUDA dependency
        (("nvidia-ml-py",), "", ""),  # NVIDIA's, but no CUDA library
    ],
)  # fmt: skip
def test_the_wheel_says_its_framework_and_cuda_dependency(tmp_path, requires, framework, cuda):
    path = make_wheel(tmp_path, requiring(*requires))

    with path.open("rb") as wheel:
        info = validate_wheel(wheel, FILENAME)

    assert (info.framework, info.cuda_requirement) == (framework, cuda)


def test_a_requirement_pip_cannot_read_is_refused(tmp_path, alice, api):
    path = make_wheel(tmp_path, requiring("torch>=>2"))

    response = api.post("/api/bundles", files={"file": wheel_upload(path)})

    assert response.status_code == 400
    assert "requires 'torch>=>2', which is not a valid requirement" in str(response.json())
    assert not CodeBundle.objects.exists()


def test_the_framework_is_stored_and_shown_by_the_api_the_bundle_page_and_check_bundle(tmp_path, client, alice, api):
    path = make_wheel(tmp_path, requiring("torch==2.3.0+cu121"))

    made = api.post("/api/bundles", files={"file": wheel_upload(path)}).json()
    client.force_login(alice)
    page = client.get(reverse("bundle", args=[made["id"]])).content.decode()
    out = io.StringIO()
    call_command("check_bundle", str(path), "--json", stdout=out)

    assert (made["framework"], made["cuda_requirement"]) == ("pytorch", "torch==2.3.0+cu121")
    assert 'id="bundle-framework">PyTorch' in page and "torch==2.3.0+cu121</code>: it runs on GPU workers only" in page
    assert '"framework": "pytorch"' in out.getvalue()


def test_a_bundle_stored_before_is_read_again_when_uploaded_again(tmp_path, alice):
    bundle = bundle_requiring(tmp_path, alice, "torch")
    CodeBundle.objects.filter(pk=bundle.pk).update(framework="")  # as stored before the platform read it

    again = bundle_requiring(tmp_path, alice, "torch")

    assert again.pk == bundle.pk and again.framework == CodeBundle.objects.get().framework == "pytorch"


# --- 2. the framework at every door -----------------------------------------------------------------------------

TORCH, TENSORFLOW, NEITHER = ("torch>=2",), ("tensorflow-cpu",), ()


@pytest.mark.parametrize(
    ("requires", "asked", "framework", "strategy"),
    [
        (TORCH, {}, "pytorch", "ddp"),  # the bundle's framework, its strategy
        (TORCH, {"strategy": "auto"}, "pytorch", "ddp"),  # left open: PyTorch has one
        (TORCH, {"framework": "pytorch", "strategy": "ddp"}, "pytorch", "ddp"),
        (NEITHER, {"framework": "pytorch"}, "pytorch", "ddp"),
        (NEITHER, {}, "tensorflow", "ps"),  # as before frameworks
        (TENSORFLOW, {"strategy": "mirrored"}, "tensorflow", "mirrored"),
    ],
)
def test_the_api_submits_a_job_of_its_framework(tmp_path, api, alice, digits, requires, asked, framework, strategy):
    bundle = bundle_requiring(tmp_path, alice, *requires)

    response = api.post(JOBS, {"bundle": bundle.pk, "dataset": "digits", "parameters": {"epochs": "1"}, **asked})

    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    answer = api.get(f"{JOBS}/{job.pk}").json()
    assert (job.framework, job.request["strategy"]) == (framework, strategy)
    assert (answer["framework"], answer["request"]["framework"], answer["requested_strategy"]) == (
        framework,
        framework,
        strategy,
    )


@pytest.mark.parametrize(
    ("requires", "asked", "field", "reason"),
    [
        (TORCH, {"framework": "tensorflow"}, "framework",
         "requires torch (its wheel's Requires-Dist), so its code trains with PyTorch, not TensorFlow"),
        (TENSORFLOW, {"framework": "pytorch"}, "framework",
         "requires tensorflow (its wheel's Requires-Dist), so its code trains with TensorFlow, not PyTorch"),
        (TORCH, {"strategy": "ps"}, "strategy", "a PyTorch job runs DistributedDataParallel"),
        (TORCH, {"strategy": "mirrored"}, "strategy", "not mirrored — that is TensorFlow's"),
        (NEITHER, {"strategy": "ddp"}, "strategy", "strategy ddp is PyTorch's DistributedDataParallel"),
        (TENSORFLOW, {"strategy": "ddp"}, "strategy", "a TensorFlow job runs ps or mirrored"),
        (NEITHER, {"framework": "mxnet"}, "framework", '"mxnet" is not a valid choice'),
        (("torch==2.3.0+cu121",), {}, "bundle",
         "requires torch==2.3.0+cu121, which installs only where CUDA is, and the local provider has no GPU"),
        (TENSORFLOW, {"workload_name": "theirs@pytorch"}, "workload_name",
         "'theirs@pytorch' is a PyTorch workload's key, and this is a TensorFlow job"),
        (TORCH, {"workload_name": "w" * 95}, "workload_name",
         "a workload name has at most 92 characters for a PyTorch job (its records' key adds 8)"),
    ],
)  # fmt: skip
def test_the_api_refuses_a_framework_it_cannot_run(tmp_path, api, alice, digits, requires, asked, field, reason):
    bundle = bundle_requiring(tmp_path, alice, *requires)

    response = api.post(JOBS, {"bundle": bundle.pk, "dataset": "digits", **asked})

    assert response.status_code == 400
    assert reason in " ".join(response.json()["fields"][field])
    assert not Job.objects.exists()


def test_submit_job_takes_the_framework_and_refuses_one_the_bundle_contradicts(tmp_path, alice, digits):
    path = make_wheel(tmp_path, requiring(*TORCH))
    options = ["--bundle", str(path), "--dataset", "digits", "--user", "alice", "--json"]

    def submit(*args: str) -> tuple[int, str]:
        err = io.StringIO()
        try:
            call_command("submit_job", *options, *args, stdout=io.StringIO(), stderr=err)
        except SystemExit as exc:
            return int(exc.code), err.getvalue()
        return 0, err.getvalue()

    refused = submit("--framework", "tensorflow")
    wrong_strategy = submit("--strategy", "ps")
    made = submit("--param", "epochs=1")

    assert refused[0] == 1 and "not TensorFlow: submit it as framework pytorch" in refused[1]
    assert wrong_strategy[0] == 1 and "a PyTorch job runs DistributedDataParallel" in wrong_strategy[1]
    assert made[0] == 0
    job = Job.objects.get()
    assert (job.framework, job.request["strategy"]) == ("pytorch", "ddp")


def test_fc2_submit_sends_the_framework():
    parsed = cli.build_parser().parse_args(["submit", "w.whl", "--dataset", "digits", "--framework", "pytorch"])

    assert cli.job_payload(parsed, 7, parsed.dataset) == {
        "bundle": 7,
        "dataset": "digits",
        "parameters": {},
        "framework": "pytorch",
    }


def test_fc2_submit_help_names_the_frameworks(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["submit", "--help"])

    said = " ".join(capsys.readouterr().out.split())
    assert "--framework {tensorflow,pytorch}" in said and "ddp (DistributedDataParallel" in said


def test_the_wizard_starts_from_the_bundles_framework_and_refuses_a_contradiction(tmp_path, client, alice, digits):
    bundle = bundle_requiring(tmp_path, alice, *TORCH)
    client.force_login(alice)
    through_data(client, bundle)

    shown = client.get(step_url("resource"))
    refused = client.post(step_url("resource"), resource_form(framework="tensorflow", strategy="ps"))
    accepted = client.post(step_url("resource"), resource_form(framework="pytorch", strategy="ddp"))
    review = client.get(step_url("review")).content.decode()
    ran = client.post(step_url("review"))

    assert (shown.context["form"]["framework"].value(), shown.context["form"]["strategy"].value()) == (
        "pytorch",
        "ddp",
    )
    reasons = shown.context["form"].fields["strategy"].widget.unavailable
    assert reasons == {s: "it is TensorFlow's, and this is a PyTorch job" for s in ("ps", "mirrored", "auto")}
    assert "<strong>Parameter server</strong> cannot be chosen: it is TensorFlow&#x27;s" in shown.content.decode()
    assert "not TensorFlow: submit it as framework pytorch" in refused.context["form"].errors["framework"][0]
    assert accepted.status_code == 302
    assert 'id="review-framework">PyTorch' in review and "All-Reduce (PyTorch DDP)" in review
    assert ran.status_code == 302
    job = Job.objects.get()
    assert (job.framework, job.workload) == ("pytorch", "demo:digits@pytorch")
    assert 'id="job-framework">PyTorch' in client.get(job.get_absolute_url()).content.decode()


def test_the_choices_one_form_disables_are_not_the_next_forms():
    """Each form gets copies of its class's fields; a PyTorch job's form marking the TensorFlow strategies unavailable
    (in place, where nothing else had marked one yet) must leave the next form, in the same server process, alone."""
    field = ResourceForm.base_fields["strategy"]
    first, second = copy.deepcopy(field), copy.deepcopy(field)

    first.widget.unavailable["mirrored"] = "it is TensorFlow's, and this is a PyTorch job"

    assert second.widget.unavailable == {} and field.widget.unavailable == {}


@pytest.mark.parametrize(
    ("first", "saved", "then", "shown"),
    [
        (("tensorflow-cpu",), ("tensorflow", "mirrored"), ("torch",), ("pytorch", "ddp")),
        (("torch",), ("pytorch", "ddp"), ("tensorflow-cpu",), ("tensorflow", "ps")),  # ddp is not TensorFlow's
        (("tensorflow-cpu",), ("tensorflow", "mirrored"), ("tensorflow",), ("tensorflow", "mirrored")),  # offered
        (("torch",), ("pytorch", "ddp"), ("numpy",), ("pytorch", "ddp")),  # a bundle naming none keeps the choice
    ],
)
def test_another_bundle_takes_the_saved_resource_step_to_its_framework(
    tmp_path, client, alice, digits, first, saved, then, shown
):
    framework, strategy = saved
    client.force_login(alice)
    through_data(client, bundle_requiring(tmp_path, alice, *first))
    assert client.post(step_url("resource"), resource_form(framework=framework, strategy=strategy)).status_code == 302

    other = bundle_requiring(tmp_path, alice, *then)
    assert client.post(step_url("code"), code_form(bundle=other)).status_code == 302
    form = client.get(step_url("resource")).context["form"]
    saved_again = client.post(
        step_url("resource"), resource_form(**{n: form[n].value() for n in ("framework", "strategy")})
    )
    ran = client.post(step_url("review"))

    assert (form["framework"].value(), form["strategy"].value()) == shown
    assert saved_again.status_code == 302, saved_again.context["form"].errors
    assert ran.status_code == 302
    job = Job.objects.get()
    assert (job.framework, job.request["strategy"]) == shown


# --- a CUDA-only dependency -------------------------------------------------------------------------------------

CUDA = ("torch==2.3.0+cu121",)


@pytest.fixture
def fc2_2018(db):
    return load_catalog("fc2-2018")


@pytest.mark.parametrize(
    ("provider", "asked", "field", "reason"),
    [
        ("local", {}, "bundle", "the local provider has no GPU worker type"),
        ("lab", {}, "bundle", "the lab provider has no GPU worker type"),
        ("aws", {"worker_type": "c4.xlarge"}, "worker_type", "worker type c4.xlarge has no GPU"),
        ("aws", {"algorithm": "cost-opt", "worker_types": ["c4.xlarge", "m4.xlarge"]}, "worker_types",
         "none of the worker types c4.xlarge, m4.xlarge has a GPU"),
        ("aws", {"worker_type": "p2.xlarge"}, None, ""),
        ("aws", {"algorithm": "cost-opt"}, None, ""),
    ],
)  # fmt: skip
def test_a_cuda_bundle_runs_on_gpu_workers_alone(tmp_path, alice, digits, fc2_2018, provider, asked, field, reason):
    if provider == "lab":
        load_catalog("lab")
    request = jobs.JobRequest(bundle=bundle_requiring(tmp_path, alice, *CUDA), dataset=digits, provider=provider)
    for name, value in asked.items():
        setattr(request, name, value)

    if field is None:
        jobs.check_gpu(request)
        return
    with pytest.raises(jobs.SubmitError) as refused:
        jobs.check_gpu(request)

    assert (refused.value.field, reason in str(refused.value)) == (field, True)


def test_the_recommend_step_keeps_a_cuda_bundle_to_gpu_worker_types(tmp_path, alice, digits, fc2_2018):
    cuda = bundle_requiring(tmp_path, alice, *CUDA)
    request = jobs.JobRequest(bundle=cuda, dataset=digits, provider="aws", algorithm="cost-opt", workers=2)

    asked = planning.recommend_request(request)
    with pytest.raises(RecommendationError) as none_left:
        planning.recommend_request(request, blocked=("p2.xlarge", "g3.4xlarge"))
    plain = planning.recommend_request(
        jobs.JobRequest(bundle=bundle_requiring(tmp_path, alice, "torch"), dataset=digits, provider="aws")
    )

    assert sorted(asked.worker_types) == ["g3.4xlarge", "p2.xlarge"]
    assert "no worker type the job may use has a GPU and capacity" in str(none_left.value)
    assert plain.worker_types == ()  # every type, as before


# --- 3. the workload key ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("framework", "name", "key"),
    [
        ("tensorflow", "", "demo:digits"),  # as records were filed before frameworks
        ("tensorflow", "anwar2021-mnist", "anwar2021-mnist"),
        ("pytorch", "", "demo:digits@pytorch"),
        ("pytorch", "mine", "mine@pytorch"),
        ("pytorch", "mine@pytorch", "mine@pytorch"),
    ],
)
def test_the_workload_key_carries_a_pytorch_jobs_framework(tmp_path, alice, digits, framework, name, key):
    bundle = bundle_requiring(tmp_path, alice)
    request = jobs.JobRequest(bundle=bundle, dataset=digits, framework=framework, workload_name=name)
    job = jobs.submit(alice, request)

    assert request.workload == job.workload == workload_name(bundle, digits, framework, name) == key
    assert jobs.JobRequest.of(job).workload == key


def test_a_pytorch_jobs_key_is_within_the_records_column(tmp_path, alice, digits):
    request = jobs.JobRequest(bundle=bundle_requiring(tmp_path, alice, *TORCH), dataset=digits, workload_name="w" * 92)

    jobs.validate(request)

    assert len(request.workload) == jobs.WORKLOAD_NAME_MAX
