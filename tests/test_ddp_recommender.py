"""ddp in the recommender (issue 46): a PyTorch workload is treated like any other, under one rule — where the
recommender decides "all-reduce", a PyTorch request says ddp (explore's trials, the model's choice, `recommend
--strategy ddp`, the API) — and never with a parameter server; records of ddp runs count as all-reduce."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from fc2.models import Job
from fc2.services import feedback, jobs, planning
from recommender import algorithms, explore_answer, service
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from recommender.service import strategy_counts
from recommender.types import PerfRecord, RecommendationError, RecommendRequest, strategy_request
from tests.conftest import TABLE4, call_json
from tests.helpers import Api, job_row
from tests.test_frameworks import bundle_requiring

GRID = Path(__file__).resolve().parents[1] / "recommender" / "data" / "lab-digits-grid.csv"
TORCH_WORKLOAD = "digits@pytorch"


@pytest.fixture
def lab(db):
    return load_catalog("lab")


@pytest.fixture
def ddp_records(lab, tmp_path) -> Path:
    """The lab's measured digits grid, as a PyTorch workload's ddp runs."""
    text = GRID.read_text().replace("lab-digits-grid,", f"{TORCH_WORKLOAD},").replace(",mirrored\n", ",ddp\n")
    path = tmp_path / "ddp.csv"
    path.write_text(text)
    call_command("import_perf_data", str(path), "--format", "csv", stdout=StringIO())
    return path


@pytest.mark.parametrize(
    ("strategy", "parameter_server", "framework"),
    [("ps", True, "tensorflow"), ("mirrored", False, "tensorflow"), ("auto", None, "tensorflow"),
     ("ddp", False, "pytorch")],
)  # fmt: skip
def test_a_strategy_asks_for_its_cluster_and_framework(strategy, parameter_server, framework):
    assert strategy_request(strategy) == {"parameter_server": parameter_server, "framework": framework}


@pytest.mark.parametrize(
    ("record", "through_ps", "all_reduce"),
    [
        (PerfRecord("w", "c4.xlarge", "", 2, strategy="ddp"), False, "ddp"),
        (PerfRecord("w", "c4.xlarge", "m4.large", 2, strategy="ddp"), False, "ddp"),  # a PS type named, not used
        (PerfRecord("w", "c4.xlarge", "", 2, strategy="mirrored"), False, "mirrored"),
        (PerfRecord("w", "c4.xlarge", "", 2), False, "mirrored"),  # Anwar's runs: TensorFlow's
        (PerfRecord("w", "c4.xlarge", "m4.large", 2, strategy="ps"), True, None),
    ],
)
def test_a_ddp_run_is_all_reduce(record, through_ps, all_reduce):
    config = explore_answer.record_config(record)

    assert algorithms.runs_through_ps(record) is through_ps
    assert config is not None and config.strategy == ("ps" if through_ps else all_reduce)


@pytest.mark.parametrize(
    ("framework", "parameter_server", "strategies"),
    [
        ("tensorflow", None, {"ps", "mirrored"}),
        ("tensorflow", False, {"mirrored"}),
        ("tensorflow", True, {"ps"}),
        ("pytorch", False, {"ddp"}),
    ],
)
def test_explore_considers_a_pytorch_workload_on_ddp_clusters_alone(
    fc2_catalog, framework, parameter_server, strategies
):
    request = RecommendRequest(
        algorithm="explore", workload="w", max_workers=4, parameter_server=parameter_server, framework=framework
    )

    configs = explore_answer.configurations(request, service.catalog_specs("fc2-2018"))

    assert {c.strategy for c in configs} == strategies
    assert all(not c.ps_type for c in configs if c.strategy != "ps")


@pytest.mark.parametrize("parameter_server", [True, None])
def test_a_pytorch_request_with_a_parameter_server_is_refused(fc2_catalog, parameter_server):
    request = RecommendRequest(
        algorithm="cost-opt" if parameter_server else "model", max_workers=2, parameter_server=parameter_server,
        framework="pytorch",
    )  # fmt: skip

    with pytest.raises(RecommendationError, match="A PyTorch workload runs DistributedDataParallel, all-reduce"):
        algorithms.recommend(request, service.catalog_specs("fc2-2018"))


def test_ddp_records_import_and_count_as_ddp(ddp_records):
    records = PerformanceRecord.objects.filter(workload=TORCH_WORKLOAD)

    assert set(records.values_list("strategy", flat=True)) == {"ddp"}
    assert strategy_counts(service.workload_records(TORCH_WORKLOAD)) == {"ddp": records.count()}


def test_a_csv_strategy_is_one_the_platform_knows(lab, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("workload,workers,epoch_time_s,strategy\nw,2,4.0,horovod\n")

    code, _, err = call_json("import_perf_data", str(path), "--format", "csv")

    assert code == 1 and "strategy must be '', 'ps', 'mirrored' or 'ddp', got 'horovod'" in err


def test_recommend_with_strategy_ddp_answers_a_cluster_without_ps(ddp_records):
    code, answer, err = call_json(
        "recommend", "--algorithm", "model", "--catalog", "lab", "--workload", TORCH_WORKLOAD, "--max-workers", "4",
        "--strategy", "ddp", "--batch-size", "32", "--latency-ms", "0",
    )  # fmt: skip

    assert code == 0, err
    assert answer["ps_type"] is None and answer["worker_type"].startswith("lab-w") and 1 <= answer["workers"] <= 4


def test_the_api_takes_strategy_ddp(client, alice, ddp_records):
    api = Api(client, alice)
    asked = {"algorithm": "model", "catalog": "lab", "workload": TORCH_WORKLOAD, "max_workers": 4, "batch_size": 32}

    answered = api.post("/api/recommend", {**asked, "strategy": "ddp"})
    refused = api.post("/api/recommend", {**asked, "strategy": "horovod"})

    assert answered.status_code == 200, answered.json()
    assert answered.json()["ps_type"] is None
    assert refused.status_code == 400


def test_a_pytorch_job_is_planned_on_ddp_by_the_model_and_by_explore(tmp_path, alice, digits, ddp_records):
    bundle = bundle_requiring(tmp_path, alice, "torch")
    asked = {"bundle": bundle, "dataset": digits, "provider": "lab", "parameters": {"batch_size": "32"}}

    model = planning.plan(jobs.JobRequest(**asked, algorithm="model", workers=4, workload_name="digits"))
    explore = planning.plan(jobs.JobRequest(**asked, algorithm="explore", workers=4, workload_name="new"))

    assert (model.strategy, model.ps_type) == ("ddp", "")
    assert model.recommendation is not None and model.recommendation["records"]["platform"] == 72
    assert (explore.source, explore.strategy, explore.ps_type) == ("explore", "ddp", "")
    assert explore.search is not None and {t.strategy for t in explore.search.batch} == {"ddp"}


def test_a_tensorflow_job_never_reads_a_pytorch_workloads_records(tmp_path, alice, digits, ddp_records):
    bundle = bundle_requiring(tmp_path, alice, "tensorflow-cpu")
    request = jobs.JobRequest(
        bundle=bundle, dataset=digits, provider="lab", algorithm="model", workers=4, workload_name="digits"
    )

    with pytest.raises(RecommendationError, match="(?i)no performance records for workload 'digits'"):
        planning.plan(request)


def test_a_ddp_jobs_run_is_recorded_as_ddp_under_its_own_key(lab, alice):
    job = job_row(
        alice, provider="lab", state=Job.State.SUCCEEDED, framework="pytorch", strategy=Job.Strategy.DDP, workers=2,
        worker_type="lab-w-1g", parameters={"batch_size": "32"}, metrics={"batch_size": 64, "epoch_time_s": 2.5},
    )  # fmt: skip

    record = feedback.record_job(job)

    assert record is not None
    assert (record.workload, record.strategy, record.ps_type) == ("code-of-alice:data-of-alice@pytorch", "ddp", "")
    assert strategy_counts(service.workload_records(record.workload, alice)) == {"ddp": 1}


# --- the workload key says the framework, at each of the recommender's doors -----------------------------------------

TF_WORKLOAD = "lab-digits-grid"
PYTORCH_KEY_REFUSES = "is a PyTorch workload's key (it ends in @pytorch): it runs DistributedDataParallel, strategy ddp"
TENSORFLOW_KEY_REFUSES = f"is a TensorFlow workload's key (a PyTorch workload's is '{TF_WORKLOAD}@pytorch')"
WITH_PS = "answered with a PS"
# workload | strategy asked ("": none) | answered with no PS (None), with one (WITH_PS), or the reason it is refused
KEY_CASES = [
    (TORCH_WORKLOAD, "ddp", None),
    (TORCH_WORKLOAD, "", None),  # omitted: PyTorch's one strategy
    (TORCH_WORKLOAD, "ps", PYTORCH_KEY_REFUSES),
    (TORCH_WORKLOAD, "mirrored", PYTORCH_KEY_REFUSES),
    (TF_WORKLOAD, "ddp", TENSORFLOW_KEY_REFUSES),
    (TF_WORKLOAD, "mirrored", None),
    (TF_WORKLOAD, "", WITH_PS),  # omitted: TensorFlow's default, a parameter server (the page's: all-reduce)
]


@pytest.fixture
def both_frameworks(ddp_records) -> None:
    """The lab's digits grid twice: as TensorFlow's mirrored runs (its own key) and as a PyTorch workload's ddp runs."""
    call_command("import_perf_data", str(GRID), "--format", "csv", stdout=StringIO())


