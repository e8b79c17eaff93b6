"""Every command in the README, run as printed in a fresh shell, in the README's order, as a newcomer would: `make run`
on a fresh data directory, the `fc2` client installed with `pip install ./client` into a virtualenv of its own, the
curl lines, the server-side `manage.py` lines, and the lab's. A command added to the README that this walk does not
run fails it, so the README cannot promise a command nobody ran.

The shell is fresh: nothing in its environment but PATH, HOME and the data directory (FC2_VAR_DIR, so that the walk
does not touch the checkout's own var/), and FC2_TOKEN once the README has said to make a token. The only change to a
command is the address: the walk's `make run` serves on a free port, not 8000.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provisioner import unavailable
from tests.conftest import PROJECT_DIR

pytestmark = [
    pytest.mark.heavy,  # a whole platform, four TensorFlow jobs and a lab grid
    pytest.mark.skipif(os.geteuid() != 0, reason="local jobs run sandboxed, which needs root"),
]

README = PROJECT_DIR / "README.md"
README_URL = "http://127.0.0.1:8000"
SYSTEM_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(PROJECT_DIR)))


def readme_commands(text: str) -> list[str]:
    """The commands of the README's code blocks (a block marked ```text shows something else: what a bundle prints),
    continued lines joined and trailing comments dropped.

    >>> readme_commands("x\\n```\\nmake run   # serves\\nfc2 a \\\\\\n    --b c\\n```\\n```text\\nnot this\\n```\\n")
    ['make run', 'fc2 a --b c']
    """
    commands, fence = [], None
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence == "" and (command := re.sub(r"\s+#.*$", "", line).strip()):
            commands.append(re.sub(r"\s+", " ", command))
    return commands


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Shell:
    """A fresh shell in the newcomer's working directory: a checkout (its files linked, so nothing is written into the
    real one) with the data directory of its own."""

    home: Path
    url: str
    log: Path  # make run's output
    env: dict[str, str] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    bundle_id: int = 0  # what the README's first curl line answered

    def run(self, command: str, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
        """`command` as printed, but for the address; it must succeed."""
        result = self.attempt(command, stdin, timeout)
        said = f"{command}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
        assert result.returncode == 0, f"{said}\nmake run said:\n{self.log.read_text()[-4000:]}"
        assert "Traceback" not in result.stderr, f"{command}\n{result.stderr}"
        return result

    def attempt(self, command: str, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
        self.ran.append(command)
        return subprocess.run(
            ["bash", "-c", command.replace(README_URL, self.url)],
            cwd=self.home,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def checkout_for(home: Path) -> None:
    """What a clone has, linked from this one: `.venv/` (built by make), the sources manage.py needs, the examples."""
    for name in ("Makefile", "manage.py", "pyproject.toml", ".venv", "examples", "fc2", "recommender", "provisioner",
                 "monitor", "common", "templates", "static", "docs", "README.md"):  # fmt: skip
        (home / name).symlink_to(PROJECT_DIR / name)
    # `pip install ./client` builds in the folder it is given: a copy, so that the checkout is left as it was.
    shutil.copytree(PROJECT_DIR / "client", home / "client", ignore=shutil.ignore_patterns("build", "*.egg-info"))


@pytest.fixture
def shell(tmp_path) -> Iterator[Shell]:
    # The walk's checkout links this one's .venv: were it out of date (pyproject.toml edited since), the walk's
    # `make run` would reinstall the project into it from the walk's temporary checkout, and leave the real one's
    # imports pointing there once it is gone. Brought up to date here, from here, it is left alone.
    subprocess.run(["make", "--quiet", ".venv/bin/.installed"], cwd=PROJECT_DIR, check=True, timeout=900)
    home = tmp_path / "checkout"
    home.mkdir()
    checkout_for(home)
    port = free_port()
    env = {
        "PATH": SYSTEM_PATH,
        "HOME": str(tmp_path / "home"),
        "LANG": "C.UTF-8",
        "FC2_VAR_DIR": str(tmp_path / "var"),
    }
    (tmp_path / "home").mkdir()
    walk = Shell(home=home, url=f"http://127.0.0.1:{port}", log=tmp_path / "make-run.log", env=env)
    # `make run PORT=8080 HOST=0.0.0.0`, as the README says, on a free port of this machine only.
    log = (tmp_path / "make-run.log").open("w")
    platform = subprocess.Popen(
        ["make", "run", f"PORT={port}", "HOST=127.0.0.1"],
        cwd=home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_serving(walk.url, platform, tmp_path / "make-run.log")
        yield walk
    finally:
        stop(platform)
        log.close()
        # A walk that failed half-way may have left a cluster up (`cluster up`'s) or stopped the platform under a
        # job: the operator's tools remove them (`cluster down`, `cluster reap`; docs/OPERATIONS.md).
        listed = walk.attempt(".venv/bin/python manage.py cluster list --json")
        for cluster in json.loads(listed.stdout or "{}").get("clusters", []):
            walk.attempt(f".venv/bin/python manage.py cluster down {cluster['name']}")
        for provider in ("local", "lab"):
            walk.attempt(f".venv/bin/python manage.py cluster reap --provider {provider}")


def wait_until_serving(url: str, platform: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert platform.poll() is None, f"make run exited {platform.returncode}:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url + "/", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"make run did not serve {url} in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(platform: subprocess.Popen) -> None:
    """Ctrl-C's signal to make's whole group, then whatever is left is killed: the walk leaves no process behind."""
    try:
        os.killpg(platform.pid, signal.SIGINT)
        platform.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(platform.pid, signal.SIGKILL)
        platform.wait(timeout=30)


def json_of(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout)


def test_every_readme_command_runs_as_printed(shell):
    readme = README.read_text()
    commands = readme_commands(readme)
    before = written_into_checkout()
    assert commands, "the README shows no command"

    # "`make run` puts it in .venv/bin/fc2" — and on the researcher's own machine, `pip install ./client`.
    assert "`pip install ./client`" in readme
    shell.run(f"{sys.executable} -m venv ../client-venv && ../client-venv/bin/pip install --quiet ./client")
    shell.env["PATH"] = f"{shell.home.parent / 'client-venv' / 'bin'}{os.pathsep}{SYSTEM_PATH}"
    shell.ran.append("pip install ./client")

    # "Make a token on API tokens (/account/tokens/) first": the same token as the page makes, from its command.
    secret = json_of(shell.run(".venv/bin/python manage.py api_token create researcher --name laptop --json"))["token"]
    shell.env["FC2_TOKEN"] = secret

    done: set[str] = set()
    for command in commands:
        if command in done:
            continue
        run_one(shell, command, readme)
        done.add(command)

    # Nothing the walk made is in the real checkout: its commands wrote into the walk's own.
    assert written_into_checkout() == before


def written_into_checkout() -> set[str]:
    """What the README's commands would write into the checkout they run in, found in the real one."""
    return {name for name in ("results", "my-runs.csv", "client/build") if (PROJECT_DIR / name).exists()}


