"""Importing performance records from files (DESIGN.md's `import_perf_data` contract).

Every row is parsed and checked before anything is written; a bad row is a PerfDataError with its line number and
nothing of the file is imported. A figure is checked against its physical bound (recommender/bounds.py), the same
rule every other door and every answer applies. Records are imported as the platform's (every user's answers read
them) unless an owner is given. Re-importing the same file for the same owner replaces its earlier records
(idempotent).

A row's shape is a pydantic model (AnwarRow, CsvRow). An empty field is an absent one: it takes the field's default
(None: not measured, or a failed run's missing time), or is refused as required when the field has none.
"""

from __future__ import annotations

import csv
import hashlib
import io
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from common.columns import max_length
from recommender import service
from recommender.bounds import BOUNDS
from recommender.models import PerformanceRecord
from recommender.types import ALL_REDUCE_STRATEGIES, key_conflict, key_framework

if TYPE_CHECKING:
    from django.contrib.auth.models import User

FORMATS = ("anwar2021", "csv")
DEFAULT_ANWAR_WORKLOAD = "anwar2021"
SAMPLES_DIR = Path(__file__).resolve().parent / "data"
SAMPLES_MANIFEST = SAMPLES_DIR / "samples.toml"


class PerfDataError(ValueError):
    """The file cannot be imported; the message names the line and the field."""


@dataclass(frozen=True)
class ImportResult:
    file: str  # the file's name
    workloads: tuple[str, ...]
    strategies: tuple[str, ...]  # the distribution strategies its records name ("" for none)
    imported: int  # rows stored, failed runs included
    failed_runs: int  # rows with no time (kept, counted, never used as a time)
    replaced: int  # records of an earlier import of the same file that were replaced
    owner: str  # whose records they are: a user's name, or "" for the platform's


class _Row(BaseModel):
    # NaN and ±inf are refused: a time or a bandwidth has to be a number the algorithms can compare.
    model_config = ConfigDict(allow_inf_nan=False, frozen=True)


def _bounded(name: str, default: Any = ...) -> Any:  # a FieldInfo, typed as pydantic's own Field is
    """A field bounded as recommender/bounds.py bounds the figure `name`: the one statement of what a record holds."""
    bound = BOUNDS[name]
    return Field(default, ge=bound.low, le=bound.high)


class AnwarRow(_Row):
    """One row of Anwar et al.'s Table 4; without the times it is a failed run (e.g. one machine out of memory)."""

    workers: int = _bounded("workers")
    batch_size: int = _bounded("batch_size")
    latency_ms: float = _bounded("latency_ms")
    step_time_s: float | None = _bounded("step_time_s", None)
    epoch_time_s: float | None = _bounded("epoch_time_s", None)
    loss: float | None = _bounded("loss", None)


class CsvRow(_Row):
    """One row of the `csv` format: a run, a failed run (no epoch time) or a bandwidth profile (no workers)."""

    workload: str = Field(max_length=max_length(PerformanceRecord, "workload"))
    instance_type: str = Field("", max_length=max_length(PerformanceRecord, "instance_type"))
    ps_type: str = Field("", max_length=max_length(PerformanceRecord, "ps_type"))
    workers: int | None = _bounded("workers", None)
    batch_size: int | None = _bounded("batch_size", None)
    latency_ms: float | None = _bounded("latency_ms", None)
    epoch_time_s: float | None = _bounded("epoch_time_s", None)
    bandwidth_mbps: float | None = _bounded("bandwidth_mbps", None)
    cpu_util: float | None = _bounded("cpu_util", None)
    strategy: Literal["", "ps", "mirrored", "ddp"] = ""  # ddp: PyTorch's all-reduce


ANWAR_COLUMNS = tuple(AnwarRow.model_fields)  # in the file's order
CSV_COLUMNS = tuple(CsvRow.model_fields)


