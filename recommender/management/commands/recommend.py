"""`manage.py recommend`: a cluster recommendation on the command line (DESIGN.md's contract)."""

from __future__ import annotations

import json

from fc2.management.base import ContractCommand
from recommender import service
from recommender.types import ALGORITHMS, MissingProfilesError, RecommendationError, RecommendRequest


def _types(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


class Command(ContractCommand):
    help = "Recommend a cluster: PS type, worker type and count, $/h, predicted epoch time, and why."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--algorithm", required=True, choices=ALGORITHMS)
        parser.add_argument("--catalog", default=service.DEFAULT_CATALOG)
        parser.add_argument("--workload", default="")
        limit = parser.add_mutually_exclusive_group()
        limit.add_argument("--budget", type=float, help="indicative budget C in $/h")
        limit.add_argument("--max-workers", type=int)
        parser.add_argument("--ps-type")
        parser.add_argument("--ps-types", type=_types, default=(), help="L^p, comma-separated")
        parser.add_argument("--worker-types", type=_types, default=(), help="L^w, comma-separated")
        parser.add_argument("--worker-type", help="Scala-Opt-M: the worker type")
        parser.add_argument("--batch-size", type=int)
        parser.add_argument("--latency-ms", type=float)
        parser.add_argument("--saturation", type=float, default=0.95, help="p, the PS saturation margin")
        parser.add_argument(
            "--strategy", choices=["ps", "mirrored"], default="ps", help="mirrored: All-Reduce, no parameter server"
        )
        parser.add_argument("--alpha", type=float, default=1.0)
        parser.add_argument("--beta", type=float, default=0.0)
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object")

    def handle(self, *args, **options):
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
            parameter_server=options["strategy"] == "ps",
            alpha=options["alpha"],
            beta=options["beta"],
        )
        try:
            answer = service.as_dict(service.recommend(request, options["catalog"]))
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
