"""What the client shows a person: a line redrawn in place on a terminal (an upload's progress bar, a followed job's
state), and jobs, costs and recommendations in words. Nothing here is printed under `--json`."""

from __future__ import annotations

import shutil
from typing import TextIO

ENDED = ("succeeded", "failed", "cancelled")  # a job in one of these will not change any more


class LiveLine:
    """One line redrawn in place on a terminal; elsewhere (a log file, a pipe), each new text on a line of its own."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.redraw = stream.isatty()
        self._last: str | None = None

    def show(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        if self.redraw:
            # A line longer than the terminal wraps, and \r would then redraw only its last part.
            width = shutil.get_terminal_size().columns - 1
            self.stream.write(f"\r{text[:width]}\033[K")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.redraw and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()
        self._last = None


class ProgressBar:
    """`[############------------]  50%  1.2 MB of 2.4 MB  upload model.whl`, redrawn as the bytes go."""

    WIDTH = 24

    def __init__(self, label: str, line: LiveLine):
        self.label = label
        self.line = line

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        # The label last: a line cut at the terminal's width loses its end, and the figures matter more.
        self.line.show(f"[{bar}] {fraction:4.0%}  {size(done)} of {size(total)}  {self.label}")


def size(count: int) -> str:
    """
    >>> size(1_234_567), size(45_678), size(512)
    ('1.2 MB', '45.7 kB', '512 B')
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def usd(value) -> str:
    """Dollars as the platform shows them (its common/numbers.py, copied: the client is standard library only): whole
    dollars from $100, cents from $1, three significant digits below, "< $0.0001" under that; a dash when unknown.

    >>> usd(1234.6), usd(12.3456), usd(0.0034), usd(0.00104), usd(0.00004), usd(0), usd(None)
    ('$1,235', '$12.35', '$0.0034', '$0.00104', '< $0.0001', '$0', '–')
    """
    if value is None:
        return "–"
    value = float(value)
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value == 0:
        return "$0"
    if value < 0.0001:
        return f"{sign}< $0.0001"
    if value >= 100:
        return f"{sign}${value:,.0f}"
    if value >= 1:
        return f"{sign}${value:,.2f}"
    digits = f"{value:.3g}"
    if "e" in digits:
        digits = f"{float(digits):f}".rstrip("0")
    return f"{sign}${value:.{max(len(digits.partition('.')[2]), 2)}f}"


def _of(done, total) -> str:
    return f"{done}/{total}" if total else f"{done}"


def job_line(job: dict) -> str:
    """A job in one line, as it is now: its state, how far it got, its loss and its cost so far.

    >>> job_line({"id": 7, "state": "running", "progress": {"epoch": 1, "epochs": 3, "step": 20, "steps": 60,
    ...           "loss": 0.41234}, "cost": {"cost_so_far": 0.0012}})
    'job 7 running · epoch 1/3 · step 20/60 · loss 0.412 · ≈ $0.0012 so far'
    >>> job_line({"id": 7, "state": "queued"})
    'job 7 queued'
    >>> job_line({"id": 7, "state": "recommending", "trials": [{"number": 2, "state": "under way", "workers": 3,
    ...           "worker_type": "lab-w-1g", "ps_type": "", "strategy": "mirrored"}]})
    'job 7 recommending · trial 2 on 3 × lab-w-1g'
    >>> job_line({"id": 7, "state": "recommending", "trials": [{"number": n, "state": "under way", "workers": n,
    ...           "worker_type": "c4.xlarge", "ps_type": "", "strategy": "mirrored"} for n in (2, 3)]})
    'job 7 recommending · trials 2 on 2 × c4.xlarge, 3 on 3 × c4.xlarge'
    >>> job_line({"id": 7, "state": "queued", "worker": {"taking_jobs": False,
    ...           "message": "No worker is taking jobs since 13:24 UTC"}})
    'job 7 queued · No worker is taking jobs since 13:24 UTC'
    """
    parts = [f"job {job['id']} {job['state']}"]
    under_way = [t for t in job.get("trials") or [] if t.get("state") == "under way"]  # explore's search
    if under_way:  # several where trials overlap (aws)
        said = ", ".join(f"{t.get('number')} on {cluster(t)}" for t in under_way)
        parts.append(f"trial{'s' * (len(under_way) > 1)} {said}")
    progress = job.get("progress") or {}
    if progress.get("epoch") is not None:
        parts.append(f"epoch {_of(progress['epoch'], progress.get('epochs'))}")
    if progress.get("step") is not None:
        parts.append(f"step {_of(progress['step'], progress.get('steps'))}")
    if progress.get("loss") is not None:
        parts.append(f"loss {float(progress['loss']):.3g}")
    cost = job.get("cost") or {}
    if cost.get("cost_so_far") is not None:
        parts.append(f"≈ {usd(cost['cost_so_far'])} so far")
    worker = job.get("worker") or {}  # (null on a job no worker has to move on; absent from older platforms)
    if worker.get("taking_jobs") is False:
        parts.append(str(worker.get("message")))
    return " · ".join(parts)


