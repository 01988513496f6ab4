"""The training phase of an RL step, from the training cost model (autoconfig.cost.evaluate on
inputs from autoconfig.columns.build, as `autoconfig estimate` builds them): the policy update
on every generated sequence, the forward-only log-prob passes, and PPO's critic.

- Policy update: one pass over the step's `prompts x samples` sequences with the trainer's
  layout, Megatron-Core's behaviour (NeMo-RL's training backend for the published runs),
  ZeRO-1 (the distributed optimizer). The sequences are packed (NeMo-RL and verl pack
  variable-length rollouts), read as sequences of the mean length, prompt + mean response:
  the tokens trained are exact; attention, quadratic in length, is under-counted for the long
  ones (an assumption that errs fast). Several optimizer steps per RL step (NeMo-RL's T-GBS
  under G-GBS) cost the same tokens, so one pass is timed.
- Activation recompute: none or full, the faster that fits (the least memory when neither
  fits); `fits` says which.
- Log-probs: each forward pass over the same tokens costs a third of a training step (forward
  1x, backward 2x the FLOPs: Narayanan et al. 2021, Sec. 5.1), applied to the whole step's
  time. GRPO and DAPO run two: the old policy and the frozen reference (KL penalty); PPO runs
  those plus the critic's values and the reward model's score (each the critic's size when
  not given).
- Critic (PPO): one more training step of the critic's shape on the same GPUs and layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from autoconfig.columns import frameworks
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import evaluate
from autoconfig.cost.inputs import busiest_rank_layers
from autoconfig.rl.job import Job, TrainLayout
from autoconfig.spec import catalog, layout
from autoconfig.spec.schema import ModelSpec

FRAMEWORK = "megatron"
FORWARD_SHARE = 1.0 / 3.0  # a forward pass's share of a training step (1 of 1 + 2)


@dataclass(frozen=True)
class Update:
    """The training phase of one step on one trainer layout."""

    layout: TrainLayout
    update_s: float  # the policy's training step
    logprob_s: float  # forward-only passes (old policy, reference, critic values, reward)
    critic_s: float  # PPO's critic training step (0 otherwise)
    recompute: str
    peak_mem_gib: float
    state_gib: float  # gradients and optimizer state per GPU (what colocation offloads)
    fits: bool

    @property
    def seconds(self) -> float:
        return self.update_s + self.logprob_s + self.critic_s


def _frame(model: ModelSpec, layouts: list[TrainLayout], gpus: int) -> pd.DataFrame:
    rows: list[Mapping[str, Any]] = []
    for lay in layouts:
        for recompute in ("none", "full"):
            dp = max(gpus // lay.model_parallel, 1)
            held = int(
                busiest_rank_layers(*(np.asarray(v, float) for v in (model.layers, lay.pp, 1)))
            )
            rows.append(
                {
                    "dp": dp,
                    "tp": lay.tp,
                    "pp": lay.pp,
                    "vp": 1,
                    "cp": lay.cp,
                    "ep": lay.ep,
                    "etp": 1,
                    "sp": lay.tp > 1,
                    "mbs": 1,
                    "recompute": recompute,
                    "recompute_layers": held if recompute == "full" else 0,
                    "zero": 1,
                    "optimizer_state": "fp32",  # the framework's default Adam state
                    "offload": "none",  # nothing kept in host memory
                    "hybrid_cp": False,  # static context parallelism
                    "activation_offload": False,
                }
            )
    return layout.frame_of(rows)


def _steps(job: Job, model: ModelSpec, layouts: list[TrainLayout], gpus: int) -> pd.DataFrame:
    """Training-model predictions of every layout, with and without full recompute."""
    frame = _frame(model, layouts, gpus)
    fw = catalog.get_framework(FRAMEWORK)
    precision = job.precision if job.gpu.supports(job.precision) else "bf16"
    does = frameworks.behaviour(fw, precision, 1.0)
    seq = float(job.prompt_tokens + job.lengths.mean_tokens)
    # The batch in whole sequences per data-parallel rank: a rank short of one pads it.
    dp = frame["dp"].to_numpy(float)
    gbs = np.ceil(job.sequences / dp) * dp
    inputs = training_inputs(
        model, Hardware(job.gpu, job.cluster, precision), frame, gbs, seq, does
    )
    with np.errstate(all="ignore"):
        preds = evaluate(inputs)
    out = frame.assign(
        **{k: np.asarray(v, float) for k, v in preds.items() if k.startswith(("pred_", "mem_"))}
    )
    return out


def updates(job: Job, layouts: list[TrainLayout], gpus: int) -> list[Update]:
    """The training phase of each trainer layout on `gpus` GPUs."""
    actor = _steps(job, job.model, layouts, gpus)
    critic_model = job.critic or job.model
    critic = _steps(job, critic_model, layouts, gpus) if job.algorithm.has_critic else None
    limit = job.gpu.memory_gib
    out = []
    for i, lay in enumerate(layouts):
        pair = actor.iloc[2 * i : 2 * i + 2]
        fits = pair["pred_peak_mem_gib"].to_numpy() <= limit
        times = pair["pred_step_time_s"].to_numpy()
        pick = (
            int(np.argmin(np.where(fits, times, np.inf)))
            if fits.any()
            else int(np.argmin(pair["pred_peak_mem_gib"].to_numpy()))
        )
        row = pair.iloc[pick]
        update_s = float(row["pred_step_time_s"])
        forwards = 2.0 if job.reference else 1.0
        critic_s = 0.0
        logprob_s = forwards * FORWARD_SHARE * update_s
        if critic is not None:
            critic_row = critic.iloc[2 * i + pick]
            critic_s = float(critic_row["pred_step_time_s"])
            # the critic's values and the reward model's score, each a forward of its size
            logprob_s += 2.0 * FORWARD_SHARE * critic_s
        state = float(row["mem_gradients_gib"] + row["mem_optimizer_gib"])
        out.append(
            Update(
                lay,
                update_s,
                logprob_s,
                critic_s,
                str(row["recompute"]),
                float(row["pred_peak_mem_gib"]),
                state,
                bool(fits[pick]),
            )
        )
    return out
