"""Every registered provider's module implements the provider interface (provisioner/interface.py, `Primitives`):
each primitive there, taking the protocol's arguments under the same names. mypy checks the same in `make test`
(provisioner/registry.py, `modules`); this holds it where mypy is not run, and for a provider added to the registry
but not routed to."""

from __future__ import annotations

import inspect

import pytest

from provisioner import registry
from provisioner.interface import Primitives

PRIMITIVES = sorted(name for name, _ in inspect.getmembers(Primitives, inspect.isfunction) if not name.startswith("_"))


def test_the_interface_is_the_nine_primitives():
    assert PRIMITIVES == [
        "get_cluster",
        "launch",
        "list_clusters",
        "machine",
        "node_command",
        "regions",
        "report_url",
        "teardown",
        "unavailable",
    ]


def test_every_registered_provider_is_routed_to_a_module():
    assert sorted(registry.modules()) == sorted(registry.PROVIDERS)
    for name in registry.PROVIDERS:
        assert registry.primitives(name) is registry.modules()[name]


@pytest.mark.parametrize("provider", sorted(registry.PROVIDERS))
@pytest.mark.parametrize("primitive", PRIMITIVES)
def test_a_provider_has_every_primitive_with_its_arguments(provider, primitive):
    module = registry.modules()[provider]
    function = getattr(module, primitive, None)
    assert callable(function), f"{module.__name__} has no {primitive}"
    wanted = [p.name for p in inspect.signature(getattr(Primitives, primitive)).parameters.values()][1:]  # no self
    given = list(inspect.signature(function).parameters.values())
    assert [p.name for p in given[: len(wanted)]] == wanted
    assert all(p.default is not inspect.Parameter.empty for p in given[len(wanted) :]), "an extra argument is optional"