def expect(outcome: str | None, answered: dict | None, refusal: str) -> None:
    if outcome in (None, WITH_PS):
        assert answered is not None, refusal
        assert bool(answered["ps_type"]) is (outcome == WITH_PS)
    else:
        assert answered is None and outcome in refusal


LOOKUP = {"algorithm": "lookup", "catalog": "lab", "batch_size": 128, "latency_ms": 0}


@pytest.mark.parametrize(("workload", "strategy", "outcome"), KEY_CASES)
def test_recommend_holds_the_strategy_to_the_workload_keys_framework(both_frameworks, workload, strategy, outcome):
    asked = [f"--{name.replace('_', '-')}={value}" for name, value in LOOKUP.items()]
    code, answer, err = call_json(
        "recommend", *asked, "--workload", workload, *(["--strategy", strategy] * bool(strategy))
    )

    assert code in (0, 1)
    expect(outcome, answer if code == 0 else None, err)


@pytest.mark.parametrize(("workload", "strategy", "outcome"), KEY_CASES)
def test_the_api_holds_the_strategy_to_the_workload_keys_framework(
    client, alice, both_frameworks, workload, strategy, outcome
):
    response = Api(client, alice).post(
        "/api/recommend", {**LOOKUP, "workload": workload, **({"strategy": strategy} if strategy else {})}
    )

    assert response.status_code in (200, 400)
    expect(outcome, response.json() if response.status_code == 200 else None, response.json().get("error", ""))


