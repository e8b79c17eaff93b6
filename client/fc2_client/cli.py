"""`fc2`: the platform's jobs API from a researcher's shell — log in, get a recommendation, submit a wheel and follow
its job, read its logs, cancel it, download its results.

Every command takes `--json` and then prints exactly one JSON object on stdout, an error too (`{"ok": false,
"error": …}`); without it, results go to stdout and progress (an upload's bar, a followed job's live line) to stderr,
on a terminal only. Exit codes: 0 success (for `submit --follow` and `status`: the job succeeded), 1 an error or a
job that failed or was cancelled, 2 a usage error, 3 `status` of a job that has not ended, 130 interrupted.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import urlsplit

from fc2_client import __version__, config, display
from fc2_client.api import ApiError, Client, Progress
from fc2_client.config import ConfigError, Login

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_ENDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
POLL_S = 2.0  # between two looks at a followed job or log
PATIENCE_S = 120.0  # how long following rides out an unreachable platform (a restart) before giving up
RELEASE_WAIT_S = 120.0  # how long following waits, once a job has ended, for its cluster to be torn down
ALGORITHMS = ("cost-opt", "time-opt", "scala-opt", "scala-opt-m", "lookup", "model")  # the platform says which it has


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
        "cancelled, 2 usage error, 3 status: the job has not ended, 130 interrupted.",
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

    recommend = command("recommend", cmd_recommend, "Ask the recommender for a cluster (POST /api/recommend).")
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
        choices=("ps", "mirrored", "auto"),
        help="mirrored: All-Reduce, no PS; auto: --algorithm model compares both (default: ps)",
    )
    recommend.add_argument("--catalog", metavar="NAME", help="the instance catalogue (default: the platform's)")

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
        "--strategy",
        choices=("ps", "mirrored", "auto"),
        help="ps (default), mirrored (All-Reduce) or auto (left open: --algorithm model chooses)",
    )
    submit.add_argument("--worker-type", metavar="TYPE", help="the workers' instance type")
    submit.add_argument("--worker-types", type=type_list, metavar="T1,T2", help="with --algorithm: types to consider")
    submit.add_argument("--ps-type", metavar="TYPE", help="the parameter server's instance type")
    submit.add_argument("--workload", metavar="NAME", help="the performance records' name for this code and data")
    submit.add_argument("--latency-ms", type=number, metavar="L", help="lab: delay between the nodes, ms one way")
    submit.add_argument("--region", metavar="R", help="aws: the region")
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


def recommend_payload(args: argparse.Namespace) -> dict:
    """POST /api/recommend's body: what was given, the platform's defaults for the rest."""
    names = ("algorithm", "workload", "budget", "max_workers", "batch_size", "latency_ms", "worker_types", "ps_types")
    names += ("ps_type", "worker_type", "strategy", "catalog")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


# The job's fields in POST /api/jobs (docs/API.md), by the option that gives each.
JOB_FIELDS = {
    "provider": "provider",
    "algorithm": "algorithm",
    "workers": "workers",
    "budget": "hourly_budget",
    "total_budget": "budget",
    "strategy": "strategy",
    "worker_type": "worker_type",
    "worker_types": "worker_types",
    "ps_type": "ps_type",
    "workload": "workload_name",
    "latency_ms": "latency_ms",
    "region": "region",
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
        me = Client(url, token).get("/api/me")
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
    answer = client().post("/api/recommend", recommend_payload(args))
    return Outcome({"recommendation": answer}, display.recommendation(answer))


def cmd_submit(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    if not args.wheel.is_file():
        raise Failure(f"{args.wheel} is not a file")
    api = client()
    dataset = _dataset(api, args.dataset, terminal)
    bundle = _bundle(api, args.wheel, args.main, terminal)
    job = api.post("/api/jobs", job_payload(args, bundle["id"], dataset))
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
    dataset = api.upload("/api/datasets", {"name": path.stem}, "file", path, _progress(terminal, path))
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
    for stored in api.get("/api/bundles").get("results", []):
        stored_main = str(stored.get("main") or "")
        if stored.get("sha256") == digest.hexdigest() and (stored_main == wanted or stored_main.endswith("/" + wanted)):
            terminal.say(f"{wheel.name} is stored already as bundle {stored['id']}")
            return stored
    fields = {"main": main} if main else {}
    return api.upload("/api/bundles", fields, "file", wheel, _progress(terminal, wheel))


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
                job = api.get(f"/api/jobs/{job_id}")
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
    job = follow(api, args.job, terminal) if args.follow else api.get(f"/api/jobs/{args.job}")
    return _ended(job, {"job": job})


def cmd_jobs(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    page = client().get("/api/jobs", state=args.state, provider=args.provider, page=args.page)
    jobs = page.get("results", [])
    text = display.jobs_table(jobs) if jobs else "no jobs"
    if page.get("next"):
        text += f"\n(more: --page {(args.page or 1) + 1})"
    return Outcome({"count": page.get("count"), "next": page.get("next"), "jobs": jobs}, text)


def cmd_logs(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    """The node's log from its start: every piece the platform has now, and with --follow every piece to come."""
    api = client()
    node, since, pieces = args.node, 0, []
    while True:
        page = api.get(f"/api/jobs/{args.job}/logs", node=node, since=since)
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
    job = client().post(f"/api/jobs/{args.job}/cancel")
    return Outcome({"job": job}, display.job_line(job))


