"""The cost model's view of trainer runs: the inputs of a run as it was configured (the model
as trained, the layout, the GPU profile) and the predicted figures metrics.json shows beside
what was measured."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig import catalog, layout
from autoconfig.columns import Behaviour, Hardware, serving_inputs, training_inputs
from autoconfig.cost import CostInputs, evaluate
from autoconfig.cost.inference import evaluate_serving
from autoconfig.trainer.config import TrainConfig
from autoconfig.vocab import KvPrecision, ServePrecision

DEFAULT_PROFILE = "h100-sxm-80gb"  # for memory parts when no GPU ran (CPU runs)


def _plain(preds: dict, prefixes: tuple[str, ...]) -> dict:
    return {k: float(np.asarray(v).ravel()[0]) for k, v in preds.items() if k.startswith(prefixes)}


def predicted_serving(cfg: TrainConfig, profile: str | None) -> dict:
    """The serving model's figures for a generation run."""
    gpu = catalog.get_gpu(profile or "cpu-gloo")
    # The generator runs bf16 on GPU and fp32 on CPU unless told otherwise.
    bf16 = (profile and cfg.precision != "fp32") or cfg.precision == "bf16"
    weights = ServePrecision.BF16 if bf16 else ServePrecision.FP32
    deployment = pd.DataFrame(
        {
            "tp": [cfg.tp],
            "pp": [cfg.pp],
            "batch_size": [cfg.mbs],
            "input_len": [cfg.input_len],
            "output_len": [cfg.output_len],
            "replicas": [1],
            "precision": [weights.value],
            "kv_precision": [KvPrecision.AUTO.resolve(weights).value],
        }
    )
    with np.errstate(all="ignore"):
        preds = evaluate_serving(serving_inputs(cfg.spec(), (gpu, gpu.cluster), deployment))
    return _plain(preds, ("pred_", "mem_", "time_"))


def training_inputs_of_runs(configs: list[TrainConfig], profiles: list[str]) -> CostInputs:
    """The cost model's inputs for trainer runs: the model as trained (slice shapes in slice
    mode), the layout that ran, on the given GPU profiles."""
    specs = [cfg.trained_spec() for cfg in configs]
    gpus = [catalog.get_gpu(p) for p in profiles]
    dims = []
    for cfg in configs:
        d = layout.plain(cfg.model_dump())
        dims.append(d | {"tp": 1, "sp": False} if cfg.slice else d)
    return training_inputs(
        specs,
        [Hardware(g, g.cluster) for g in gpus],
        layout.frame_of(dims),
        np.array([cfg.global_batch for cfg in configs], float),
        np.array([cfg.seq(s) for cfg, s in zip(configs, specs, strict=True)], float),
        Behaviour(sp_saves_gathered=1.0),  # DTensor SP keeps the all-gathered inputs
    )


def predicted(cfg: TrainConfig, profile: str | None) -> dict | None:
    """The cost model's figures for this run (on CPU only the memory parts mean anything)."""
    try:
        if cfg.task == "generate":
            return predicted_serving(cfg, profile)
        inputs = training_inputs_of_runs([cfg], [profile or DEFAULT_PROFILE])
        with np.errstate(all="ignore"):
            out = _plain(evaluate(inputs), ("pred_", "mem_", "time_", "act_"))
    except Exception as exc:  # a prediction must never cost the measurement
        return {"error": str(exc)}
    out["gpu_profile"] = profile or f"{DEFAULT_PROFILE} (no GPU: memory parts only)"
    return out
