"""The analytical cost model: memory, FLOPs and time as pure functions over arrays."""

from autoconfig.cost.evaluate import PREDICTION_COLUMNS, evaluate
from autoconfig.cost.inputs import CostInputs

__all__ = ["PREDICTION_COLUMNS", "CostInputs", "evaluate"]
