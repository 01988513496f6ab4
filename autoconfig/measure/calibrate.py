"""`autoconfig calibrate RUN`: refit the GPU profile's efficiency constants to what a measured
search measured, with the model's error before and after, and the calibrated profile (recording
what it was fitted on) for later searches' --profile. Rendering and writing are the caller's."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from autoconfig import catalog, layout
from autoconfig.cost.evaluate import evaluate
from autoconfig.errors import UserError
from autoconfig.fit import fit_time, gemm_class, with_params
from autoconfig.measure.study import STUDY_NAME, exists, open_storage, storage_url
from autoconfig.specs import GPUSpec
from autoconfig.trainer.config import TrainConfig, load_config
from autoconfig.trainer.prediction import DEFAULT_PROFILE, training_inputs_of_runs

# What a handful of trials on one machine can pin down; the inter-node constants need trials
# that cross nodes and join the fit only then.
LOCAL_PARAMS = (
    "gemm",
    "attention",
    "kernel_us",
    "intra_node_bus",
    "intra_node_latency_us",
    "step_overhead_ms",
)
NETWORK_PARAMS = ("inter_node_bus", "inter_node_latency_us")
# Wider than the published-run fit's ranges: CPU ranks over gloo are far slower than GPUs.
BOUNDS = {
    "kernel_us": (0.0, 5000.0),
    "intra_node_latency_us": (0.0, 20000.0),
    "inter_node_latency_us": (0.0, 20000.0),
    "step_overhead_ms": (0.0, 20000.0),
    "gemm": (0.01, 1.0),
    "attention": (0.01, 1.0),
    "intra_node_bus": (0.01, 1.0),
    "inter_node_bus": (0.01, 1.0),
}


@dataclass
class Trial:
    number: int
    config: TrainConfig
    measured: float  # tokens/s/GPU

    @property
    def profile(self) -> str:
        return self.config.gpu or DEFAULT_PROFILE


def measured_trials(run: Path, storage: str | None = None) -> list[Trial]:
    """The successful trials of a measured search, with the configuration each ran."""
    url = storage_url(run, storage)
    if storage is None and not (run / "study.db").exists():
        raise UserError(f"run: no measured search in '{run}' (no study.db)")
    store = open_storage(url)
    if not exists(store):
        raise UserError(f"run: no measured search in '{url}'")
    study = optuna.load_study(study_name=STUDY_NAME, storage=store)
    trials = [
        Trial(t.number, load_config(Path(t.user_attrs["run_dir"]) / "config.json"), t.value)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    ]
    if not trials:
        raise UserError(f"run: '{run}' has no successful trial to calibrate on")
    return trials


def predictions(trials: list[Trial], constants: dict[str, float] | None = None) -> np.ndarray:
    """Predicted tokens/s/GPU of each trial (with refitted constants, when given)."""
    x = training_inputs_of_runs([t.config for t in trials], [t.profile for t in trials])
    if constants:
        chip = catalog.get_gpu(trials[0].profile).chip
        n = len(trials)
        x = with_params(x, np.full(n, chip), gemm_class(x, n), {chip: constants})
    with np.errstate(all="ignore"):
        return np.broadcast_to(evaluate(x)["pred_tokens_per_s_per_gpu"], (len(trials),)).copy()


@dataclass
class Calibration:
    trials: list[Trial]
    base: GPUSpec
    constants: dict[str, float]  # the refitted ones
    before: np.ndarray  # predicted tokens/s/GPU per trial
    after: np.ndarray

    @property
    def measured(self) -> np.ndarray:
        return np.array([t.measured for t in self.trials], float)

    def error(self, predicted: np.ndarray) -> np.ndarray:
        return np.abs(predicted / self.measured - 1) * 100

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "trial": [f"trial-{t.number}" for t in self.trials],
                "layout": [layout.full_label(t.config.model_dump()) for t in self.trials],
                "measured": self.measured,
                "before": self.before,
                "after": self.after,
            }
        )

    def profile(self, run_dir: Path) -> dict:
        """The calibrated GPU profile (a copy of the base with the refitted constants)."""
        data = self.base.model_dump(mode="json")
        eff = data["efficiency"]
        for name, value in self.constants.items():
            eff[name] = round(float(value), 6)
        models = ", ".join(sorted({t.config.trained_spec().name for t in self.trials}))
        worlds = [t.config.world for t in self.trials]
        eff["provenance"] = (
            f"fitted by autoconfig calibrate on {len(self.trials)} measured trials in {run_dir} "
            f"({models}; {min(worlds)}-{max(worlds)} ranks) on {time.strftime('%Y-%m-%d')}, "
            f"starting from {self.base.name}; refitted: {', '.join(sorted(self.constants))}; "
            f"median absolute error of tokens/s/GPU {np.median(self.error(self.before)):.1f}% "
            f"before, {np.median(self.error(self.after)):.1f}% after"
        )
        data["name"] = f"{self.base.name}-calibrated"
        return data


def calibrate(run: Path, storage: str | None = None) -> Calibration:
    """Refit to the successful trials of the measured search in `run`."""
    return fit_trials(measured_trials(Path(run), storage))


def fit_trials(trials: list[Trial]) -> Calibration:
    """Refit the trials' GPU profile to what they measured."""
    profiles = {t.profile for t in trials}
    if len(profiles) > 1:
        raise UserError(f"run: trials use several GPU profiles ({', '.join(sorted(profiles))})")
    base = catalog.get_gpu(profiles.pop())
    worlds = np.array([t.config.world for t in trials])
    only = LOCAL_PARAMS + (NETWORK_PARAMS if (worlds > base.cluster.gpus_per_node).any() else ())
    x = training_inputs_of_runs([t.config for t in trials], [t.profile for t in trials])
    measured = np.array([t.measured for t in trials], float)
    chips = np.full(len(trials), base.chip)
    fitted, _ = fit_time(x, chips, measured, {base.chip: base.efficiency}, only, BOUNDS)
    constants = fitted[base.chip]
    calibration = Calibration(trials, base, constants, predictions(trials), np.zeros(0))
    return replace(calibration, after=predictions(trials, constants))
