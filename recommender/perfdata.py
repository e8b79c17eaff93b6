"""Importing performance records from files (DESIGN.md's `import_perf_data` contract).

Every row is parsed and checked before anything is written; a bad row is an ImportError_ with its line number and
nothing of the file is imported. Re-importing the same file replaces its earlier records (idempotent).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from recommender.models import PerformanceRecord

ANWAR_COLUMNS = ("workers", "batch_size", "latency_ms", "step_time_s", "epoch_time_s", "loss")
CSV_COLUMNS = (
    "workload",
    "instance_type",
    "ps_type",
    "workers",
    "batch_size",
    "latency_ms",
    "epoch_time_s",
    "bandwidth_mbps",
    "cpu_util",
    "strategy",
)
FORMATS = ("anwar2021", "csv")
DEFAULT_ANWAR_WORKLOAD = "anwar2021"
SAMPLES_DIR = Path(__file__).resolve().parent / "data"
SAMPLES_MANIFEST = SAMPLES_DIR / "samples.toml"


class PerfDataError(ValueError):
    """The file cannot be imported; the message names the line and the field."""


@dataclass(frozen=True)
class ImportResult:
    workloads: tuple[str, ...]
    imported: int  # rows stored, failed runs included
    failed_runs: int  # rows with no time (kept, counted, never used as a time)
    replaced: int  # records of an earlier import of the same file that were replaced


def _int(value: str, field: str, line: int, minimum: int = 1) -> int | None:
    if value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        try:
            as_float = float(value)
        except ValueError:
            raise PerfDataError(f"line {line}: {field} must be a whole number, got {value!r}") from None
        if not as_float.is_integer():
            raise PerfDataError(f"line {line}: {field} must be a whole number, got {value!r}") from None
        number = int(as_float)
    if number < minimum:
        raise PerfDataError(f"line {line}: {field} must be at least {minimum}, got {value!r}")
    return number


def _float(value: str, field: str, line: int, positive: bool = False, maximum: float | None = None) -> float | None:
    if value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise PerfDataError(f"line {line}: {field} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise PerfDataError(f"line {line}: {field} must be a {'positive' if positive else 'non-negative'} number")
    if maximum is not None and number > maximum:
        raise PerfDataError(f"line {line}: {field} must be at most {maximum}, got {value!r}")
    return number


def _text(value: str, field: str, line: int, limit: int) -> str:
    if len(value) > limit:
        raise PerfDataError(f"line {line}: {field} is longer than {limit} characters")
    return value


def parse_anwar2021(text: str, workload: str) -> list[PerformanceRecord]:
    """Headerless rows `workers,batch_size,latency_ms,step_time_s,epoch_time_s,loss`; empty fields mark a failed run.

    >>> [(r.workers, r.batch_size, r.latency_ms, r.epoch_time_s) for r in parse_anwar2021("4,64000,0,,419,\\n", "w")]
    [(4, 64000, 0.0, 419.0)]
    """
    records = []
    for line, row in _rows(text):
        if len(row) != len(ANWAR_COLUMNS):
            raise PerfDataError(
                f"line {line}: expected {len(ANWAR_COLUMNS)} fields ({','.join(ANWAR_COLUMNS)}), got {len(row)}"
            )
        workers, batch, latency, step_time, epoch_time, loss = row
        records.append(
            PerformanceRecord(
                workload=workload,
                workers=_int(workers, "workers", line) or _missing("workers", line),
                batch_size=_int(batch, "batch_size", line) or _missing("batch_size", line),
                latency_ms=_float(latency, "latency_ms", line) if latency else _missing("latency_ms", line),
                step_time_s=_float(step_time, "step_time_s", line, positive=True),
                epoch_time_s=_float(epoch_time, "epoch_time_s", line, positive=True),
                loss=_float(loss, "loss", line),
                strategy="mirrored",
            )
        )
    return records


def _missing(field: str, line: int):
    raise PerfDataError(f"line {line}: {field} is required")


def parse_csv(text: str, workload: str | None = None) -> list[PerformanceRecord]:
    """A header row naming columns of CSV_COLUMNS (any order, any subset with `workload` unless given)."""
    rows = _rows(text)
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
        value = dict(zip(header, row, strict=True))
        name = workload or value.get("workload", "")
        if not name:
            raise PerfDataError(f"line {line}: workload is required")
        strategy = value.get("strategy", "")
        if strategy not in ("", "ps", "mirrored"):
            raise PerfDataError(f"line {line}: strategy must be 'ps', 'mirrored' or empty, got {strategy!r}")
        records.append(
            PerformanceRecord(
                workload=_text(name, "workload", line, 100),
                instance_type=_text(value.get("instance_type", ""), "instance_type", line, 40),
                ps_type=_text(value.get("ps_type", ""), "ps_type", line, 40),
                workers=_int(value.get("workers", ""), "workers", line),
                batch_size=_int(value.get("batch_size", ""), "batch_size", line),
                latency_ms=_float(value.get("latency_ms", ""), "latency_ms", line),
                epoch_time_s=_float(value.get("epoch_time_s", ""), "epoch_time_s", line, positive=True),
                bandwidth_mbps=_float(value.get("bandwidth_mbps", ""), "bandwidth_mbps", line, positive=True),
                cpu_util=_float(value.get("cpu_util", ""), "cpu_util", line, maximum=100),
                strategy=strategy,
            )
        )
    return records


def _rows(text: str):
    """(line number, stripped fields) of every non-blank, non-comment line."""
    for line, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        fields = [field.strip() for field in row]
        if not any(fields) or fields[0].startswith("#"):
            continue
        yield line, fields


def import_file(path: Path, fmt: str, workload: str | None = None) -> ImportResult:
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
    with transaction.atomic():
        replaced, _ = PerformanceRecord.objects.filter(origin=origin, source=PerformanceRecord.Source.IMPORTED).delete()
        PerformanceRecord.objects.bulk_create(records)
    return ImportResult(
        workloads=tuple(sorted({r.workload for r in records})),
        imported=len(records),
        failed_runs=sum(r.failed for r in records),
        replaced=replaced,
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
