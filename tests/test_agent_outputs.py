"""What the node agent (monitor/agent.py) keeps of a node's output directory, and says of what it does not keep:
every entry is kept, or listed as not kept with why — a link, a FIFO, a socket, a device, a folder past the depth
limit — and a node whose output directory itself cannot be read has not succeeded. Real files, real agent runs."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from monitor import agent

AGENT = Path(agent.__file__)


def not_kept(outputs: agent.Outputs) -> dict[str, str]:
    return {entry["path"]: entry["reason"] for entry in outputs.not_kept}


def test_what_is_not_a_file_is_listed_as_not_kept_with_why(tmp_path):
    out = tmp_path / "output"
    (out / "model").mkdir(parents=True)
    (out / "model" / "weights").write_bytes(b"w")
    os.mkfifo(out / "fifo")
    os.mkfifo(out / "model" / "fifo")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(out / "model" / "socket"))
        if os.geteuid() == 0:  # a device node: never opened (reading one may do anything)
            os.mknod(out / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        (out / "link").symlink_to(out / "model" / "weights")

        outputs = agent.collect_outputs(out, 10_000)

    assert [o["path"] for o in outputs.listed] == ["model"]
    with zipfile.ZipFile(io.BytesIO(outputs.files[outputs.listed[0]["file"]])) as archive:
        assert archive.namelist() == ["model/weights"]
    expected = {
        "fifo": "a named pipe (FIFO), not a file",
        "link": "a symbolic link: links are not followed",
        "model/fifo": "a named pipe (FIFO), not a file",
        "model/socket": "a socket, not a file",
    }
    if os.geteuid() == 0:
        expected["null"] = "a device, not a file"
    assert not_kept(outputs) == expected


def test_a_folder_past_the_depth_limit_is_listed_not_dropped(tmp_path):
    """Before: the folder became an empty archive and no line said where its files went."""
    out = tmp_path / "output"
    deepest = out.joinpath(*["d"] * (agent.MAX_OUTPUT_DEPTH + 2))
    deepest.mkdir(parents=True)
    (deepest / "weights").write_bytes(b"w")
    (out / "d" / "near").write_bytes(b"n")

    outputs = agent.collect_outputs(out, 10_000)

    with zipfile.ZipFile(io.BytesIO(outputs.files[outputs.listed[0]["file"]])) as archive:
        assert archive.namelist() == ["d/near"]
    too_deep = "/".join(["d"] * (agent.MAX_OUTPUT_DEPTH + 1)) + "/"
    assert not_kept(outputs) == {too_deep: f"a folder deeper than {agent.MAX_OUTPUT_DEPTH} levels: not looked into"}


def test_a_not_kept_path_too_long_for_a_report_is_shortened(tmp_path):
    """Names of 200 characters, ten folders deep: the line fits in what the platform takes, both ends shown."""
    out = tmp_path / "output"
    deep = out.joinpath(*["n" * 200] * 10)
    deep.mkdir(parents=True)
    os.mkfifo(deep / "fifo")

    (entry,) = agent.collect_outputs(out, 10_000).not_kept

    assert len(entry["path"]) <= agent.MAX_LISTED_PATH
    assert entry["path"].startswith("n" * 200 + "/") and entry["path"].endswith("/fifo")


def run_agent(tmp_path: Path, output: Path, code: str) -> dict:
    """The agent run as on a node, reporting to nobody, with `output` as its output directory; its kept report."""
    (token := tmp_path / "token").write_text("t")
    argv = [sys.executable, str(AGENT), "--url", "", "--job", "1", "--node", "worker-0", "--token-file", str(token)]
    argv += ["--log", str(tmp_path / "node.log"), "--output", str(output), "--result", str(tmp_path / "result")]
    subprocess.run([*argv, "--", sys.executable, "-c", code], check=True, timeout=60)
    return json.loads((tmp_path / "result" / "report.json").read_text())


@pytest.mark.parametrize("how", ["a link to a directory", "a file"])
def test_a_node_whose_output_directory_cannot_be_read_has_not_succeeded(how, tmp_path):
    """Its code exited 0, but what it wrote is lost: the node failed, and its log says why."""
    (elsewhere := tmp_path / "elsewhere").mkdir()
    output = tmp_path / "output"
    if how == "a file":
        output.write_text("not a directory")
    else:
        output.symlink_to(elsewhere)

    report = run_agent(tmp_path, output, f"open({str(elsewhere / 'model')!r}, 'w').write('m')")

    assert report["status"] == "failed" and report["exit_code"] == 0
    last = report["log_tail"].splitlines()[-1]
    assert last.startswith(f"fc2-agent: the output directory {output} cannot be read (")
    assert last.endswith("): what the command wrote there is lost")
    assert "what the command wrote there is lost" in (tmp_path / "node.log").read_text()
    assert report["outputs"] == []


def test_a_node_that_wrote_nothing_where_nothing_was_made_succeeds(tmp_path):
    """A cloud node's code makes the directory when it writes: none there means nothing written, not a loss."""
    report = run_agent(tmp_path, tmp_path / "output", "print('trained')")
    assert report["status"] == "succeeded"
