"""The fault matrix: every way a job's machinery dies that the tests emulate, run for real, as one table of fault ×
step → outcome, seconds to it, and what was left behind.

The scenarios are the tests' own (real clusters, real Celery workers, the sweep every half second, short timings):
tests/test_faults.py (a Celery worker SIGKILLed inside each step with a second host up, the platform unreachable for
its nodes, cancel, a PS job's end, the web server down), tests/test_node_loss.py (a lab node's sshd, agent, host or
link lost mid-training; an EC2 instance terminated behind the platform's back, on moto with lab hosts),
tests/test_outages.py (PostgreSQL and Redis of the test's own restarted under a running job; the 503s in process),
tests/test_local_faults.py (a local launch SIGKILLed half-way and sent again, a node's disk gone, the worker killed
with its whole cgroup under a running job), tests/test_local_admission.py (the machine full of local clusters), the
hostile bundle of tests/test_hostile_reports.py (NaN, huge integers and NUL in what a job writes, local and lab), and
managed jobs' lost nodes (tests/test_resume.py, tests/test_chaos.py: resumed from their checkpoint, or failed naming
their restarts).
This runs them in one pytest session in a scratch FC2_VAR_DIR and pytest --basetemp (nothing of the developer's var/
is touched), reads what each printed (`FIGURE …` lines) and how it ended (a test marked xfail is a known bug, its
reason says whose), then looks on the machine for anything of the run left: namespaces, veths, bridges, iptables
rules, cgroups, mounts, loop devices, processes.

    .venv/bin/python benchmarks/faults.py [--only SUBSTRING] [--keep]

--only runs the scenarios whose test id contains SUBSTRING (e.g. `host gone`, `outages`, `provisioning`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
SUITES = [
    "tests/test_faults.py",
    "tests/test_node_loss.py",
    "tests/test_outages.py",
    "tests/test_local_faults.py",
    "tests/test_local_admission.py",
    "tests/test_hostile_reports.py::test_a_hostile_bundle_succeeds_showably_and_leaves_nothing",
    "tests/test_resume.py",
    "tests/test_chaos.py",
]
# test function -> (the fault, the step it hits when the test id does not say)
FAULTS = {
    "test_a_worker_killed_at_any_step_leaves_no_job_hanging": ("Celery worker SIGKILLed (2 hosts)", ""),
    "test_a_worker_killed_while_provisioning_on_aws_makes_no_double_and_leaves_no_instance": (
        "Celery worker SIGKILLed (aws)",
        "provisioning",
    ),
    "test_a_result_that_never_reached_the_platform_is_fetched_from_the_node": ("nodes cannot reach platform", "all"),
    "test_cancel_answers_before_the_teardown": ("cancel", "running"),
    "test_a_ps_job_does_not_wait_in_collecting_for_its_servers": ("PS servers never exit", "collecting"),
    "test_the_web_server_down_at_the_end_of_training_loses_no_result": ("web server down 20 s", "end of run"),
    "test_a_lab_node_lost_mid_training_ends_the_job_by_name_and_leaves_nothing": ("lab node:", "running"),
    "test_the_lab_teardown_after_each_loss_removes_everything": ("lab teardown alone:", "running"),
    "test_an_ec2_instance_terminated_behind_the_platforms_back_fails_the_job_and_leaves_nothing": (
        "aws instance terminated",
        "running",
    ),
    "test_a_launch_killed_half_way_is_completed_and_every_node_keeps_its_outputs": (
        "local launch killed:",
        "provisioning",
    ),
    "test_a_node_whose_disk_is_gone_is_never_started": ("local node's disk gone", "bootstrapping"),
    "test_local_nodes_outlive_a_worker_killed_with_its_control_group": ("worker's cgroup SIGKILLed (local)", "running"),
    "test_a_cluster_past_what_the_machine_has_waits_and_starts_when_one_ends": ("machine full (local)", "provisioning"),
    "test_two_launches_at_once_are_admitted_one_after_the_other": ("room for 1, 2 launches at once", "provisioning"),
    "test_a_job_with_no_room_waits_its_turn_with_the_reason_said_once": ("machine full (local), a job", "provisioning"),
    "test_a_hostile_bundle_succeeds_showably_and_leaves_nothing": (
        "hostile metrics.json, log, progress",
        "end of run",
    ),
    "test_postgres_restarted_mid_job_answers_503_meanwhile_and_the_job_goes_on": ("PostgreSQL down 12 s", "end of run"),
    "test_redis_restarted_mid_job_answers_503_meanwhile_and_the_job_recovers": ("Redis down 12 s", "end of run"),
    "test_a_database_error_in_a_view_is_a_503": ("DB error in a view", "request"),
    "test_a_database_error_reading_the_session_is_a_503": ("DB error reading the session", "request"),
    "test_a_database_error_in_a_middleware_around_the_view_is_a_503": ("DB error in a middleware", "request"),
    "test_the_node_report_endpoint_answers_503_for_the_agent_to_retry": ("DB error on a node report", "request"),
    "test_a_broker_error_sending_a_task_is_a_503": ("broker error in a request", "request"),
    "test_any_other_error_stays_a_500": ("any other error (a 500)", "request"),
    "test_a_lab_worker_lost_mid_training_resumes_from_the_checkpoint_and_succeeds": ("managed, lab node:", "running"),
    "test_a_spot_instance_taken_back_mid_run_is_relaunched_and_the_job_resumes": ("managed job, spot taken", "running"),
    "test_a_node_lost_while_bootstrapping_is_replaced_and_a_cancel_during_the_restart_leaves_nothing": (
        "managed job, host gone, then cancel",
        "bootstrapping",
    ),
    "test_a_peer_failing_because_a_lab_node_is_gone_resumes_the_job": ("managed, peer fails, host gone", "running"),
}


def collect(env: dict[str, str], only: str | None) -> list[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SUITES],
        cwd=PROJECT_DIR, env=env, capture_output=True, text=True,
    )  # fmt: skip
    ids = [line.strip() for line in listed.stdout.splitlines() if "::" in line]
    return [i for i in ids if only is None or only.lower() in i.lower()]


def run(ids: list[str], env: dict[str, str], scratch: Path) -> Path:
    report = scratch / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(scratch / "pytest"),
         "-o", "junit_logging=system-out", "--junitxml", str(report), *ids],
        cwd=PROJECT_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return report


def rows(report: Path) -> list[dict[str, str]]:
    """Each test case as a row: fault, step, test (its result), outcome (what it printed), left (behind), s (its
    seconds) and why (an xfail's reason, a failure's message)."""
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        function, _, param = case.get("name", "").partition("[")
        param = param.rstrip("]")
        fault, step = FAULTS.get(function, (function, ""))
        if fault.endswith(":"):
            fault, param = f"{fault} {param}", ""
        out = "".join(node.text or "" for node in case.iter("system-out"))
        figures = [line.split("FIGURE ", 1)[1] for line in out.splitlines() if "FIGURE " in line]
        left = [f.split(": left ", 1)[1] for f in figures if ": left " in f]
        said = [re.sub(r"^[^:]*: ", "", f) for f in figures if ": left " not in f]
        result, why = "passed", ""
        for child in case:
            if child.tag == "skipped":
                result = "xfail" if child.get("type") == "pytest.xfail" else "skipped"
                why = child.get("message", "")
            elif child.tag in ("failure", "error"):
                result, why = child.tag, (child.get("message") or "").splitlines()[0]
        if step == "request":
            left_behind = "-"  # in process: no cluster
        elif result == "passed":
            left_behind = left[0] if left else "nothing (asserted)"
        else:
            left_behind = left[0] if left else "not checked"
        found.append({
            "fault": fault, "step": param or step, "test": result, "outcome": "; ".join(said) or "-",
            "left": left_behind, "s": f"{float(case.get('time', 0)):.0f}", "why": why,
        })  # fmt: skip
    return found


def leftovers(scratch: Path) -> list[str]:
    """Anything of this run still on the machine: found by the scratch directory (mounts, loop devices, processes)
    and by the lab installation tags of the tests' lab directories (namespaces, links, rules, cgroups)."""
    left = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if str(scratch) in line]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.splitlines()
    left += [f"loop {line.split(':')[0]}" for line in loops if str(scratch) in line]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(scratch) in line:
                left.append(f"process {entry.name} {line[:100]}")
    tags = {hashlib.sha256(str(d.resolve()).encode()).hexdigest()[:6] for d in scratch.glob("pytest/*/fc2var/lab")}
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout.splitlines()
    cgroups = [p.name for root in ("cpu/fc2lab", "memory/fc2") for p in Path("/sys/fs/cgroup", root).glob("fc2lab-*")]
    for tag in tags:
        left += [f"namespace {n}" for n in names if n.startswith(f"fc2lab-{tag}-")]
        left += [f"link {line.split(':')[1].strip()}" for line in links if f"fc2lab:{tag}:" in line]
        left += [f"iptables {line}" for line in rules if f"fc2lab:{tag}:" in line]
        left += [f"cgroup {c}" for c in cgroups if c.startswith(f"fc2lab-{tag}-")]
    return left


