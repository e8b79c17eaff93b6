"""`fc2`: the platform's jobs API from a researcher's shell — log in, get a recommendation, submit a wheel and follow
its job, read its logs, cancel it, download its results.

Every command takes `--json` and then prints exactly one JSON object on stdout, an error too (`{"ok": false,
"error": …}`); without it, results go to stdout and progress (an upload's bar, a followed job's live line) to stderr,
on a terminal only. Exit codes: 0 success (for `submit --follow` and `status`: the job succeeded), 1 an error or a
job that failed or was cancelled, 2 a usage error, 3 `status` of a job that has not ended, 130 interrupted, 141 the
reader of its output went away (`fc2 status 5 | head -1`), quietly.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import math
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import urlsplit

from fc2_client import __version__, config, display
from fc2_client.api import API, ApiError, Client, Progress
from fc2_client.config import ConfigError, Login

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_ENDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 141  # what a shell reports for a command SIGPIPE ended: its output's reader went away (`| head`)
POLL_S = 2.0  # between two looks at a followed job or log
PATIENCE_S = 120.0  # how long following rides out an unreachable platform (a restart) before giving up
RELEASE_WAIT_S = 120.0  # how long following waits, once a job has ended, for its cluster to be torn down
ALGORITHMS = ("cost-opt", "time-opt", "scala-opt", "scala-opt-m", "lookup", "model", "explore")  # the platform judges
PRESETS = ("fastest", "cheapest", "balanced")  # explore's: what "best" means (the platform's recommender.explore)
FRAMEWORKS = ("tensorflow", "pytorch")  # what a job's code trains with (the platform's fc2.models.Framework)
SUBMIT_RETRIES = 5  # a submission not answered (or answered 502, 503, 504, 429) is sent again this often at most


class UsageError(Exception):
    """A command line argparse refused, with the usage of the (sub)command that refused it."""

    def __init__(self, message: str, usage: str, prog: str):
        super().__init__(message)
        self.usage = usage
        self.prog = prog


class Failure(Exception):
    """A command that could not do what it was asked; the message says why, `data` goes into its JSON."""

    def __init__(self, message: str, code: int = EXIT_ERROR, data: dict | None = None):
        super().__init__(message)
        self.code = code
        self.data = data or {}


@dataclass
class Outcome:
    data: dict  # the command's JSON object, without "ok"
    text: str = ""  # what a person reads on stdout ("" when the command printed as it went)
    code: int = EXIT_OK
    error: str = ""  # why the exit code is not 0


@dataclass(frozen=True)
class Terminal:
    """Where a person sees progress: stderr, never under --json."""

    as_json: bool

    def bar(self) -> display.LiveLine | None:
        """A line for a progress bar: on a terminal only (elsewhere a bar is noise)."""
        return display.LiveLine(sys.stderr) if not self.as_json and sys.stderr.isatty() else None

    def status_line(self) -> display.LiveLine | None:
        """A line for a followed job: redrawn on a terminal, each change on a line of its own elsewhere (a CI log)."""
        return None if self.as_json else display.LiveLine(sys.stderr)

    def say(self, text: str) -> None:
        """A remark on stderr for a person."""
        if not self.as_json:
            print(text, file=sys.stderr, flush=True)


# --- arguments ----------------------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse whose refusals come back to main() (which prints them as JSON under --json) instead of exiting."""

    def error(self, message):
        raise UsageError(message, self.format_usage(), self.prog)


