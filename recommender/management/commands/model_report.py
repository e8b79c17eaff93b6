"""`manage.py model_report --workload W [--strategy ps|mirrored]`: what the recommender's model is worth for a workload
and strategy — the predictor's cross-validated error and interval coverage (the very figures the Records page, the
wizard, the API and `fc2 recommend` quote) — and the leave-one-group-out calibration of its mean, the fitted model
alone: MAPE of epoch time and mean regret of the recommended worker count."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from recommender import algorithms, perfmodel, service
from recommender.management.base import ContractCommand, user_named
from recommender.management.commands.recommend import CATALOG_HELP
from recommender.types import RecommendationError, key_conflict


class Command(ContractCommand):
    help = "Calibrate the performance model on a workload's records (leave one latency out by default)."
    requires_system_checks = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workload", required=True, metavar="NAME", help="whose performance records to use")
        parser.add_argument(
            "--catalog", default="", metavar="NAME", help=CATALOG_HELP + " (default: the one of the records' types)"
        )
        parser.add_argument(
            "--strategy",
            choices=["ps", "mirrored", "ddp"],
            help="whose runs: through a parameter server, or all-reduce (default: the one with more records)",
        )
        parser.add_argument(
            "--group-by",
            default="latency",
            choices=["latency", "workers", "batch_size"],
            help="which records are left out together in each fold (default: latency)",
        )
        parser.add_argument(
            "--user",
            metavar="USERNAME",
            help="the model this user's answers use: from the platform's records and theirs (default: the "
            "platform's alone)",
        )
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            read = service.records_of(options["workload"], user_named(options["user"]))
            records = read.records
            if not records:
                raise RecommendationError(
                    f"workload {options['workload']!r} has no performance records to read ({read.counts()['text']})"
                )
            counts = service.strategy_counts(records)
            strategy = options["strategy"] or max(counts, key=lambda strategy: counts[strategy])
            if reason := key_conflict(options["workload"], strategy):
                raise RecommendationError(reason)
            if strategy not in counts:
                raise RecommendationError(f"workload {options['workload']!r} has no records of the {strategy} strategy")
            catalog = options["catalog"] or service.records_catalog(records)
            own = algorithms.of_strategy(records, strategy == "ps")
            predictor = service.model_figures(records, strategy, catalog)
            report = perfmodel.calibration_report(own, service.catalog_specs(catalog), group_by=options["group_by"])
            report |= {"strategy": strategy, "catalog": catalog, "predictor": predictor, "records_read": read.counts()}
            if where := service.non_finite(report):
                raise RecommendationError(f"the workload's records give no finite calibration ({where})")
        except service.NUMERIC_FAILURES as exc:  # RecommendationError (a ValueError), and numpy's complaints
            reason = str(exc) if isinstance(exc, RecommendationError) else f"{type(exc).__name__}: {exc}"
            self.fail(reason, options["json"])
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return

        def percent(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1%}"

        self.stdout.write(
            f"{options['workload']} ({service.STRATEGY_LABELS[strategy]}, {catalog} catalogue): the recommender's "
            f"predictor errs by {predictor['cv_mape'] or 'n/a'} cross-validated, its 80 % intervals holding "
            f"{predictor['cv_coverage'] or 'n/a'} of the held-out runs ({predictor['cv'] or 'not cross-validated'})"
        )
        self.stdout.write(f"how it chooses among configurations: {predictor['choice']}")
        self.stdout.write(f"from {read.counts()['text']}")
        self.stdout.write(
            f"its mean alone: {report['full_model']['family']} model (cross-validated MAPE "
            f"{percent(report['full_model']['cv_mape'])}); leave-one-{options['group_by']}-out on {report['records']} "
            f"records: MAPE {percent(report['mape'])}, mean regret of the picked worker count "
            f"{percent(report['mean_regret'])} over {report['cells']} cells"
        )
