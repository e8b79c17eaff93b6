"""How a job's outcome reads on the pages: its headline metric, its metrics rounded, and a failure in one line.

Pure functions over plain values (no ORM): `Job.headline` and `Job.failure_summary` call them, the templates show
what those give.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from common.numbers import percent, significant

# Where a job's headline comes from, best first: metrics.json's keys (the bundle contract, examples/README.md).
ACCURACY_KEY = "test_accuracy"
LOSS_KEYS = ("test_loss", "final_train_loss")

# TensorFlow's and absl's start-up chatter: "W0000 00:00:1700000000.1 123 file.cc:12] …" (absl's glog-style
# prefix), "2026-11-23 12:00:00.000000: I tensorflow/…" (TF's C++ logging), the oneDNN and CPU-feature notices.
NOISE = re.compile(
    r"""^(
        [IWEF]\d{4}\s                                   # absl / glog: I1123 12:00:00 …
      | \d{4}-\d\d-\d\d[ T][\d:.]+:\s[IWEF]\s           # TF C++: 2026-11-23 12:00:00.000: W tensorflow/…
      | .*\boneDNN\b
      | .*cpu_feature_guard
      | .*To\ enable\ the\ following\ instructions      # the second half of cpu_feature_guard's notice
      | .*rebuild\ TensorFlow\ with\ the\ appropriate\ compiler\ flags
      | WARNING:\ All\ log\ messages\ before\ absl::InitializeLog
    )""",
    re.VERBOSE,
)
LOG_INTRO = "; its log ends:\n"  # what a node's failure reason puts between what failed and the end of its log


@dataclass(frozen=True)
class Headline:
    """The one figure a job's result is compared by."""

    label: str  # e.g. "test accuracy"
    text: str  # the value as people read it, e.g. "97.3 %"


# A list of at most this many numbers is shown as the list itself (an input shape, a few epochs' losses); a longer one
# is summed up.
SHORT_LIST = 4


def figure(value: float) -> str:
    """A measured figure as every page shows it (a metric's pill, the run's throughput): three significant digits,
    but never fewer than its whole part, so that one figure reads the same wherever it shows.

    >>> figure(0.083456), figure(2.34567), figure(1143.6), figure(12345.6), figure(-1143.6)
    ('0.0835', '2.35', '1144', '12346', '-1144')
    """
    return f"{value:.0f}" if math.isfinite(value) and abs(value) >= 1000 else significant(value)


def rounded(value: object) -> object:
    """A metric as a page shows it: a count exactly, other numbers as `figure`, a short list of numbers as the list,
    a longer one summed up (how many, the last, the range), a mapping by its size, anything else as it is.

    >>> rounded(0.123456), rounded(1437), rounded(1143.6), rounded(True), rounded("adam")
    ('0.123', '1437', '1144', True, 'adam')
    >>> rounded([8, 8, 1]), rounded([2.3, 0.51234]), rounded([]), rounded([1, "a"])
    ('[8, 8, 1]', '[2.3, 0.512]', 'none', '2 values')
    >>> rounded([2.3, 0.51234, 0.0123, 0.01, 0.005])
    '5 values, last 0.005 (0.005–2.3)'
    >>> rounded({"a": 1, "b": 2})
    '2 entries'
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return figure(value)
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        numbers = [n for v in value if (n := _number(v)) is not None]
        if len(value) == 1 and numbers:
            return rounded(value[0])
        count = f"{len(value)} values"
        if len(numbers) < len(value):
            return count
        if len(value) <= SHORT_LIST:
            return f"[{', '.join(str(rounded(v)) for v in value)}]"
        return f"{count}, last {figure(numbers[-1])} ({figure(min(numbers))}–{figure(max(numbers))})"
    if isinstance(value, dict):
        return f"{len(value)} entries"
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def headline(metrics: dict, final_loss: float | None) -> Headline | None:
    """The test accuracy if metrics.json has it, else its test loss (or final training loss), else the last loss the
    chief printed; None when there is none of them.

    >>> headline({"test_accuracy": 0.97345, "test_loss": 0.1}, 0.2)
    Headline(label='test accuracy', text='97.3 %')
    >>> headline({"test_loss": 0.083456}, 0.2), headline({}, 1.23456), headline({"test_accuracy": "n/a"}, None)
    (Headline(label='test loss', text='0.0835'), Headline(label='loss', text='1.23'), None)
    """
    accuracy = _number(metrics.get(ACCURACY_KEY))
    if accuracy is not None:
        return Headline("test accuracy", percent(accuracy))
    for key in LOSS_KEYS:
        loss = _number(metrics.get(key))
        if loss is not None:
            return Headline(key.replace("_", " ").removeprefix("final "), figure(loss))
    loss = _number(final_loss)
    return Headline("loss", figure(loss)) if loss is not None else None


def last_meaningful_line(log: str) -> str:
    """The last line of a log that says something: not blank, not TensorFlow's start-up noise (so a traceback's
    last line, the exception, is what a failure is summed up by); the last line at all when every line is noise.

    >>> last_meaningful_line("Traceback (most recent call last):\\n  File 'x'\\nValueError: bad shape\\n"
    ...                      "W0000 00:00:1.2 3 cpu_feature_guard.cc:1] oneDNN custom operations are on\\n")
    'ValueError: bad shape'
    """
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if not NOISE.match(line):
            return line
    return lines[-1] if lines else ""


def failure_summary(reason: str) -> str:
    """A failure reason in one line: what failed and, for a node's failure, the last meaningful line of its log.

    >>> failure_summary("chief-0 failed with exit code 1; its log ends:\\nI0000 start\\nKeyError: 'x'\\nE0000 gone")
    "chief-0 failed with exit code 1: KeyError: 'x'"
    >>> failure_summary("no capacity for 4 workers")
    'no capacity for 4 workers'
    """
    what, intro, log = reason.partition(LOG_INTRO)
    if not intro:
        return last_meaningful_line(reason)
    line = last_meaningful_line(log)
    return f"{what}: {line}" if line else what