def run_one(shell: Shell, command: str, readme: str) -> None:
    """Run one README command and check what the README says it does."""
    words = command.split()
    if command.startswith("make run"):
        return  # the fixture's `make run PORT=… HOST=…` is this line, on a free port
    if command == "make test":
        return  # the command running this walk
    if words[:2] == ["fc2", "login"]:
        # "asks for the token": typed at the prompt, or piped in.
        result = shell.run(command, stdin=shell.env["FC2_TOKEN"] + "\n")
        assert shell.url in result.stdout + result.stderr
        return
    if words[:2] == ["fc2", "submit"]:
        result = shell.run(command)
        assert "succeeded" in result.stdout + result.stderr
        return
    if words[:2] == ["fc2", "jobs"]:
        listing = shell.run(command).stdout
        assert "succeeded" in listing
        # "then: fc2 status 1, fc2 logs 1, fc2 cancel 1" — job 1 is the one `fc2 submit` ran and it has ended, so
        # cancel gets its own job below (the curl job).
        assert "fc2 status 1, fc2 logs 1, fc2 cancel 1" in readme
        assert "succeeded" in shell.run("fc2 status 1").stdout
        assert "FC2_PROGRESS" in shell.run("fc2 logs 1").stdout
        return
    if words[:2] == ["fc2", "download"]:
        shell.run(command)
        saved = {p.name for p in (shell.home / "results").rglob("*")}
        assert {"model.keras", "metrics.json"} <= saved, saved
        return
    if words[0] == "curl" and "/api/bundles" in command:
        bundle = json_of(shell.run(command))
        # "The second call's `bundle` is the `id` the first one answered": on a fresh install, 2 (fc2 submit's was 1).
        shell.bundle_id = bundle["id"]
        return
    if words[0] == "curl" and "/api/jobs" in command:
        command = command.replace('"bundle": 1', f'"bundle": {shell.bundle_id}')
        job = json_of(shell.run(command))
        assert job.get("state") == "queued", job
        # `fc2 cancel N` on the job just submitted: everything it started is torn down.
        shell.run(f"fc2 cancel {job['id']}")
        ended = shell.attempt(f"fc2 status {job['id']} --follow --json", timeout=180)
        assert (ended.returncode, json_of(ended)["job"]["state"]) == (1, "cancelled"), ended.stdout
        return
    if "manage.py submit_job" in command:
        result = json_of(shell.run(command))
        assert result["status"] == "succeeded" and "model.keras" in {a["name"] for a in result["artifacts"]}, result
        return
    if "manage.py import_perf_data" in command:
        path = words[words.index("import_perf_data") + 1]
        # The user's measured runs, in the headerless rows of Anwar et al.: workers,batch,latency,step,epoch,loss.
        (shell.home / path).write_text("1,32,0,0.01,2.0,0.5\n2,32,0,0.01,1.4,0.5\n4,32,0,,,\n")
        result = shell.run(command)
        assert "imported 3 records for fc2-digits-cnn:digits" in result.stdout, result.stdout
        assert "1 failed runs kept" in result.stdout, result.stdout
        return
    if "manage.py recommend" in command:
        answer = json_of(shell.run(command))
        assert answer["workers"] >= 1 and answer["source"] == "measured", answer
        return
    if "--provider lab" in command or "manage.py cluster down" in command or "manage.py lab_sweep" in command:
        reason = unavailable("lab")
        if reason:
            pytest.skip(f"the README's lab commands need the lab: {reason}")
        result = shell.run(command, timeout=900)
        if "cluster up" in command:
            assert [node["role"] for node in json_of(result)["nodes"]].count("worker") == 2
        return
    raise AssertionError(f"the README shows a command this walk does not run: {command}")
