"""Attacks on the local sandbox from code running inside a node (and from a second node of the same cluster), each
tried for real: what the root-run agent and the platform do with what the code controls.

Findings that are not fixed yet are marked xfail(strict=True): they fail today, and flip (failing the suite as an
XPASS) once fixed, so that the mark is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

import provisioner
from harness.wheels import GOOD
from provisioner import ClusterInfo, RunSpec, local, sandbox
from tests.helpers import code_wheel, start_cluster, wait_result

pytestmark = [
    pytest.mark.skipif(sandbox.unavailable() is not None, reason=f"no sandbox here: {sandbox.unavailable()}"),
    pytest.mark.alone,  # thread bombs, full disks and memory hogs bounded: nothing beside them
]


@pytest.fixture
def teardown_after():
    clusters: list[ClusterInfo] = []
    yield clusters.append
    for cluster in clusters:
        local.teardown(cluster.cluster_id)


# Worker 0 hands its output directory to worker 1 (an fd over an abstract unix socket: the nodes of a cluster share a
# network namespace) and exits; worker 1, still alive, sees the agent of worker 0 start collecting (the atime of `a`)
# and swaps the directory `b`, already listed as a directory, for a link to a directory the agent can read as root.
RACE = """
import json, os, socket, sys, time

secret_dir = json.loads(open(os.path.join(os.path.dirname(__file__), "target.json")).read())
address = "\\0fc2-race-" + os.environ["FC2_CLUSTER_ID"]
if os.environ["FC2_TASK_INDEX"] == "1":
    server = socket.socket(socket.AF_UNIX)
    server.bind(address)
    server.listen()
    conn, _ = server.accept()
    _, (fd,), _, _ = socket.recv_fds(conn, 16, 1)
    while os.stat("a", dir_fd=fd).st_atime < 1000:  # the agent has not listed `a` yet
        time.sleep(0.001)
    os.rename("b", "b-real", src_dir_fd=fd, dst_dir_fd=fd)
    os.symlink(secret_dir, "b", dir_fd=fd)
    print("swapped", flush=True)
    time.sleep(600)
out = os.environ["FC2_OUTPUT_DIR"]
os.makedirs(f"{out}/a")
with open(f"{out}/a/x", "wb") as f:
    f.write(os.urandom(40 * 2**20))  # incompressible: zipping it keeps the agent busy for a while
os.makedirs(f"{out}/b")
open(f"{out}/b/token", "w").write("mine")
os.utime(f"{out}/a", (0, time.time()))  # atime far in the past: the agent's listing of `a` updates it
for _ in range(300):
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect(address)
        break
    except OSError:
        time.sleep(0.1)
