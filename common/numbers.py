"""Numbers as people read them — money, significant digits, percentages: what the pages, the jobs' timelines, the job
page's results (fc2/results.py) and the monitor's alerts (monitor/figures.py) write, so a leaf that each may import."""

from __future__ import annotations

import math
from decimal import Decimal


def significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, without an exponent for everyday magnitudes.

    >>> [significant(v) for v in (0.083456, 1.0, 2.34567, 1234.5, 0.0001234, 0)]
    ['0.0835', '1', '2.35', '1230', '0.000123', '0']
    """
    if value == 0 or not math.isfinite(value):
        return str(0 if value == 0 else value)
    text = f"{value:.{digits}g}"
    if "e" in text and 1e-6 <= abs(value) < 1e15:
        text = f"{float(text):f}".rstrip("0").rstrip(".")
    return text


def percent(fraction: float) -> str:
    """A fraction (an accuracy in [0, 1], a link's saturation) as a percentage with three significant digits (one
    decimal past 10 %).

    >>> percent(0.97345), percent(1.0), percent(0.0567)
    ('97.3 %', '100 %', '5.67 %')
    """
    return f"{significant(fraction * 100)} %"


# Below this a cost is shown as "< $0.0001" (a few seconds of a small local cluster), never as "$0.0000".
SMALLEST_USD = 0.0001


def usd(value: float | Decimal) -> str:
    """Dollars as people read them: whole dollars from $100 on, cents from $1, three significant digits below a
    dollar (at least cents), "< $0.0001" for a positive amount smaller than that, "$0" for nothing.

    >>> [usd(v) for v in (1234.6, 12.3456, 1, 0.75, 0.356, 0.1, 0.012826, 0.00012, 0.00004, 0)]
    ['$1,235', '$12.35', '$1.00', '$0.75', '$0.356', '$0.10', '$0.0128', '$0.00012', '< $0.0001', '$0']
    """
    value = float(value)
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value == 0:
        return "$0"
    if value < SMALLEST_USD:
        return f"{sign}< $0.0001"
    if value >= 100:
        return f"{sign}${value:,.0f}"
    if value >= 1:
        return f"{sign}${value:,.2f}"
    text = significant(value)
    decimals = len(text.partition(".")[2])
    return f"{sign}${value:.{max(decimals, 2)}f}"


def usd_per_hour(value: float | Decimal) -> str:
    """A price in $/h: four significant digits (a catalogue's prices differ in the third), at least cents.

    >>> [usd_per_hour(v) for v in (0.356, 0.0116, 1.944, 2, 32.7726, 1234.5, 0.00004, 0)]
    ['$0.356/h', '$0.0116/h', '$1.944/h', '$2.00/h', '$32.77/h', '$1,234/h', '< $0.0001/h', '$0/h']
    """
    value = float(value)
    if value == 0 or abs(value) < SMALLEST_USD or abs(value) >= 1000:
        return f"{usd(value)}/h"
    decimals = len(significant(abs(value), 4).partition(".")[2])
    return f"{'-' if value < 0 else ''}${abs(value):,.{max(decimals, 2)}f}/h"
