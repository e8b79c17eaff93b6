"""The residual model: scikit-learn's GaussianProcessRegressor on the log residuals of the mean — its inputs
(standardised log n, log B, latency, the worker type one-hot), its kernel (C·Matérn-5/2, no length scale shorter than
the runs can tell), its noise (each configuration's repeats as `alpha`, a WhiteKernel where nothing ran twice), and
its likelihood search (`n_restarts_optimizer` with a fixed `random_state`). No custom kernel, no custom optimiser."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel

from recommender.perfmodel.guards import Point

RESTARTS = 1  # the likelihood searched again from one random start (n_restarts_optimizer)
SEED = 0


def latent(gp: GaussianProcessRegressor, std: float) -> float:
    """The process's own standard deviation at a point: predict's, less the white noise where the kernel has it."""
    white = gp.kernel_.k2.noise_level if isinstance(gp.kernel_.k2, WhiteKernel) else 0.0
    return math.sqrt(max(std**2 - white, 0.0))


def inputs(
    rows: Sequence[Point], batch_ref: float | None, center: np.ndarray, scale: np.ndarray, types: tuple[str, ...]
) -> np.ndarray:
    """The process's inputs: standardised (log n, log B, l), and the worker type one-hot where there are several."""
    numbers = np.array(
        [[math.log(n), math.log(b or batch_ref or 1.0), lat] for _, n, b, lat in rows], dtype=float
    ).reshape(-1, 3)
    columns = [(numbers - center) / scale]
    if types:
        columns.append(np.array([[t == u for u in types] for t, *_ in rows], dtype=float))
    return np.hstack(columns)


def run_noise(runs: dict) -> float | None:
    """A run's noise from the repeats: the pooled standard deviation of log time within each repeated configuration
    (None: no configuration ran twice)."""
    repeated = [np.log(times) for times in runs.values() if len(times) > 1]
    if not repeated:
        return None
    squares = sum(float(np.sum((t - t.mean()) ** 2)) for t in repeated)
    return math.sqrt(squares / sum(len(t) - 1 for t in repeated))


def length_scale_bounds(inputs: np.ndarray) -> np.ndarray:
    """Each input's length scale from a tenth of its spread to a hundred spreads, and no shorter than the gap between
    its two closest measured values: the runs cannot tell a shorter one (Betancourt, "Robust Gaussian processes in
    Stan", 2017), and with one the process drops the runs' residuals a step past them.

    >>> length_scale_bounds(np.array([[0.0, 5.0, 1.0], [0.5, 5.0, 2.0], [2.0, 5.0, 4.0]]))[:, 0].tolist()
    [0.5, 0.1, 1.0]
    """
    bounds = np.tile([0.1, 100.0], (inputs.shape[1], 1))
    for i in range(min(3, inputs.shape[1])):  # the numbers; the worker types' one-hot columns follow
        gaps = np.diff(np.unique(inputs[:, i].round(9)))
        if len(gaps):
            bounds[i, 0] = min(max(bounds[i, 0], float(gaps.min())), bounds[i, 1])
    return bounds


def own_noise(runs: dict, pooled: float | None) -> dict:
    """Each configuration's noise: the standard deviation of its repeats' log times, the pooled one where it ran once
    (on the lab two runs of a 0 ms cell differ by 20 %, of a 20 or 40 ms cell by 0.5 %: one figure fits neither)."""
    return {row: float(np.std(np.log(t), ddof=1)) if len(t) > 1 else pooled for row, t in runs.items()}


def fit(
    inputs: np.ndarray, residuals: np.ndarray, variance: np.ndarray | None, kernel: Kernel | None
) -> GaussianProcessRegressor:
    """scikit-learn's process on the configurations' mean residuals: its kernel's hyper-parameters by maximum
    marginal likelihood (or `kernel`'s, fixed). variance: each configuration's mean's, from its repeats (alpha);
    without any repeat (None), a WhiteKernel learns the noise."""
    fixed = kernel is not None and kernel.n_dims == 1 + inputs.shape[1] + (variance is None)
    if not fixed:  # (a fold whose runs lost a worker type or every repeat fits its own)
        bounds = length_scale_bounds(inputs)
        kernel = ConstantKernel(0.01, (1e-4, 1e2)) * Matern(np.maximum(bounds[:, 0], 1.0), bounds, nu=2.5)
        if variance is None:
            kernel += WhiteKernel(1e-3, (1e-6, 1.0))
    alpha = (0.0 if variance is None else variance) + 1e-10
    gp = GaussianProcessRegressor(
        kernel,
        alpha=alpha,
        optimizer=None if fixed else "fmin_l_bfgs_b",
        n_restarts_optimizer=RESTARTS,
        random_state=SEED,
    )
    with warnings.catch_warnings():
        # A hyper-parameter at its bound is an answer (e.g. a residual that does not vary), not a failure.
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gp.fit(inputs, residuals)
