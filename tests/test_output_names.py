"""Any name a job's code may write is kept, and nothing a job writes keeps its cluster up (issue 27 §1–2).

The jobs here run for real on the local provider (sandboxed, as another uid), without TensorFlow: a small wheel whose
code writes outputs with every kind of name Linux allows, one over the size limit, and exits.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from unittest import mock

import pytest
from django.urls import reverse

from fc2.models import Artifact, Job, Node
from fc2.services import artifacts, inline, jobs, pipeline, sweep
from harness.wheels import GOOD, make_wheel
from monitor import agent
from tests.conftest import cluster_processes, launch_cluster

State = Job.State

# Every kind of name: whitespace only, symbols only, a leading - or ., a newline and other control characters, bytes
# that are not UTF-8, 255 bytes, a name that is already an escape, a name Django's storage reduces to nothing.
ODD_NAMES = [
    b" ",
    b"   ",
    b"!@#$%^&*()",
    b"-rf",
    b".hidden",
    b"...",
    b"a\nb",
    b"tab\there\r",
    b"\x01\x1b[31mred",
    b"\xff\xfe not utf-8",
    b"x" * 251 + b".bin",
    b"a\\nb",
    b"\xe6\x97\xa5\xe6\x9c\xac.txt",  # 日本.txt
    b"\xe2\x80\x8b",  # a zero-width space: invisible, escaped
]
WRITE_OUTPUTS = f"""
import os
out = os.environb[b"FC2_OUTPUT_DIR"]
for name in {ODD_NAMES!r}:
    with open(os.path.join(out, name), "wb") as f:
        f.write(name)
deep = os.path.join(out, b"deep", *[b"d"] * 40)
os.makedirs(deep)
with open(os.path.join(deep, b"leaf\\n"), "wb") as f:
    f.write(b"leaf")
os.makedirs(os.path.join(out, b"model"))  # its archive, model.zip, meets the file below
with open(os.path.join(out, b"model", b"w"), "wb") as f:
    f.write(b"weights")
with open(os.path.join(out, b"model.zip"), "wb") as f:
    f.write(b"a file of that name")
with open(os.path.join(out, b"big.bin"), "wb") as f:
    f.write(b"0" * (3 * 2**20))  # over FC2_MAX_ARTIFACT_MB
with open(os.path.join(out, b"metrics.json"), "wb") as f:
    f.write(b'{{"ok": 1}}')
