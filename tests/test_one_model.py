"""One model per workload and strategy on every door: the Records page quotes the very figures the API's answer
carries (the same predictor, fitted once per process for the same records and catalogue)."""

from __future__ import annotations

import html
import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from recommender.perfmodel.explanation import coverage_text, error_text


@pytest.fixture
def shipped(db):
    call_command("setup_platform", "--no-demo-accounts", stdout=StringIO())


def test_the_records_page_and_the_api_quote_the_same_error_figures(client, alice, shipped):
    client.force_login(alice)
    asked = {"algorithm": "model", "workload": "lab-digits-grid", "max_workers": 3, "batch_size": 64,
             "latency_ms": 10, "strategy": "mirrored", "catalog": "lab"}  # fmt: skip

    answer = client.post(reverse("api-recommend"), asked, content_type="application/json")
    page = client.get(reverse("recommender-records"), {"workload": "lab-digits-grid", "strategy": "mirrored"})

    assert answer.status_code == 200, answer.content
    quoted = answer.json()["extra"]["predictor"]
    text = page.content.decode()
    shown = {
        key: re.search(rf'id="{key}">([^<]+)<', text).group(1) for key in ("predictor-error", "predictor-coverage")
    }
    error, coverage = error_text(quoted["cv_mape"]), coverage_text(quoted["cv_coverage_80"])
    assert shown == {"predictor-error": error, "predictor-coverage": coverage}
    why = " ".join(answer.json()["extra"]["why"])  # the details behind the answer's one sentence
    assert f"cross-validated error is {error}, its 80 % intervals holding {coverage}" in why
    assert page.context["report"]["pairs"], "the calibration chart draws the held-out estimates behind the figure"
    out = StringIO()
    call_command("model_report", "--workload", "lab-digits-grid", "--strategy", "mirrored", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert (report["predictor"]["cv_mape"], report["predictor"]["cv_coverage"]) == (error, coverage)
    # ... and how the choice judges a time: the sentence the answer carries, on the page and in the report.
    choice = html.unescape(re.search(r'id="predictor-choice">How it chooses among configurations: ([^<]+)<', text)[1])
    assert choice.startswith("Each time is judged by") and choice in why
    assert report["predictor"]["choice"] == choice
    assert report["strategy"] == "mirrored" and report["catalog"] == "lab"