def name_of(ref) -> str:
    """A job's bundle or dataset, `{"id", "name"}`, by its name.

    >>> name_of({"id": 3, "name": "digits"}), name_of(None)
    ('digits', '–')
    """
    if isinstance(ref, dict):
        return str(ref.get("name") or ref.get("id"))
    return "–" if ref is None else str(ref)


def headline(job: dict) -> str:
    """The figure the job's result is judged by (e.g. "test accuracy 97.3 %"), or "" before there is one."""
    figure = job.get("headline")
    if isinstance(figure, dict):
        return " ".join(str(figure[key]) for key in ("label", "text") if figure.get(key))
    return str(figure or "")


# The strategies with no parameter server: TensorFlow's mirrored, PyTorch's DDP (the platform's provisioner.ALL_REDUCE).
ALL_REDUCE = ("mirrored", "ddp")


def cluster(spec: dict) -> str:
    """The cluster a job or a recommendation names.

    >>> cluster({"workers": 6, "worker_type": "c4.xlarge", "ps_type": "m4.large"})
    '6 × c4.xlarge + PS m4.large'
    >>> cluster({"workers": 2, "worker_type": "", "ps_type": "", "strategy": "mirrored"})
    '2 workers'
    """
    count = spec.get("workers")
    nodes = f"{count} × {spec['worker_type']}" if spec.get("worker_type") else f"{count} worker{'s' * (count != 1)}"
    if spec.get("ps_type") and spec.get("strategy") not in ALL_REDUCE:
        nodes += f" + PS {spec['ps_type']}"
    return nodes


def strategy(job: dict) -> str:
    """A job's strategy, and whether the model chose it; before its cluster is chosen, the one asked.

    >>> strategy({"strategy": "mirrored", "requested_strategy": "auto"})
    'mirrored, left open: the model chose it'
    >>> strategy({"strategy": "ps", "requested_strategy": "ps"})
    'ps'
    >>> strategy({"strategy": "", "requested_strategy": "auto"})
    'left open'
    """
    asked = job.get("requested_strategy")
    if not job.get("strategy"):
        return "left open" if asked == "auto" else str(asked)
    chosen = asked == "auto"
    return f"{job.get('strategy')}, left open: the model chose it" if chosen else str(job.get("strategy"))


def job_report(job: dict) -> str:
    """A job in full, as `fc2 status` prints it."""
    lines = [
        job_line(job),
        f"  code      {name_of(job.get('bundle'))} on {name_of(job.get('dataset'))}"
        + (f" ({job['framework']})" if job.get("framework") else ""),
        f"  cluster   {cluster(job) if job.get('workers') is not None else 'not chosen yet'} on "
        f"{job.get('provider')} ({strategy(job)}, {job.get('algorithm')})",
    ]
    lines += search_lines(job)
    if restarts := restarts_line(job):
        lines.append(restarts)
    cost = job.get("cost") or {}
    if cost.get("hourly_cost") is not None:
        spent = f"{usd(cost['hourly_cost'])}/h, ≈ {usd(cost.get('cost_so_far'))} so far"
        if cost.get("projected_total") is not None and job["state"] not in ENDED:
            spent += f", ≈ {usd(cost['projected_total'])} projected"
        if cost.get("total_budget") is not None:
            spent += f" of a {usd(cost['total_budget'])} budget"
        lines.append(f"  cost      {spent} (catalogue prices)")
    if figure := headline(job):
        lines.append(f"  result    {figure}")
    if job.get("failure_reason"):
        lines.append(f"  reason    {job['failure_reason']}")
    for event in (job.get("events") or [])[-5:]:
        lines.append(f"  {event.get('at', '')[:19].replace('T', ' ')}  {event.get('state')}: {event.get('message')}")
    artifacts = job.get("artifacts") or []
    if artifacts:
        names = ", ".join(a["name"] for a in artifacts[:6]) + (" …" if len(artifacts) > 6 else "")
        lines.append(f"  artifacts {names}  (fc2 download {job['id']})")
    if job.get("url"):
        lines.append(f"  page      {job['url']}")
    return "\n".join(lines)


