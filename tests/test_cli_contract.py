"""The command-line contract (DESIGN.md): with --json, every outcome is exactly one JSON object on stdout — a user's
error too, with its reason and a non-zero exit, never a traceback — and `--help` documents every option."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command, load_command_class

import provisioner
from fc2.models import CodeBundle, Job
from recommender.catalog import load_catalog
from tests.conftest import PROJECT_DIR

COMMANDS = {
    "submit_job": "fc2",
    "check_bundle": "fc2",
    "setup_platform": "fc2",
    "cluster": "fc2",
    "lab_sweep": "fc2",
    "api_token": "fc2",
    "recommend": "recommender",
    "import_perf_data": "recommender",
    "model_report": "recommender",
    "refresh_catalog": "recommender",
}


def refused(command: str, *args: str) -> tuple[dict, str]:
    """Run `command *args --json` in-process, expecting a refusal: (its one JSON object, its stderr)."""
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command(command, *args, "--json", stdout=out, stderr=err)
    assert exit_info.value.code not in (0, None), out.getvalue()
    assert "Traceback" not in err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()  # the whole of stdout is one object


# --- a user's errors, in-process --------------------------------------------------------------------------------------

# (command, arguments; "{wheel}" is the example wheel, "{dir}" a directory) -> the reason the error must give.
USER_ERRORS = [
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "no-such-set"], "no dataset named 'no-such-set'"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--algorithm", "model"],
     "No performance records for workload 'fc2-digits-cnn:digits'"),
    ("submit_job", ["--bundle", "{dir}/missing.whl", "--dataset", "digits"], "missing.whl does not exist"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--param", "epochs"], "not KEY=VALUE"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--param", "a b=1"], "must be letters, digits"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--workers", "0"], "at least 1 worker"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--strategy", "auto"],
     "A strategy left open is chosen by the Model algorithm"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--strategy", "auto", "--algorithm", "model"],
     "No performance records for workload 'fc2-digits-cnn:digits'"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--main", "train.py"], "train.py"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--user", "nobody"], "no user 'nobody'"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--latency-ms", "20"],
     "the local provider cannot add latency between its nodes"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--total-budget", "0"],
     "a job's total budget must be more than $0 (not 0)"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--total-budget", "-2.5"],
     "a job's total budget must be more than $0 (not -2.5)"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--budget", "2"],
     "budget is the recommender's budget C in $/h, which Manual does not take"),
    ("submit_job", ["--bundle", "{wheel}", "--dataset", "digits", "--provider", "aws"],
     "aws clusters need AWS credentials: no AWS credentials"),  # see without_aws_credentials
    ("cluster", ["down", "no-such-cluster", "--provider", "local"], "no cluster named 'no-such-cluster' on local"),
    ("cluster", ["up", "--provider", "local", "--worker-type", "x", "--workers", "99", "--name", "big"],
     "the local provider runs at most 8 workers"),
    ("lab_sweep", ["--bundle", "{wheel}", "--dataset", "digits", "--workers", "1,x", "--batch-sizes", "8",
                   "--workload", "w"], "'1,x' is not a comma-separated list of numbers"),
    ("lab_sweep", ["--bundle", "{wheel}", "--dataset", "digits", "--workers", "1", "--batch-sizes", "8",
                   "--workload", "w", "--csv", "{dir}/no-such-folder/grid.csv"], "no-such-folder"),
    ("lab_sweep", ["--bundle", "{wheel}", "--dataset", "digits", "--workers", "1", "--batch-sizes", "8",
                   "--workload", "w", "--csv", "{dir}"], "is a folder, not a file"),
    ("api_token", ["create", "nobody", "--name", "laptop"], "no user 'nobody'"),
    ("api_token", ["revoke", "alice", "--name", "laptop"], "alice has no live token with name 'laptop'"),
    ("check_bundle", ["{dir}/missing.whl"], "no such file"),
    ("check_bundle", ["{dir}"], "is a directory, not a wheel"),
    ("recommend", ["--algorithm", "model", "--workload", "nothing"], "No performance records for workload 'nothing'"),
    ("recommend", ["--algorithm", "cost-opt", "--budget", "0.01"], "cannot buy a PS plus one worker"),
    ("recommend", ["--algorithm", "cost-opt", "--max-workers", "2", "--strategy", "auto"],
     "Only the model chooses between a parameter server and all-reduce"),
    ("recommend", ["--algorithm", "cost-opt", "--max-workers", "2", "--catalog", "nope"], "nope"),
    ("import_perf_data", ["{dir}/missing.csv", "--format", "csv"], "cannot read"),
    ("import_perf_data", ["{readme}", "--format", "csv"], "unknown column"),
    ("model_report", ["--workload", "nothing"], "Workload 'nothing' has no performance records"),
]  # fmt: skip


@pytest.fixture
def without_aws_credentials(monkeypatch, tmp_path):
    """An installation where aws is unavailable: boto3 finds no credentials (no AWS_* variable, no shared files, no
    instance metadata), whatever the machine running the tests has configured."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.django_db
