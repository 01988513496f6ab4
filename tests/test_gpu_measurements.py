"""The cost model against what one H100 measured (docs/measured/, docs/gpu_measurements.md):
the bundled trainer's activations, peaks and per-layer times, the GPU profile's GEMM
constants against the GEMM kernels, FSDP2's copies against their kernels, and what calibration
makes of the trainer runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from autoconfig.calibrate.micro_batches import step_line
from autoconfig.cost.timing import wave_utilization
from autoconfig.measure.calibrate import Trial, fit_trials
from autoconfig.spec import catalog
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.prediction import predicted

MEASURED = Path(__file__).resolve().parents[1] / "docs" / "measured"
PROFILE = "h100-sxm-80gb"


# The set of one-GPU runs, and four of them again on a later machine start with the trainer as
# it stands after the ZeRO-0 change (reduction held to the last micro-batch).
TRAINER_RUNS = ["h100_trainer_runs.json", "h100_trainer_runs_head_check.json"]


def _runs(names: list[str] = TRAINER_RUNS) -> list[dict]:
    runs = [r for name in names for r in json.loads((MEASURED / name).read_text())["runs"]]
    # torch.compile fuses the casts and norms the eager trainer runs; the model describes eager
    return [r for r in runs if not r["config"].get("compile")]


def _predicted(run: dict) -> dict:
    return predicted(TrainConfig.model_validate(run["config"]), PROFILE, "cuda")


def _kernel_rows() -> list[dict]:
    return json.loads((MEASURED / "h100_kernels.json").read_text())["rows"]


@pytest.mark.parametrize("run", [r for r in _runs() if r["saved_activation_bytes_per_layer"]])
def test_a_layers_activations_under_autocast_match_the_h100(run: dict) -> None:
    pred = _predicted(run)["act_bytes_per_layer"]
    assert pred == pytest.approx(run["saved_activation_bytes_per_layer"], rel=0.02)


@pytest.mark.parametrize("run", [r for r in _runs() if r["status"] == "ok"])
def test_the_trainers_peak_memory_on_the_h100(run: dict) -> None:
    assert _predicted(run)["pred_peak_mem_gib"] == pytest.approx(run["peak_allocated_gib"], rel=0.1)


@pytest.mark.parametrize("run", [r for r in _runs() if r["slice_forward_ms"]])
def test_one_layers_forward_and_backward_time_on_the_h100(run: dict) -> None:
    """One llama3-70b layer at tp 4 and tp 8 shapes, timed from the measured kernel tables
    with the trainer's eager RMSNorm counted as the passes it makes (cost.layer.
    eager_norm_passes): within 10% of what the trainer ran. Counted as one fused kernel, the
    layer came out 13-25% fast."""
    pred = _predicted(run)
    for part in ("forward", "backward"):
        assert pred[f"layer_{part}_s"] * 1e3 == pytest.approx(run[f"slice_{part}_ms"], rel=0.1)


@pytest.mark.parametrize("run", [r for r in _runs() if r["status"] == "ok"])
def test_the_trainers_steps_on_the_h100_are_predicted_within_10_percent(run: dict) -> None:
    """Trainer steps on one H100 (gpt3-1.3b, llama3-8b on 4 layers, one-layer slices of
    llama3-70b), with the shipped constants and the measured kernel tables: within 10% of the
    measured tokens/s."""
    pred = _predicted(run)["pred_tokens_per_s_per_gpu"]
    assert pred == pytest.approx(run["tokens_per_s_per_gpu"], rel=0.1)


def _gemm_efficiencies(fp8: bool) -> list[float]:
    """What each measured GEMM at a layer's shape ran at, as the profile's `gemm` (or
    `gemm_fp8`) constant counts it: a fraction of peak once its output tiles' waves are
    accounted for."""
    gpu = catalog.get_gpu(PROFILE)
    peak = gpu.peak("fp8" if fp8 else "bf16")
    out = []
    for row in _kernel_rows():
        if row["kind"] != "gemm" or "square" in row["label"]:
            continue
        if row["label"].startswith("fp8") != fp8:
            continue
        tokens, _, n = (float(v) for v in row["shape"].split("x"))
        util = float(wave_utilization(np.array(tokens), np.array(n), np.array(float(gpu.sms))))
        out.append(row["measured"] / (peak * util))
    return out


def test_the_h100_gemm_constants_are_what_its_gemm_kernels_run_at() -> None:
    eff = catalog.get_gpu(PROFILE).efficiency
    bf16, fp8 = _gemm_efficiencies(fp8=False), _gemm_efficiencies(fp8=True)
    assert len(bf16) >= 20 and len(fp8) >= 2
    assert statistics.median(bf16) == pytest.approx(eff.gemm, rel=0.15)
    assert statistics.median(fp8) == pytest.approx(eff.gemm_fp8, rel=0.15)


def test_calibrating_on_the_h100_trainer_runs_keeps_gemm_where_the_kernels_are() -> None:
    trials = [
        Trial(
            i, TrainConfig.model_validate(r["config"] | {"gpu": PROFILE}), r["tokens_per_s_per_gpu"]
        )
        for i, r in enumerate(_runs(TRAINER_RUNS[:1]))  # the six docs/gpu_measurements.md fits
        if r["status"] == "ok"
    ]
    calibration = fit_trials(trials)
    assert not calibration.refused
    kernels = _gemm_efficiencies(fp8=False)
    gemm = calibration.constants.get("gemm", catalog.get_gpu(PROFILE).efficiency.gemm)
    assert min(kernels) <= gemm <= max(kernels)
    assert calibration.heldout_after < calibration.heldout_before


RUNS_OF_MICRO_BATCHES = [
    "h100_micro_batch_runs.json",
    "h100_micro_batch_runs_second.json",
    "h100_micro_batch_runs_third.json",  # the Llama family alone, after the ZeRO-0 change
]


def _micro_batch_families(name: str) -> dict[str, list[tuple[TrainConfig, dict]]]:
    """One recording of scripts/bench_trainer_gpu.py --cases micro-batches by family: one model
    and global batch cut into 1 to 16 micro-batches (the case name before ' mbs')."""
    runs = json.loads((MEASURED / name).read_text())["runs"]
    families: dict[str, list[tuple[TrainConfig, dict]]] = {}
    for run in runs:
        cfg = TrainConfig.model_validate(run["config"])
        families.setdefault(run["case"].rsplit(" mbs", 1)[0], []).append((cfg, run))
    return families


@pytest.mark.parametrize(
    "name, family",
    [(name, family) for name in RUNS_OF_MICRO_BATCHES for family in _micro_batch_families(name)],
)
def test_what_a_micro_batch_costs_the_trainer_on_the_h100(name: str, family: str) -> None:
    """The same tokens cut into more micro-batches take longer by what each micro-batch costs
    whatever its size: in the eager trainer, casting each weight gradient to fp32 and adding it
    to `.grad`. Micro-batches of fewer than 4,096 tokens are left out: there the trainer's
    kernel launches, which the model does not describe, weigh in and vary between runs."""
    points = [
        (cfg.micro_batches, run["median_step_time_s"], _predicted(run)["pred_step_time_s"])
        for cfg, run in _micro_batch_families(name)[family]
        if cfg.mbs * cfg.seq(cfg.trained_spec()) >= 4096
    ]
    micro, measured, model = (np.array(v, float) for v in zip(*points, strict=True))
    assert len(micro) >= 3
    (measured_slope, _), (model_slope, _) = step_line(micro, measured), step_line(micro, model)
    # the model moves the gradients at the profile's fitted `memory` (0.5 of HBM); the cast and
    # add kernels run at 0.69-0.81 (h100_kernels.json), so it may charge up to 1.6x
    assert 0.6 * measured_slope <= model_slope <= 1.6 * measured_slope
    assert list(np.argsort(model)) == list(np.argsort(measured))


@pytest.mark.parametrize(
    "cfg, run",
    [
        pair
        for name in RUNS_OF_MICRO_BATCHES
        for v in _micro_batch_families(name).values()
        for pair in v
    ],
)
def test_the_micro_batch_runs_peak_memory_on_the_h100(cfg: TrainConfig, run: dict) -> None:
    assert _predicted(run)["pred_peak_mem_gib"] == pytest.approx(run["peak_allocated_gib"], rel=0.1)


def test_fsdp2s_copies_cost_what_the_h100_measured() -> None:
    """ZeRO-3 copies out two gathers and copies in one reduction a micro-batch: the model's
    charge for them on a llama3-8b rank over 8 (one micro-batch, FSDP's copies on against off)
    is within 25% of the time the H100 took for the same bytes a parameter."""
    from helpers import make_inputs

    from autoconfig.cost.timing import step_time

    rows = json.loads((MEASURED / "h100_kernels_fsdp_copies.json").read_text())["rows"]
    by_label = {r["label"]: r for r in rows}
    out = by_label["FSDP2 all-gather copy-out, bf16"]
    into = by_label["FSDP2 reduce-scatter copy-in, bf16 to fp32"]
    params = out["measured"] * 1e12 * out["median_ms"] / 1e3 / 4  # bytes moved, 4 a parameter
    measured_s_per_param = (2 * out["median_ms"] + into["median_ms"]) / 1e3 / params
    layout = {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "gbs": 8, "zero": 3}
    spec = catalog.get_model("llama3-8b")
    on = step_time(make_inputs("llama3-8b", PROFILE, fsdp_copies=1.0, **layout))
    off = step_time(make_inputs("llama3-8b", PROFILE, **layout))
    charged_s_per_param = float(on.compute - off.compute) / spec.param_count()
    assert charged_s_per_param == pytest.approx(measured_s_per_param, rel=0.25)


# -- one H200 (2026-11-28): the same runs on another chip, and what a step costs whatever its size

H200_PROFILE = "h200-sxm-141gb"
H200_RUNS = [
    "h200_trainer_runs.json",
    "h200_trainer_runs_slices.json",
    "h200_trainer_runs_second.json",  # gpt3-2.7b without recompute, a second machine start
]
H200_FIXED_COST = "h200_fixed_cost_runs.json"


def _h200_predicted(run: dict) -> dict:
    return predicted(TrainConfig.model_validate(run["config"]), H200_PROFILE, "cuda")


def _h200_runs() -> list[dict]:
    return [r for r in _runs([*H200_RUNS, H200_FIXED_COST]) if r["status"] == "ok"]


def test_the_trainers_steps_on_the_h200_are_predicted_within_10_percent_but_one() -> None:
    """Fourteen runs on one H200, none of which any constant was fitted to: the median error
    at most 3%, and every run within 10% but gpt3-2.7b with selective recompute, predicted
    11% fast and held within 12%. Without recompute the same run is 7.9% fast: the trainer's
    checkpointed attention core cost 40 ms a step measured, 17 ms modelled, and SDPA at its
    80-wide heads ran at 0.96 of the h200 table against the 1.10 the model carries from the
    H100 (docs/gpu_measurements.md)."""
    errors = {}
    for run in _h200_runs():
        pred = _h200_predicted(run)["pred_tokens_per_s_per_gpu"]
        errors[run["case"]] = abs(pred / run["tokens_per_s_per_gpu"] - 1.0)
    assert len(errors) == 14
    assert statistics.median(errors.values()) <= 0.03
    worst = max(errors, key=errors.__getitem__)
    assert worst == "gpt3-2.7b mbs4 selective" and errors[worst] <= 0.12
    assert all(e <= 0.1 for case, e in errors.items() if case != worst)


@pytest.mark.parametrize("run", [r for r in _runs(H200_RUNS) if r["slice_forward_ms"]])
def test_one_layers_forward_and_backward_time_on_the_h200(run: dict) -> None:
    """The llama3-70b slices' layers on the H200, from the h200 tables and the eager norm's
    passes: within 10% (2-5% fast; counted as one fused kernel, 12-25% fast)."""
    pred = _h200_predicted(run)
    for part in ("forward", "backward"):
        assert pred[f"layer_{part}_s"] * 1e3 == pytest.approx(run[f"slice_{part}_ms"], rel=0.1)


def _fixed_cost_families() -> dict[str, list[tuple[float, float, float]]]:
    families: dict[str, list[tuple[float, float, float]]] = {}
    for run in _runs([H200_FIXED_COST]):
        cfg = TrainConfig.model_validate(run["config"])
        point = (
            float(cfg.micro_batches),
            run["median_step_time_s"],
            _h200_predicted(run)["pred_step_time_s"],
        )
        families.setdefault(run["case"].rsplit(" gbs", 1)[0], []).append(point)
    return families


@pytest.mark.parametrize("family", list(_fixed_cost_families()))
def test_what_a_trainer_step_costs_whatever_its_size_on_the_h200(family: str) -> None:
    """1 to 8 micro-batches a step: the line through the step times meets zero micro-batches
    at the optimizer's passes (measured -0.9 ms for a 70B two-layer slice, 10.3 ms for
    gpt3-1.3b) and the model's line within 5 ms of it (with the profile's fitted 50 ms step
    overhead it was 53 and 57 ms); each micro-batch's cost within 5%."""
    points = _fixed_cost_families()[family]
    micro, measured, model = (np.array(v, float) for v in zip(*points, strict=True))
    assert len(micro) >= 3
    slope, intercept = np.polyfit(micro, measured, 1)
    model_slope, model_intercept = np.polyfit(micro, model, 1)
    assert abs(model_intercept - intercept) <= 0.005
    assert model_slope == pytest.approx(slope, rel=0.05)