def _validate(model: type[_Row], fields: dict[str, str], line: int) -> _Row:
    """The row as `model`, or a PerfDataError naming the line, the first bad field and why."""
    try:
        return model.model_validate({name: value for name, value in fields.items() if value != ""})
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        name = str(error["loc"][0])
        raise PerfDataError(f"line {line}: {name} {_reason(model.model_fields[name], error)}") from None


def _reason(field: FieldInfo, error: ErrorDetails) -> str:
    """pydantic's complaint about a field in the words of this module's messages."""
    got, context = error["input"], error.get("ctx", {})
    if isinstance(got, str) and len(got) > 40:  # (a 5,000-digit number is not echoed whole)
        got = f"{got[:37]}..."
    match error["type"]:
        case "missing":
            return "is required"
        case "int_parsing" | "int_from_float" | "int_parsing_size":
            return f"must be a whole number, got {got!r}"
        case "float_parsing":
            return f"must be a number, got {got!r}"
        case "finite_number":
            return f"must be a finite number, got {got!r}"
        case "greater_than_equal":
            return f"must be at least {_number(context['ge'])}, got {got!r}"
        case "less_than_equal":
            return f"must be at most {_number(context['le'])}, got {got!r}"
        case "string_too_long":
            return f"is longer than {context['max_length']} characters"
        case "literal_error":
            return f"must be {context['expected']}, got {got!r}"
    return f"{error['msg']}, got {got!r}"


