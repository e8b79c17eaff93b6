"""The provider contract (provisioner/__init__.py), run against every registered provider for real: launch idempotent
by name, the cluster listed and found, its nodes answering their runner (subprocess, or SSH to the node's own sshd),
teardown by name alone that leaves nothing and is safe twice. A provider this machine cannot run is skipped with its
own reason."""

from __future__ import annotations

import secrets

import pytest

import provisioner
from provisioner import ClusterSpec

pytestmark = pytest.mark.heavy  # the lab's and aws's nodes are network namespaces of the lab


@pytest.fixture(params=sorted(provisioner.PROVIDERS))
def provider(request, settings, tmp_path):
    name = request.param
    if name == "aws":  # moto's EC2 API, its instances brought up as lab hosts (harness/ec2lab.py)
        request.getfixturevalue("ec2_hosts")
    if reason := provisioner.unavailable(name):
        pytest.skip(reason)
    settings.FC2_LOCAL_CLUSTER_DIR = tmp_path / "clusters"
    settings.FC2_LAB_DIR = tmp_path / "lab"
    settings.FC2_LOCAL_NODE_DISK_MB = 64
    return name


def spec(provider: str, **fields) -> ClusterSpec:
    worker_type = {"lab": "lab-w-100", "aws": "c4.xlarge"}.get(provider, "")
    return ClusterSpec(
        **{
            "cluster_id": f"fc2-contract-{secrets.token_hex(3)}",
            "provider": provider,
            "strategy": "ps",
            "workers": 1,
            "worker_type": worker_type,
            **fields,
        }
    )


def test_launch_is_idempotent_and_teardown_by_name_leaves_nothing(provider):
    wanted = spec(provider)
    try:
        first = provisioner.launch(wanted)
        again = provisioner.launch(wanted)

        assert [n.name for n in first.nodes] == ["ps-0", "chief-0", "worker-0"]
        assert again.nodes == first.nodes  # found, not made twice
        assert provisioner.list_clusters(provider).count(wanted.cluster_id) == 1
        assert provisioner.get_cluster(provider, wanted.cluster_id) == first
        assert len({(n.host, n.port) for n in first.nodes}) == 3  # every node has its own TensorFlow address
        provisioner.wait_ready(first)
        for node in first.nodes:
            result = provisioner.run_on(first, node.name, ["sh", "-c", "echo $((6 * 7))"])
            assert (result.exit_status, result.stdout) == (0, "42\n")
    finally:
        provisioner.teardown(provider, wanted.cluster_id)

    assert wanted.cluster_id not in provisioner.list_clusters(provider)
    assert provisioner.get_cluster(provider, wanted.cluster_id) is None
    provisioner.teardown(provider, wanted.cluster_id)  # twice: nothing to do, no error


def test_teardown_of_a_cluster_never_made_is_harmless(provider):
    provisioner.teardown(provider, "fc2-never-made")
    assert "fc2-never-made" not in provisioner.list_clusters(provider)


def test_a_launch_refused_leaves_nothing(provider):
    wanted = spec(provider, workers=0)
    with pytest.raises((provisioner.ProvisionError, ValueError)):
        provisioner.launch(wanted)
    assert wanted.cluster_id not in provisioner.list_clusters(provider)
