"""explore's search as people give it and see it: what "best" means (a preset or α and β, the same rule at every door:
the wizard, the jobs API, `submit_job`), and a job's trial runs and search read back for its page, the jobs API and the
`fc2` client. Read only: the trial runner (fc2/services/trials.py) writes `Job.profiling_runs` and `Job.search`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from common.numbers import usd
from fc2.models import Job, epochs_parameter
from fc2.services import pricing
from fc2.services.requests import SubmitError, search_limits
from fc2.services.trials import entries as made
from recommender import explore
from recommender.explore import PRESETS

PRESET_LABELS = {
    "fastest": "Fastest: time counts, not cost",
    "cheapest": "Cheapest: cost counts, not time",
    "balanced": "Balanced: time and cost alike",
}
# What the wizard offers: a preset, or weights of the user's own.
PRESET_CHOICES = {**PRESET_LABELS, "custom": "My own weights"}
DEFAULT_PRESET = "balanced"  # the JobRequest's own α and β


def weights(preset: str | None, alpha: float | None, beta: float | None) -> tuple[float, float]:
    """α (time) and β (cost) from a preset, or as given (a weight not given: the balanced preset's), by
    `recommender.explore.weights`; its refusal a SubmitError (an unknown preset names `alpha`, a preset with numbers
    too names `preset`). Whether the numbers can be used is `jobs.check_search`'s to say, at submission."""
    try:
        return explore.weights(preset or None, alpha, beta, PRESETS[DEFAULT_PRESET])
    except ValueError as refused:
        raise SubmitError(str(refused), "preset" if preset in PRESETS else "alpha") from refused


def preset_of(alpha: float, beta: float) -> str:
    """The preset whose weights these are, else "custom" (a re-run's wizard shows what was asked)."""
    return next((name for name, pair in PRESETS.items() if pair == (alpha, beta)), "custom")


TRIAL_STATES = ("under way", "measured", "failed")  # what becomes of a trial run, as pages say it


@dataclass(frozen=True)
class TrialRow:
    """One trial run of a job, as its page, the API and the CLI show it."""

    number: int
    worker_type: str
    ps_type: str
    workers: int
    strategy: str
    hourly_cost: float
    started_at: datetime | None
    ended_at: datetime | None
    epoch_time_s: float | None
    state: str  # one of TRIAL_STATES
    error: str  # why it failed; "" otherwise
    cost: float  # its $/h over its span: from its start to its end (to the job's teardown, or now, while open)
    record: int | None  # the PerformanceRecord it made


def trials(job: Job, now: datetime | None = None) -> list[TrialRow]:
    """The job's trial runs (`"kind": "trial"` entries of `Job.profiling_runs`), in their order."""
    now = now or timezone.now()
    rows = []
    for index, entry in enumerate(made(job)):
        started, ended = _moment(entry.get("started_at")), _moment(entry.get("ended_at"))
        epoch = entry.get("epoch_time_s")
        error = str(entry.get("error") or "")
        if ended is None and not job.is_terminal:
            state = "under way"
        elif ended is None:
            state, error = "failed", error or f"cut off when the job was {job.state}"
        elif error or epoch is None:
            state, error = "failed", error or "it measured no epoch time"
        else:
            state = "measured"
        hourly = float(entry.get("hourly_cost") or 0.0)
        # As the job's cost counts it (Job.run_span): a run cut off ended with its cluster's teardown.
        up_from, up_to, _ = job.run_span(entry, now) if started else (now, now, 0.0)
        rows.append(
            TrialRow(
                number=int(entry.get("number") or index + 1),
                worker_type=str(entry.get("worker_type") or ""),
                ps_type=str(entry.get("ps_type") or ""),
                workers=int(entry.get("workers") or 0),
                strategy=str(entry.get("strategy") or ""),
                hourly_cost=hourly,
                started_at=started,
                ended_at=ended,
                epoch_time_s=float(epoch) if isinstance(epoch, int | float) else None,
                state=state,
                error=error if state == "failed" else "",
                cost=hourly * max(0.0, (up_to - up_from).total_seconds()) / 3600,
                record=entry.get("record") if isinstance(entry.get("record"), int) else None,
            )
        )
    return rows


def _moment(text: object) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) and text else None


@dataclass(frozen=True)
class Prediction:
    """The cluster the search believed best (before its trials) or chose (after), with its predicted epoch time, its
    80 % interval and what that costs: an epoch, and the whole job where its epochs are known."""

    cluster: dict  # Job.search's CFG: worker_type, ps_type, workers, strategy, hourly_cost, epoch_time_s, low_s, high_s
    epoch_cost: float | None  # $ of one epoch at its $/h
    job_cost: Decimal | None  # the whole job (pricing.estimate: start-up, epochs, teardown)


