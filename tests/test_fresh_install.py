"""A fresh installation: `setup_platform` loads the shipped sample records (idempotently), so the Recommender and
Records pages have something to show; with no records at all the Recommender page says how to get some."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from recommender.models import PerformanceRecord
from recommender.perfdata import PerfDataError, import_samples

pytestmark = pytest.mark.django_db
SAMPLE = "anwar2021-mnist"
LAB = "lab-digits-grid"  # measured on the lab here (recommender/data/lab-digits-grid.csv)


def setup_platform() -> str:
    out = StringIO()
    call_command("setup_platform", "--no-demo-accounts", stdout=out)
    return out.getvalue()


def records_of(workload: str) -> list[tuple]:
    rows = PerformanceRecord.objects.filter(workload=workload).order_by("pk")
    return list(rows.values_list("workers", "batch_size", "latency_ms", "epoch_time_s"))


def test_setup_loads_table4_once_however_often_it_runs():
    output = setup_platform()
    first = records_of(SAMPLE)
    setup_platform()

    assert f"performance records {SAMPLE} (mirrored) from anwar2021-table4.csv: 10 records" in output
    assert len(first) == 10 and (4, 64000, 0.0, 419.0) in first
    assert records_of(SAMPLE) == first


def test_sample_grids_in_the_manifest_are_loaded(tmp_path):
    (tmp_path / "grid.csv").write_text("workload,workers,batch_size,latency_ms,epoch_time_s\nmy-grid,2,128,0,12.5\n")
    (tmp_path / "samples.toml").write_text('[[sample]]\nfile = "grid.csv"\nformat = "csv"\n')

    (result,) = import_samples(tmp_path / "samples.toml")

    assert result.workloads == ("my-grid",) and records_of("my-grid") == [(2, 128, 0.0, 12.5)]


def test_a_manifest_entry_without_a_format_is_refused(tmp_path):
    (tmp_path / "samples.toml").write_text('[[sample]]\nfile = "grid.csv"\n')

    with pytest.raises(PerfDataError, match="sample 1 needs a file and a format"):
        import_samples(tmp_path / "samples.toml")


def test_recommender_and_records_pages_show_the_shipped_sample(client, alice):
    setup_platform()
    client.force_login(alice)

    recommender = client.get(reverse("recommender-anwar"))
    records = client.get(reverse("recommender-records"))

    assert recommender.context["form"].fields["workload"].choices == [(SAMPLE, SAMPLE), (LAB, LAB)]
    assert recommender.context["batch_sizes"] == [2560, 6400, 32000, 64000]
    assert records.context["workload"] == SAMPLE and len(records.context["rows"]) == 10


def test_recommender_page_without_records_says_how_to_load_them(client, alice):
    client.force_login(alice)

    empty = client.get(reverse("recommender-anwar"))
    submitted = client.get(reverse("recommender-anwar"), {"batch_size": 64000, "latency_ms": 0})

    for response in (empty, submitted):
        page = response.content.decode()
        assert response.status_code == 200
        assert 'id="no-records"' in page and "manage.py import_perf_data PATH" in page
        assert 'id="lookup-form"' not in page and "This field is required" not in page