"""
SAFE = re.compile(r"^(worker-1/)?[\w][\w.-]*$")


def odd_names_wheel(directory: Path) -> Path:
    return make_wheel(directory, {**GOOD, "demo/main.py": WRITE_OUTPUTS.encode()})


def escaped(name: bytes) -> str:
    return agent.escape_name(os.fsdecode(name))


@pytest.mark.django_db(transaction=True)
def test_every_name_linux_allows_is_kept_under_a_safe_unique_name(alice, digits, tmp_path, settings, client):
    settings.FC2_MAX_ARTIFACT_MB = 1
    wheel = odd_names_wheel(tmp_path)
    with wheel.open("rb") as upload:
        job = jobs.submit_upload(
            alice, upload, wheel.name, "demo/main.py", dataset=digits, driver=Job.Driver.INLINE,
            strategy="mirrored", workers=2,
        )  # fmt: skip

    job = inline.run_inline(job.pk)

    assert job.state == State.SUCCEEDED, job.failure_reason
    assert job.cluster is None and job.torn_down_at is not None
    assert not cluster_processes()
    assert job.metrics == {"ok": 1}
    for node, prefix in (("worker-0", ""), ("worker-1", "worker-1/")):  # the chief's by their own name, not worker-1's
        stored = {
            a.original_name: a
            for a in Artifact.objects.filter(job=job, node__name=node, not_kept="").exclude(original_name="")
        }
        expected = {escaped(name) for name in ODD_NAMES} | {"deep", "model", "model.zip", "metrics.json"}
        assert set(stored) == expected
        for name in ODD_NAMES:
            artifact = stored[escaped(name)]
            assert SAFE.match(artifact.name) and artifact.name.startswith(prefix), artifact.name
            assert Path(artifact.file.path).read_bytes() == name
        assert stored["model"].name != stored["model.zip"].name
        big = Artifact.objects.get(job=job, node__name=node, original_name="big.bin")
        assert (big.size_bytes, bool(big.file)) == (3 * 2**20, False)
        assert "over the 1 MB limit" in big.not_kept
    names = list(job.artifacts.values_list("name", flat=True))
    assert len(names) == len(set(names))
    assert agent.escape_name("a\nb") == "a\\nb" != agent.escape_name("a\\nb")  # two names never escape alike
    assert job.events.filter(message__contains="'big.bin' (3 MB) not kept: over the 1 MB limit").count() == 2

    client.force_login(alice)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    assert "written as <code>a\\nb</code>" in page
    assert "Not kept: over the 1 MB limit" in page
    big = job.artifacts.get(name="big.bin")
    assert client.get(reverse("artifact-download", args=[job.pk, big.pk])).status_code == 404


def test_names_escape_to_printable_text_and_safe_names():
    for name, shown in [
        (b"model.keras", "model.keras"),
        (b" ", " "),
        (b"a\nb", "a\\nb"),
        (b"a\\nb", "a\\\\nb"),
        (b"\x01", "\\x01"),
        (b"\xff", "\\xff"),
        (b"\xe2\x80\x8b", "\\u200b"),
        (b"\xe6\x97\xa5", "日"),
    ]:
        assert agent.escape_name(os.fsdecode(name)) == shown
    for shown, safe in [(" ", "output"), ("-rf", "_rf"), (".env", "_env"), ("a\\nb", "a_nb"), ("$$", "output")]:
        assert artifacts.safe_name(shown) == safe


def kept_result(tmp_path: Path, node_dir: Path, names: list[bytes]) -> None:
    """What the real agent keeps on a node whose command wrote `names` and whose report never arrived."""
    out = tmp_path / node_dir.name
    out.mkdir()
    for name in names:
        with open(os.path.join(os.fsencode(out), name), "wb") as f:
            f.write(name)
    outputs = agent.collect_outputs(out, 2**20)
    agent.keep_result(node_dir / "result", {"status": "succeeded", "exit_code": 0, **outputs.report()}, outputs.files)


@pytest.mark.django_db(transaction=True)
def test_a_kept_result_with_odd_names_is_applied_by_the_sweep(job, tmp_path, settings):
    """The chief's report never arrived; what its agent kept, with a name Django's storage reduces to nothing and one
    with a newline, is fetched (no listing parsed), applied once, and the job goes on."""
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, driver=Job.Driver.CELERY, strategy="mirrored")
    cluster = launch_cluster(job, strategy="mirrored", workers=1)
    kept_result(tmp_path, Path(cluster.nodes[0].workdir), [b" ", b"a\nb", b"metrics.json"])
    Node.objects.filter(job=job).update(last_report_at=None)
    settings.FC2_NODE_SILENCE_S = 0

    with mock.patch("provisioner.alive", return_value={"worker-0": False}):
        sweep.sweep()
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.COLLECTING, job.failure_reason
    assert set(job.artifacts.values_list("original_name", flat=True)) == {" ", "a\\nb", "metrics.json"}
    assert job.events.filter(message__contains="its report never arrived").count() == 1


@pytest.mark.django_db(transaction=True)
def test_cancel_tears_down_a_cluster_whose_results_cannot_be_kept(job, tmp_path):
    """Keeping the logs and late outputs fails (a node that cannot be read): a line on the timeline, and the
    cluster is torn down all the same."""
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, driver=Job.Driver.INLINE, strategy="mirrored")
    cluster = launch_cluster(job, strategy="mirrored", workers=2)
    kept_result(tmp_path, Path(cluster.nodes[1].workdir), [b" ", b"\n"])
    job.refresh_from_db()
    assert pipeline.cancel(job, by="alice")

    with mock.patch("provisioner.fetch_logs", side_effect=OSError("node unreachable")):
        assert pipeline.release(job.pk) is True

    job.refresh_from_db()
    assert job.cluster is None and not Path(cluster.workdir).exists()
    messages = list(job.events.values_list("message", flat=True))
    assert "keeping the nodes' logs failed: node unreachable" in messages
    assert f"cluster {cluster.cluster_id} torn down" in messages


@pytest.mark.django_db(transaction=True)
def test_a_job_the_sweep_keeps_failing_on_ends_and_is_torn_down(job, tmp_path, settings):
    """A sweep step that raises for one job is tried FC2_SWEEP_ATTEMPTS times, then the job fails with the reason
    and its cluster is torn down; no event is written twice meanwhile."""
    Job.objects.filter(pk=job.pk).update(state=State.RUNNING, driver=Job.Driver.CELERY, strategy="mirrored")
    cluster = launch_cluster(job, strategy="mirrored", workers=1)
    kept_result(tmp_path, Path(cluster.nodes[0].workdir), [b"model"])
    Node.objects.filter(job=job).update(last_report_at=None)
    settings.FC2_NODE_SILENCE_S = 0
    settings.FC2_SWEEP_ATTEMPTS = 3
    before = job.events.count()

    with (
        mock.patch("provisioner.alive", return_value={"worker-0": True}),
        mock.patch("fc2.services.reports.apply_report", side_effect=RuntimeError("disk full")),
    ):
        for attempt in range(1, 3):
            sweep.sweep()
            job.refresh_from_db()
            assert (job.state, job.sweep_failures, job.events.count()) == (State.RUNNING, attempt, before)
        sweep.sweep()

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.failure_reason == "the platform could not look after this job (3 sweeps in a row failed): disk full"
    assert job.cluster is None and not Path(cluster.workdir).exists()
    messages = list(job.events.values_list("message", flat=True))
    assert len(messages) == len(set(messages))


@pytest.mark.django_db(transaction=True)
def test_a_failing_teardown_is_said_once_and_tried_again(job, settings):
    Job.objects.filter(pk=job.pk).update(state=State.FAILED, driver=Job.Driver.CELERY)
    launch_cluster(job, strategy="mirrored", workers=1)

    with mock.patch("provisioner.teardown", side_effect=OSError("cloud API down")):
        for _ in range(3):
            sweep.sweep()

    job.refresh_from_db()
    assert job.cluster is not None
    assert job.events.filter(message__startswith="tearing down its cluster failed (cloud API down)").count() == 1
    sweep.sweep()
    job.refresh_from_db()
    assert job.cluster is None and job.sweep_failures == 0
