"""`autoconfig calibrate RUN`: refit the GPU profile's efficiency constants to what a measured
search measured, with the model's error before and after, and the calibrated profile (recording
what it was fitted on) for later searches' --profile. Rendering and writing are the caller's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
from scipy.linalg import qr

from autoconfig.base.errors import UserError
from autoconfig.calibrate.fit import TIME_PARAMS, fit_time, gemm_class, with_params
from autoconfig.cost.evaluate import evaluate
from autoconfig.cost.inputs import CostInputs
from autoconfig.measure.study import STUDY_NAME, exists, open_storage, storage_url
from autoconfig.spec import catalog, layout
from autoconfig.spec.schema import GPUSpec
from autoconfig.trainer.config import TrainConfig, load_config
from autoconfig.trainer.prediction import DEFAULT_PROFILE, training_inputs_of_runs

# What a handful of trials on one machine can pin down; the inter-node constants need trials
# that cross nodes and join the fit only then. Without `memory`, a machine whose memory-bound
# kernels run faster than the profile says pushes `gemm` up instead: six bundled-trainer runs
# on one H100 (docs/gpu_measurements.md) put it at 1.0 without, 0.73 with, where the GEMM
# kernels themselves run at a median 0.75 of peak (0.62-0.92) at those layers' shapes.
LOCAL_PARAMS = (
    "gemm",
    "attention",
    "memory",
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
    # no higher than the published-run fit allows: a device copy reaches 0.89 of an H100's HBM
    "memory": (0.01, 0.95),
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


# How far the prior is trusted against a trial: a profile's constant is believed within a
# factor e of its prior (PRIOR_SPREAD, in log units), a trial's timing within the scatter the
# trials show about a first fit (NOISE until then; at least MIN_NOISE, since timings of a few
# steps do not repeat better than ~1%). Each fitted constant adds a residual noise /
# PRIOR_SPREAD x its log-distance from the prior: moving a constant by a factor e costs as much
# as one trial off by the noise.
NOISE = 0.05
MIN_NOISE = 0.01
PRIOR_SPREAD = 1.0
# A constant is identifiable when the trials say more about it than the prior does: the part
# of its sensitivity (the change of the trials' log predictions per 100% change of it) that
# the constants already chosen do not explain, summed over the trials (the diagonal of the
# pivoted QR of the sensitivity matrix), is at least NOISE / PRIOR_SPREAD.
# A trial counts as an outlier (Cauchy loss) beyond a factor e off the fit, not 15% as for the
# published runs: an uncalibrated profile can be several times off every trial at once.
OUTLIER = 1.0
FOLDS = 5  # held-out check: leave-one-out up to FOLDS trials, then FOLDS folds


@dataclass
class Calibration:
    trials: list[Trial]
    base: GPUSpec
    constants: dict[str, float]  # the refitted ones (empty when the fit was refused)
    before: np.ndarray  # predicted tokens/s/GPU per trial
    after: np.ndarray
    prior: dict[str, float] = field(default_factory=dict)  # the base's value of each candidate
    effect: dict[str, float] = field(default_factory=dict)  # rms log change per 100% change
    held: dict[str, str] = field(default_factory=dict)  # constant -> why it kept its prior
    heldout_before: float = float("nan")  # median abs % error on trials a fit did not see
    heldout_after: float = float("nan")
    refused: str = ""  # why the fit was not kept ("" when it was)

    @property
    def measured(self) -> np.ndarray:
        return np.array([t.measured for t in self.trials], float)

    def error(self, predicted: np.ndarray) -> np.ndarray:
        return np.abs(predicted / self.measured - 1) * 100

    def moves(self) -> list[str]:
        """One line per constant: how far it moved and why, or why it kept its prior."""
        lines = []
        for name, value in sorted(self.constants.items()):
            old = self.prior[name]
            change = f"{100 * (value / old - 1):+.0f}%" if old else "from 0"
            lines.append(
                f"{name} {old:g} -> {value:.4g} ({change}): the trials identify it (a 100% "
                f"change moves their predictions {100 * self.effect[name]:.0f}% rms)"
            )
        for name, why in self.held.items():
            lines.append(f"{name} stays {self.prior[name]:g}: {why}")
        return lines

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
        refitted = ", ".join(sorted(self.constants)) or "none"
        eff["provenance"] = (
            f"fitted by autoconfig calibrate on {len(self.trials)} measured trials in {run_dir} "
            f"({models}; {min(worlds)}-{max(worlds)} ranks) on {time.strftime('%Y-%m-%d')}, "
            f"starting from {self.base.name}; refitted: {refitted}"
            + (f" (fit refused: {self.refused})" if self.refused else "")
            + f"; median absolute error of tokens/s/GPU {np.median(self.error(self.before)):.1f}% "
            f"before, {np.median(self.error(self.after)):.1f}% after; on held-out trials "
            f"{self.heldout_before:.1f}% before, {self.heldout_after:.1f}% after"
        )
        data["name"] = f"{self.base.name}-calibrated"
        return data


def calibrate(run: Path, storage: str | None = None) -> Calibration:
    """Refit to the successful trials of the measured search in `run`."""
    return fit_trials(measured_trials(Path(run), storage))


def _log_predictions(x: CostInputs, chip: str, values: dict[str, float], n: int) -> np.ndarray:
    xi = with_params(x, np.full(n, chip), gemm_class(x, n), {chip: values})
    with np.errstate(all="ignore"):
        tps = np.broadcast_to(evaluate(xi)["pred_tokens_per_s_per_gpu"], (n,))
    return np.log(np.maximum(tps.astype(float), 1e-12))


def _bounds(name: str) -> tuple[float, float]:
    return BOUNDS.get(name, TIME_PARAMS[name][2:])


def identify(
    x: CostInputs, n: int, chip: str, prior: dict[str, float], names: tuple[str, ...]
) -> tuple[list[str], dict[str, float], dict[str, str]]:
    """Which constants the trials can pin down: the ones whose sensitivity (the Jacobian of the
    trials' log predictions over each constant's relative change, at the prior) is large
    enough and not spanned by stronger ones. Returns the chosen names (strongest first), each
    candidate's effect and why the others keep their prior."""
    base = _log_predictions(x, chip, prior, n)
    columns = {}
    for name in names:
        hi = _bounds(name)[1]
        scale = max(abs(prior[name]), 0.01 * hi)
        step = 0.25 * scale if prior[name] + 0.25 * scale <= hi else -0.25 * scale
        moved = _log_predictions(x, chip, {**prior, name: prior[name] + step}, n)
        columns[name] = (moved - base) / (step / scale)
    effect = {k: float(np.sqrt(np.mean(c**2))) for k, c in columns.items()}
    enough = NOISE / PRIOR_SPREAD
    held = {
        k: f"the trials barely depend on it (a 100% change moves them {100 * e:.1f}% rms)"
        for k, e in effect.items()
        if e * np.sqrt(n) < enough
    }
    live = [k for k in names if k not in held]
    chosen: list[str] = []
    if live:
        jac = np.column_stack([columns[k] for k in live])
        _, r, order = qr(jac, mode="economic", pivoting=True)
        for i, j in enumerate(order):
            name = live[j]
            part = abs(r[i, i]) if i < min(r.shape) else 0.0
            if len(chosen) >= max(n - 1, 1):
                held[name] = f"{n} trials cannot pin more than {max(n - 1, 1)} constants"
            elif part < enough:
                alike = max(chosen, key=lambda k: abs(_cosine(columns[k], columns[name])))
                held[name] = (
                    f"the trials move it as they move {alike} (the rest moves them "
                    f"{100 * part / np.sqrt(n):.1f}% rms)"
                )
            else:
                chosen.append(name)
    return chosen, effect, held


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def _fit(
    x: CostInputs,
    chip: str,
    measured: np.ndarray,
    base: GPUSpec,
    names: list[str],
    noise: float = NOISE,
) -> dict[str, float]:
    """The chosen constants fitted to the finite entries of `measured`, pulled to the prior."""
    chips = np.full(len(measured), chip)
    weight = noise / PRIOR_SPREAD
    start = {chip: base.efficiency}
    fitted, _ = fit_time(x, chips, measured, start, tuple(names), BOUNDS, None, weight, OUTLIER)
    return fitted[chip]