@pytest.mark.usefixtures("without_aws_credentials")
@pytest.mark.parametrize(("command", "args", "reason"), USER_ERRORS, ids=lambda v: v if isinstance(v, str) else None)
def test_a_users_error_is_one_json_object_with_the_reason(command, args, reason, alice, example_wheel, tmp_path):
    load_catalog("fc2-2018")
    paths = {"wheel": str(example_wheel), "dir": str(tmp_path), "readme": str(PROJECT_DIR / "README.md")}
    args = [arg.format(**paths) for arg in args]
    if command == "submit_job" and "--user" not in args:
        args += ["--user", "alice"]

    answer, stderr = refused(command, *args)

    assert answer["ok"] is False and reason in answer["error"]
    assert f"error: {answer['error']}" in stderr
    assert not Job.objects.exists() and not CodeBundle.objects.exists()


@pytest.mark.django_db
def test_a_bug_still_leaves_one_json_object_and_its_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("recommender.service.recommend", broken)
    out = StringIO()
    with pytest.raises(RuntimeError, match="disk on fire"):  # a bug is not hidden: its traceback goes to stderr
        call_command("recommend", "--algorithm", "cost-opt", "--max-workers", "2", "--json", stdout=out)

    assert json.loads(out.getvalue()) == {"ok": False, "error": "internal error: RuntimeError: disk on fire"}


# --- errors argparse finds, from the command line ---------------------------------------------------------------------

WHEEL = "examples/dist/fc2_digits_cnn-0.1.0-py3-none-any.whl"
USAGE_ERRORS = [
    (["submit_job", "--bundle", WHEEL, "--dataset", "digits", "--provider", "gcp"], "invalid choice: 'gcp'"),
    (["submit_job", "--dataset", "digits"], "the following arguments are required: --bundle"),
    (["submit_job", "--bundle", WHEEL, "--dataset", "digits", "--workers", "x"], "invalid int value: 'x'"),
    (["submit_job", "--bundle", WHEEL, "--dataset", "digits", "--algorithm", "fastest"], "invalid choice: 'fastest'"),
    (["submit_job", "--bundle", WHEEL, "--dataset", "x", "--total-budget", "ten"], "not an amount of dollars: 'ten'"),
    (["submit_job", "--bundle", WHEEL, "--dataset", "x", "--total-budget", "inf"], "not an amount of dollars: 'inf'"),
    (["recommend", "--algorithm", "nope"], "invalid choice: 'nope'"),
    (["recommend", "--algorithm", "cost-opt", "--budget", "1", "--max-workers", "2"], "not allowed with argument"),
    (["model_report"], "the following arguments are required: --workload"),
    (["import_perf_data", "x.csv", "--format", "xml"], "invalid choice: 'xml'"),
    (["check_bundle"], "the following arguments are required: path"),
    (["refresh_catalog"], "the following arguments are required: --region"),
    # and two that the commands find, with no database needed
    (["check_bundle", "missing.whl"], "no such file: missing.whl"),
    (["import_perf_data", "missing.csv", "--format", "csv"], "cannot read missing.csv"),
]


