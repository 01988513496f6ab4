"""Serving predictions for a table of points (`autoconfig infer --runs`): input columns first,
then the pred_* columns, breakdowns and `error`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig.cost.inference import INFERENCE_COLUMNS, evaluate_serving
from autoconfig.frame import with_predictions
from autoconfig.serve.frame import read_serving_rows


def predict_frame(points: pd.DataFrame) -> pd.DataFrame:
    """Predictions for every row; a row that cannot be predicted keeps blank predictions and
    its reason in `error`, and the others go on."""
    if points.empty:
        return points.assign(**{c: pd.Series(dtype=float) for c in INFERENCE_COLUMNS}, error="")
    points = points.reset_index(drop=True)
    rows = read_serving_rows(points)
    with np.errstate(all="ignore"):
        preds = evaluate_serving(rows.inputs())
    return with_predictions(points, preds, rows.errors)