def restarts_line(job: dict) -> str | None:
    """A managed job's restarts made of those allowed, its last interruption and its spot choice, in a line; None for
    a job that asked for neither restarts nor spot (or from a platform without them). `--json` has every restart.

    >>> restarts_line({"max_restarts": 2, "restarts": [{"at": "2026-11-03T10:10:00+00:00", "nodes": ["worker-1"],
    ...     "lost_steps": 3, "lost_s": 40, "lost_dollars": 0.01, "checkpoint": "", "resumed_at": "2026-11-03T10:11"}]})
    '  restarts  1 of 2 · last: worker-1 lost at 2026-11-03 10:10:00, 3 steps, 40 s, $0.01 lost, resumed from the start'
    """
    made = job.get("restarts") if isinstance(job.get("restarts"), list) else []
    made = [restart for restart in made if isinstance(restart, dict)]
    allowed = job.get("max_restarts") or 0
    if not (allowed or made or job.get("spot")):
        return None
    parts = [f"{len(made)} of {allowed}"]
    if made:
        parts.append(_last_restart(made[-1], ended=job.get("state") in ENDED))
    if job.get("spot"):
        price = f" at most {usd(job['spot_max_price'])}/h" if job.get("spot_max_price") is not None else ""
        parts.append(f"spot{price}, without capacity: {job.get('spot_fallback') or 'on-demand'}")
    return f"  restarts  {' · '.join(parts)}"


def _last_restart(last: dict, ended: bool) -> str:
    """A restart in words: the nodes lost, when and why, the work lost and where it resumed from (`ended`: the job
    has ended, so one not resumed never will be)."""
    nodes = ", ".join(map(str, last["nodes"])) if isinstance(last.get("nodes"), list) else ""
    said = f"last: {nodes or 'a node'} lost at {str(last.get('at') or '?')[:19].replace('T', ' ')}"
    if last.get("reason"):
        said += f" ({last['reason']})"
    steps = last.get("lost_steps")
    lost = [f"{steps} steps"] if isinstance(steps, int) and not isinstance(steps, bool) else []
    if isinstance(last.get("lost_s"), (int, float)):
        lost.append(f"{last['lost_s']:.0f} s")
    if isinstance(last.get("lost_dollars"), (int, float)):
        lost.append(usd(last["lost_dollars"]))
    if lost:
        said += f", {', '.join(lost)} lost"
    if not last.get("resumed_at"):
        return f"{said}, {'never resumed' if ended else 'restart under way'}"
    checkpoint = last.get("checkpoint")
    return f"{said}, resumed from {f'checkpoint {checkpoint}' if checkpoint else 'the start'}"


TRIALS_SHOWN = 5  # `fc2 status` lists an explore job's latest trials; the page and --json have them all


def search_lines(job: dict) -> list[str]:
    """An explore job's trials (the latest few) and its search's outcome, a line each; none for another job.

    >>> search_lines({"trials": [{"number": 1, "workers": 2, "worker_type": "w", "ps_type": "p", "strategy": "ps",
    ...               "state": "under way", "epoch_time_s": None, "cost": 0.004, "error": ""}], "search": None})
    ['  trial 1   2 × w + PS p: under way, ≈ $0.004', '  search    1 trial ≈ $0.004']
    """
    trials, found = job.get("trials") or [], job.get("search")
    if not trials and not isinstance(found, dict):
        return []
    lines = (
        [f"  ({len(trials) - TRIALS_SHOWN} earlier trials: fc2 status --json)"] if len(trials) > TRIALS_SHOWN else []
    )
    for trial in trials[-TRIALS_SHOWN:]:
        said = str(trial.get("state"))
        if trial.get("error"):
            said += f" ({trial['error']})"
        if trial.get("epoch_time_s") is not None:
            said += f", epoch {float(trial['epoch_time_s']):.3g} s"
        lines.append(f"  trial {trial.get('number')}   {cluster(trial)}: {said}, ≈ {usd(trial.get('cost'))}")
    spent = sum(float(trial.get("cost") or 0) for trial in trials)
    outcome = [f"{len(trials)} trial{'s' * (len(trials) != 1)} ≈ {usd(spent)}"]
    if isinstance(found, dict):
        if found.get("no_trial_needed"):
            outcome.append("no trial needed")
        if isinstance(found.get("after"), dict):
            outcome.append(f"chose {cluster(found['after'])}")
        if found.get("reason"):
            outcome.append(f"stopped: {found['reason']}")
    return [*lines, f"  search    {' · '.join(outcome)}"]


def jobs_table(jobs: list[dict]) -> str:
    """One row per job, newest first as the platform lists them."""
    rows = [("ID", "STATE", "PROVIDER", "CLUSTER", "DATASET", "RESULT", "CREATED")]
    for job in jobs:
        created = (job.get("created_at") or "")[:16].replace("T", " ")
        rows.append(
            (str(job["id"]), job["state"], job.get("provider") or "", cluster(job), name_of(job.get("dataset")),
             headline(job), created)
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def recommendation(answer: dict) -> str:
    """A recommendation as `manage.py recommend` says it: the cluster, its price and time, and why."""
    epoch = answer.get("predicted_epoch_time_s")
    timing = f", epoch ≈ {epoch:.3g} s" if epoch is not None else ""
    lines = [
        f"{answer['algorithm']}: {cluster(answer)}, {usd(answer['hourly_cost'])}/h{timing} ({answer.get('source')})"
    ]
    if answer.get("explanation"):
        lines.append(answer["explanation"])
    return "\n".join(lines)