@pytest.mark.parametrize(("workload", "strategy", "outcome"), KEY_CASES)
def test_the_recommender_page_holds_the_strategy_to_the_workload_keys_framework(
    client, alice, both_frameworks, workload, strategy, outcome
):
    client.force_login(alice)
    response = client.get(reverse("recommender-anwar"), {**LOOKUP, "workload": workload, "strategy": strategy})

    answered = response.context["answer"]
    expect(None if outcome == WITH_PS else outcome, answered, response.context["error"] or "")


@pytest.mark.parametrize(("workload", "strategy", "outcome"), KEY_CASES)
def test_the_records_page_holds_the_strategy_to_the_workload_keys_framework(
    client, alice, both_frameworks, workload, strategy, outcome
):
    """The Records page shows a workload's runs of a strategy: one its key's framework does not run is ignored, and
    the page says why (it shows the workload's own)."""
    client.force_login(alice)
    response = client.get(reverse("recommender-records"), {"workload": workload, "strategy": strategy})

    refused = [m for m in response.context["ignored"] if m.startswith("Ignored strategy")]
    assert response.context["strategy"] == ("ddp" if workload == TORCH_WORKLOAD else "mirrored")
    if outcome in (None, WITH_PS):
        assert refused == []
    else:
        assert len(refused) == 1 and outcome in refused[0]


def test_model_report_holds_the_strategy_to_the_workload_keys_framework(both_frameworks):
    code, _, err = call_json("model_report", "--workload", TORCH_WORKLOAD, "--strategy", "mirrored")

    assert code == 1 and PYTORCH_KEY_REFUSES in err


@pytest.mark.parametrize(
    ("row", "refusal"),
    [
        ("w@pytorch,2,4.0,ddp", None),
        ("w@pytorch,2,4.0,", None),
        ("w@pytorch,2,4.0,mirrored", "line 2: workload 'w@pytorch' is a PyTorch workload's key"),
        ("w@pytorch,2,4.0,ps", "line 2: workload 'w@pytorch' is a PyTorch workload's key"),
        ("w,2,4.0,ddp", "line 2: strategy ddp is PyTorch's DistributedDataParallel, and workload 'w' is a TensorFlow"),
        ("w,2,4.0,mirrored", None),
    ],
)
def test_import_refuses_a_run_of_the_other_framework_than_its_key(lab, tmp_path, row, refusal):
    path = tmp_path / "runs.csv"
    path.write_text(f"workload,workers,epoch_time_s,strategy\n{row}\n")

    code, _, err = call_json("import_perf_data", str(path), "--format", "csv")

    assert (code, refusal is None or refusal in err) == (0 if refusal is None else 1, True), err


def test_a_pytorch_workloads_runs_that_name_no_strategy_are_ddp(lab, tmp_path):
    """Anwar's rows are all-reduce runs, as are a csv's that name no PS and no strategy: a PyTorch workload's are its
    ddp, as every page and answer counts them."""
    path = tmp_path / "runs.csv"
    path.write_text("workload,workers,epoch_time_s\nw@pytorch,2,4.0\nw,2,4.0\n")
    call_command(
        "import_perf_data", str(TABLE4), "--format", "anwar2021", "--workload", "mnist@pytorch", stdout=StringIO()
    )
    call_command("import_perf_data", str(path), "--format", "csv", stdout=StringIO())

    assert set(PerformanceRecord.objects.filter(workload="mnist@pytorch").values_list("strategy", flat=True)) == {"ddp"}
    assert [strategy_counts(service.workload_records(w)) for w in ("w@pytorch", "w")] == [{"ddp": 1}, {"mirrored": 1}]
