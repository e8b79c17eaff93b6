"""The admin dashboard's numbers: every job with its duration and cost computed in SQL, and the aggregates over them.

Duration and cost are database annotations (not Python properties) so that the job table can sort by them and the
totals and charts can sum them without loading the rows. Each function that reads the database runs one query,
however many jobs there are. The cost is the job page's (`pricing.cost_summary`'s `cost_so_far`, `Job.cost_between`)
written in SQL: its cluster's and its profiling runs', each at its own $/h.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from django.db import NotSupportedError
from django.db.models import (
    Count,
    DateTimeField,
    Expression,
    F,
    FloatField,
    Func,
    OrderBy,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.functions import Cast, Coalesce, TruncWeek
from django.utils import timezone

from fc2 import query
from fc2.models import Job, ReapedCluster

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler, _AsSqlType
    from django_stubs_ext import WithAnnotations

    class Spend(TypedDict):
        """What with_spend annotates."""

        elapsed_s: float  # s; NULL (None) for a job that never started, as the plugin does not say
        cost: Any  # $ (a Coalesce, which the plugin does not type); NULL for a job that cost nothing


Spent: TypeAlias = "QuerySet[WithAnnotations[Job, Spend]]"  # jobs as with_spend annotates them

# Big JSON columns no dashboard list shows: not worth reading and decoding 50 times a page.
UNSHOWN_FIELDS = ("cluster", "recommendation", "parameters", "metrics", "worker_types", "token_hash")

# sort key in the URL -> what it orders by (the annotations `elapsed_s` and `cost` come from `with_spend`).
SORTS = {
    "id": "pk",
    "created": "created_at",
    "finished": "finished_at",
    "state": "state",
    "user": "owner__username",
    "provider": "provider",
    "cluster": "workers",
    "duration": "elapsed_s",
    "cost": "cost",
}
DEFAULT_SORT = "-created"
# Sort keys whose value may be missing; the others are NOT NULL columns, ordered plainly so an index can serve them
# (PostgreSQL will not walk a btree backwards for a DESC NULLS LAST it was not built with).
NULLABLE_SORTS = {"finished", "duration", "cost"}


class SecondsBetween(Func):
    """Seconds from the first datetime to the second, as a float: `end - start` in SQL on SQLite and PostgreSQL.

    Django's own datetime difference is a DurationField (an interval on PostgreSQL, microseconds on SQLite) that
    cannot be multiplied by a price on both engines, so this spells the two out: julianday() counts days on SQLite
    (to the millisecond); EXTRACT(EPOCH FROM interval) counts seconds on PostgreSQL (to the microsecond). NULL in,
    NULL out.
    """

    arity = 2
    output_field = FloatField()

    def __init__(self, start: Expression | str, end: Expression | str, **extra: Any) -> None:
        super().__init__(end, start, **extra)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, *args: Any, **extra: Any) -> _AsSqlType:
        raise NotSupportedError(f"SecondsBetween is written for SQLite and PostgreSQL, not {connection.vendor}")

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> _AsSqlType:
        template = "EXTRACT(EPOCH FROM (%(expressions)s))::double precision"
        return super().as_sql(compiler, connection, template=template, arg_joiner=" - ", **extra_context)

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> _AsSqlType:
        # julianday() keeps milliseconds; rounding to them drops the float noise of subtracting two ~2.46e6-day values.
        template = "ROUND((julianday(%(expressions)s)) * 86400.0, 3)"
        return super().as_sql(compiler, connection, template=template, arg_joiner=") - julianday(", **extra_context)


class SpansCost(Func):
    """$ of a job's spans in a list of them — its profiling runs (`Job.profiling_runs`) or a spot job's cluster's
    rates (`Job.rates`), each {"hourly_cost", "started_at", "ended_at"} — in SQL, by `Job.cost_between`'s rule: each
    span's $/h over the time it was up, to its end, else its job's teardown, else `now`. NULL for a job with none."""

    output_field = FloatField()
    POSTGRESQL = (
        "(SELECT SUM((fc2_run->>'hourly_cost')::double precision * GREATEST(0, EXTRACT(EPOCH FROM ("
        "COALESCE((fc2_run->>'ended_at')::timestamptz, %(end)s, %(now)s) - (fc2_run->>'started_at')::timestamptz"
        "))::double precision)) / 3600.0 FROM jsonb_array_elements(%(runs)s) AS fc2_run)"
    )
    SQLITE = (
        "(SELECT SUM(json_extract(fc2_run.value, '$.hourly_cost') * MAX(0, ROUND((julianday(COALESCE("
        "json_extract(fc2_run.value, '$.ended_at'), %(end)s, %(now)s)) - julianday(json_extract(fc2_run.value, "
        "'$.started_at'))) * 86400.0, 3))) / 3600.0 FROM json_each(%(runs)s) AS fc2_run)"
    )

    def __init__(self, spans: str, now: dt.datetime, **extra: Any) -> None:
        super().__init__(F(spans), F("torn_down_at"), Value(now, output_field=DateTimeField()), **extra)

    def _sql(self, template: str, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> _AsSqlType:
        (runs, runs_params), (end, end_params), (now, now_params) = (
            compiler.compile(expression) for expression in self.get_source_expressions()
        )
        # Each placeholder's parameters in the order the template uses them.
        return template % {"end": end, "now": now, "runs": runs}, (*end_params, *now_params, *runs_params)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, *args: Any, **extra: Any) -> _AsSqlType:
        raise NotSupportedError(f"SpansCost is written for SQLite and PostgreSQL, not {connection.vendor}")

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> _AsSqlType:
        return self._sql(self.POSTGRESQL, compiler, connection)

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> _AsSqlType:
        return self._sql(self.SQLITE, compiler, connection)


def with_spend(queryset: QuerySet[Job], now: dt.datetime) -> Spent:
    """Annotate `elapsed_s` (started → finished, or → `now` while it runs) and `cost` ($ = hourly_cost × the hours
    its cluster was up — launched → torn down, or → `now` while it is up; a spot job's at each of its rates over its
    span — plus its profiling runs': `SpansCost`).

    Same rules as `Job.duration_s` / `Job.cost_so_far`: a job that never started has no duration, one whose cluster
    was never launched and that profiled nothing no cost (NULL), and so adds nothing to any sum.
    """
    at_now = Value(now, output_field=DateTimeField())
    up_s = SecondsBetween("launched_at", Coalesce("torn_down_at", at_now))
    cluster = Coalesce(SpansCost("rates", now), Cast("hourly_cost", FloatField()) * up_s / Value(3600.0))
    profiling = SpansCost("profiling_runs", now)
    return queryset.annotate(
        elapsed_s=SecondsBetween("started_at", Coalesce("finished_at", at_now)),
        cost=Coalesce(cluster + Coalesce(profiling, Value(0.0)), profiling),
    )


@dataclass(frozen=True)
class JobFilters:
    """What the admin narrowed the job table (and its totals and charts) to; empty means everything."""

    state: str = ""  # a Job.State, or "active" for any state that has not ended
    provider: str = ""
    user: str = ""  # username
    created_from: dt.date | None = None
    created_to: dt.date | None = None  # inclusive: the whole day
    search: str = ""  # a username, words of a failure reason, or a job id ("42" or "#42")


def filtered_jobs(filters: JobFilters, now: dt.datetime) -> Spent:
    """Every user's jobs that pass `filters`, with their owner and their `elapsed_s` and `cost` annotations."""
    queryset = Job.objects.select_related("owner").defer(*UNSHOWN_FIELDS)
    if filters.state == "active":
        queryset = queryset.filter(state__in=Job.ACTIVE)
    elif filters.state:
        queryset = queryset.filter(state=filters.state)
    if filters.provider:
        queryset = queryset.filter(provider=filters.provider)
    if filters.user:
        queryset = queryset.filter(owner__username=filters.user)
    if filters.created_from:
        queryset = queryset.filter(created_at__gte=_start_of(filters.created_from))
    if filters.created_to and filters.created_to < dt.date.max:  # (no day follows the last: nothing to leave out)
        queryset = queryset.filter(created_at__lt=_start_of(filters.created_to + dt.timedelta(days=1)))
    search = filters.search.strip()
    if search:
        match = Q(owner__username__icontains=search) | Q(failure_reason__icontains=search)
        if (job_id := query.as_id(search.removeprefix("#"))) is not None:
            match |= Q(pk=job_id)
        queryset = queryset.filter(match)
    return with_spend(queryset, now)


def _start_of(day: dt.date) -> dt.datetime:
    return timezone.make_aware(dt.datetime.combine(day, dt.time.min))


def sort_jobs(queryset: Spent, sort: str) -> Spent:
    """Order by a SORTS key ("-key" for descending); jobs without a value (no cost yet) come last either way."""
    key = sort.removeprefix("-")
    if key not in SORTS:
        raise ValueError(f"unknown sort {sort!r} (expected one of {', '.join(SORTS)}, optionally with a leading -)")
    order = OrderBy(F(SORTS[key]), descending=sort.startswith("-"), nulls_last=key in NULLABLE_SORTS or None)
    return queryset.order_by(order, "-pk")  # ties broken by id, so that pages never overlap


def totals(queryset: Spent) -> dict:
    """How many jobs, how many failed, and their summed running time (seconds) and cost (one query)."""
    # Aggregate names must differ from the annotations they sum, or Django reads the alias as a column.
    result = queryset.aggregate(
        jobs=Count("pk"),
        failed=Count("pk", filter=Q(state=Job.State.FAILED)),
        total_seconds=Sum("elapsed_s"),
        total_cost=Sum("cost"),
    )
    return {
        "jobs": result["jobs"],
        "failed": result["failed"],
        "seconds": result["total_seconds"] or 0.0,
        "cost": result["total_cost"] or 0.0,
    }


def running_clusters(now: dt.datetime, limit: int = 10) -> list[Job]:
    """Jobs that hold a cluster right now, the most expensive first."""
    holding = Job.objects.filter(state__in=Job.ACTIVE, cluster__isnull=False).select_related("owner")
    queryset = with_spend(holding.defer(*UNSHOWN_FIELDS), now)
    return list(queryset.order_by(OrderBy(F("hourly_cost"), descending=True, nulls_last=True), "-pk")[:limit])


def burn() -> dict:
    """How many clusters are up and what they cost per hour, all together (one query)."""
    result = Job.objects.filter(state__in=Job.ACTIVE, cluster__isnull=False).aggregate(
        clusters=Count("pk"), hourly_cost=Sum("hourly_cost")
    )
    return {"clusters": result["clusters"], "hourly_cost": float(result["hourly_cost"] or 0)}


def recent_failures(limit: int = 10) -> list[Job]:
    """The latest failed jobs, with their reasons.

    Failing sets finished_at (`Job.transition`); asking for it to be there also lets both engines order the same way
    and PostgreSQL read the newest straight from the (state, -finished_at) index.
    """
    queryset = Job.objects.filter(state=Job.State.FAILED, finished_at__isnull=False)
    return list(queryset.select_related("owner").defer(*UNSHOWN_FIELDS).order_by("-finished_at", "-pk")[:limit])


def recent_reapings(limit: int = 10) -> list[ReapedCluster]:
    """The leftover clusters removed last (fc2.services.sweep.reap), with what each had."""
    return list(ReapedCluster.objects.all()[:limit])


# Spend in the charts' data keeps six decimals: a local run's estimate is fractions of a cent, and cents would draw it
# as nothing.
SPEND_DIGITS = 6


def spend_by_user(queryset: Spent, total: float, top: int = 12) -> list[dict]:
    """[{"user", "cost"}] for the `top` spenders, then everyone else as one "others" row (from `total`)."""
    rows = (
        queryset.filter(cost__isnull=False)
        .order_by()
        .values("owner__username")
        .annotate(spent=Sum("cost"))
        .order_by("-spent", "owner__username")[:top]
    )
    result = [{"user": row["owner__username"], "cost": round(row["spent"], SPEND_DIGITS)} for row in rows]
    others = total - sum(row["cost"] for row in result)
    if len(result) == top and round(others, SPEND_DIGITS) > 0:
        result.append({"user": "others", "cost": round(others, SPEND_DIGITS)})
    return result


def spend_by_week(queryset: Spent) -> list[dict]:
    """[{"week": Monday as ISO date, "cost"}] from the first to the last week with spend, weeks with none at 0.

    A job's cost counts in the week its cluster was launched, or, for one that only profiled (it ended before its
    cluster), the week it was submitted.
    """
    rows = (
        queryset.filter(cost__isnull=False)
        .order_by()
        .annotate(week=TruncWeekUTC(Coalesce("launched_at", "created_at")))
        .values("week")
        .annotate(spent=Sum("cost"))
        .order_by("week")
    )
    spent = {_as_date(row["week"]): row["spent"] for row in rows}
    if not spent:
        return []
    weeks, week = [], min(spent)
    while week <= max(spent):
        weeks.append({"week": week.isoformat(), "cost": round(spent.get(week, 0.0), SPEND_DIGITS)})
        week += dt.timedelta(weeks=1)
    return weeks


class TruncWeekUTC(TruncWeek):
    """TruncWeek that SQLite computes with its own date functions (Django's generic SQLite version calls back into
    Python for every row: ~70 ms over 10,000 jobs). Same answer: the Monday 00:00 on or before, in UTC."""

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> _AsSqlType:
        if self.get_tzname() not in (None, "UTC"):
            return super().as_sqlite(compiler, connection, **extra_context)
        sql, params = compiler.compile(self.lhs)
        return f"datetime({sql}, 'start of day', '-6 days', 'weekday 1')", params


def _as_date(value: dt.datetime | dt.date) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value
