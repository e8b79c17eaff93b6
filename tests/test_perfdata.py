"""`import_perf_data`: both formats, failed runs kept, bad rows refused by line with nothing imported."""

from __future__ import annotations

from pathlib import Path

import pytest

from recommender.models import PerformanceRecord
from tests.conftest import call_json

pytestmark = pytest.mark.django_db
TABLE4 = Path(__file__).resolve().parent.parent / "recommender" / "data" / "anwar2021-table4.csv"


def run(*args: str) -> tuple[int, dict, str]:
    return call_json("import_perf_data", *args)


def test_anwar_table4_imports_with_its_failed_run():
    code, result, _ = run(str(TABLE4), "--format", "anwar2021", "--workload", "mnist-mwms")

    assert code == 0
    assert result == {
        "ok": True,
        "workloads": ["mnist-mwms"],
        "imported": 10,
        "failed_runs": 1,
        "replaced": 0,
        "owner": None,
    }
    failed = PerformanceRecord.objects.get(workers=1, batch_size=64000)
    assert failed.epoch_time_s is None and failed.failed
    best = PerformanceRecord.objects.filter(batch_size=64000, latency_ms=0).exclude(epoch_time_s=None)
    assert best.order_by("epoch_time_s").first().workers == 4


def test_reimporting_the_same_file_replaces_it():
    run(str(TABLE4), "--format", "anwar2021")
    code, result, _ = run(str(TABLE4), "--format", "anwar2021")

    assert code == 0 and result["replaced"] == 10
    assert PerformanceRecord.objects.filter(workload="anwar2021").count() == 10


def test_csv_with_header_in_any_order(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(
        "workers,workload,instance_type,ps_type,batch_size,latency_ms,epoch_time_s,bandwidth_mbps,cpu_util,strategy\n"
        "2,cifar10,c4.xlarge,m4.large,128,0,61.5,180,85,ps\n"
        "4,cifar10,c4.xlarge,m4.large,128,,,,,ps\n"
        ",cifar10,p2.xlarge,m4.2xlarge,512,,,420,,\n"
    )
    code, result, _ = run(str(path), "--format", "csv")

    assert code == 0
    assert result["imported"] == 3 and result["failed_runs"] == 1  # the bandwidth-only profile is not a failure
    profile = PerformanceRecord.objects.get(instance_type="p2.xlarge")
    assert (profile.workers, profile.bandwidth_mbps, profile.epoch_time_s) == (None, 420.0, None)


@pytest.mark.parametrize(
    ("fmt", "content", "reason"),
    [
        ("anwar2021", "4,64000,0,,419,\n4,32000,zero,,220,\n", "line 2: latency_ms must be a number"),
        ("anwar2021", "4,64000,0,,419,\n4,32000,0,,220\n", "line 2: expected 6 fields"),
        ("anwar2021", "0,64000,0,,419,\n", "line 1: workers must be at least 1"),
        ("anwar2021", "2.5,64000,0,,419,\n", "line 1: workers must be a whole number"),
        ("anwar2021", "4,64000,0,,-3,\n", "line 1: epoch_time_s must be at least 0.001"),
        ("anwar2021", "4,64000,0,,nan,\n", "line 1: epoch_time_s must be a finite number"),
        ("anwar2021", "4,,0,,419,\n", "line 1: batch_size is required"),
        ("anwar2021", "4,64000,,,419,\n", "line 1: latency_ms is required"),
        ("anwar2021", "four,64000,0,,419,\n", "line 1: workers must be a whole number, got 'four'"),
        ("anwar2021", "-2,64000,0,,419,\n", "line 1: workers must be at least 1, got '-2'"),
        ("anwar2021", "4,64000,-5,,419,\n", "line 1: latency_ms must be at least 0"),
        ("anwar2021", "4,64000,0,,inf,\n", "line 1: epoch_time_s must be a finite number"),
        ("anwar2021", "4,64000,0,-inf,419,\n", "line 1: step_time_s must be a finite number"),
        ("anwar2021", "4,64000,0,,0,\n", "line 1: epoch_time_s must be at least 0.001"),
        ("anwar2021", "4,64000,0,,419,NaN\n", "line 1: loss must be a finite number"),
        ("anwar2021", "\n# only comments\n", "has no data rows"),
        ("csv", "workload,workers,gpu\nw,2,1\n", "line 1: unknown column(s) gpu"),
        ("csv", "workers,batch_size\n2,64\n", "no workload column"),
        ("csv", "workload,workers\nw,2\n,3\n", "line 3: workload is required"),
        ("csv", f"workload\n{'w' * 101}\n", "line 2: workload is longer than 100 characters"),
        ("csv", f"workload,instance_type\nw,{'t' * 41}\n", "line 2: instance_type is longer than 40 characters"),
        ("csv", "workload,workers\nw,-1\n", "line 2: workers must be at least 1"),
        ("csv", "workload,batch_size\nw,64.5\n", "line 2: batch_size must be a whole number"),
        ("csv", "workload,epoch_time_s\nw,fast\n", "line 2: epoch_time_s must be a number, got 'fast'"),
        ("csv", "workload,bandwidth_mbps\nw,nan\n", "line 2: bandwidth_mbps must be a finite number"),
        ("csv", "workload,latency_ms\nw,-inf\n", "line 2: latency_ms must be a finite number"),
        ("csv", "workload,cpu_util\nw,inf\n", "line 2: cpu_util must be a finite number"),
        ("csv", "workload,workers\nw,2,3\n", "line 2: expected 2 fields, got 3"),
        ("csv", "workload,workload\nw,w\n", "line 1: a column appears twice"),
        ("csv", "workload,strategy\nw,ring\n", "line 2: strategy must be"),
        ("csv", "workload,cpu_util\nw,140\n", "line 2: cpu_util must be at most 100"),
        # past what a record's integer columns hold on PostgreSQL (there: a DataError, a traceback), or a latency the
        # models overflow on
        ("csv", "workload,batch_size\nw,3000000000\n", "line 2: batch_size must be at most 2147483647"),
        ("csv", "workload,workers\nw,99999999999\n", "line 2: workers must be at most 10000"),
        ("anwar2021", "4,64000,1e300,,419,\n", "line 1: latency_ms must be at most 60000, got '1e300'"),
        ("csv", "", "the file is empty"),
    ],
)
def test_bad_rows_are_refused_by_line_and_nothing_is_imported(tmp_path, fmt, content, reason):
    path = tmp_path / "data.csv"
    path.write_text(content)

    code, result, err = run(str(path), "--format", fmt)

    assert code == 1
    assert reason in result["error"] and err.startswith("error: ")
    assert not PerformanceRecord.objects.exists()


def test_missing_and_binary_files_are_clear_errors(tmp_path):
    assert run(str(tmp_path / "nope.csv"), "--format", "csv")[1]["error"].startswith("cannot read")
    binary = tmp_path / "data.csv"
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert "not UTF-8" in run(str(binary), "--format", "csv")[1]["error"]