def number(text: str) -> float:
    """A finite number (JSON has no NaN or infinity)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def parameter(text: str) -> tuple[str, str]:
    """`key=value` for the training script; the platform judges the key and the value."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def type_list(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def build_parser() -> Parser:
    parser = Parser(
        prog="fc2",
        description="Submit training jobs to an FC² platform, follow them and download their results.",
        epilog="Exit codes: 0 success (submit --follow, status: the job succeeded), 1 error or the job failed or was "
        "cancelled, 2 usage error, 3 status: the job has not ended, 130 interrupted, 141 output's reader went away.",
    )
    parser.add_argument("--version", action="version", version=f"fc2-client {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def command(name: str, run, summary: str) -> Parser:
        sub = commands.add_parser(name, parents=[common], help=summary, description=summary)
        sub.set_defaults(run=run)
        return sub

    login = command("login", cmd_login, "Check an API token with the platform and store it for the next commands.")
    login.add_argument("url", metavar="URL", help="the platform's address, e.g. https://fc2.example.org")
    login.add_argument(
        "--token",
        help="the API token (from URL/account/tokens/); default: FC2_TOKEN, else asked for without echo. On the "
        "command line it lands in your shell's history: prefer the prompt",
    )
    command("logout", cmd_logout, "Forget the stored token.")

    recommend = command("recommend", cmd_recommend, "Ask the recommender for a cluster (POST /api/v1/recommend).")
    recommend.add_argument("--algorithm", required=True, metavar="NAME", help=", ".join(ALGORITHMS))
    recommend.add_argument("--workload", metavar="NAME", help="the workload whose performance records to use")
    limit = recommend.add_mutually_exclusive_group()
    limit.add_argument("--budget", type=number, metavar="C", help="indicative budget C in $/h")
    limit.add_argument("--max-workers", type=count, metavar="N", help="at most N workers (instead of a budget)")
    recommend.add_argument("--batch-size", type=count, metavar="B", help="lookup, model: the batch size")
    recommend.add_argument("--latency-ms", type=number, metavar="L", help="lookup, model: the network latency in ms")
    recommend.add_argument("--worker-types", type=type_list, metavar="T1,T2", help="the worker types to choose from")
    recommend.add_argument("--ps-types", type=type_list, metavar="T1,T2", help="the PS types to choose from")
    recommend.add_argument("--ps-type", metavar="TYPE", help="the parameter server's type (default: chosen)")
    recommend.add_argument("--worker-type", metavar="TYPE", help="scala-opt-m: the worker type")
    recommend.add_argument(
        "--strategy",
        choices=("ps", "mirrored", "auto", "ddp"),
        help="mirrored: All-Reduce, no PS; auto: --algorithm model compares both; ddp: PyTorch's All-Reduce, the one "
        "strategy of a PyTorch workload (NAME@pytorch) (default: ps; ddp for a PyTorch workload)",
    )
    recommend.add_argument("--catalog", metavar="NAME", help="the instance catalogue (default: the platform's)")
    explore = explore_options(recommend, "--algorithm explore: what best means, and its trial runs' budget")
    explore.add_argument(
        "--provider",
        choices=("lab", "aws"),
        help="where its trials would run: a trial's minutes count its start-up and teardown there",
    )

    submit = command("submit", cmd_submit, "Upload a wheel and submit a training job with it.")
    submit.add_argument("wheel", type=Path, metavar="WHEEL", help="the wheel with your training code")
    submit.add_argument(
        "--dataset",
        required=True,
        metavar="NAME|URL|ID|FILE",
        help="a built-in (digits, mnist, cifar10), one of your datasets by name or id, an http(s) URL, or a local "
        "file (uploaded first)",
    )
    submit.add_argument("--main", metavar="SCRIPT", help="the main script in the wheel (default: main.py)")
    submit.add_argument(
        "--param", type=parameter, action="append", default=[], metavar="K=V", help="a parameter (repeatable)"
    )
    submit.add_argument("--provider", choices=("local", "lab", "aws"), help="where the cluster runs (default: local)")
    submit.add_argument(
        "--algorithm", metavar="NAME", help=f"manual (default) or one of {', '.join(ALGORITHMS)}: it picks the cluster"
    )
    size = submit.add_mutually_exclusive_group()
    size.add_argument("--budget", type=number, metavar="$/H", help="with --algorithm: the hourly budget C")
    size.add_argument("--workers", type=count, metavar="N", help="workers (with --algorithm: at most)")
    submit.add_argument(
        "--total-budget", type=number, metavar="$", help="a budget for the whole job: stopped before it would exceed it"
    )
    submit.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="what the code trains with (default: what the wheel requires, its Requires-Dist; else tensorflow)",
    )
    submit.add_argument(
        "--strategy",
        choices=("ps", "mirrored", "auto", "ddp"),
        help="TensorFlow's: ps (its default), mirrored (All-Reduce) or auto (left open: --algorithm model chooses); "
        "PyTorch's: ddp (DistributedDataParallel, All-Reduce; its default)",
    )
    submit.add_argument("--worker-type", metavar="TYPE", help="the workers' instance type")
    submit.add_argument("--worker-types", type=type_list, metavar="T1,T2", help="with --algorithm: types to consider")
    submit.add_argument("--ps-type", metavar="TYPE", help="the parameter server's instance type")
    submit.add_argument("--workload", metavar="NAME", help="the performance records' name for this code and data")
    submit.add_argument("--latency-ms", type=number, metavar="L", help="lab: delay between the nodes, ms one way")
    submit.add_argument("--region", metavar="R", help="aws: the region")
    explore_options(submit, "--algorithm explore: trial runs find the best cluster for code never run")
    managed = submit.add_argument_group("managed jobs: resume after a lost node, spot instances (aws)")
    managed.add_argument(
        "--max-restarts",
        type=count,
        metavar="N",
        help="replace a lost node and resume from the latest checkpoint up to N times (default: 0, the job fails)",
    )
    managed.add_argument("--spot", action="store_true", default=None, help="aws: spot instances rather than on-demand")
    managed.add_argument("--spot-max-price", type=number, metavar="$/H", help="the most a spot instance may cost")
    managed.add_argument(
        "--spot-fallback",
        choices=("on-demand", "wait"),
        help="without spot capacity: on-demand instances (default), or wait for spot",
    )
    submit.add_argument(
        "--follow", action="store_true", help="follow the job until it ends; exit 1 unless it succeeded"
    )

    jobs = command("jobs", cmd_jobs, "List your jobs, newest first.")
    jobs.add_argument("--state", metavar="S", help="only jobs in this state (queued, running, succeeded, failed …)")
    jobs.add_argument("--provider", metavar="P", help="only jobs on this provider")
    jobs.add_argument("--page", type=count, metavar="N", help="the page of the list (default: 1)")

    status = command("status", cmd_status, "A job's state, progress, cost and result; exit 0 only if it succeeded.")
    status.add_argument("job", type=count, metavar="ID")
    status.add_argument("--follow", action="store_true", help="follow the job until it ends")

    logs = command("logs", cmd_logs, "A job's log, one node at a time.")
    logs.add_argument("job", type=count, metavar="ID")
    logs.add_argument("--node", metavar="NAME", help="the node, e.g. worker-0 (default: the platform's choice)")
    logs.add_argument("--follow", action="store_true", help="keep printing the log as it grows, until the job ends")

    cancel = command("cancel", cmd_cancel, "Cancel a job that has not ended.")
    cancel.add_argument("job", type=count, metavar="ID")

    download = command("download", cmd_download, "Download every artifact of a job (model, metrics, logs).")
    download.add_argument("job", type=count, metavar="ID")
    download.add_argument("--dir", type=Path, metavar="D", help="where to put them (default: ./fc2-job-ID)")
    return parser