def cmd_download(args: argparse.Namespace, terminal: Terminal) -> Outcome:
    api = client()
    artifacts = api.get(f"/api/jobs/{args.job}/artifacts").get("results", [])
    root = args.dir or Path(f"fc2-job-{args.job}")
    # Every name is judged before the first byte is written: a job's files come from its (untrusted) training code.
    targets = [(artifact, destination(root, artifact["name"])) for artifact in artifacts]
    files = []
    for artifact, target in targets:
        inside(root, target.parent)  # a folder in D that is a symlink cannot carry the file (or a folder) elsewhere
        target.parent.mkdir(parents=True, exist_ok=True)
        line = terminal.bar()
        progress = display.ProgressBar(artifact["name"], line) if line else None
        size = api.download(f"/api/jobs/{args.job}/artifacts/{artifact['id']}", target, progress)
        if line:
            line.close()
        files.append({"name": artifact["name"], "path": str(target), "size_bytes": size})
    text = "\n".join(f"{f['path']}  ({display.size(f['size_bytes'])})" for f in files) or "no artifacts"
    return Outcome({"dir": str(root), "files": files}, text)


def destination(root: Path, name: str) -> Path:
    """Where artifact `name` goes under `root`, keeping its folders (worker-0/…); a name that could land anywhere
    else — absolute, with a drive, with `..`, empty — is refused, whatever the OS (so `\\` separates too).

    >>> destination(Path("out"), "worker-0/model.keras").as_posix()
    'out/worker-0/model.keras'
    >>> destination(Path("out"), "../x")
    Traceback (most recent call last):
    ...
    fc2_client.cli.Failure: refusing artifact name '../x': it would be written outside out
    """
    windows = PureWindowsPath(name)  # splits at both / and \
    parts = [part for part in windows.parts if part not in ("", ".")]
    if not parts or "\0" in name or windows.drive or windows.root or PurePosixPath(name).is_absolute() or ".." in parts:
        raise Failure(f"refusing artifact name {name!r}: it would be written outside {root}")
    return root.joinpath(*parts)


def inside(root: Path, folder: Path) -> None:
    """Refuse `folder` unless it is `root` or under it once symlinks are followed."""
    real_root, real = os.path.realpath(root), os.path.realpath(folder)
    if os.path.commonpath([real_root, real]) != real_root:
        raise Failure(f"refusing to write into {folder}: it leads outside {root} (to {real})")


# --- output -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
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
