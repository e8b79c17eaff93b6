"""Template helpers of the site's pages: numbers for people (money, estimated costs, prices, rates, capacities,
memory, elapsed time) and a pager that keeps the page's other filters and pages."""

from __future__ import annotations

from decimal import Decimal

from django import template

register = template.Library()


def _missing(value) -> bool:
    # A lookup through a missing object (`node.latest.memory_mb` with no sample yet) gives the empty string.
    return value is None or value == ""


@register.filter
def usd(value) -> str:
    """Dollars with cents, or with four decimals under a dollar (a short local run costs fractions of a cent).

    >>> usd(1234.5), usd(0.0034), usd(0), usd(None)
    ('$1,234.50', '$0.0034', '$0.00', '–')
    """
    if _missing(value):
        return "–"
    value = float(value)
    if value == 0 or abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}"


# Every cost the platform shows is the cluster's catalogue price × its running time: what the run would cost on the
# catalogue's cloud, never a bill (a local cluster runs on this machine and spends nothing). `estimate` marks each one
# so, and pages say why once with `estimate_note`.
ESTIMATE_NOTE = (
    "≈ costs are estimates at the instance catalogue's prices, not bills: a local cluster runs on this machine and "
    "spends nothing."
)


@register.filter
def estimate(value) -> str:
    """A catalogue-priced cost: `usd` marked as an estimate.

    >>> estimate(0.0034), estimate(12), estimate(None)
    ('≈ $0.0034', '≈ $12.00', '–')
    """
    amount = usd(value)
    return amount if amount == "–" else f"≈ {amount}"


@register.simple_tag
def estimate_note() -> str:
    """The one sentence that says what the ≈ on a page's costs means."""
    return ESTIMATE_NOTE


@register.filter
def mbps(value) -> str:
    """A rate given in Mbps as a number with sensible precision (the unit is in the column's header).

    >>> mbps(0.01234), mbps(12.345), mbps(1234.5), mbps(None)
    ('0.012', '12.3', '1,234', '–')
    """
    if _missing(value):
        return "–"
    value = float(value)
    if value < 1:
        return f"{value:.3f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


@register.filter
def per_hour(value) -> str:
    """A catalogue price in $/h as people write it, with every digit it has and no more.

    >>> per_hour(Decimal("0.125000")), per_hour(Decimal("2.000000")), per_hour(0.0), per_hour(None)
    ('$0.125/h', '$2/h', '$0/h', '–')
    """
    if _missing(value):
        return "–"
    return f"${Decimal(str(value)).normalize():f}/h"


@register.filter
def capacity(mbps) -> str:
    """A network capacity given in Mbps, in Gbps from 1000 on.

    >>> capacity(10000.0), capacity(12500), capacity(450.0), capacity(0.5), capacity(None)
    ('10 Gbps', '12.5 Gbps', '450 Mbps', '0.5 Mbps', '–')
    """
    if _missing(mbps):
        return "–"
    mbps = float(mbps)
    return f"{mbps / 1000:g} Gbps" if mbps >= 1000 else f"{mbps:g} Mbps"


@register.filter
def gib(value) -> str:
    """Memory given in GiB.

    >>> gib(16.0), gib(0.5), gib(None)
    ('16 GiB', '0.5 GiB', '–')
    """
    if _missing(value):
        return "–"
    return f"{float(value):g} GiB"


@register.filter
def megabytes(value) -> str:
    """Memory given in MB, as MB or GB.

    >>> megabytes(612.4), megabytes(2048), megabytes(None)
    ('612 MB', '2.0 GB', '–')
    """
    if _missing(value):
        return "–"
    value = float(value)
    return f"{value / 1024:.1f} GB" if value >= 1024 else f"{value:.0f} MB"


@register.filter
def duration(seconds) -> str:
    """Elapsed seconds as `42 s`, `3 min 05 s` or `2 h 07 min`.

    >>> duration(42.4), duration(185), duration(7620), duration(None)
    ('42 s', '3 min 05 s', '2 h 07 min', '–')
    """
    if _missing(seconds):
        return "–"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _query_url(query, anchor: str = "", **changes) -> str:
    """The current query string with `changes` applied (None removes a key), and an #anchor."""
    params = query.copy()
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = str(value)
    return f"?{params.urlencode()}" + (f"#{anchor}" if anchor else "")


@register.inclusion_tag("fc2/_pager.html", takes_context=True)
def pager(context, page, param: str = "page", anchor: str = "") -> dict:
    """Newer/older links for `page` that change only `param` in the current query string (other lists on the same
    page keep their filters and pages)."""
    query = context["request"].GET
    return {
        "page": page,
        "previous_url": _query_url(query, anchor, **{param: page.previous_page_number()})
        if page.has_previous()
        else None,
        "next_url": _query_url(query, anchor, **{param: page.next_page_number()}) if page.has_next() else None,
        "label": anchor or "results",
    }


@register.inclusion_tag("fc2/_chips.html", takes_context=True)
def filter_chips(context, param: str, choices, current: str, page_param: str, anchor: str, label: str) -> dict:
    """One link per choice (values, or (value, label) pairs) setting `param`, and "all" clearing it; each goes back
    to the first page of its list (`page_param`) and leaves the page's other lists as they are."""
    query = context["request"].GET
    pairs = [c if isinstance(c, list | tuple) else (c, c) for c in choices]
    return {
        "label": label,
        "chips": [
            {"text": text, "url": _query_url(query, anchor, **{param: value or None, page_param: None}),
             "on": value == current}
            for value, text in [("", "all"), *pairs]
        ],
    }  # fmt: skip
