"""The frozen judging grid: a seeded synthetic grid, generated once (2026-11-28) and committed as
recommender/data/frozen-judging-grid.csv, that no commit tunes on — the predictor is judged on it
(benchmarks/model_calibration.py prints it apart, with its noise-free times) and it is never loaded as sample data.
Do not change this formula, its constants or its seed: a grid that moves with the code judges nothing.

A data-parallel job through one parameter server, one worker type, 1–6 workers × batch sizes 32–256 (per worker) ×
latencies 0–40 ms, two runs a cell, each × exp(N(0, 0.06²)):

    t = T0 + (D / (n·B)) · (c·B + 2·l + n·M / bw(n))        bw(n) = BW for n ≤ 5, BW / 3 from 6 workers on

T0 = 2 s of start-up, D = 60,000 samples an epoch, c = 2 ms a sample, 2·l one round trip to the PS a step, M = 4 MB
of gradients each worker sends a step through the PS's link of BW = 125 MB/s (1 Gbps). From six workers the link
collapses to a third (TCP incast: many senders overflow the switch buffer at once) — a cliff one more worker falls
off, which no run of fewer workers foretells: at batch size 32 and 0 ms five workers take 86 s an epoch and six 202 s.

    .venv/bin/python benchmarks/frozen_grid.py      # (re)writes the CSV; it is committed, so this changes nothing
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

FROZEN_GRID = Path(__file__).resolve().parent.parent / "recommender" / "data" / "frozen-judging-grid.csv"
FROZEN_MARK = "# FROZEN, FOR JUDGING ONLY, NOT LOADED"
WORKLOAD = "frozen-judging"
WORKER, PS = "judge-w", "judge-ps"
WORKERS = (1, 2, 3, 4, 5, 6)
BATCH_SIZES = (32, 64, 128, 256)
LATENCIES_MS = (0, 10, 20, 40)
REPEATS = 2
SIGMA = 0.06
SEED = 20261128
T0_S, SAMPLES, SAMPLE_S, GRADIENT_MB, BANDWIDTH_MB_S, INCAST_FROM = 2.0, 60_000, 0.002, 4.0, 125.0, 6


def frozen_epoch_time(workers: int, batch: int, latency_ms: float) -> float:
    """The grid's noise-free epoch time (module docstring)."""
    bandwidth = BANDWIDTH_MB_S if workers < INCAST_FROM else BANDWIDTH_MB_S / 3
    step = SAMPLE_S * batch + 2 * latency_ms / 1000 + workers * GRADIENT_MB / bandwidth
    return T0_S + SAMPLES / (workers * batch) * step


def rows() -> list[tuple[int, int, int, float]]:
    """(workers, batch size, latency ms, epoch time s) of every run, noise seeded."""
    rng = np.random.default_rng(SEED)
    return [
        (n, b, lat, frozen_epoch_time(n, b, lat) * math.exp(rng.normal(0.0, SIGMA)))
        for n in WORKERS
        for b in BATCH_SIZES
        for lat in LATENCIES_MS
        for _ in range(REPEATS)
    ]


def write() -> None:
    lines = [
        f"{FROZEN_MARK}: a seeded synthetic grid (benchmarks/frozen_grid.py), never tuned on; the network saturates "
        "from 6 workers",
        "workload,instance_type,ps_type,workers,batch_size,latency_ms,epoch_time_s,bandwidth_mbps,cpu_util,strategy",
    ]
    lines += [f"{WORKLOAD},{WORKER},{PS},{n},{b},{lat},{t:.4f},,,ps" for n, b, lat, t in rows()]
    FROZEN_GRID.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write()