def _folds(n: int) -> list[np.ndarray]:
    """Held-out trial sets: each trial alone up to FOLDS trials, else FOLDS interleaved folds."""
    k = min(n, FOLDS)
    return [np.arange(i, n, k) for i in range(k)]


def fit_trials(trials: list[Trial]) -> Calibration:
    """Refit the trials' GPU profile to what they measured: only the constants the trials can
    identify, pulled toward the profile's values, and kept only if trials held out of the fit
    are predicted better than by the profile as it was."""
    profiles = {t.profile for t in trials}
    if len(profiles) > 1:
        raise UserError(f"run: trials use several GPU profiles ({', '.join(sorted(profiles))})")
    base = catalog.get_gpu(profiles.pop())
    chip, n = base.chip, len(trials)
    worlds = np.array([t.config.world for t in trials])
    crosses = bool((worlds > base.cluster.gpus_per_node).any())
    candidates = LOCAL_PARAMS + NETWORK_PARAMS
    prior = {k: float(getattr(base.efficiency, k)) for k in candidates}
    x = training_inputs_of_runs([t.config for t in trials], [t.profile for t in trials])
    measured = np.array([t.measured for t in trials], float)
    names, effect, held = identify(x, n, chip, prior, candidates if crosses else LOCAL_PARAMS)
    if not crosses:
        for k in NETWORK_PARAMS:
            held[k] = "no trial crosses nodes"
    before = np.exp(_log_predictions(x, chip, prior, n))
    err_before = float(np.median(np.abs(before / measured - 1)) * 100)
    calibration = Calibration(
        trials, base, {}, before, before, prior, effect, held, err_before, err_before
    )
    if not names:
        return replace(calibration, refused="the trials identify no constant")
    if n < 2:
        return replace(calibration, refused="one trial leaves none to check a fit on")
    first = _log_predictions(x, chip, {**prior, **_fit(x, chip, measured, base, names)}, n)
    scatter = np.sqrt(np.sum((first - np.log(measured)) ** 2) / max(n - len(names), 1))
    noise = float(np.clip(scatter, MIN_NOISE, 1.0))
    held_out = np.full(n, np.nan)
    for fold in _folds(n):
        train = measured.copy()
        train[fold] = np.nan
        values = {**prior, **_fit(x, chip, train, base, names, noise)}
        held_out[fold] = np.exp(_log_predictions(x, chip, values, n))[fold]
    err_after = float(np.median(np.abs(held_out / measured - 1)) * 100)
    calibration = replace(calibration, heldout_after=err_after)
    if not err_after < err_before:
        return replace(
            calibration,
            refused=f"fits on part of the trials predicted the others worse ({err_after:.1f}% "
            f"median error) than the profile as it was ({err_before:.1f}%)",
        )
    constants = _fit(x, chip, measured, base, names, noise)
    after = np.exp(_log_predictions(x, chip, {**prior, **constants}, n))
    return replace(calibration, constants=constants, after=after)
