"""What the predictor's fit and cross-validation cost, cold and warm, on the grids the recommender answers from.

For each grid: the constructed grid in the unseen grid's shape (Anwar's 114 rows: 1–4 workers × 6 batch sizes × 6
latencies, one machine at 0 ms only; benchmarks/model_calibration.py's `in_unseen_shape`), the constructed grid
itself and the lab's two measured grids. Cold: the first predictor this process builds (its imports done, nothing
memoised), as a fresh server's first predicted answer pays it; warm: the same rebuilt with the memos cleared (the
median of five); each in wall-clock and CPU seconds (the CPU's are what a busy shared machine does not inflate);
memo: the answer again with the memo kept (what every later request of the same records pays).

    .venv/bin/python benchmarks/predictor_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from benchmarks.model_calibration import CONSTRUCTED_GRID, DATA_DIR, in_unseen_shape, read_grid  # noqa: E402
from recommender.perfmodel import predictor  # noqa: E402

_predictor = sys.modules["recommender.perfmodel.predictor"]._predictor
_fit = sys.modules["recommender.perfmodel.fitting"]._fit


def _clear() -> None:
    _predictor.cache_clear()
    _fit.cache_clear()


def _seconds(records) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one predictor built (the CPU's: what a shared machine's load does not inflate)."""
    start, cpu = time.perf_counter(), time.process_time()
    predictor(records)
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    constructed = read_grid(CONSTRUCTED_GRID, "anwar2021")
    grids = {
        "anwar2021 constructed, unseen shape": in_unseen_shape(constructed),
        "anwar2021 constructed": constructed,
        "lab-digits-grid (all-reduce)": read_grid(DATA_DIR / "lab-digits-grid.csv", "csv"),
        "lab-digits-ps-grid (PS)": read_grid(DATA_DIR / "lab-digits-ps-grid.csv", "csv"),
    }
    print(f"{'grid':38} {'rows':>5} {'cold s':>7} {'cpu s':>6} {'warm s':>7} {'cpu s':>6} {'memo ms':>8}  mean")
    for name, records in grids.items():
        _clear()
        cold, cold_cpu = _seconds(records)
        warm = []
        for _ in range(5):
            _clear()
            warm.append(_seconds(records))
        memo, _ = _seconds(records)
        warm_s, warm_cpu = (statistics.median(column) for column in zip(*warm, strict=True))
        fitted = predictor(records).model
        mean = fitted.family if fitted else "the runs' mean"
        print(
            f"{name:38} {len(records):5} {cold:7.3f} {cold_cpu:6.3f} {warm_s:7.3f} {warm_cpu:6.3f} {memo * 1e3:8.3f}"
            f"  {mean}"
        )


if __name__ == "__main__":
    main()
