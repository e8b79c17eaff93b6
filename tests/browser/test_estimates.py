"""Estimates and answers that hold, in real Chromium: the wizard's total cost counts the provider's start-up and
teardown and says where they come from; Scala-Opt is drawn disabled on Local with its reason; a file that is no
dataset is refused beside the file field, before anything is stored."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from fc2.models import Dataset
from fc2.services import pricing
from recommender.catalog import load_catalog
from recommender.models import PerformanceRecord
from tests.browser.conftest import log_in, to_resource_step

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_wizard_s_estimate_counts_start_up_and_teardown(page, shot, alice, example_wheel):
    load_catalog("fc2-2018")
    PerformanceRecord.objects.create(
        workload="fc2-digits-cnn:digits", instance_type="c4.xlarge", ps_type="m4.large", workers=2,
        epoch_time_s=360.0, strategy="ps",
    )  # fmt: skip
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel, {"epochs": "10"})

    page.get_by_label("Resource configuration").select_option("cost-opt")
    page.get_by_label("PS type").select_option("m4.large")
    page.get_by_label("Worker types").select_option(["c4.xlarge"])

    # $0.587/h (m4.large + 2 × c4.xlarge) × (15 s + 3,600 s + 1 s, the local provider's defaults) = $0.590.
    estimate = pricing.estimate(Decimal("0.587"), 360.0, 10, "local")
    expect(page.locator("#plan-total-cost")).to_contain_text("≈ $0.59")
    expect(page.locator("#plan-total-cost")).to_contain_text("start-up and teardown included")
    expect(page.locator("#plan-estimate-basis")).to_have_text(estimate.basis)
    shot("estimate")


def test_scala_opt_is_disabled_on_local_with_its_reason(page, shot, alice, example_wheel):
    load_catalog("fc2-2018")
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)

    for value in ("scala-opt", "scala-opt-m"):
        expect(page.locator(f"#id_algorithm option[value='{value}']")).to_be_disabled()
    reason = page.locator(".wz-reason", has_text="Scala-Opt cannot answer: Scala-Opt sizes the cluster by its")
    expect(reason).to_be_visible()
    expect(reason).to_contain_text("run it on the lab or AWS")
    shot("scala-opt-disabled-on-local")


def test_a_file_that_is_no_dataset_is_refused_beside_the_file(page, shot, alice, example_wheel, tmp_path):
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)
    text = tmp_path / "points.csv"
    text.write_text("x,y\n1,2\n")

    page.goto("/jobs/new/data/")
    page.get_by_text("Upload a file", exact=True).click()
    page.get_by_label("Data file").set_input_files(str(text))
    page.get_by_role("button", name=re.compile("^Next")).click()

    refusal = "points.csv is not an .npz file: a dataset is an .npz (numpy.savez) with x_train"
    expect(page.locator(".wz-field .errorlist", has_text=refusal)).to_be_visible()
    assert not Dataset.objects.filter(kind=Dataset.Kind.UPLOAD).exists()
    shot("dataset-refused")
