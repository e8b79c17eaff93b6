"""The performance model: epoch time t(n, B, l, type) per workload from its records — the fitted model as the mean, a
Gaussian process on its log residuals, every estimate with its uncertainty — and the `model` algorithm.

Pure numpy/scipy/scikit-learn over the shared dataclasses (recommender/types.py): no ORM, no Django.

By concern, each module's docstring saying what it owns:

- ``families`` — the model forms (Anwar eq. 5, Ernest), batch scalings, speed and loss modes, their design matrices,
  and the fitted `PerfModel` that predicts (`predict`, `predict_many`);
- ``fitting`` — `fit`: cross-validation, the choice of family and the final fit;
- ``guards`` — which configurations may be answered at all, and why not: pure functions run before the model;
- ``predictor`` — `predictor`: the epoch time of a configuration — its runs where it ran, else the fitted family
  corrected by scikit-learn's Gaussian process on its log residuals — with an 80 % interval, cross-validated;
- ``process`` — scikit-learn's Gaussian process on the mean's log residuals: its inputs, kernel, noise and search;
- ``conformal`` — calibration: the predictor held out axis by axis, and the split-conformal quantile that sets its
  interval's width;
- ``candidates`` — the configurations a request may be answered with (worker types, PS types, counts within the
  limit), each estimated;
- ``choice`` — `recommend_model` and `predict_fallback`: the one rule that chooses among the candidates (the upper
  end of the 80 % interval, α/β, within the budget; ties by price, then name), and the Pareto frontier;
- ``explanation`` — one sentence per pick and the details behind its "why", and the refusal when nothing can be
  estimated;
- ``calibration`` — `calibration_report` (the model's leave-one-group-out figures: Records page, `model_report`) and
  `holdout_report` (the predictor's against the model alone and plain interpolation: benchmarks/model_calibration.py).

Names with a leading underscore are shared between these modules only; callers use the names below.
"""

from recommender.perfmodel.calibration import calibration_report, holdout_report
from recommender.perfmodel.candidates import MAX_WORKERS_EVALUATED
from recommender.perfmodel.choice import choose, pareto_front, predict_fallback, recommend_model
from recommender.perfmodel.families import LOSSES, SCALINGS, SHAPES, SPEEDS, PerfModel
from recommender.perfmodel.fitting import FOLDS, GROUPINGS, LOO_LIMIT, MIN_GROUPS, MIN_RECORDS, PARSIMONY_MAPE, fit
from recommender.perfmodel.predictor import BASES, Estimate, PredictorModel, predictor

__all__ = [
    "BASES",
    "FOLDS",
    "GROUPINGS",
    "LOO_LIMIT",
    "LOSSES",
    "MAX_WORKERS_EVALUATED",
    "MIN_GROUPS",
    "MIN_RECORDS",
    "PARSIMONY_MAPE",
    "SCALINGS",
    "SHAPES",
    "SPEEDS",
    "Estimate",
    "PerfModel",
    "PredictorModel",
    "calibration_report",
    "choose",
    "fit",
    "holdout_report",
    "pareto_front",
    "predict_fallback",
    "predictor",
    "recommend_model",
]
