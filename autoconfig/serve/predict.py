"""Serving predictions for a table of points (`autoconfig infer --runs`): input columns first,
then the pred_* columns, breakdowns and `error`. Static rows get the static-batch model
(cost/inference.py); continuous rows the max-load model (cost/max_load.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig.cost.inference import INFERENCE_COLUMNS, evaluate_serving
from autoconfig.cost.max_load import evaluate_max_load
from autoconfig.rows.serving import read_serving_rows
from autoconfig.rows.training import with_predictions


def predict_frame(points: pd.DataFrame) -> pd.DataFrame:
    """Predictions for every row; a row that cannot be predicted keeps blank predictions and
    its reason in `error`, and the others go on."""
    if points.empty:
        return points.assign(**{c: pd.Series(dtype=float) for c in INFERENCE_COLUMNS}, error="")
    points = points.reset_index(drop=True)
    rows = read_serving_rows(points)
    inputs = rows.inputs()
    with np.errstate(all="ignore"):
        static = pd.DataFrame(evaluate_serving(inputs))
        continuous = pd.DataFrame(evaluate_max_load(inputs))
    chosen = rows.continuous
    blank = np.full(len(points), np.nan, dtype=object)
    merged: dict[str, np.ndarray] = {}
    for col in dict.fromkeys([*static, *continuous]):
        # A static-only figure means nothing for a continuous row (its batch is the
        # runtime's), and a max-load figure nothing for a static row.
        ours = continuous[col].to_numpy(object) if col in continuous else blank
        theirs = static[col].to_numpy(object) if col in static else blank
        merged[col] = np.where(chosen, ours, theirs)
    frame = pd.DataFrame(merged).infer_objects()
    return with_predictions(points, frame.to_dict("series"), rows.errors)