@pytest.mark.parametrize(
    "name, profile", [("h100_kernels.json", PROFILE), ("h200_kernels.json", H200_PROFILE)]
)
def test_the_trainers_eager_rmsnorm_costs_what_it_measured(name: str, profile: str) -> None:
    """The trainer's RMSNorm forward over 8192 x 8192 fp32 elements, as the model charges it
    (a fused kernel's 2 passes and the eager ops' 5 more, at the profile's memory share) within
    20% of the kernel bench's time for it; one fused kernel's charge alone would be 3.5x short."""
    from autoconfig.cost.layer import EAGER_NORM_BYTES

    rows = json.loads((MEASURED / name).read_text())["rows"]
    norm = next(r for r in rows if r["label"].startswith("RMSNorm forward, eager fp32"))
    gpu = catalog.get_gpu(profile)
    elements = 8192.0 * 8192.0
    bandwidth = gpu.memory_tb_s * 1e12 * gpu.efficiency.memory
    charged_ms = EAGER_NORM_BYTES[4.0][0] * elements / bandwidth * 1e3
    assert charged_ms == pytest.approx(norm["median_ms"], rel=0.2)


def test_the_trainers_eager_rmsnorm_backward_costs_what_it_measured() -> None:
    """Its backward (both gradients) on the H200's second start: 19 passes charged, within
    20% of the 1.70 ms it took; a fused kernel's 4 would be 4.75x short."""
    from autoconfig.cost.layer import EAGER_NORM_BYTES

    rows = json.loads((MEASURED / "h200_kernels_second.json").read_text())["rows"]
    norm = next(r for r in rows if r["label"].startswith("RMSNorm backward, eager fp32"))
    gpu = catalog.get_gpu(H200_PROFILE)
    bandwidth = gpu.memory_tb_s * 1e12 * gpu.efficiency.memory
    charged_ms = EAGER_NORM_BYTES[4.0][1] * 8192.0 * 8192.0 / bandwidth * 1e3
    assert charged_ms == pytest.approx(norm["median_ms"], rel=0.2)


def test_the_bench_script_tabulates_recorded_runs_with_no_gpu() -> None:
    """`bench_trainer_gpu.py --recorded` sets the cost model beside runs recorded earlier and
    fits each fixed-cost family's line: the H200's slice family meets zero micro-batches at
    -0.9 ms measured."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_trainer_gpu.py"
    done = subprocess.run(
        [sys.executable, str(script), "--recorded", str(MEASURED / H200_FIXED_COST)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("llama3-70b slice tp8 gbs") for line in lines) == 4
    family = next(line for line in lines if line.startswith("llama3-70b slice tp8 |"))
    measured_ms = float(family.split("|")[1].split("/")[0])
    assert measured_ms == pytest.approx(-0.9, abs=0.05)