@dataclass(frozen=True)
class Search:
    """A job's search as its page shows it: its trials so far and, once done, what it chose and why it stopped."""

    trials: list[TrialRow]
    running: tuple[TrialRow, ...]  # every trial running now: several where trials overlap (aws)
    spent: float  # $ of its trials (part of the job's cost)
    outcome: dict | None  # Job.search, once written
    before: Prediction | None
    after: Prediction | None
    epochs: int | None
    asked: str  # what "best" means and the search's budget, as the job was submitted with them

    @property
    def running_text(self) -> str:
        """The trials running now, in words: "trial 3 under way", "trials 3 and 4 under way"; "" when none is."""
        numbers = [str(row.number) for row in self.running]
        if len(numbers) < 2:
            return f"trial {numbers[0]} under way" if numbers else ""
        return f"trials {', '.join(numbers[:-1])} and {numbers[-1]} under way"

    @property
    def running_clusters(self) -> str:
        """Their clusters in words, as the live line names them: "3 × lab-w-1g", "1 × c4.xlarge and 2 × c4.xlarge"."""
        clusters = [f"{row.workers} × {row.worker_type}" for row in self.running]
        return " and ".join(filter(None, [", ".join(clusters[:-1]), clusters[-1]])) if clusters else ""

    @property
    def predictions(self) -> list[tuple[str, Prediction | None, str]]:
        """(label, prediction, id) of the cluster before the trials and after them, as the page lists them."""
        return [("Believed best before the trials", self.before, "before"), ("Chosen after them", self.after, "after")]


def of_job(job: Job) -> Search | None:
    """The job's search, None for a job that is not explore's."""
    if job.algorithm != "explore":
        return None
    rows = trials(job)
    epochs = epochs_parameter(job.parameters or {})
    outcome = job.search if isinstance(job.search, dict) else None

    def predicted(key: str) -> Prediction | None:
        cluster = (outcome or {}).get(key)
        if not isinstance(cluster, dict):
            return None
        hourly, epoch = cluster.get("hourly_cost"), cluster.get("epoch_time_s")
        if not isinstance(hourly, int | float) or not isinstance(epoch, int | float):
            return Prediction(cluster, None, None)
        estimate = pricing.estimate(Decimal(str(hourly)), epoch, epochs, job.provider)
        return Prediction(cluster, hourly * epoch / 3600, estimate.total if estimate else None)

    return Search(
        trials=rows,
        running=tuple(row for row in rows if row.state == "under way"),
        spent=sum(row.cost for row in rows),
        outcome=outcome,
        before=predicted("before"),
        after=predicted("after"),
        epochs=epochs,
        asked=asked(job.request or {}),
    )


def asked(request: dict) -> str:
    """What an explore request (`Job.request`) asked of its search, in words: what best means and its budget (the
    platform's default where it named none).

    >>> asked({"alpha": 0.0, "beta": 1.0, "search_budget": "2.5", "search_minutes": 20})
    'best: cheapest (α 0, β 1) · search budget $2.50 and 20 minutes'
    """
    alpha, beta = request.get("alpha", PRESETS[DEFAULT_PRESET][0]), request.get("beta", PRESETS[DEFAULT_PRESET][1])
    preset = preset_of(alpha, beta)
    weights = f"{preset} (α {alpha:g}, β {beta:g})" if preset != "custom" else f"α {alpha:g}, β {beta:g}"
    budget = request.get("search_budget")
    dollars, minutes = search_limits(None if budget is None else Decimal(budget), request.get("search_minutes"))
    return f"best: {weights} · search budget {usd(dollars)} and {minutes} minutes"


def said(found: Search) -> str:
    """The search in one line, as `submit_job` prints it: its trials, their cost and why it stopped."""
    measured = sum(row.state == "measured" for row in found.trials)
    failed = sum(row.state == "failed" for row in found.trials)
    parts = [f"{len(found.trials)} trial{'s' * (len(found.trials) != 1)} ({measured} measured, {failed} failed)"]
    parts.append(f"≈ {usd(found.spent)}")
    if found.running:
        parts.append(found.running_text)
    if found.outcome and found.outcome.get("reason"):
        parts.append(f"stopped: {found.outcome['reason']}")
    return " · ".join(parts)