def _number(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def to_csv(records: Iterable[PerformanceRecord]) -> str:
    """Records in the `csv` format, every column of CSV_COLUMNS (an absent value, or a failed run's time, empty):
    what `parse_csv` reads back, e.g. a `lab_sweep --csv` grid to ship in recommender/data/.

    >>> text = to_csv([PerformanceRecord(workload="w", workers=2, batch_size=64, latency_ms=20.0, epoch_time_s=4.5)])
    >>> text.splitlines()[1]
    'w,,,2,64,20.0,4.5,,,'
    >>> [(r.workers, r.latency_ms, r.epoch_time_s, r.cpu_util) for r in parse_csv(text)]
    [(2, 20.0, 4.5, None)]
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record in records:
        writer.writerow(["" if (value := getattr(record, name)) is None else value for name in CSV_COLUMNS])
    return out.getvalue()


def parse_anwar2021(text: str, workload: str) -> list[PerformanceRecord]:
    """Headerless rows `workers,batch_size,latency_ms,step_time_s,epoch_time_s,loss`; empty fields mark a failed run.

    >>> [(r.workers, r.batch_size, r.latency_ms, r.epoch_time_s) for r in parse_anwar2021("4,64000,0,,419,\\n", "w")]
    [(4, 64000, 0.0, 419.0)]
    >>> parse_anwar2021("1,64000,0,,,\\n", "w")[0].epoch_time_s is None  # a failed run, kept as such
    True
    """
    records = []
    for line, row in data_lines(text):
        if len(row) != len(ANWAR_COLUMNS):
            raise PerfDataError(
                f"line {line}: expected {len(ANWAR_COLUMNS)} fields ({','.join(ANWAR_COLUMNS)}), got {len(row)}"
            )
        fields = _validate(AnwarRow, dict(zip(ANWAR_COLUMNS, row, strict=True)), line)
        # All-reduce runs, named as the workload key's framework names its all-reduce (a PyTorch workload's: ddp).
        strategy = ALL_REDUCE_STRATEGIES[key_framework(workload)]
        records.append(PerformanceRecord(workload=workload, strategy=strategy, **fields.model_dump()))
    return records


def parse_csv(text: str, workload: str | None = None) -> list[PerformanceRecord]:
    """A header row naming columns of CSV_COLUMNS (any order, any subset with `workload` unless given).

    >>> [(r.workload, r.workers, r.bandwidth_mbps) for r in parse_csv("workers,bandwidth_mbps\\n,420\\n", "w")]
    [('w', None, 420.0)]
    """
    rows = data_lines(text)
    try:
        line, header = next(rows)
    except StopIteration:
        raise PerfDataError("the file is empty") from None
    header = [h.strip().lower() for h in header]
    unknown = [h for h in header if h not in CSV_COLUMNS]
    if unknown:
        raise PerfDataError(f"line {line}: unknown column(s) {', '.join(unknown)} (known: {', '.join(CSV_COLUMNS)})")
    if len(set(header)) != len(header):
        raise PerfDataError(f"line {line}: a column appears twice in the header")
    if "workload" not in header and not workload:
        raise PerfDataError(f"line {line}: no workload column (or give --workload)")
    records = []
    for line, row in rows:
        if len(row) != len(header):
            raise PerfDataError(f"line {line}: expected {len(header)} fields, got {len(row)}")
        fields = dict(zip(header, row, strict=True)) | ({"workload": workload} if workload else {})
        valid = _validate(CsvRow, fields, line).model_dump()
        if valid["strategy"] and (reason := key_conflict(valid["workload"], valid["strategy"])):
            raise PerfDataError(f"line {line}: {reason}")
        records.append(PerformanceRecord(**valid))
    return records


def data_lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, stripped fields) of every non-blank, non-comment line of a grid file: what both formats'
    parsers read, and what tells them apart (benchmarks/explore.py's grid_format).

    >>> list(data_lines("# a grid\\n\\n2, 64 ,0\\n"))
    [(3, ['2', '64', '0'])]
    """
    for line, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        fields = [field.strip() for field in row]
        if not any(fields) or fields[0].startswith("#"):
            continue
        yield line, fields


def import_file(path: Path, fmt: str, workload: str | None = None, owner: User | None = None) -> ImportResult:
    """Import the file's records as `owner`'s (a user: only their answers read them), else as the platform's (every
    user's answers read them: an operator's import, the shipped samples). Re-importing the same file for the same
    owner replaces what it imported before, and nothing of anyone else's."""
    if fmt not in FORMATS:
        raise PerfDataError(f"unknown format {fmt!r} (expected {' or '.join(FORMATS)})")
    try:
        data = path.read_bytes()
        text = data.decode("utf-8-sig")
    except OSError as exc:
        raise PerfDataError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise PerfDataError(f"{path} is not UTF-8 text") from None
    try:
        records = (
            parse_anwar2021(text, workload or DEFAULT_ANWAR_WORKLOAD)
            if fmt == "anwar2021"
            else parse_csv(text, workload)
        )
    except csv.Error as exc:
        raise PerfDataError(f"not valid CSV: {exc}") from exc
    if not records:
        raise PerfDataError(f"{path} has no data rows")
    origin = f"{path.name} sha256:{hashlib.sha256(data).hexdigest()[:16]}"
    for record in records:
        record.origin = origin
        record.source = PerformanceRecord.Source.IMPORTED
        record.owner = owner
    with transaction.atomic():
        earlier = PerformanceRecord.objects.filter(origin=origin, source=PerformanceRecord.Source.IMPORTED, owner=owner)
        replaced, _ = earlier.delete()
        PerformanceRecord.objects.bulk_create(records)
        service.forget()  # (bulk_create sends no signal)
    return ImportResult(
        file=path.name,
        workloads=tuple(sorted({r.workload for r in records})),
        strategies=tuple(sorted({r.strategy for r in records})),
        imported=len(records),
        failed_runs=sum(r.failed for r in records),
        replaced=replaced,
        owner="" if owner is None else owner.get_username(),
    )


def import_samples(manifest: Path = SAMPLES_MANIFEST) -> list[ImportResult]:
    """Import every sample grid `manifest` lists (files beside it); idempotent, as each import replaces its earlier
    records. A manifest entry that is wrong is a PerfDataError naming it, before anything is imported."""
    try:
        entries = tomllib.loads(manifest.read_text()).get("sample", [])
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PerfDataError(f"cannot read the sample manifest {manifest}: {exc}") from exc
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry.get("file"), str) or entry.get("format") not in FORMATS:
            raise PerfDataError(f"{manifest.name}: sample {number} needs a file and a format ({' or '.join(FORMATS)})")
    return [import_file(manifest.parent / e["file"], e["format"], e.get("workload")) for e in entries]