def explore_options(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """explore's options, as `submit` and `recommend` take them: what best means (a preset, or α and β) and its
    search's budget; their group."""
    explore = parser.add_argument_group(title)
    explore.add_argument("--preset", choices=PRESETS, help="what best means (default: balanced)")
    explore.add_argument("--alpha", type=number, metavar="A", help="the weight of time (instead of --preset)")
    explore.add_argument("--beta", type=number, metavar="B", help="the weight of cost (instead of --preset)")
    explore.add_argument(
        "--search-budget", type=number, metavar="$", help="the most its trial runs may cost (default: the platform's)"
    )
    explore.add_argument(
        "--search-minutes",
        type=count,
        metavar="M",
        help="the most minutes its trial runs may take (default: the platform's)",
    )
    return explore


def recommend_payload(args: argparse.Namespace) -> dict:
    """POST /api/recommend's body: what was given, the platform's defaults for the rest."""
    names = ("algorithm", "workload", "budget", "max_workers", "batch_size", "latency_ms", "worker_types", "ps_types")
    names += ("ps_type", "worker_type", "strategy", "catalog", "preset", "alpha", "beta", "search_budget")
    names += ("search_minutes", "provider")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


# The job's fields in POST /api/jobs (docs/API.md), by the option that gives each.
JOB_FIELDS = {
    "framework": "framework",
    "provider": "provider",
    "algorithm": "algorithm",
    "workers": "workers",
    "budget": "budget",
    "total_budget": "total_budget",
    "strategy": "strategy",
    "worker_type": "worker_type",
    "worker_types": "worker_types",
    "ps_type": "ps_type",
    "workload": "workload_name",
    "latency_ms": "latency_ms",
    "region": "region",
    "preset": "preset",
    "alpha": "alpha",
    "beta": "beta",
    "search_budget": "search_budget",
    "search_minutes": "search_minutes",
    "max_restarts": "max_restarts",
    "spot": "spot",
    "spot_max_price": "spot_max_price",
    "spot_fallback": "spot_fallback",
}


def job_payload(args: argparse.Namespace, bundle: int, dataset: str) -> dict:
    """POST /api/jobs's body: the uploaded bundle, the dataset, the parameters and whatever else was given."""
    payload = {"bundle": bundle, "dataset": dataset, "parameters": dict(args.param)}
    for option, name in JOB_FIELDS.items():
        if getattr(args, option) is not None:
            payload[name] = getattr(args, option)
    return payload


# --- commands -----------------------------------------------------------------------------------------------------


def client() -> Client:
    login = config.current()
    return Client(login.url, login.token)


def cmd_login(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    url = config.normalise_url(args.url)
    token = (args.token or os.environ.get("FC2_TOKEN") or _ask_token(url)).strip()
    if not token:
        raise Failure("no token given (--token, FC2_TOKEN or the prompt)")
    try:
        me = Client(url, token).get(f"{API}/me")
    except ApiError as exc:
        if exc.status in (401, 403):
            raise Failure(f"{url} refused this token: {exc.reason}", data=exc.as_dict()) from None
        raise
    path = config.save(Login(url, token))
    host = urlsplit(url).hostname or ""
    if url.startswith("http://") and host not in ("localhost", "127.0.0.1", "::1"):
        terminal.say(f"warning: {url} is not https: the token crosses the network readable by anyone on the way")
    return Outcome(
        {"url": url, "username": me.get("username"), "is_admin": me.get("is_admin"), "config": str(path)},
        f"logged in to {url} as {me.get('username')} (token stored in {path})",
    )


def _ask_token(url: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"API token (create one at {url}/account/tokens/): ")
    return sys.stdin.readline()  # piped in: `pass fc2 | fc2 login URL`


def cmd_logout(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    path = config.config_path()
    removed = config.remove(path)
    text = f"logged out ({path} removed; the token stays valid until you revoke it on the platform)"
    return Outcome({"removed": removed, "config": str(path)}, text if removed else "not logged in")


def cmd_recommend(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    answer = client().post(f"{API}/recommend", recommend_payload(args))
    return Outcome({"recommendation": answer}, display.recommendation(answer))


def cmd_submit(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    if not args.wheel.is_file():
        raise Failure(f"{args.wheel} is not a file")
    api = client()
    dataset = _dataset(api, args.dataset, terminal)
    bundle = _bundle(api, args.wheel, args.main, terminal)
    # One key for this submission, sent again with each retry: however often it is sent, the platform makes one job.
    key = str(uuid.uuid4())

    def waiting(error: ApiError, pause: float) -> None:
        terminal.say(f"submitting: {error} (trying again in {pause:g} s)")

    job = api.post(
        f"{API}/jobs",
        job_payload(args, bundle["id"], dataset),
        idempotency_key=key,
        retries=SUBMIT_RETRIES,
        waiting=waiting,
    )
    terminal.say(f"job {job['id']} submitted: {job.get('url', '')}")
    if not args.follow:
        return Outcome({"job": job, "bundle": bundle}, display.job_line(job))
    job = follow(api, job["id"], terminal)
    return _ended(job, {"job": job, "bundle": bundle})


def _dataset(api: Client, given: str, terminal: Terminal) -> str:
    """What POST /api/jobs's `dataset` takes (a built-in's name, a dataset's id or name, a URL): a local file is
    uploaded first and named by its id."""
    path = Path(given)
    if not path.is_file():
        return given
    dataset = api.upload(f"{API}/datasets", {"name": path.stem}, "file", path, _progress(terminal, path))
    terminal.say(f"{path.name} uploaded as dataset {dataset['id']}")
    return str(dataset["id"])


def _bundle(api: Client, wheel: Path, main: str | None, terminal: Terminal) -> dict:
    """The platform's bundle of this wheel and main script: the one stored already (same bytes and main script,
    so nothing is sent again), else the wheel uploaded."""
    digest = hashlib.sha256()
    with wheel.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    wanted = main or "main.py"  # a file name found anywhere in the wheel, or its path; the platform keeps the path
    for stored in api.get(f"{API}/bundles").get("results", []):
        stored_main = str(stored.get("main") or "")
        if stored.get("sha256") == digest.hexdigest() and (stored_main == wanted or stored_main.endswith("/" + wanted)):
            terminal.say(f"{wheel.name} is stored already as bundle {stored['id']}")
            return stored
    fields = {"main": main} if main else {}
    return api.upload(f"{API}/bundles", fields, "file", wheel, _progress(terminal, wheel))


def _progress(terminal: Terminal, path: Path) -> Progress | None:
    line = terminal.bar()
    return display.ProgressBar(f"upload {path.name}", line) if line else None


def follow(api: Client, job_id: int, terminal: Terminal) -> dict:
    """Look at the job every POLL_S seconds, its state on a live line, until it has ended and its cluster is torn
    down (its last artifacts, the nodes' logs, are stored then, and its cost is final) or RELEASE_WAIT_S later."""
    line = terminal.status_line()
    job: dict = {"id": job_id}
    unreachable_since = ended_at = None
    try:
        while True:
            try:
                job = api.get(f"{API}/jobs/{job_id}")
                unreachable_since = None
            except ApiError as exc:
                if exc.status is not None and exc.status < 500:
                    raise
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > PATIENCE_S:
                    raise
                if line:
                    line.show(f"job {job_id}: {exc} (trying again)")
                time.sleep(POLL_S)
                continue
            if line:
                line.show(display.job_line(job))
            if job["state"] in display.ENDED:
                ended_at = ended_at or time.monotonic()
                cost = job.get("cost") or {}
                if not cost.get("launched_at") or cost.get("torn_down_at"):
                    return job
                if time.monotonic() - ended_at > RELEASE_WAIT_S:
                    return job
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        raise Failure(
            f"stopped following; job {job_id} goes on (`fc2 status {job_id} --follow`, `fc2 cancel {job_id}`)",
            EXIT_INTERRUPTED,
            {"job": job},
        ) from None
    finally:
        if line:
            line.close()


def _ended(job: dict, data: dict) -> Outcome:
    """A job's outcome as an exit code: 0 succeeded, 1 failed or cancelled, 3 not ended yet."""
    state = job["state"]
    if state == "succeeded":
        return Outcome(data, display.job_report(job))
    code = EXIT_ERROR if state in display.ENDED else EXIT_NOT_ENDED
    reason = f": {job['failure_reason']}" if job.get("failure_reason") else ""
    return Outcome(data, display.job_report(job), code, f"job {job['id']} {state}{reason}")


def cmd_status(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    api = client()
    job = follow(api, args.job, terminal) if args.follow else api.get(f"{API}/jobs/{args.job}")
    return _ended(job, {"job": job})


def cmd_jobs(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    page = client().get(f"{API}/jobs", state=args.state, provider=args.provider, page=args.page)
    jobs = page.get("results", [])
    text = display.jobs_table(jobs) if jobs else "no jobs"
    # Said once under the table, as `fc2 status` says it beside a job: the jobs listed wait on no worker.
    silent = {
        (job.get("worker") or {}).get("message")
        for job in jobs
        if (job.get("worker") or {}).get("taking_jobs") is False
    }
    text += "".join(f"\n{message}" for message in sorted(silent - {None, ""}))
    if page.get("next"):
        text += f"\n(more: --page {(args.page or 1) + 1})"
    return Outcome({"count": page.get("count"), "next": page.get("next"), "jobs": jobs}, text)


def cmd_logs(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    """The node's log from its start: every piece the platform has now, and with --follow every piece to come."""
    api = client()
    node, since, pieces = args.node, 0, []
    while True:
        page = api.get(f"{API}/jobs/{args.job}/logs", node=node, since=since)
        node, since, text = page.get("node") or node, page.get("offset", since), page.get("text") or ""
        if text:
            pieces.append(text)
            if not terminal.as_json:
                sys.stdout.write(text)
                sys.stdout.flush()
        if page.get("complete") or (not text and not args.follow):
            break
        if not text:
            time.sleep(POLL_S)
    data = {"job": args.job, "node": node, "nodes": page.get("nodes", []), "offset": since}
    return Outcome({**data, "complete": bool(page.get("complete")), "text": "".join(pieces)})


def cmd_cancel(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    job = client().post(f"{API}/jobs/{args.job}/cancel")
    return Outcome({"job": job}, display.job_line(job))


def cmd_download(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    """Every artifact the job kept, each under its own name where that is safe on this machine, else under a safe
    one (renamed); one that cannot be written (not kept, or no safe place for it) is skipped and the rest go on."""
    api = client()
    artifacts = api.get(f"{API}/jobs/{args.job}/artifacts").get("results", [])
    root = args.dir or Path(f"fc2-job-{args.job}")
    files, renamed, skipped = [], [], []
    # Every name is judged before the first byte is written: a job's files come from its (untrusted) training code.
    for place in placements(root, artifacts):
        name = str(place.artifact.get("name"))
        if place.path is None:
            skipped.append({"name": name, "why": place.why})
            continue
        try:
            make_folders(root, place.path.parent)
        except Failure as exc:
            skipped.append({"name": name, "why": str(exc)})
            continue
        line = terminal.bar()
        progress = display.ProgressBar(name, line) if line else None
        try:
            size = api.download(f"{API}/jobs/{args.job}/artifacts/{place.artifact['id']}", place.path, progress)
        except ApiError as exc:
            if exc.status != 404:  # (the platform or the connection: the next one would fail as well)
                raise
            skipped.append({"name": name, "why": exc.reason})
            continue
        finally:
            if line:
                line.close()
        files.append({"name": name, "path": str(place.path), "size_bytes": size})
        if place.why:
            renamed.append({"name": name, "path": str(place.path), "why": place.why})
    lines = [f"{f['path']}  ({display.size(f['size_bytes'])})" for f in files] or ["no artifacts downloaded"]
    lines += [f"renamed: {r['name']!r} -> {r['path']} ({r['why']})" for r in renamed]
    lines += [f"skipped: {s['name']!r} ({s['why']})" for s in skipped]
    data = {"dir": str(root), "files": files, "renamed": renamed, "skipped": skipped}
    if skipped:
        return Outcome(data, "\n".join(lines), EXIT_ERROR, f"{len(skipped)} of {len(artifacts)} artifacts skipped")
    return Outcome(data, "\n".join(lines) if artifacts else "no artifacts")


# What a file or folder name may not be or hold on the machines the client runs on (Windows the strictest): control
# characters, the characters Windows refuses, a device name whatever its extension; nor end in a dot or a space.
UNPORTABLE = re.compile(r'[\x00-\x1f\x7f<>:"|?*]')
RESERVED_NAMES = {"con", "prn", "aux", "nul", "conin$", "conout$"} | {
    f"{d}{i}" for d in ("com", "lpt") for i in range(10)
}
# Longest name written, in UTF-8 bytes: file systems take 255, and the download is first written as `.<name>.part`.
MAX_NAME_BYTES = 240


@dataclass
class Placement:
    artifact: dict  # as the platform lists it
    path: Path | None  # where it is written; None: skipped
    why: str = ""  # why it was renamed or skipped; empty for one written under its own name


def safe_parts(name: str) -> tuple[list[str], list[str]]:
    r"""The folders and file name artifact `name` is written under, each a name every OS takes, and what had to
    change to make them so (nothing, for a name that is fine as it is); a slash and a backslash both separate.

    >>> safe_parts("worker-0/model.keras"), safe_parts("./metrics.json")
    ((['worker-0', 'model.keras'], []), (['metrics.json'], []))
    >>> safe_parts("/etc/../passwd")
    (['etc', 'passwd'], ['absolute', "'..'"])
    >>> safe_parts("C:\\x\\CON.txt")
    (['C_', 'x', '_CON.txt'], ['absolute', 'characters no file name may hold', 'a reserved name'])
    >>> safe_parts("a\nb/end. ")
    (['a_b', 'end_'], ['characters no file name may hold', 'a dot or space at the end'])
    """
    changes: list[str] = []

    def changed(why: str) -> None:
        if why not in changes:
            changes.append(why)

    windows = PureWindowsPath(name)
    if windows.drive or windows.root or name.startswith("/"):
        changed("absolute")
    parts = []
    for part in re.split(r"[\\/]", name):
        if part in ("", "."):
            continue
        if part == "..":
            changed("'..'")
            continue
        safe = UNPORTABLE.sub("_", part)
        if safe != part:
            changed("characters no file name may hold")
        if safe.rstrip(". ") != safe:
            safe = safe.rstrip(". ") + "_"
            changed("a dot or space at the end")
        if safe.split(".")[0].rstrip(" ").casefold() in RESERVED_NAMES:
            safe = "_" + safe
            changed("a reserved name")
        if len(safe.encode()) > MAX_NAME_BYTES:
            safe = _shortened(safe)
            changed("too long")
        parts.append(safe)
    return parts, changes


def _shortened(name: str) -> str:
    """`name` within MAX_NAME_BYTES: itself, or shortened, its extension kept, and marked with a digest of the whole
    (two stay two)."""
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    suffix = PurePosixPath(name).suffix
    suffix = suffix if len(suffix.encode()) <= 16 else ""
    tail = f"-{hashlib.sha256(name.encode()).hexdigest()[:11]}{suffix}"
    stem = name[: len(name) - len(suffix)]
    while len(f"{stem}{tail}".encode()) > MAX_NAME_BYTES:
        stem = stem[:-1]
    return f"{stem}{tail}"


def placements(root: Path, artifacts: list[dict]) -> list[Placement]:
    """Where each artifact goes under `root`: its own name made safe (`safe_parts`), else — when that path meets
    another artifact's (a file where the other needs a folder, or the same name but for case), or something in
    `root` that is in the way (a symlink, a file where a folder goes, a folder where the file goes) — a name of its
    own in its own folder (a node's outputs stay in the node's), or at the top where that folder cannot be had, else
    nowhere (skipped); one not kept is skipped."""
    files: set[str] = set()  # what the artifacts placed so far take, case folded (macOS and Windows ignore case)
    folders: set[str] = set()
    placed = []
    for artifact in artifacts:
        if artifact.get("not_kept") or ("url" in artifact and artifact["url"] is None):
            placed.append(Placement(artifact, None, f"not kept: {artifact.get('not_kept') or 'it has no file'}"))
            continue
        parts, changes = safe_parts(str(artifact.get("name") or ""))
        why = f"renamed: {', '.join(changes)}" if changes else ""
        if not parts:
            parts, why = [f"artifact-{artifact['id']}"], "renamed: no name"
        if not _free(root, parts, files, folders):
            own = _shortened(f"artifact-{artifact['id']}-{parts[-1]}")
            found = next((p for p in ([*parts[:-1], own], [own]) if _free(root, p, files, folders)), None)
            if found is None:
                placed.append(Placement(artifact, None, f"no free place for it in {root}"))
                continue
            parts, why = found, "renamed: its path meets another artifact's or something in the way"
        files.add("/".join(parts).casefold())
        folders.update("/".join(parts[:i]).casefold() for i in range(1, len(parts)))
        placed.append(Placement(artifact, root.joinpath(*parts), why))
    return placed


def _free(root: Path, parts: list[str], files: set[str], folders: set[str]) -> bool:
    key = "/".join(parts).casefold()
    if key in files or key in folders or any("/".join(parts[:i]).casefold() in files for i in range(1, len(parts))):
        return False
    for i in range(1, len(parts)):
        folder = root.joinpath(*parts[:i])
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            return False
    target = root.joinpath(*parts)
    return not target.is_symlink() and not target.is_dir()


def make_folders(root: Path, folder: Path) -> None:
    """`folder` made under `root`, level by level; refused where a level is a symlink or leads outside `root`."""
    root.mkdir(parents=True, exist_ok=True)
    for level in reversed([folder, *folder.parents]):
        if level == root or root not in level.parents:
            continue
        if level.is_symlink():
            raise Failure(f"{level} is a symlink: not followed")
        level.mkdir(exist_ok=True)
    inside(root, folder)


def inside(root: Path, folder: Path) -> None:
    """Refuse `folder` unless it is `root` or under it once symlinks are followed."""
    real_root, real = os.path.realpath(root), os.path.realpath(folder)
    if os.path.commonpath([real_root, real]) != real_root:
        raise Failure(f"refusing to write into {folder}: it leads outside {root} (to {real})")


# --- output -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """The `fc2` command; ends quietly (EXIT_BROKEN_PIPE) when the reader of its output goes away, as `head -1`
    does after its line: no traceback, as with any command a shell pipes into `head`."""
    try:
        try:
            return _run(argv)
        finally:  # (argparse's --help and --version exit from within): now, not as the interpreter exits
            sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout (and stderr) once more as it exits, into the same closed pipe: /dev/null takes it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
        return EXIT_BROKEN_PIPE


def _run(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    terminal = Terminal(as_json="--json" in argv)
    try:
        args = build_parser().parse_args(argv)
        outcome = args.run(args, terminal)
    except UsageError as exc:
        if terminal.as_json:
            return _print_error(terminal, str(exc), EXIT_USAGE, {})
        sys.stderr.write(f"{exc.usage}{exc.prog}: error: {exc}\n")
        return EXIT_USAGE
    except ApiError as exc:
        return _print_error(terminal, str(exc), EXIT_ERROR, exc.as_dict())
    except Failure as exc:
        return _print_error(terminal, str(exc), exc.code, exc.data)
    except BrokenPipeError:
        raise  # our output's reader went away (main): not an error of the command's to report
    except (ConfigError, OSError) as exc:  # OSError: a local file (a wheel, a download's folder) that cannot be used
        return _print_error(terminal, str(exc), EXIT_ERROR, {})
    except KeyboardInterrupt:
        return _print_error(terminal, "interrupted", EXIT_INTERRUPTED, {})
    if terminal.as_json:
        body = {"ok": outcome.code == EXIT_OK, **({"error": outcome.error} if outcome.code else {}), **outcome.data}
        print(json.dumps(body))
    elif outcome.text:
        print(outcome.text)
    return outcome.code


def _print_error(terminal: Terminal, message: str, code: int, data: dict) -> int:
    if terminal.as_json:
        print(json.dumps({**data, "ok": False, "error": message}))
        return code
    print(f"fc2: error: {message}", file=sys.stderr)
    return code
