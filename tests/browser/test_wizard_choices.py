"""Every choice the wizard's resource step offers, in real Chromium, on a fresh install's data: each provider and each
resource configuration either gives a cluster (the live "Your cluster" panel names its workers) or is drawn disabled
with the reason and the way to enable it — never a dead end found only after submitting."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

import provisioner
from recommender.catalog import load_catalog
from tests.browser.conftest import log_in, to_resource_step

pytestmark = pytest.mark.django_db(transaction=True)

# What each usable configuration needs besides the defaults (max workers 2) to give a cluster on fc2-2018.
NEEDS = {
    "manual": {"Worker type": "c4.xlarge"},
}


def test_every_resource_choice_gives_a_cluster_or_says_why_not(page, shot, alice, example_wheel):
    load_catalog("fc2-2018")
    log_in(page, "alice", "alice-password-1")
    to_resource_step(page, example_wheel)

    # Providers: every registered one is offered, usable here or disabled with its reason.
    for provider in provisioner.PROVIDERS.values():
        radio = page.get_by_label(provider.label)
        expect(radio).to_have_count(1)
        if reason := provisioner.unavailable(provider.name):
            expect(page.get_by_text(f"{provider.label} cannot be chosen: {reason}.")).to_be_visible()

    # Resource configurations: each enabled one gives a cluster; each disabled one says why.
    algorithm = page.get_by_label("Resource configuration")
    options = algorithm.locator("option")
    seen = {"usable": [], "disabled": []}
    for i in range(options.count()):
        option = options.nth(i)
        value, label = option.get_attribute("value"), option.inner_text().strip()
        if option.is_disabled():
            expect(page.locator(".wz-reason", has_text=f"{label} cannot answer:")).to_be_visible()
            seen["disabled"].append(value)
            continue
        algorithm.select_option(value)
        for field, choice in NEEDS.get(value, {}).items():
            page.get_by_label(field, exact=True).select_option(choice)
        expect(page.locator("#recommendation")).to_contain_text(re.compile(r"\d+ workers?"))
        shot(f"choice-{value}")
        seen["usable"].append(value)

    # A fresh install has no records for this code and data: the model says so. On Local, whose nodes share the
    # machine's network, Scala-Opt can never answer: disabled with its reason (tests/browser/test_estimates.py).
    assert {"manual", "cost-opt", "time-opt"} <= set(seen["usable"])
    assert {"model", "scala-opt", "scala-opt-m"} <= set(seen["disabled"])

    # All-Reduce: every usable configuration gives a cluster (Scala-Opt's reason for All-Reduce is not shown).
    page.get_by_label("All-Reduce", exact=True).check()
    reason = page.locator(".wz-reason", has_text="an All-Reduce cluster has none")
    for value in seen["usable"]:
        algorithm.select_option(value)
        for field, choice in NEEDS.get(value, {}).items():
            page.get_by_label(field, exact=True).select_option(choice)
        expect(reason).to_be_hidden()
        expect(page.locator("#recommendation")).to_contain_text(re.compile(r"\d+ (× \S+ )?workers?"))

    # Left open: only the model and explore choose the strategy, and neither can here (no records; local's nodes are
    # of no type): the choice is drawn disabled with its reason before anyone picks it (no dead end).
    expect(page.get_by_label("Left open (Model, explore)")).to_be_disabled()
    reason = page.locator(
        ".wz-reason", has_text="Left open (Model, explore) cannot be chosen: only Model and explore choose"
    )
    expect(reason).to_be_visible()
    shot("strategy-left-open")
