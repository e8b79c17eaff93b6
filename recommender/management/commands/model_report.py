"""`manage.py model_report --workload W`: leave-one-group-out calibration of the performance model on the workload's
own records — MAPE of epoch time and mean regret of the recommended worker count."""

from __future__ import annotations

import json

from recommender import perfmodel, service
from recommender.management.base import ContractCommand
from recommender.management.commands.recommend import CATALOG_HELP
from recommender.types import RecommendationError


class Command(ContractCommand):
    help = "Calibrate the performance model on a workload's records (leave one latency out by default)."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--workload", required=True, metavar="NAME", help="whose performance records to use")
        parser.add_argument("--catalog", default=service.DEFAULT_CATALOG, metavar="NAME", help=CATALOG_HELP)
        parser.add_argument(
            "--group-by",
            default="latency",
            choices=["latency", "workers", "batch_size"],
            help="which records are left out together in each fold (default: latency)",
        )
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args, **options):
        try:
            records = service.workload_records(options["workload"])
            if not records:
                raise RecommendationError(f"workload {options['workload']!r} has no performance records")
            report = perfmodel.calibration_report(
                records, service.catalog_specs(options["catalog"]), group_by=options["group_by"]
            )
        except RecommendationError as exc:
            self.fail(str(exc), options["json"])
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return

        def percent(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1%}"

        self.stdout.write(
            f"{options['workload']}: {report['full_model']['family']} model (cross-validated MAPE "
            f"{percent(report['full_model']['cv_mape'])}); leave-one-{options['group_by']}-out on {report['records']} "
            f"records: MAPE {percent(report['mape'])}, mean regret of the picked worker count "
            f"{percent(report['mean_regret'])} over {report['cells']} cells"
        )
