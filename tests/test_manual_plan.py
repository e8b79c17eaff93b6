"""A Manual plan's epoch time comes from the measured runs of that very cluster, or says exactly why there is none."""

from __future__ import annotations

import csv
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from fc2.services import jobs, planning

GRID = Path(__file__).resolve().parents[1] / "recommender" / "data" / "lab-digits-grid.csv"


@pytest.fixture
def lab_grid(db):
    """The catalogues and the shipped samples, lab-digits-grid among them, as on a fresh install."""
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())


def request_for(bundle, digits, **fields) -> jobs.JobRequest:
    asked = {"provider": "lab", "strategy": "mirrored", "workers": 2, "worker_type": "lab-w-1g"}
    request = jobs.JobRequest(bundle=bundle, dataset=digits, workload_name="lab-digits-grid", **(asked | fields))
    request.parameters = {"epochs": "2", "batch_size": "32"}
    return request


def measured(workers: int, batch_size: int, latency_ms: float) -> list[float]:
    lines = (line for line in GRID.read_text().splitlines() if not line.startswith("#"))
    return [
        float(row["epoch_time_s"])
        for row in csv.DictReader(lines)
        if (int(row["workers"]), int(row["batch_size"]), float(row["latency_ms"])) == (workers, batch_size, latency_ms)
        and row["epoch_time_s"]
    ]


def test_a_manual_lab_cluster_gets_its_measured_epoch_time_and_a_total_cost(lab_grid, bundle, digits):
    runs = measured(2, 32, 0.0)

    plan = planning.plan(request_for(bundle, digits))

    assert plan.predicted_epoch_time_s == pytest.approx(sum(runs) / len(runs))
    assert f"the mean of {len(runs)} measured run" in plan.explanation and not plan.epoch_time_note
    assert plan.estimate(2) is not None


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"provider": "local", "worker_type": ""}, "a local cluster is no instance type"),
        ({"worker_type": ""}, "choose a worker type"),
        ({"workers": 7}, "has no measured run of 7 × lab-w-1g (mirrored) at 0 ms and batch size 32"),
        ({"latency_ms": 15.0}, "at 15 ms"),
    ],
)
def test_a_manual_plan_says_why_it_has_no_epoch_time(lab_grid, bundle, digits, fields, why):
    plan = planning.plan(request_for(bundle, digits, **fields))

    assert plan.predicted_epoch_time_s is None and plan.estimate(2) is None
    assert why in plan.epoch_time_note
