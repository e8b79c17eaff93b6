"""Template helpers of the site's pages: numbers for people (money, estimated costs, prices, rates, capacities,
memory, elapsed time, measured times), text written with `code` spans, and a pager that keeps the page's other
filters and pages."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django import template
from django.template.defaulttags import querystring
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from common import numbers
from fc2 import results

register = template.Library()


def _dash_when_missing(format_number: Callable[[Any], str]) -> Callable[[Any], str]:
    """A number filter that shows a dash for a missing value: None, or the empty string that a lookup through a
    missing object gives (`node.latest.memory_mb` with no sample yet)."""

    @wraps(format_number)
    def number_or_dash(value) -> str:
        return "–" if value is None or value == "" else format_number(value)

    return number_or_dash


@register.filter
@_dash_when_missing
def usd(value) -> str:
    """Dollars as every page and timeline writes them (common.numbers.usd).

    >>> usd(1234.6), usd(0.0034), usd(0.00001), usd(0), usd(None)
    ('$1,235', '$0.0034', '< $0.0001', '$0', '–')
    """
    return numbers.usd(value)


# Every cost the platform shows is the cluster's catalogue price × its running time: what the run would cost on the
# catalogue's cloud, never a bill (a local cluster runs on this machine and spends nothing). `estimate` marks each one
# so, and pages say why once with `estimate_note`.
ESTIMATE_NOTE = (
    "≈ costs are estimates at the instance catalogue's prices, not bills: a local or lab cluster runs on this machine "
    "and spends nothing."
)

register.filter("metric", results.rounded)
register.filter("share", _dash_when_missing(results.percent))  # a fraction (0.95) as "95 %"


@register.filter
@_dash_when_missing
def estimate(value) -> str:
    """A catalogue-priced cost: `usd` marked as an estimate.

    >>> estimate(0.0034), estimate(12), estimate(0.00001), estimate(None)
    ('≈ $0.0034', '≈ $12.00', '< $0.0001', '–')
    """
    text = usd(value)
    return text if text.startswith("<") else f"≈ {text}"


@register.simple_tag
def estimate_note() -> str:
    """The one sentence that says what the ≈ on a page's costs means."""
    return ESTIMATE_NOTE


@register.filter
@_dash_when_missing
def mbps(value) -> str:
    """A rate given in Mbps as a number with sensible precision (the unit is in the column's header).

    >>> mbps(0.01234), mbps(12.345), mbps(1234.5), mbps(None)
    ('0.012', '12.3', '1,234', '–')
    """
    value = float(value)
    if value < 1:
        return f"{value:.3f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


@register.filter
@_dash_when_missing
def per_hour(value) -> str:
    """A price in $/h (common.numbers.usd_per_hour).

    >>> from decimal import Decimal
    >>> per_hour(Decimal("0.125000")), per_hour(Decimal("2.000000")), per_hour(Decimal("0.356000")), per_hour(None)
    ('$0.125/h', '$2.00/h', '$0.356/h', '–')
    """
    return numbers.usd_per_hour(value)


@register.filter
@_dash_when_missing
def capacity(mbps) -> str:
    """A network capacity given in Mbps, in Gbps from 1000 on.

    >>> capacity(10000.0), capacity(12500), capacity(450.0), capacity(0.5), capacity(None)
    ('10 Gbps', '12.5 Gbps', '450 Mbps', '0.5 Mbps', '–')
    """
    mbps = float(mbps)
    return f"{mbps / 1000:g} Gbps" if mbps >= 1000 else f"{mbps:g} Mbps"


@register.filter
@_dash_when_missing
def gib(value) -> str:
    """Memory given in GiB.

    >>> gib(16.0), gib(0.5), gib(None)
    ('16 GiB', '0.5 GiB', '–')
    """
    return f"{float(value):g} GiB"


@register.filter
@_dash_when_missing
def megabytes(value) -> str:
    """Memory given in MB, as MB or GB.

    >>> megabytes(612.4), megabytes(2048), megabytes(None)
    ('612 MB', '2.0 GB', '–')
    """
    value = float(value)
    return f"{value / 1024:.1f} GB" if value >= 1024 else f"{value:.0f} MB"


@register.filter
@_dash_when_missing
def duration(seconds) -> str:
    """Elapsed seconds as `42 s`, `3 min 05 s` or `2 h 07 min`.

    >>> duration(42.4), duration(185), duration(7620), duration(None)
    ('42 s', '3 min 05 s', '2 h 07 min', '–')
    """
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
@_dash_when_missing
def seconds(value) -> str:
    """A measured time given in seconds (an epoch's): milliseconds below a second, each to three significant digits
    but never fewer than its whole part (fc2.results.figure), so that a short epoch never reads "0.0 s".

    >>> seconds(0.0412), seconds(0.5), seconds(0.00004), seconds(2.345), seconds(503.2), seconds(1143.6), seconds(0)
    ('41.2 ms', '500 ms', '0.04 ms', '2.35 s', '503 s', '1144 s', '0 s')
    """
    value = float(value)
    if 0 < abs(value) < 1:
        return f"{results.figure(value * 1000)} ms"
    return f"{results.figure(value)} s"


@register.filter
def inline_code(text) -> SafeString:
    """Text whose `backticked` spans are code (a catalogue's source names the command that rebuilds it), as HTML:
    the text escaped, each span in <code>.

    >>> inline_code("run `manage.py refresh_catalog` <now>")
    'run <code>manage.py refresh_catalog</code> &lt;now&gt;'
    """
    parts = escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick is a character, not the start of code
        return mark_safe("`".join(parts))
    return mark_safe("".join(f"<code>{part}</code>" if i % 2 else part for i, part in enumerate(parts)))


def _link(context, anchor: str, **changes) -> str:
    """Django's {% querystring %} with `changes` (None removes a key), then the #anchor. Called from Python because a
    template cannot hand {% querystring %} a key held in a variable (`param`, `page_param`)."""
    return querystring(context, **changes) + (f"#{anchor}" if anchor else "")


@register.inclusion_tag("fc2/_pager.html", takes_context=True)
def pager(context, page, param: str = "page", anchor: str = "") -> dict:
    """Newer/older links for `page` that change only `param` in the current query string (other lists on the same
    page keep their filters and pages)."""
    return {
        "page": page,
        "previous_url": _link(context, anchor, **{param: page.previous_page_number()}) if page.has_previous() else None,
        "next_url": _link(context, anchor, **{param: page.next_page_number()}) if page.has_next() else None,
        "label": anchor or "results",
    }


@register.inclusion_tag("fc2/_chips.html", takes_context=True)
def filter_chips(context, param: str, choices, current: str, page_param: str, anchor: str, label: str) -> dict:
    """One link per choice (values, or (value, label) pairs) setting `param`, and "all" clearing it; each goes back
    to the first page of its list (`page_param`) and leaves the page's other lists as they are."""
    pairs = [c if isinstance(c, list | tuple) else (c, c) for c in choices]
    return {
        "label": label,
        "chips": [
            {"text": text, "url": _link(context, anchor, **{param: value or None, page_param: None}),
             "on": value == current}
            for value, text in [("", "all"), *pairs]
        ],
    }  # fmt: skip