def manage(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python manage.py *args` as a user runs it, on a database of its own (none of these reach it)."""
    env = {
        **os.environ,
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "FC2_VAR_DIR": str(tmp_path / "var"),
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(("args", "reason"), USAGE_ERRORS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_usage_error_on_the_command_line_is_one_json_object(args, reason, tmp_path):
    run = manage(tmp_path, *args, "--json")

    assert run.returncode != 0
    answer = json.loads(run.stdout)  # the whole of stdout is one object
    assert answer["ok"] is False and reason in answer["error"]
    assert "Traceback" not in run.stderr and f"error: {answer['error']}" in run.stderr


def test_a_database_not_migrated_is_the_operator_s_to_fix_not_a_traceback(tmp_path):
    run = manage(tmp_path, "recommend", "--algorithm", "cost-opt", "--max-workers", "2", "--json")

    assert run.returncode == 1 and "Traceback" not in run.stderr
    answer = json.loads(run.stdout)
    assert "the database cannot answer (no such table" in answer["error"] and "make setup" in answer["error"]


def test_without_json_a_usage_error_is_argparse_s_own(tmp_path):
    run = manage(tmp_path, "recommend", "--algorithm", "nope")

    assert run.returncode == 2 and run.stdout == ""
    assert "usage: manage.py recommend" in run.stderr and "invalid choice: 'nope'" in run.stderr


# --- --help -----------------------------------------------------------------------------------------------------------


def parser_of(command: str):
    return load_command_class(COMMANDS[command], command).create_parser("manage.py", command)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_documents_every_option_and_its_choices(command):
    parser = parser_of(command)
    text = parser.format_help()

    for action in parser._actions:
        assert action.help, f"{command}: {action.option_strings or action.dest} has no help"
        if action.choices:
            assert "{" + ",".join(map(str, action.choices)) + "}" in text


def test_help_offers_the_choices_the_service_accepts():
    from recommender.types import ALGORITHMS

    algorithm = next(a for a in parser_of("submit_job")._actions if a.dest == "algorithm")
    assert tuple(algorithm.choices) == ("manual", *ALGORITHMS)
    provider = next(a for a in parser_of("submit_job")._actions if a.dest == "provider")
    assert list(provider.choices) == sorted(provisioner.PROVIDERS)


def readme_invocations() -> list[tuple[str, str, str]]:
    """(command, its first word, option) for every `manage.py COMMAND … --option` the README shows (continued lines
    included); the first word is the action of a command that has actions (`cluster up`)."""
    text = (PROJECT_DIR / "README.md").read_text().replace("\\\n", " ")
    found = []
    for command, rest in re.findall(r"manage\.py (\w+)([^\n`#]*)", text):
        if command in COMMANDS:
            first = rest.split()[0] if rest.split() else ""
            found += [(command, first, option) for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)]
    return found


def options_of(command: str, first_word: str) -> dict:
    parser = parser_of(command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and first_word in action.choices:
            return action.choices[first_word]._option_string_actions
    return parser._option_string_actions


def test_every_option_the_readme_mentions_exists():
    invocations = {(command, option) for command, _, option in readme_invocations()}
    assert ("submit_job", "--strategy") in invocations and ("recommend", "--latency-ms") in invocations
    assert ("cluster", "--worker-type") in invocations and ("lab_sweep", "--latency-ms") in invocations

    for command, first_word, option in readme_invocations():
        assert option in options_of(command, first_word), f"README: {command} {first_word} {option}"
