"""The examples in docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = [
    "common.numbers",
    "common.retry",
    "common.wheels",
    "fc2.bundles",
    "fc2.jsonbounds",
    "fc2.management.commands.cluster",
    "fc2.models",
    "fc2.query",
    "fc2.results",
    "fc2.services.artifacts",
    "fc2.services.limits",
    "fc2.services.monitoring",
    "fc2.services.noderecords",
    "fc2.services.requests",
    "fc2.services.pricing",
    "fc2.templatetags.fc2_ui",
    "fc2_client.api",
    "fc2_client.cli",
    "fc2_client.config",
    "fc2_client.display",
    "monitor.agent",
    "monitor.figures",
    "monitor.ingest",
    "monitor.retention",
    "monitor.safe_fetch",
    "monitor.series",
    "provisioner.lab.net",
    "provisioner.types",
    "recommender.perfdata",
    "recommender.algorithms",
    "recommender.explore_answer",
    "recommender.perfmodel.choice",
    "recommender.perfmodel.explanation",
    "recommender.pricing",
    "recommender.types",
    "recommender.views",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples left to check"
    assert result.failed == 0
