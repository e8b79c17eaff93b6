"""`manage.py submit_job`: submit a training job from the command line (DESIGN.md's contract)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser

import provisioner
from fc2.bundles import BundleError
from fc2.models import Framework, Job
from fc2.services import datasets, inline, jobs, pricing, search, submissions, workers
from fc2.templatetags.fc2_ui import estimate, usd
from recommender.management.base import ContractCommand
from recommender.types import ALGORITHMS

RELEASE_WAIT_S = 120  # how long --wait waits for an ended job's teardown
EXPLORE_OPTIONS = ("preset", "alpha", "beta", "search_budget", "search_minutes")  # --algorithm explore's


def dollars(text: str) -> Decimal:
    """An amount of dollars as given on the command line ("12.50"); the job service says whether it is a budget."""
    try:
        amount = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not an amount of dollars: {text!r}") from None
    if not amount.is_finite():
        raise argparse.ArgumentTypeError(f"not an amount of dollars: {text!r}")
    return amount


def add_framework_arguments(parser: CommandParser, strategies: str) -> None:
    """--framework and --strategy, as every command that submits jobs takes them (the job service resolves and
    judges them: fc2.services.requests.framework_strategy, jobs.check_framework); `strategies` says what each is."""
    parser.add_argument(
        "--framework",
        choices=Framework.values,
        default="",
        help="what the code trains with (default: what the wheel requires, its Requires-Dist; else tensorflow)",
    )
    parser.add_argument(
        "--strategy",
        choices=Job.Strategy.values,
        default="",
        help=f"{strategies} (default: the framework's, ps for TensorFlow, ddp for PyTorch)",
    )


class Command(ContractCommand):
    help = "Submit a training job: a wheel bundle, a dataset and a cluster; optionally run it here and wait."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bundle", required=True, metavar="PATH", help="path of the wheel")
        parser.add_argument(
            "--main",
            default="main.py",
            metavar="SCRIPT",
            help="the main script: a file name found anywhere in the wheel, or its full path (default: main.py)",
        )
        parser.add_argument(
            "--param", action="append", default=[], metavar="K=V", help="a parameter for the script (repeatable)"
        )
        parser.add_argument(
            "--dataset",
            required=True,
            metavar="NAME|URL",
            help="a built-in (digits, mnist, cifar10), one of your datasets by name, or an http(s) URL",
        )
        parser.add_argument("--workload", default="", metavar="NAME", help=jobs.WORKLOAD_NAME_HELP)
        parser.add_argument(
            "--provider",
            default="local",
            choices=sorted(provisioner.PROVIDERS),
            help="where the cluster runs (default: local, processes on this machine)",
        )
        parser.add_argument(
            "--algorithm",
            default="manual",
            choices=("manual", *ALGORITHMS),
            help="manual: the cluster you give; any other: the recommender chooses it, --workers being the limit "
            "(default: manual)",
        )
        parser.add_argument(
            "--workers", type=int, default=2, metavar="N", help="workers (with --algorithm: at most) (default: 2)"
        )
        add_framework_arguments(
            parser,
            "TensorFlow's: ps, 1 parameter server + a chief + N workers; mirrored, N workers with All-Reduce; auto, "
            "left open for --algorithm model (or explore) to choose from the workload's records of each. PyTorch's: "
            "ddp, N workers with DistributedDataParallel.",
        )
        parser.add_argument("--ps-type", default="", metavar="TYPE", help="instance type of the parameter server")
        parser.add_argument("--worker-type", default="", metavar="TYPE", help="instance type of the workers")
        parser.add_argument(
            "--latency-ms",
            type=float,
            default=0.0,
            metavar="L",
            help="lab: delay every packet between two nodes by L ms (a round trip takes 2L) (default: 0)",
        )
        parser.add_argument(
            "--region",
            default="",
            metavar="R",
            help="aws: the region the cluster is made in (default: FC2_AWS_REGION, the catalogue's region)",
        )
        parser.add_argument(
            "--budget",
            type=dollars,
            metavar="C",
            help="with --algorithm: the budget C in $/h, which then sets the worker count (instead of --workers)",
        )
        parser.add_argument(
            "--total-budget",
            type=dollars,
            metavar="DOLLARS",
            help="a budget for the whole job, in $ at the catalogue's prices: refused if the cluster's projected total "
            "cost exceeds it, stopped and torn down before its cost would",
        )
        parser.add_argument(
            "--budget-total", type=dollars, metavar="DOLLARS", help="deprecated: the old name of --total-budget"
        )
        explore = parser.add_argument_group("--algorithm explore: what the best cluster is, and its search's budget")
        explore.add_argument(
            "--preset",
            choices=sorted(search.PRESETS),
            help="what best means: fastest (α 1, β 0), cheapest (α 0, β 1) or balanced (α 0.5, β 0.5, the default)",
        )
        explore.add_argument("--alpha", type=float, metavar="A", help="the weight of time (instead of --preset)")
        explore.add_argument("--beta", type=float, metavar="B", help="the weight of cost (instead of --preset)")
        explore.add_argument(
            "--search-budget",
            type=dollars,
            metavar="USD",
            help="the most its trial runs may cost together, in $ at the catalogue's prices (default: FC2_EXPLORE_USD)",
        )
        explore.add_argument(
            "--search-minutes",
            type=int,
            metavar="M",
            help="the most minutes its trial runs may take together (default: FC2_EXPLORE_MINUTES)",
        )
        managed = parser.add_argument_group("managed jobs: resume after a lost node, spot instances (aws)")
        managed.add_argument(
            "--max-restarts",
            type=int,
            default=0,
            metavar="N",
            help="replace a lost node and resume from the latest checkpoint up to N times (default: 0, the job fails)",
        )
        managed.add_argument("--spot", action="store_true", help="aws: spot instances rather than on-demand")
        managed.add_argument(
            "--spot-max-price", type=dollars, metavar="USD", help="the most $/h a spot instance may cost"
        )
        managed.add_argument(
            "--spot-fallback",
            choices=Job.SpotFallback.values,
            default=Job.SpotFallback.ON_DEMAND,
            help="without spot capacity: on-demand instances, or wait for spot (default: on-demand)",
        )
        parser.add_argument("--user", default="researcher", help="username the job belongs to (default: researcher)")
        parser.add_argument("--inline", action="store_true", help="run the pipeline in this process (no worker)")
        parser.add_argument("--wait", action="store_true", help="wait for the job to end; exit 1 unless succeeded")
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["json"]
        if options["budget_total"] is not None:
            if options["total_budget"] is not None:
                self.fail("--budget-total is the deprecated name of --total-budget: give one of them", as_json)
            self.stderr.write("warning: --budget-total is deprecated: use --total-budget")
            options["total_budget"] = options["budget_total"]
        explore = {name: options[name] for name in EXPLORE_OPTIONS if options[name] is not None}
        if options["algorithm"] == "explore":
            try:  # (whether they can be used is the submission's to say: jobs.check_search)
                explore["alpha"], explore["beta"] = search.weights(
                    explore.pop("preset", None), explore.get("alpha"), explore.get("beta")
                )
            except jobs.SubmitError as exc:
                self.fail(f"--preset or --alpha and --beta: {exc}", as_json)
        elif explore:
            name = next(iter(explore)).replace("_", "-")
            self.fail(f"--{name} is explore's: give it with --algorithm explore", as_json)
        owner = get_user_model().objects.filter(username=options["user"]).first()
        if owner is None:
            self.fail(f"no user {options['user']!r} (run `make run` once, or pass --user)", as_json)
        path = Path(options["bundle"])
        if not path.is_file():
            self.fail(f"bundle {path} does not exist", as_json)
        try:
            # Built-ins are materialised (maybe downloaded) here, before any transaction holds the database.
            dataset = datasets.ready(datasets.resolve(owner, options["dataset"]))
            parameters = jobs.parse_parameters(options["param"])
            with path.open("rb") as wheel:
                job, _ = submissions.submit_once(
                    owner,
                    lambda: jobs.submit_upload(
                        owner,
                        wheel,
                        path.name,
                        options["main"],
                        dataset=dataset,
                        driver=Job.Driver.INLINE if options["inline"] else Job.Driver.CELERY,
                        parameters=parameters,
                        provider=options["provider"],
                        framework=options["framework"],
                        strategy=options["strategy"],
                        workers=options["workers"],
                        algorithm=options["algorithm"],
                        ps_type=options["ps_type"],
                        worker_type=options["worker_type"],
                        latency_ms=options["latency_ms"],
                        region=options["region"],
                        budget=options["budget"],
                        total_budget=options["total_budget"],
                        workload_name=options["workload"],
                        max_restarts=options["max_restarts"],
                        spot=options["spot"],
                        spot_max_price=options["spot_max_price"],
                        spot_fallback=options["spot_fallback"],
                        plan_first=True,
                        **explore,
                    ),
                )
        except (BundleError, datasets.DatasetError, jobs.SubmitError) as exc:
            self.fail(str(exc), as_json)
        except submissions.TooManySubmissions as exc:  # the user's limit, as in the wizard and the API
            self.fail(f"{exc} (try again in {exc.wait} s)", as_json)

        if not as_json:
            budget = f", budget {usd(job.total_budget)} for the whole job" if job.total_budget is not None else ""
            self.stderr.write(f"job {job.pk} submitted ({job.get_absolute_url()}){budget}")
        if options["inline"]:
            job = inline.run_inline(job.pk)
        elif options["wait"]:
            # Until the job has ended and its cluster is gone (its last artifacts — logs, a late worker's outputs —
            # are stored on the way): a teardown that keeps failing is the sweep's to retry, not a reason to hang.
            released_by, said = None, ""
            while True:
                job.refresh_from_db()
                said = self._say_workers(job, said)
                if job.is_terminal:
                    released_by = released_by or time.monotonic() + RELEASE_WAIT_S
                    if job.cluster is None or time.monotonic() > released_by:
                        break
                time.sleep(0.5)
        self._print(job, as_json)
        if (options["wait"] or options["inline"]) and job.state != Job.State.SUCCEEDED:
            sys.exit(1)

    def _say_workers(self, job: Job, said: str) -> str:
        """On stderr, when no worker is taking jobs while the job waits on one (and again each time that changes):
        rather than a wait that says nothing. Returns the message now ("" while a worker takes jobs)."""
        found = workers.for_job(job)
        message = found.message if found is not None else ""
        if message and message != said:
            self.stderr.write(f"job {job.pk} {job.state}: {message}; it waits until a worker is started")
        return message

    def _print(self, job: Job, as_json: bool) -> None:
        result = {
            "id": job.pk,
            "status": job.state,
            "workers": job.workers,
            "duration_s": round(job.duration_s, 3) if job.duration_s is not None else None,
            "artifacts": [
                {
                    "name": a.name,
                    "size_bytes": a.size_bytes,
                    "path": a.file.path if a.file else None,
                    "original_name": a.original_name,
                    "not_kept": a.not_kept,
                }
                for a in job.artifacts.all()
            ],  # fmt: skip
            "metrics": job.metrics,
            "cost": pricing.cost_summary(job),
            "search": job.search,  # explore's search, once made (docs/API.md's job "search")
        }
        if job.failure_reason:
            result["error"] = job.failure_reason
        if as_json:
            self.stdout.write(json.dumps(result))
        else:
            summary = f" — {job.failure_summary}" if job.failure_reason else ""
            self.stdout.write(f"job {job.pk}: {job.state}{summary}")
            if job.cost_so_far is not None:
                budget = f" of a {usd(job.total_budget)} budget" if job.total_budget is not None else ""
                self.stdout.write(f"  {job.cost_label.lower()} {estimate(job.cost_so_far)}{budget} (catalogue prices)")
            if (found := search.of_job(job)) is not None and (found.trials or found.outcome):
                self.stdout.write(f"  search: {search.said(found)}")
            for artifact in result["artifacts"]:
                self.stdout.write(f"  {artifact['name']} ({artifact['size_bytes']} bytes): {artifact['path']}")