socket.send_fds(client, [b"x"], [os.open(out, os.O_RDONLY | os.O_DIRECTORY)])
"""


def test_agent_uploads_no_file_through_a_directory_swapped_for_a_link_while_it_collects(
    tmp_path, settings, teardown_after
):
    """Finding 1 (high): the root agent follows a link planted by the cluster's other node between its listing of the
    output directory and its reading of a sub-directory, and keeps (and would upload) any file of the machine."""
    secret_dir = tmp_path / "other-job" / "worker-0"
    secret_dir.mkdir(parents=True)
    (secret_dir / "token").write_text("another job's token")
    os.chmod(secret_dir, 0o700)
    os.chmod(secret_dir / "token", 0o600)
    wheel = code_wheel(tmp_path, RACE, **{"demo/target.json": json.dumps(str(secret_dir)).encode()})
    cluster = start_cluster(tmp_path / "race", wheel, settings, workers=2)
    teardown_after(cluster)

    result = wait_result(cluster)
    node_log = (Path(cluster.nodes[1].workdir) / "node.log").read_text()
    assert "swapped" in node_log, node_log  # the attack ran
    files = provisioner.fetch_results(cluster)["worker-0"].outputs
    assert "a.zip" in files
    kept = b"".join(files.values())
    for member in files.get("b.zip") and zipfile.ZipFile(BytesIO(files["b.zip"])).namelist() or []:
        kept += zipfile.ZipFile(BytesIO(files["b.zip"])).read(member)
    assert b"another job's token" not in kept
    assert b"another job's token" not in b"".join(p.read_bytes() for p in result.rglob("*") if p.is_file())


def test_installing_the_bundle_again_runs_none_of_its_code_as_root(tmp_path, settings, teardown_after):
    """Finding 2 (high): pip installs with `--python <cluster env>`, i.e. runs the cluster's interpreter as root, which
    executes every .pth file in the env's site-packages: a wheel that ships one runs as root the next time the bundle
    is installed (a redelivered or re-sent bootstrap step calls start() again)."""
    marker = tmp_path / "ran-as-root"
    pth = f"import os; os.geteuid() == 0 and open({str(marker)!r}, 'w').write('root')\n"
    wheel = code_wheel(tmp_path, "import time; time.sleep(600)\n", **{"zzz_evil.pth": pth.encode()})
    cluster = start_cluster(tmp_path / "pth", wheel, settings)
    teardown_after(cluster)
    assert not marker.exists()
    run = RunSpec(1, str(wheel), "demo.main", dataset=str(tmp_path / "pth.npz"), report_url="http://127.0.0.1:9")
    cluster = provisioner.bootstrap(cluster, run)  # the bootstrap step again
    assert not marker.exists(), "the wheel's .pth ran as root"


def test_wheel_data_files_cannot_replace_the_interpreter_root_runs(tmp_path, settings, teardown_after):
    """Finding 2 too: a wheel's `.data/scripts/python` replaces the env's bin/python, which the install step runs as
    root the next time."""
    marker = tmp_path / "ran-as-root"
    script = f"#!/bin/sh\n[ $(id -u) = 0 ] && echo root > {marker}\nexec /usr/bin/false\n"
    wheel = tmp_path / "w" / "demo-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in GOOD.items():
            zf.writestr(name, data if name != "demo/main.py" else b"import time; time.sleep(600)\n")
        info = zipfile.ZipInfo("demo-1.0.data/scripts/python")
        info.external_attr = 0o100755 << 16
        zf.writestr(info, script)
    cluster = start_cluster(tmp_path / "data", wheel, settings)
    teardown_after(cluster)
    run = RunSpec(1, str(wheel), "demo.main", dataset=str(tmp_path / "data.npz"), report_url="http://127.0.0.1:9")
    with contextlib.suppress(provisioner.ProvisionError):  # refused, or harmless: never run as root
        provisioner.bootstrap(cluster, run)
    assert not marker.exists(), "the wheel's bin/python ran as root"


def test_node_log_and_log_tail_are_bounded(tmp_path, settings, teardown_after):
    """Finding 3 (medium): the root agent writes everything the code prints to node.log on the platform's disk, with no
    limit (one node can fill the disk; the platform then reads the whole log into memory), and buffers a line without
    newline whole (its memory) into the log tail of the final report."""
    code = """
        import sys
        chunk = b"x" * 2**20
        for _ in range(48):  # 48 MiB with no newline
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.write(b"\\n")
        for _ in range(48 * 16):  # then 48 MiB of lines
            sys.stdout.buffer.write(b"y" * 65535 + b"\\n")
        sys.stdout.flush()
    """
    cluster = start_cluster(tmp_path / "log", code_wheel(tmp_path, code), settings)
    teardown_after(cluster)
    result = wait_result(cluster)
    node_log = Path(cluster.nodes[0].workdir) / "node.log"
    assert node_log.stat().st_size <= 20 * 2**20, node_log.stat().st_size
    assert (result / "report.json").stat().st_size <= 2**20


def test_a_thread_bomb_is_bounded(tmp_path, settings, teardown_after):
    """Finding 4 (medium): no limit on a cluster's tasks — the machine's pid_max (32768 here) is shared, so a fork or
    thread bomb from one job leaves the platform (and every other job) unable to fork."""
    code = """
        import os, threading, time
        threading.stack_size(64 * 1024)
        stop = threading.Event()
        count = 0
        try:
            while count < 6000:
                threading.Thread(target=stop.wait, daemon=True).start()
                count += 1
        except RuntimeError:
            pass
        stop.set()
        open(os.path.join(os.environ["FC2_OUTPUT_DIR"], "count"), "w").write(str(count))
    """
    cluster = start_cluster(tmp_path / "bomb", code_wheel(tmp_path, code), settings)
    teardown_after(cluster)
    wait_result(cluster)
    count = int(provisioner.fetch_results(cluster)["worker-0"].outputs["count"])
    assert count < 6000, f"{count} threads"


def test_a_node_cannot_fill_the_platforms_disk(tmp_path, settings, teardown_after):
    """Finding 5 (medium): work/ and output/ were directories on the platform's own filesystem with no quota: fallocate
    took any amount of space at once (tried with 8 GiB; the whole disk would do). Now each node's are on a disk of
    its own of FC2_LOCAL_NODE_DISK_MB: past it, ENOSPC — for a file allocated at once or written bit by bit, in work/
    and output/ together — and the outputs written within it are still collected."""
    settings.FC2_LOCAL_NODE_DISK_MB = 64
    code = """
        import errno, json, os
        got = {}
        fd = os.open("/job/work/big", os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, 8 * 2**30)
            got["fallocate"] = "allocated"
        except OSError as exc:
            got["fallocate"] = errno.errorcode[exc.errno]
        os.ftruncate(fd, 0)
        written = 0
        rest = os.path.join(os.environ["FC2_OUTPUT_DIR"], "rest")
        with open("/job/work/half", "wb") as work, open(rest, "wb") as out:
            try:
                for i in range(200):  # 200 MiB, alternately to work/ and output/
                    (work if i % 2 else out).write(b"x" * 2**20)
                    (work if i % 2 else out).flush()
                    written += 1
                got["write"] = "written"
            except OSError as exc:
                got["write"] = errno.errorcode[exc.errno]
        got["written_mb"] = written
        os.remove("/job/work/half")
        os.remove(rest)
        open(os.path.join(os.environ["FC2_OUTPUT_DIR"], "got"), "w").write(json.dumps(got))
    """
    cluster = start_cluster(tmp_path / "disk", code_wheel(tmp_path, code), settings)
    teardown_after(cluster)
    wait_result(cluster)
    got = json.loads(provisioner.fetch_results(cluster)["worker-0"].outputs["got"])
    assert got["fallocate"] == "ENOSPC", got
    assert got["write"] == "ENOSPC" and 32 <= got["written_mb"] <= 64, got
    image = Path(cluster.nodes[0].workdir) / "disk.img"
    assert image.stat().st_blocks * 512 <= 64 * 2**20  # what the node took of the platform's disk


def test_a_node_cannot_take_the_machines_memory(tmp_path, settings, teardown_after):
    """Finding 6 (medium): no memory limit (no cgroup, RLIMIT_AS unlimited): one node could take all the machine's
    memory, and the kernel's OOM killer then picks among the platform's processes too (tried with 4 GiB, touched).
    Now the cluster has a memory cgroup of FC2_LOCAL_CLUSTER_MEMORY_MB, less than the machine's by default: past it
    the kernel kills the node's code, and its failure says why."""
    machine_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert machine_mb > settings.FC2_LOCAL_CLUSTER_MEMORY_MB  # by default
    settings.FC2_LOCAL_CLUSTER_MEMORY_MB = 512
    code = """
        import os
        try:
            block = bytearray(2 * 2**30)  # zero pages: touch one byte per page
            for i in range(0, len(block), 4096):
                block[i] = 1
            got = "allocated"
        except MemoryError:
            got = "refused"
        open(os.path.join(os.environ["FC2_OUTPUT_DIR"], "got"), "w").write(got)
    """
    cluster = start_cluster(tmp_path / "mem", code_wheel(tmp_path, code), settings)
    teardown_after(cluster)
    wait_result(cluster)
    result = provisioner.fetch_results(cluster)["worker-0"]
    assert result.outputs.get("got") != b"allocated"
    assert result.report["status"] == "failed" and result.report["exit_code"] in (-9, 137), result.report
    assert result.report["log_tail"].endswith("fc2-agent: killed: out of memory (cluster limit 512 MB)")
