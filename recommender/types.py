"""Values the recommender's algorithms work on: frozen dataclasses, no ORM (the service layer builds them).

Notation follows FC² §5 and Anwar et al. §4 (see ../shared/DESIGN.md): C = budget $/h, c_ps / c_t = PS / worker
prices, B_ps = PS network capacity (Mbps), b_t = measured bandwidth of one worker of type t (Mbps), p = saturation
margin, L^w / L^p = worker / PS types considered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What a question may be about is what a record may hold (recommender/bounds.py says why).
from recommender.bounds import MAX_BATCH_SIZE as MAX_BATCH_SIZE
from recommender.bounds import MAX_LATENCY_MS as MAX_LATENCY_MS
from recommender.bounds import MAX_WORKERS as MAX_WORKERS

ALGORITHMS = ("cost-opt", "time-opt", "scala-opt", "scala-opt-m", "lookup", "model", "explore")

# What each framework calls its all-reduce strategy — TensorFlow's MultiWorkerMirroredStrategy, PyTorch's
# DistributedDataParallel (which has no parameter server at all): wherever the recommender decides "all-reduce" it
# names it so for the request's framework (RecommendRequest.all_reduce).
ALL_REDUCE_STRATEGIES = {"tensorflow": "mirrored", "pytorch": "ddp"}
# The strategies a question may name: a parameter server, either framework's all-reduce, or left open (`auto`).
STRATEGIES = ("ps", "mirrored", "auto", "ddp")


# What a workload key of a framework other than TensorFlow ends with (TensorFlow's ends with nothing: its keys are the
# ones records were filed under before there were other frameworks, the shipped data's among them).
FRAMEWORK_KEY_SUFFIX = {"pytorch": "@pytorch"}


def workload_key(name: str, framework: str) -> str:
    """A workload's key for `framework`, so that its records never mix with another framework's: TensorFlow's is the
    name itself, PyTorch's carries `@pytorch` (once).

    >>> [workload_key("fc2-digits:digits", f) for f in ("tensorflow", "pytorch")]
    ['fc2-digits:digits', 'fc2-digits:digits@pytorch']
    >>> workload_key("mine@pytorch", "pytorch")
    'mine@pytorch'
    """
    suffix = FRAMEWORK_KEY_SUFFIX.get(framework, "")
    return name if name.endswith(suffix) else name + suffix


def key_framework(key: str) -> str:
    """The framework a workload key is of (`workload_key`'s inverse); a key without a mark is TensorFlow's.

    >>> [key_framework(k) for k in ("fc2-digits:digits", "fc2-digits:digits@pytorch", "")]
    ['tensorflow', 'pytorch', 'tensorflow']
    """
    return next((f for f, suffix in FRAMEWORK_KEY_SUFFIX.items() if key.endswith(suffix)), "tensorflow")


def strategy_request(strategy: str, workload: str = "", omitted: str = "ps") -> dict:
    """The RecommendRequest fields a strategy asks for (the API's, `manage.py recommend`'s, a job's): whether its
    cluster has a parameter server (None: left open) and the framework — ddp is PyTorch's, every other TensorFlow's.
    A strategy omitted ("") is `omitted`; for a PyTorch workload's key (`key_framework`) an omitted or open one is
    ddp, the one strategy PyTorch has. One of the other framework's is asked as it is, for the recommender to refuse
    (algorithms.recommend): a key's records never answer for the other framework.

    >>> strategy_request("ddp"), strategy_request("auto")
    ({'parameter_server': False, 'framework': 'pytorch'}, {'parameter_server': None, 'framework': 'tensorflow'})
    >>> [strategy_request(s, "w@pytorch")["framework"] for s in ("", "auto", "ps")]
    ['pytorch', 'pytorch', 'tensorflow']
    """
    if key_framework(workload) == "pytorch" and strategy in ("", "auto"):
        strategy = ALL_REDUCE_STRATEGIES["pytorch"]
    strategy = strategy or omitted
    framework = next((f for f, name in ALL_REDUCE_STRATEGIES.items() if name == strategy), "tensorflow")
    return {"parameter_server": None if strategy == "auto" else strategy == "ps", "framework": framework}


def key_conflict(workload: str, strategy: str) -> str:
    """Why `strategy` (ps, mirrored, auto, ddp) is not for the workload whose key is `workload`: a PyTorch workload's
    key (`key_framework`) runs ddp alone, a TensorFlow workload's never ddp, so that one framework's records never
    answer for the other's. "" when it is (or no workload is named).

    >>> key_conflict("w@pytorch", "ddp"), key_conflict("w", "mirrored"), key_conflict("", "ddp")
    ('', '', '')
    >>> key_conflict("w", "ddp")
    "strategy ddp is PyTorch's DistributedDataParallel, and workload 'w' is a TensorFlow workload's key (a PyTorch \
workload's is 'w@pytorch')"
    """
    keyed = key_framework(workload)
    if not workload or strategy_request(strategy)["framework"] == keyed:
        return ""
    if keyed == "pytorch":
        return (
            f"workload {workload!r} is a PyTorch workload's key (it ends in @pytorch): it runs "
            f"DistributedDataParallel, strategy {ALL_REDUCE_STRATEGIES['pytorch']}, not {strategy} — that is "
            "TensorFlow's"
        )
    return (
        f"strategy {strategy} is PyTorch's DistributedDataParallel, and workload {workload!r} is a TensorFlow "
        f"workload's key (a PyTorch workload's is {workload_key(workload, 'pytorch')!r})"
    )


# The catalogue the recommender prices from when none is named: FC²'s own Tables 1–2 (recommender/catalogs/).
DEFAULT_CATALOG = "fc2-2018"


class RecommendationError(ValueError):
    """The request cannot be answered (infeasible budget, unknown type, no data); the message says why.

    The message is shown as it is, a sentence of its own — in the wizard, in the API's 400, on the CLI's stderr — so
    it starts with a capital however the algorithm that refused put it together:

    >>> str(RecommendationError("the budget of $1/h cannot buy a PS"))
    'The budget of $1/h cannot buy a PS'
    """

    def __init__(self, message: str, *args: object):
        super().__init__(message[:1].upper() + message[1:], *args)


@dataclass(frozen=True)
class MissingProfile:
    """A bandwidth profile Scala-Opt needs and no record has: run 1 PS + 1 worker of this type to measure it."""

    workload: str  # the workload the profile is for
    worker_type: str  # the worker instance type to profile
    ps_type: str  # the PS type it would run against
    batch_size: int | None  # batch size the bandwidth depends on (None: any)

    def __str__(self) -> str:
        batch = f", batch size {self.batch_size}" if self.batch_size else ""
        return f"{self.workload}: {self.worker_type} worker against a {self.ps_type} PS{batch}"


class MissingProfilesError(RecommendationError):
    """Scala-Opt cannot decide until these bandwidth profiles are measured."""

    def __init__(self, missing: list[MissingProfile]):
        self.missing = tuple(missing)
        workload = missing[0].workload if missing else "NAME"
        super().__init__(
            "missing bandwidth profiles (import a record with bandwidth_mbps for each: `manage.py import_perf_data "
            f"PATH --format csv --workload {workload}`): " + "; ".join(map(str, missing))
        )


@dataclass(frozen=True)
class TrialConfig:
    """A cluster `explore` runs a trial of the user's code on (recommender/explore.py chooses it; the job's
    latency is the job's)."""

    worker_type: str
    workers: int
    ps_type: str  # "" for all-reduce
    strategy: str  # "ps", or the request's all-reduce ("mirrored", PyTorch's "ddp")
    hourly_cost: float  # $/h of the trial's cluster, its PS included


@dataclass(frozen=True)
class SearchEstimate:
    """What `explore`'s search of trial runs will do for a workload from here (before its first trial, or between
    two): the trial to run now and what the search is expected to cost, within its budget."""

    workload: str
    next: TrialConfig  # the trial to run now
    candidates: int  # configurations the search chooses among
    trials_made: int  # trials this search made so far
    trials_at_most: int  # how many more trials its budget allows at most
    dollars: float  # expected $ of the trials still to make
    dollars_at_most: float  # what is left of the search's budget in $
    minutes: float  # expected minutes of the trials still to make
    minutes_at_most: float  # what is left of the search's budget in minutes
    trial_minutes: float  # one trial, start-up and teardown included
    reason: str  # why a trial is needed ("no record of this workload yet", "largest expected improvement per dollar")
    # Of the configuration believed best now: its predicted epoch time and 80 % interval (s); None when unknown
    predicted: tuple[float, float, float] | None = None
    predicted_config: TrialConfig | None = None  # that configuration
    text: str = ""  # one sentence for pages: what the search will do and cost
    # Trials to run at the same time as `next` (at most RecommendRequest.trials_at_once − 1, each worth its cost and
    # within the budget with the others); empty: `next` alone
    also: tuple[TrialConfig, ...] = ()

    @property
    def batch(self) -> tuple[TrialConfig, ...]:
        """The trials to run now, together: `next` first."""
        return (self.next, *self.also)


class TrialsNeeded(RecommendationError):
    """`explore` needs (more) trial runs of the code before it can choose: the job's recommend step runs `search.next`
    (fc2/services/trials.py) and asks again."""

    def __init__(self, search: SearchEstimate):
        self.search = search
        super().__init__(search.text or f"explore needs a trial run of {search.workload} first")


@dataclass(frozen=True)
class InstanceSpec:
    name: str  # e.g. "c4.xlarge"
    hourly_price: float  # on-demand $/h
    role: str = "any"  # "ps", "worker" or "any": which list the catalogue offers it in
    vcpu: int | None = None  # virtual CPUs
    ecu: float | None = None  # EC2 compute units (None: not published, as for every current AWS type)
    memory_gib: float | None = None
    gpus: int = 0  # number of GPUs
    gpu_model: str = ""  # e.g. "NVIDIA T4"
    network_mbps: float | None = None  # network capacity (B_ps when used as a PS)


@dataclass(frozen=True)
class PerfRecord:
    workload: str  # what was trained, e.g. "cifar10-cnn" or "anwar2021-mnist"
    instance_type: str = ""  # worker type ("" when the source does not say)
    ps_type: str = ""  # PS type ("" for all-reduce runs or unknown)
    workers: int | None = None  # number of workers
    batch_size: int | None = None
    latency_ms: float | None = None  # network latency between nodes
    epoch_time_s: float | None = None  # None: the run failed (kept, never used as a time)
    bandwidth_mbps: float | None = None  # b_t: one worker's bandwidth use
    cpu_util: float | None = None  # 0..100
    strategy: str = ""  # "ps", "mirrored", "ddp" (PyTorch's all-reduce) or ""
    source: str = "imported"  # "imported", "profiled", "measured" or "trial"


@dataclass(frozen=True)
class RecommendRequest:
    algorithm: str  # one of ALGORITHMS
    workload: str = ""  # whose performance records to use
    budget: float | None = None  # C, $/h; exactly one of budget and max_workers
    max_workers: int | None = None  # a limit on the worker count instead of a budget
    ps_type: str | None = None  # the user's PS type; None: chosen by PS selection
    ps_types: tuple[str, ...] = ()  # L^p; empty: every PS type of the catalogue
    worker_types: tuple[str, ...] = ()  # L^w; empty: every worker type of the catalogue
    worker_type: str | None = None  # Scala-Opt-M: the user's worker type
    batch_size: int | None = None
    latency_ms: float | None = None
    saturation: float = 0.95  # p
    # True: a parameter-server cluster; False: all-reduce, no PS (c_ps = 0; Scala-Opt does not apply); None: left open,
    # for the model algorithm to choose (recommender.perfmodel.choice.recommend_model)
    parameter_server: bool | None = True
    alpha: float = 1.0  # weight of time (Anwar eq. 6)
    beta: float = 0.0  # weight of cost
    # explore (recommender/explore.py): its search's budget, what this job's trials spent of it, one trial's length
    # (its start-up and teardown included) and the job's epochs (what a better cluster saves is a share of the job)
    search_dollars: float | None = None
    search_minutes: float | None = None
    spent_dollars: float = 0.0
    spent_minutes: float = 0.0
    spent_trials: int = 0  # the trials this search made (several may have shared a window)
    trial_minutes: float | None = None
    epochs: int | None = None
    workers_cap: int | None = None  # explore: the most workers the job's provider runs (a budget's count stops there)
    trials_at_once: int = 1  # explore: how many trial runs may overlap in time (FC2_EXPLORE_AT_ONCE)
    # What the workload trains with (ALL_REDUCE_STRATEGIES): "pytorch" has all-reduce alone (parameter_server False)
    framework: str = "tensorflow"

    @property
    def all_reduce(self) -> str:
        """What this request's all-reduce strategy is called: "mirrored", or PyTorch's "ddp"."""
        return ALL_REDUCE_STRATEGIES[self.framework]


@dataclass(frozen=True)
class Candidate:
    worker_type: str
    workers: int
    epoch_time_s: float | None  # measured or predicted; None when the algorithm does not know it
    hourly_cost: float  # c_ps + n·c_t (all-reduce lookups: n·c_t)
    source: str  # "measured", "predicted" or "rule"
    # How the epoch time was obtained (recommender.perfmodel.predictor.BASES): "measured" (runs of it at this point)
    # or "predicted"; "" for the FC² rules.
    basis: str = ""
    expected_error: float | None = None  # the predictor's expected |run/estimate − 1| here; None: not estimated
    interval_s: tuple[float, float] | None = None  # the predictor's 80 % interval of the expected epoch time
    judged_s: float | None = None  # the time the choice weighs (PredictorModel.judged); None: the interval's upper end
    warning: str = ""  # failed runs of this configuration near this point ("" when none)
    strategy: str = ""  # "ps" or "mirrored" where the model compared both (the strategy left open); else ""
    ps_type: str = ""  # the PS its runs went through, where the lookup tells clusters apart by it; else ""


@dataclass(frozen=True)
class Recommendation:
    algorithm: str
    ps_type: str | None  # None for PS-less (all-reduce) answers; a parameter-server request's answer always names it
    worker_type: str
    workers: int
    hourly_cost: float  # $/h of the whole cluster, its PS included: the price every page, the plan and the bill use
    predicted_epoch_time_s: float | None
    source: str  # "measured", "predicted" or "rule"
    explanation: str  # why, in a sentence or two a researcher can check
    candidates: tuple[Candidate, ...] = ()  # every configuration considered
    pareto: tuple[Candidate, ...] = ()  # model only: the time/cost frontier
    model_error: float | None = None  # model only: cross-validated MAPE of epoch time (0.12 = 12 %)
    extra: dict = field(default_factory=dict)  # algorithm-specific details for the API (JSON-serialisable)
    warnings: tuple[str, ...] = ()  # what the answer is not sure of, e.g. failed runs near the pick (also in extra)
    # Whose records it read (the service's Readers.counts): {"platform": n, "own": m, "unusable": k, "text": …};
    # empty where it read none (no workload named).
    records: dict = field(default_factory=dict)
