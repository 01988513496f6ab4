"""Published RL runs (rl_runs.csv columns, ../shared/reference/README.md): each row's model,
GPUs, placement and layouts read from its text, its step predicted, and the reason where a row
cannot be (a model or GPU the catalog lacks, a figure the source leaves out).

How the published text is read:
- placement: 'colocated...' is colocated, 'async (... k-step Off)' async with k steps of
  staleness, 'disaggregated...' lock-step on separate pools;
- train_layout: NeMo-RL's 'Training [TP,CP,EP,PP,VPP]=[...]'; a list longer than its header
  (NeMo-RL v0.5's Llama rows give 7 values for 5 names) is read by its first four values as
  TP, CP, EP, PP, and the row's `note` says so; 'FP8 generation + FP8 training' runs both in
  fp8;
- lengths: NeMo-RL's max_response_len is the total sequence limit (prompt + response), its
  mean the response's. The prompt is PROMPT_TOKENS long: the median over the NeMo-RL rows of
  tokens/s/GPU x GPUs x step time / rollouts - mean length (their own 'Total Tokens
  Processed' less the responses), 112 tokens;
- the engines' share of GPU memory: vLLM's default for every row. NeMo-RL's example config
  (0.6, autoconfig.rl.frameworks) cannot be what its published recipes ran: Qwen3-235B-A22B's
  bf16 weights at rollout tp 8 take 59 GB of each 80 GB H100, more than 0.6 of it, yet the
  async row ran; the recipes set their own share and the rows do not say it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.rl.job import Algorithm, Job, Placement, Plan, TrainLayout
from autoconfig.rl.lengths import ResponseLengths
from autoconfig.rl.step import estimate_steps
from autoconfig.spec import catalog
from autoconfig.spec.schema import ModelSpec

PROMPT_TOKENS = 112

# Published model names the catalog spells otherwise; None: a model the catalog lacks.
PUBLISHED_MODELS: dict[str, str | None] = {
    # RL trains no multi-token-prediction head (NeMo-RL loads the base layers only)
    "deepseek-v3 (671b moe)": "deepseek-v3-no-mtp",
    "llama-3.1-8b-instruct": "llama3-8b",
    "nemotron-3-nano-30b-a3b": "nemotron-3-nano",
    "qwen3-32b": "qwen3-32b",
}
# OpenRLHF's README names sizes, not checkpoints: the LLaMA 2 of that size where one exists;
# Meta released no 34B LLaMA 2, so 34B reads as Code Llama 34B, the LLaMA 2 family's one.
LLAMA2_SIZES = {"7b": "llama2-7b", "13b": "llama2-13b", "34b": "codellama-34b", "70b": "llama2-70b"}

OUTPUT_COLUMNS = (
    "pred_step_time_s",
    "pred_rollout_s",
    "pred_logprob_s",
    "pred_update_s",
    "pred_critic_s",
    "pred_sync_s",
    "pred_switch_s",
    "pred_tokens_per_s_per_gpu",
    "pred_fits",
    "ape_step_time",
    "note",
    "error",
)


def model_of(text: str) -> ModelSpec:
    """The catalog model a published name means, or a UserError saying the catalog lacks it."""
    name = str(text).strip()
    key = name.lower()
    if key in PUBLISHED_MODELS:
        known = PUBLISHED_MODELS[key]
        if known is None:
            raise UserError(f"model: {name} is not in the catalog")
        return catalog.get_model(known)
    family = re.match(r"llama-2-family (\d+b)", key)
    if family:
        size = family.group(1)
        if size not in LLAMA2_SIZES:
            raise UserError(f"model: no LLaMA-2-family {size.upper()} model in the catalog")
        return catalog.get_model(LLAMA2_SIZES[size])
    models = catalog.models()
    for candidate in (name, key, re.sub(r"\s*\(.*\)$", "", name)):
        if candidate in models:
            return models[candidate]
    raise UserError(f"model: {name} is not in the catalog")


def placement_of(text: str) -> tuple[Placement, int]:
    key = str(text).lower()
    if key.startswith("async"):
        found = re.search(r"(\d+)-step", key)
        return Placement.ASYNC, int(found.group(1)) if found else 1
    if key.startswith("colocated"):
        return Placement.COLOCATED, 0
    if key.startswith("disaggregated"):
        return Placement.DISAGGREGATED, 0
    raise UserError(f"placement: unknown placement '{text}'")


def layout_of(text: str) -> tuple[TrainLayout, str, str]:
    """(the trainer layout, precision, note) of NeMo-RL's layout text."""
    found = re.search(r"Training \[([A-Z,]+)\]=\[([^\]]*)\]", str(text))
    if not found:
        raise UserError(f"train_layout: no 'Training [..]=[..]' in '{text}'")
    names = found.group(1).split(",")
    values = found.group(2).split(",")
    note = ""
    if len(values) != len(names):
        note = (
            f"train_layout gives {len(values)} values for {len(names)} names; read the first "
            "four as TP, CP, EP, PP"
        )
        names = ["TP", "CP", "EP", "PP"]
    sizes = {}
    for name, value in zip(names, values, strict=False):
        value = value.strip()
        sizes[name] = int(value) if value.isdigit() else 1
    precision = "fp8" if "fp8 training" in str(text).lower() else "bf16"
    lay = TrainLayout(
        tp=sizes.get("TP", 1), pp=sizes.get("PP", 1), cp=sizes.get("CP", 1), ep=sizes.get("EP", 1)
    )
    return lay, precision, note