COLUMNS = ("fault", "step", "test", "outcome", "left", "s")
HEADER = {"fault": "fault", "step": "step", "test": "test", "outcome": "outcome, seconds to it", "left": "left behind",
          "s": "test s"}  # fmt: skip


def table(found: list[dict[str, str]]) -> str:
    widths = {c: min(max(len(row[c]) for row in [HEADER, *found]), 100) for c in COLUMNS}
    lines = []
    for row in [HEADER, {c: "-" * widths[c] for c in COLUMNS}, *found]:
        lines.append(" | ".join(row[c][: widths[c]].ljust(widths[c]) for c in COLUMNS).rstrip())
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the scenarios whose test id contains this (case-insensitive)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, junit.xml)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fc2-faults-"))
    env = {**os.environ, "FC2_VAR_DIR": str(scratch / "var")}
    env.pop("REDIS_URL", None)  # the workers' broker: the filesystem one (the outage tests start their own Redis)
    ids = collect(env, args.only)
    if not ids:
        sys.exit(f"no scenario matches {args.only!r}")
    print(f"{len(ids)} scenarios (filesystem broker; outages on a PostgreSQL and a Redis of their own) ...", flush=True)
    started = time.monotonic()
    found = rows(run(ids, env, scratch))
    print(table(found))
    counts = {result: sum(row["test"] == result for row in found) for result in {row["test"] for row in found}}
    took = time.monotonic() - started
    print(f"\n{len(found)} scenarios in {took:.0f} s: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items())))
    left = leftovers(scratch)
    print("after the run, of it on this machine: " + ("nothing" if not left else "\n  " + "\n  ".join(left)))
    for row in found:
        if row["test"] != "passed":
            print(f"{row['test']}: {row['fault']} ({row['step']}): {row['why']}")
    if args.keep:
        print(f"scratch kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
