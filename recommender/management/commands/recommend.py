"""`manage.py recommend`: a cluster recommendation on the command line (DESIGN.md's contract)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError, CommandParser

from recommender import service
from recommender.catalog import bundled_catalogs
from recommender.explore import DEFAULT_WEIGHTS, PRESETS, weights
from recommender.management.base import ContractCommand, user_named
from recommender.types import (
    ALGORITHMS,
    STRATEGIES,
    MissingProfilesError,
    RecommendationError,
    RecommendRequest,
    TrialsNeeded,
    strategy_request,
)

CATALOG_HELP = (
    f"instance catalogue (default: {service.DEFAULT_CATALOG}; bundled: {', '.join(bundled_catalogs())}; "
    "refresh_catalog adds more)"
)


def _types(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


class Command(ContractCommand):
    help = "Recommend a cluster: PS type, worker type and count, $/h, predicted epoch time, and why."
    requires_system_checks = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--algorithm",
            required=True,
            choices=ALGORITHMS,
            help="cost-opt, time-opt, scala-opt, scala-opt-m (FC² §5); lookup (Anwar: fastest measured worker count); "
            "model (a performance model fitted to the workload's records); explore (the best measured cluster once "
            "the workload's records are enough, else the trial runs its search needs first: exit 1)",
        )
        parser.add_argument("--catalog", default=service.DEFAULT_CATALOG, metavar="NAME", help=CATALOG_HELP)
        parser.add_argument(
            "--workload",
            default="",
            metavar="NAME",
            help="whose performance records to use (scala-opt, lookup, model); a job's is <distribution>:<dataset>",
        )
        limit = parser.add_mutually_exclusive_group()
        limit.add_argument("--budget", type=float, metavar="C", help="indicative budget C in $/h")
        limit.add_argument("--max-workers", type=int, metavar="N", help="at most N workers (instead of a budget)")
        parser.add_argument("--ps-type", metavar="TYPE", help="the parameter server's type (default: chosen)")
        parser.add_argument("--ps-types", type=_types, default=(), metavar="T1,T2", help="L^p, comma-separated")
        parser.add_argument("--worker-types", type=_types, default=(), metavar="T1,T2", help="L^w, comma-separated")
        parser.add_argument("--worker-type", metavar="TYPE", help="scala-opt-m: the worker type")
        parser.add_argument("--batch-size", type=int, metavar="B", help="lookup, model: the batch size")
        parser.add_argument("--latency-ms", type=float, metavar="L", help="lookup, model: the network latency in ms")
        parser.add_argument(
            "--saturation", type=float, default=0.95, metavar="P", help="p, the PS saturation margin (default: 0.95)"
        )
        parser.add_argument(
            "--strategy",
            choices=STRATEGIES,
            default="",
            help="ps: with a parameter server; mirrored: All-Reduce, no parameter server; auto: the model compares "
            "both from the workload's records of each and chooses (--algorithm model only); ddp: PyTorch's "
            "All-Reduce, the one strategy of a PyTorch workload (its key ends in @pytorch: NAME@pytorch), which "
            "refuses the others (default: ps; ddp for a PyTorch workload)",
        )
        parser.add_argument(
            "--alpha", type=float, metavar="A", help="model, explore: weight of time (default: 1; explore: 0.5)"
        )
        parser.add_argument(
            "--beta", type=float, metavar="B", help="model, explore: weight of cost (default: 0; explore: 0.5)"
        )
        parser.add_argument(
            "--preset", choices=tuple(PRESETS), help="explore: what best means, instead of --alpha and --beta"
        )
        parser.add_argument(
            "--search-budget", type=float, metavar="USD", help="explore: $ its trial runs may cost (default: "
            "FC2_EXPLORE_USD)"
        )  # fmt: skip
        parser.add_argument(
            "--search-minutes", type=float, metavar="M", help="explore: minutes its trial runs may take (default: "
            "FC2_EXPLORE_MINUTES)"
        )  # fmt: skip
        parser.add_argument(
            "--epochs", type=int, metavar="N", help="explore: the job's epochs (what a better cluster saves a share of)"
        )
        parser.add_argument(
            "--provider",
            metavar="NAME",
            help="explore: where its trials would run (lab, aws): a trial counts that provider's start-up and "
            "teardown as this installation measured them (default: its training window alone)",
        )
        parser.add_argument(
            "--user",
            metavar="USERNAME",
            help="answer as this user: from the platform's records and theirs (default: the platform's alone)",
        )
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        user = user_named(options["user"])
        alpha, beta = _weights(options)
        trial_minutes = None
        if (provider := options["provider"]) is not None and (trial_minutes := service.trial_minutes(provider)) is None:
            self.fail(f"unknown provider {provider!r}", options["json"])
        request = RecommendRequest(
            algorithm=options["algorithm"],
            workload=options["workload"],
            budget=options["budget"],
            max_workers=options["max_workers"],
            ps_type=options["ps_type"],
            ps_types=options["ps_types"],
            worker_types=options["worker_types"],
            worker_type=options["worker_type"],
            batch_size=options["batch_size"],
            latency_ms=options["latency_ms"],
            saturation=options["saturation"],
            **strategy_request(options["strategy"], options["workload"]),
            alpha=alpha,
            beta=beta,
            search_dollars=options["search_budget"],
            search_minutes=options["search_minutes"],
            epochs=options["epochs"],
            trial_minutes=trial_minutes,
        )
        try:
            answer = service.as_dict(service.recommend(request, options["catalog"], owner=user))
        except TrialsNeeded as needed:  # (its sentence names the trial to run now and what the search may cost)
            self.fail(str(needed), options["json"], search=asdict(needed.search))
        except MissingProfilesError as exc:
            self.fail(
                str(exc),
                options["json"],
                details=tuple(f"missing profile: {p}" for p in exc.missing),
                missing_profiles=[vars(p) for p in exc.missing],
            )
        except RecommendationError as exc:
            self.fail(str(exc), options["json"])
        if options["json"]:
            self.stdout.write(json.dumps(answer))
            return
        time = answer["predicted_epoch_time_s"]
        self.stdout.write(
            f"{answer['workers']} × {answer['worker_type']}"
            + (f" with PS {answer['ps_type']}" if answer["ps_type"] else "")
            + f" at ${answer['hourly_cost']}/h"
            + (f", ~{time:.1f} s per epoch ({answer['source']})" if time is not None else "")
        )
        self.stdout.write(answer["explanation"])
        if "records" in answer:
            self.stdout.write(f"from {answer['records']['text']}")


def _weights(options: dict[str, Any]) -> tuple[float, float]:
    """(α, β): a preset's, or the ones given; the defaults are the model's (time alone) and explore's (balanced)."""
    default = DEFAULT_WEIGHTS.get(options["algorithm"], DEFAULT_WEIGHTS["model"])
    try:
        return weights(options["preset"], options["alpha"], options["beta"], default)
    except ValueError as refused:
        raise CommandError(f"{refused} (--preset, --alpha, --beta)") from refused