def _number(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(row.get(column), errors="coerce")
    if value is None or not np.isfinite(value):
        raise UserError(f"{column}: not published for this row")
    return float(value)


def job_of(row: pd.Series) -> tuple[Job, Plan, str]:
    """The job and plan a published row states, and a note on what was read into it."""
    problems = []
    model: ModelSpec | None = None
    try:
        model = model_of(row["model"])
    except UserError as exc:
        problems.append(str(exc))
    gpu_name = str(row["gpu"]).strip().lower()
    if gpu_name not in catalog.gpus():
        problems.append(f"gpu: {gpu_name} is not in the catalog")
    if problems:
        raise UserError("; ".join(problems))
    assert model is not None
    gpu = catalog.get_gpu(gpu_name)
    algorithm = Algorithm.parse(str(row["algorithm"]))
    placement, staleness = placement_of(row["placement"])
    lay, precision, note = layout_of(row["train_layout"])
    prompts, samples = (
        int(_number(row, "prompts_per_step")),
        int(_number(row, "samples_per_prompt")),
    )
    rollout_gpus, train_gpus = int(_number(row, "rollout_gpus")), int(_number(row, "train_gpus"))
    total, mean = _number(row, "max_response_len"), _number(row, "mean_response_len")
    rollout_tp = int(_number(row, "rollout_tp"))
    job = Job(
        model,
        gpu,
        gpu.cluster,
        int(_number(row, "num_gpus")),
        algorithm,
        prompts,
        samples,
        PROMPT_TOKENS,
        ResponseLengths(total - PROMPT_TOKENS, mean),
        precision=precision,
    ).checked()
    plan = Plan(placement, rollout_gpus, train_gpus, rollout_tp, lay, staleness).checked(job)
    return job, plan, note


def predict_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The input rows with each row's predicted phases, step time, its absolute percentage error
    against measured_step_time_s, and `error` ('' or why the row was not predicted)."""
    out = runs.reset_index(drop=True).copy()
    for column in OUTPUT_COLUMNS:
        out[column] = "" if column in ("note", "error") else np.nan
    out["pred_fits"] = out["pred_fits"].astype(object)
    for i, row in out.iterrows():
        try:
            job, plan, note = job_of(row)
            (step,) = estimate_steps(job, [plan])
        except UserError as exc:
            out.at[i, "error"] = str(exc)
            continue
        phases = step.phases()
        for name, value in phases.items():
            out.at[i, f"pred_{name}"] = value
        out.at[i, "pred_step_time_s"] = step.step_s
        out.at[i, "pred_tokens_per_s_per_gpu"] = step.tokens_per_s_per_gpu
        out.at[i, "pred_fits"] = step.fits
        out.at[i, "note"] = note
        measured = pd.to_numeric(row.get("measured_step_time_s"), errors="coerce")
        if measured is not None and np.isfinite(measured) and measured > 0:
            out.at[i, "ape_step_time"] = abs(step.step_s - measured) / measured
    return out


def summary_lines(result: pd.DataFrame) -> list[str]:
    """One line per row: its id, predicted against measured step time, or why not predicted."""
    lines = []
    for _, row in result.iterrows():
        name = row.get("run_id", "")
        if row["error"]:
            lines.append(f"{name}: not predicted: {row['error']}")
            continue
        measured = pd.to_numeric(row.get("measured_step_time_s"), errors="coerce")
        shown = f"{measured:.1f} s" if np.isfinite(measured) else "not published"
        ape = row["ape_step_time"]
        error = f", error {ape:.0%}" if np.isfinite(ape) else ""
        training = row["pred_logprob_s"] + row["pred_update_s"] + row["pred_critic_s"]
        lines.append(
            f"{name}: predicted {row['pred_step_time_s']:.1f} s per step (rollout "
            f"{row['pred_rollout_s']:.1f}, training {training:.1f}, sync "
            f"{row['pred_sync_s']:.1f}, switch {row['pred_switch_s']:.1f}); measured "
            f"{shown}{error}"
        )
    return lines
