"""Local clusters are admitted against what the machine has (provisioner/local.py, `_admit`): each holds its share of
task ids (sandbox.MAX_TASKS) while it exists, and one more starts only while all fit in FC2_LOCAL_CLUSTERS_MAX_TASKS;
otherwise its launch waits, and its job waits its turn with the reason on its timeline, rather than fail. Real
sandboxed launches, counted machine-wide as the provider counts them: the budget of each test is what is admitted on
the machine when it starts plus what the test needs, so these run alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import provisioner
from fc2.models import Job
from fc2.services import pipeline
from provisioner import ClusterSpec, local, sandbox
from provisioner.errors import NoRoomError
from tests.conftest import make_job

pytestmark = [
    pytest.mark.skipif(bool(sandbox.unavailable()), reason=str(sandbox.unavailable())),
    pytest.mark.alone,  # counts every local cluster on the machine: nothing beside it may launch one meanwhile
]
PROJECT_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture
def room_for(settings, monkeypatch):
    """Room for `n` more local clusters on this machine than it holds right now, and launches that look once."""
    settings.FC2_LOCAL_NODE_DISK_MB = 16
    monkeypatch.setattr(local, "ADMISSION_WAIT_S", 0.0)

    def room(n: int) -> int:
        settings.FC2_LOCAL_CLUSTERS_MAX_TASKS = (len(sandbox.admitted()) + n) * sandbox.MAX_TASKS
        return settings.FC2_LOCAL_CLUSTERS_MAX_TASKS

    return room


def spec(name: str) -> ClusterSpec:
    return ClusterSpec(f"{name}-{os.getpid()}", "local", "mirrored", 1)


def test_a_cluster_past_what_the_machine_has_waits_and_starts_when_one_ends(room_for):
    room_for(1)
    first = local.launch(spec("fc2-first"))
    try:
        budget = room_for(0)
        with pytest.raises(NoRoomError, match=f" {budget} of the {budget} task ids") as refused:
            local.launch(spec("fc2-second"))
        assert refused.value.transient and refused.value.waits  # the pipeline tries it again, without a limit
        assert spec("fc2-second").cluster_id not in local.list_clusters()  # nothing of it left meanwhile
    finally:
        provisioner.teardown("local", first.cluster_id)

    room_for(1)  # room for one more: the first one's share is free again
    second = local.launch(spec("fc2-second"))
    print("\nFIGURE machine full (local): the second waits its turn, then starts once the first ended")
    provisioner.teardown("local", second.cluster_id)


LAUNCH = """
import sys, django
django.setup()
from provisioner import ClusterSpec, local
from provisioner.errors import NoRoomError
local.ADMISSION_WAIT_S = 0.0
try:
    local.launch(ClusterSpec(sys.argv[1], "local", "mirrored", 1))
except NoRoomError as error:
    sys.exit(f"no room: {error}")
"""


def test_two_launches_at_once_are_admitted_one_after_the_other(room_for, settings):
    """Two workers launching at once with room for one: one is admitted, the other waits (before: both, and the
    machine's task ids were promised twice)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "fc2.settings_test", "FC2_LOCAL_NODE_DISK_MB": "16"}
    env |= {"FC2_LOCAL_CLUSTER_DIR": str(settings.FC2_LOCAL_CLUSTER_DIR)}
    env["FC2_LOCAL_CLUSTERS_MAX_TASKS"] = str(room_for(1))
    names = [spec(f"fc2-racer-{i}").cluster_id for i in range(2)]
    try:
        racing = [
            subprocess.Popen([sys.executable, "-c", LAUNCH, name], cwd=PROJECT_DIR, env=env, stderr=subprocess.PIPE)
            for name in names
        ]
        outcomes = [(racer.communicate(timeout=120)[1].decode(), racer.returncode)[::-1] for racer in racing]
    finally:
        for name in names:
            provisioner.teardown("local", name)
    print(f"\nFIGURE two launches, room for one: exit codes {sorted(code for code, _ in outcomes)}")
    assert sorted(code for code, _ in outcomes) == [0, 1], outcomes
    assert "no room: no room on this machine for another local cluster now" in "".join(err for _, err in outcomes)


@pytest.mark.django_db
def test_a_job_with_no_room_waits_its_turn_with_the_reason_said_once(room_for, alice, bundle, digits, settings):
    """Past FC2_STEP_ATTEMPTS, the provision step is still tried again, not failed; the timeline says why once."""
    room_for(0)
    job = make_job(alice, bundle, digits)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RECOMMENDING, strategy="mirrored", workers=1)

    for attempt in (1, settings.FC2_STEP_ATTEMPTS + 5):
        with pytest.raises(pipeline.TryAgain) as again:
            pipeline.run_step("provision", job.pk, attempt=attempt, resume=attempt > 1)
        assert again.value.waits

    job.refresh_from_db()
    assert job.state == Job.State.PROVISIONING and not job.failure_reason
    waiting = job.events.filter(message__contains="no room on this machine")
    assert waiting.count() == 1 and "it starts when one ends" in waiting.get().message
    print(f"\nFIGURE machine full (local), a job: still {job.state} after {settings.FC2_STEP_ATTEMPTS + 5} tries")
    provisioner.teardown("local", job.cluster_name)
