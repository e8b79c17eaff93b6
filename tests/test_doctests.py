"""The examples in docstrings are tests too."""

import doctest
import importlib

import pytest

MODULES = [
    "fc2.bundles",
    "fc2.results",
    "fc2.services.reports",
    "fc2.templatetags.fc2_ui",
    "monitor.agent",
    "monitor.ingest",
    "monitor.series",
    "provisioner.types",
    "recommender.perfdata",
    "recommender.algorithms",
    "recommender.perfmodel",
    "recommender.pricing",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0
