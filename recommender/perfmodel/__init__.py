"""The performance model: epoch time t(n, B, l, type) per workload from its records — the fitted model as the mean, a
Gaussian process on its log residuals, every estimate with its uncertainty — and the `model` algorithm.

Pure numpy/scipy/scikit-learn over the shared dataclasses (recommender/types.py): no ORM, no Django.

By concern, each module's docstring saying what it owns:

- ``families`` — the model forms (Anwar eq. 5, Ernest), batch scalings, speed and loss modes, their design matrices,
  and the fitted `PerfModel` that predicts (`predict`, `predict_many`);
- ``fitting`` — `fit`: cross-validation, the choice of family and the final fit;
- ``predictor`` — `predictor`: the epoch time of a configuration — its runs where it ran, else the fitted model
  corrected by a Gaussian process on its log residuals — with a standard deviation and 80 % interval, the whole
  predictor cross-validated, and the failed runs near it;
- ``choice`` — `recommend_model` and `predict_fallback`: candidates, the risk-aware α/β choice (each time judged by
  the upper end of its interval, or by its estimate where the workload's held-out choices show that better), the
  configurations the data cannot tell from it, and the Pareto frontier;
- ``explanation`` — the texts that explain a pick, and the refusal when nothing can be estimated;
- ``calibration`` — `calibration_report` (the model's leave-one-group-out figures: Records page, `model_report`) and
  `holdout_report` (the predictor's against the model alone and plain interpolation: benchmarks/model_calibration.py).

Names with a leading underscore are shared between these modules only; callers use the names below.
"""

from recommender.perfmodel.calibration import calibration_report, holdout_report
from recommender.perfmodel.choice import MAX_WORKERS_EVALUATED, pareto_front, predict_fallback, recommend_model
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
    "fit",
    "holdout_report",
    "pareto_front",
    "predict_fallback",
    "predictor",
    "recommend_model",
]
