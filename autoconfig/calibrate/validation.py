"""Compares predictions with published measurements (shared by the validation and fit scripts).

What the published runs ran that the CSV has no column for is stated here once, with its
source, and applied as input columns: these are facts about the runs, not corrections.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from autoconfig.base.errors import UserError
from autoconfig.cost import evaluate
from autoconfig.cost.flops import model_flops_per_token
from autoconfig.cost.inputs import busiest_rank_layers, cost_split_layers
from autoconfig.rows.resolve import read_resolved
from autoconfig.rows.training import (
    Errors,
    fill_from_catalog,
    read_frameworks,
    read_training_rows,
    resolved_mlp,
    with_predictions,
)
from autoconfig.spec.vocab import GIB, Mlp

# Runs from before FlashAttention (Dao et al., May 2022) used Megatron's unfused softmax
# attention; Megatron GPT models train with dropout 0.1 (Megatron-LM arguments.py defaults
# hidden_dropout/attention_dropout = 0.1), BLOOM with dropout 0 (BLOOM paper, Sec. 3.3); the
# 2021-era Megatron and DeepSpeed stacks all-reduced gradients after the backward pass
# (overlap_grad_reduce arrived with the distributed optimizer in Megatron-Core). BLOOM trained
# with DeepSpeed's BF16_Optimizer, fp32 gradient accumulation (its rows' notes: "ZeRO-1 (bf16
# optimizer)"; written for BLOOM in 2022, it accumulated in fp32 before grad_accum_dtype).
# BLOOM trained on Jean Zay, whose nodes talk over 4 Omni-Path 100 Gbps links each, a quarter
# of a DGX A100's network (BLOOM paper, Sec. 3.4.1): its rows run on that cluster's profile.
SOURCE_FACTS: dict[str, dict[str, str]] = {
    "Megatron-LM 2021 Table 1 (A100)": {
        "flash_attention": "n",
        "dropout": "y",
        "overlap_grad_reduce": "n",
    },
    "Korthikanti 2022": {"flash_attention": "n", "dropout": "y", "overlap_grad_reduce": "n"},
    "MT-NLG": {"flash_attention": "n", "dropout": "y", "overlap_grad_reduce": "n"},
    "BLOOM": {
        "flash_attention": "n",
        "dropout": "n",
        "overlap_grad_reduce": "n",
        "bf16_optimizer": "y",
        "gpu": "a100-sxm-80gb-jean-zay",
    },
}

# How Megatron-Bridge's recipes (megatron-bridge 0.3.1, megatron/bridge/recipes/) cut their
# pipelines where they do not split evenly, keyed by the start of the row's `model`, which names
# the recipe (so "DeepSeekV3 (tokendrop)" is DeepSeek-V3's):
# - Llama 3.1 405B and Qwen3 235B-A22B set account_for_embedding_in_pipeline_split and
#   account_for_loss_in_pipeline_split (llama/llama3.py llama31_405b_pretrain_config,
#   qwen/qwen3_moe.py qwen3_235b_a22b_pretrain_config): the embedding and the loss count as a
#   layer each;
# - DeepSeek-V3 and Kimi K2 set an explicit pipeline_model_parallel_layout
#   (deepseek/deepseek_v3.py, kimi/kimi_k2.py) for the (pp, vp) pairs of their maps. Their 61
#   layers divide evenly over no pipeline the rows use, so the rows outside the maps ((2, 8),
#   (2, 4) and (8, 4) for DeepSeek-V3) ran a layout too; taken as placed by hand.
# The others split evenly: gpt_oss/gpt_oss.py sets both account_for flags False, and the Llama 3
# 8B/70B and Qwen3 30B-A3B recipes leave them unset. A row's own column wins.
PIPELINE_SPLIT_RECIPES = {
    "Megatron-Bridge": {
        "pipeline_ends_as_layers": ("LLAMA3.1_405B", "Qwen3_235B_a22B"),
        "balanced_pipeline": ("DeepSeekV3", "Kimi_K2"),
    },
}

# Rows that name a multi-stage pipeline schedule but not its stages per rank ran the
# framework's default: torchtitan builds 2 stages per rank for multi-stage schedules unless
# pipeline_parallel_layers_per_stage says otherwise (distributed/pipeline.py in 0.1.0,
# distributed/pipeline_parallel.py in 0.3.0). Keyed by source group: (note text, column, value).
SCHEDULE_DEFAULTS: dict[str, tuple[str, str, str]] = {
    "torchtitan": ("schedule=Interleaved 1F1B", "vp", "2"),
}

# torchtitan's `activation_checkpoint.mode = "selective"` defaults to selective_ac_option "op"
# (torchtitan docs, activation checkpointing): op-level checkpointing, not Megatron's
# attention-only selective recompute.
RECOMPUTE_MEANING: dict[str, dict[str, str]] = {"torchtitan": {"selective": "op"}}

# The CSV's measured_peak_mem_gib is in decimal GB: its torchtitan rows convert the GiB their
# sources publish ("peak memory 72.7 GiB" is 78.061). autoconfig counts memory in GiB
# (vocab.GIB), so those figures are read back in GiB. The Ultra-Scale Playbook's figures are
# nanotron's own "GB", which nanotron computes as bytes / 1024**3 (nanotron 0.4 helpers.py,
# "Mem Alloc (GB)"): GiB already, copied as published.
PEAK_MEMORY_IN_GIB = ("Ultra-Scale Playbook",)
SIXTEEN_BIT = ("bf16", "fp16")
MAIN_GPUS = ("a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-sxm-96gb", "h200-sxm-141gb")


REFERENCE_ENV = "AUTOCONFIG_REFERENCE"  # a folder holding training_runs.csv, inference_runs.csv


def reference_dir() -> Path | None:
    """The published measurements: $AUTOCONFIG_REFERENCE, else ../shared/reference beside the
    checkout (the current folder's or the package's); None when there are none."""
    env = os.environ.get(REFERENCE_ENV)
    candidates = [Path(env)] if env else []
    for base in (Path.cwd(), Path(__file__).resolve().parents[2]):
        candidates += [base.parent / "shared" / "reference", base / "shared" / "reference"]
    return next((c for c in candidates if (c / "training_runs.csv").exists()), None)


def require_reference_dir() -> Path:
    found = reference_dir()
    if found is None:
        raise UserError(
            "reference: no published measurements found (../shared/reference beside the "
            f"checkout, or ${REFERENCE_ENV})"
        )
    return found


def in_fit_set(run_id: str) -> bool:
    """The calibration subset: a fixed third of the rows, chosen by a hash of run_id."""
    return int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % 3 == 0


def read_reference(path: Path, facts: dict[str, dict[str, str]], key: str) -> pd.DataFrame:
    """A reference table as text, with the stated facts written into the rows whose `key`
    column names their source (a fact's column is added blank where the CSV lacks it)."""
    runs = pd.read_csv(path, dtype=str, keep_default_na=False)
    for source, values in facts.items():
        for col, value in values.items():
            if col not in runs:
                runs[col] = ""
            runs.loc[runs[key] == source, col] = value
    return runs


def load_training_runs(path: Path | None = None) -> pd.DataFrame:
    runs = read_reference(
        path or require_reference_dir() / "training_runs.csv", SOURCE_FACTS, "source_group"
    )
    for group, meaning in RECOMPUTE_MEANING.items():
        rows = runs["source_group"] == group
        runs.loc[rows, "recompute"] = runs.loc[rows, "recompute"].replace(meaning)
    for group, (note, column, value) in SCHEDULE_DEFAULTS.items():
        if "notes" not in runs or column not in runs:
            continue
        rows = (runs["source_group"] == group) & runs["notes"].str.contains(note, regex=False)
        runs.loc[rows & (runs[column].str.strip() == ""), column] = value
    for group, columns in PIPELINE_SPLIT_RECIPES.items():
        for column, recipes in columns.items():
            if column not in runs:
                runs[column] = ""
            rows = (runs["source_group"] == group) & runs["model"].str.startswith(recipes)
            runs.loc[rows & (runs[column] == ""), column] = "y"
    runs["measured_peak_mem_gib"] = peak_memory_gib(runs)
    runs["fit_set"] = runs["run_id"].map(in_fit_set)
    return runs


def peak_memory_gib(runs: pd.DataFrame) -> pd.Series:
    """The measured peaks in GiB, as text like the rest of the table (blank where none): the
    CSV's decimal GB divided by 2^30 / 10^9, except for the groups that published GiB."""
    text = runs.get("measured_peak_mem_gb", pd.Series("", index=runs.index)).astype(str)
    value = pd.to_numeric(text, errors="coerce")
    published_gib = runs["source_group"].isin(PEAK_MEMORY_IN_GIB)
    gib = value.where(published_gib, value * 1e9 / GIB)
    return gib.map("{:.6g}".format).where(value.notna(), text)


def measured_throughput(runs: pd.DataFrame) -> pd.Series:
    """Measured tokens/s/GPU; where only MFU or model TFLOP/s were published, converted with
    the same model-FLOPs count the predictions use (both follow Megatron's convention)."""
    rows = read_training_rows(runs)
    inputs, errors = rows.inputs(), rows.errors
    with np.errstate(all="ignore"):
        flops = pd.Series(
            np.broadcast_to(model_flops_per_token(inputs), len(runs)), index=runs.index
        )
        peak = pd.Series(np.broadcast_to(inputs.peak_flops, len(runs)), index=runs.index)
    num = lambda c: pd.to_numeric(runs[c], errors="coerce")  # noqa: E731
    tokens = num("measured_tokens_per_s_per_gpu")
    from_tflops = num("measured_model_tflops_per_gpu") * 1e12 / flops
    from_mfu = num("measured_mfu") * peak / flops
    return tokens.fillna(from_tflops).fillna(from_mfu).where(errors == "")


def predictions(runs: pd.DataFrame) -> pd.DataFrame:
    """Every row with its predictions (unknown settings resolved as its framework would run
    them, in `resolved_*`), `error`, the measured throughput, the constant-MFU guess and the
    absolute errors of both."""
    runs = runs.reset_index(drop=True)
    rows, resolved = read_resolved(runs)
    with np.errstate(all="ignore"):
        out = with_predictions(runs, evaluate(rows.inputs()), rows.errors)
    out = pd.concat([out, resolved], axis=1)
    out["measured_tps"] = measured_throughput(runs).to_numpy()
    out["ape"] = (out["pred_tokens_per_s_per_gpu"].astype(float) / out["measured_tps"] - 1).abs()
    out["guess_tps"] = constant_guess(runs).to_numpy()
    out["guess_ape"] = (out["guess_tps"] / out["measured_tps"] - 1).abs()
    return out


# The floor every accuracy figure is shown beside (../shared/reference/README.md, "The floor: a
# constant-MFU guess"): 40% of the GPU's dense 16-bit peak, 1.5x for fp8 and mxfp8 rows.
GUESS_MFU = 0.40
GUESS_PEAK_TFLOPS = {
    "a100": 312.0,
    "h100": 989.0,
    "h200": 989.0,
    "b200": 2250.0,
    "b300": 2250.0,
    "gb200": 2500.0,
    "gb300": 2500.0,
    # AMD Instinct dense bf16 (AMD's datasheets, as the GPU profiles cite them)
    "mi300x": 1307.4,
    "mi325x": 1307.4,
    "mi350x": 2306.9,
    "mi355x": 2516.6,
    # GDDR PCIe parts, dense bf16 with fp32 accumulate (their GPU profiles cite the datasheets)
    "rtx-4090": 165.2,
    "rtx-a6000": 154.8,
}


def constant_guess(runs: pd.DataFrame) -> pd.Series:
    """tokens/s/GPU = 0.40 * peak / (6 N + 12 L h s), N every weight (embeddings included;
    GQA attention 2h^2 + 2h^2 kv/heads; MLP 3 h ffn for SwiGLU, else 2 h ffn; MoE counted as
    dense with ffn_hidden; a blank ffn_hidden is 4h). The architecture is read as the model
    reads it: blank cells of a row naming a catalog model take the catalog's values, and a
    blank MLP is SwiGLU when the shape says so (a Llama row with its MLP cell blank is still
    SwiGLU). A MoE row keeps its own ffn_hidden (blank: 4h), since the catalog's is the width of
    one expert. NaN where a figure it needs is still blank."""
    given_ffn = runs.get("ffn_hidden", pd.Series("", index=runs.index))
    runs = fill_from_catalog(runs)
    experts = pd.to_numeric(runs.get("num_experts", pd.Series(index=runs.index)), errors="coerce")
    runs = runs.assign(ffn_hidden=runs["ffn_hidden"].mask(experts > 0, given_ffn))
    num = lambda c: pd.to_numeric(runs.get(c, pd.Series(index=runs.index)), errors="coerce")  # noqa: E731
    h, layers, heads = num("hidden"), num("layers"), num("heads")
    kv = num("kv_heads").fillna(heads)
    vocab, seq = num("vocab"), num("seq_len")
    ffn = num("ffn_hidden").fillna(4.0 * h)  # a blank FFN is GPT's 4h
    shape = pd.DataFrame({c: num(c) for c in ("hidden", "heads", "kv_heads", "ffn_hidden")})
    mats = np.where(resolved_mlp(runs, shape) == "swiglu", 3.0, 2.0)
    tied = runs.get("tied_embeddings", pd.Series("", index=runs.index)).astype(str) == "y"
    attention = 2.0 * h**2 + 2.0 * h**2 * kv / heads
    params = layers * (attention + mats * h * ffn) + vocab * h * np.where(tied, 1.0, 2.0)
    flops = 6.0 * params + 12.0 * layers * h * seq
    gpu = runs["gpu"].astype(str).str.lower()
    family = gpu.str.extract(
        r"^(gb300|gb200|b300|b200|h200|h100|a100|mi300x|mi325x|mi350x|mi355x|rtx-4090|rtx-a6000)"
    )[0]
    precision = runs["precision"].astype(str).str.lower()
    peak = family.map(GUESS_PEAK_TFLOPS) * np.where(precision.isin(["fp8", "mxfp8"]), 1.5, 1.0)
    return GUESS_MFU * peak * 1e12 / flops


def error_stats(ape: pd.Series) -> dict[str, float]:
    ape = ape.dropna()
    return {
        "rows": len(ape),
        "mape_%": 100 * ape.mean(),
        "median_ape_%": 100 * ape.median(),
        "within_20%": 100 * (ape <= 0.2).mean(),
    }


def throughput_table(out: pd.DataFrame) -> pd.DataFrame:
    ok = out[(out["status"] == "ok") & out["measured_tps"].notna() & (out["error"] == "")]
    rows = []
    for prec_name, prec in (("16-bit", SIXTEEN_BIT), ("fp8", ("fp8",))):
        sel = ok[ok["precision"].isin(prec) & ok["gpu"].isin(MAIN_GPUS)]
        for group, g in sel.groupby("source_group"):
            rows.append({"precision": prec_name, "source_group": group, **error_stats(g["ape"])})
        rows.append({"precision": prec_name, "source_group": "ALL", **error_stats(sel["ape"])})
        rows.append(
            {
                "precision": prec_name,
                "source_group": "ALL (held out)",
                **error_stats(sel.loc[~sel["fit_set"], "ape"]),
            }
        )
    return pd.DataFrame(rows)


def pick_loss(pick_by: pd.Series, measured: pd.Series) -> float:
    """Per cent of the best measured throughput lost by running the layout `pick_by` ranks
    first instead of the measured best."""
    return 100 * (1 - measured[pick_by.idxmax()] / measured.max())


def zero_twins(medians: pd.Series) -> pd.DataFrame:
    """The layouts measured with both ZeRO-0 and ZeRO-1: from per-(layout, zero) medians,
    one row per layout with columns '0' and '1'."""
    return medians.unstack("zero").reindex(columns=["0", "1"]).dropna()


def playbook_ranking(out: pd.DataFrame) -> pd.DataFrame:
    """Within each (model, GPU count) group of the Ultra-Scale Playbook sweep: Spearman rank
    correlation of predicted vs measured throughput, and the measured loss from running the
    predicted best instead of the measured best; then the same among the group's unpipelined
    layouts (pp 1) and its Spearman among the pipelined ones, where the sweep's ZeRO-0 and
    ZeRO-1 twins part (`repeat_spread`)."""
    pb = out[
        (out["source_group"] == "Ultra-Scale Playbook")
        & (out["status"] == "ok")
        & out["measured_tps"].notna()
        & (out["error"] == "")
    ]
    rows = []
    for (model, gpus), g in pb.groupby(["model", "num_gpus"]):
        if len(g) < 3:
            continue
        pred, measured = g["pred_tokens_per_s_per_gpu"].astype(float), g["measured_tps"]
        flat, piped = pipelining(g["pp"])
        row = {"model": model, "num_gpus": int(gpus), "configs": len(g)}
        row |= _ranked(pred, measured, "") | {"configs_pp1": int(flat.sum())}
        row |= _ranked(pred[flat], measured[flat], "pp1")
        row["spearman_pipelined"] = _ranked(pred[piped], measured[piped], "")["spearman"]
        rows.append(row)
    return pd.DataFrame(rows)


def pipelining(pp: Iterable[object]) -> tuple[np.ndarray, np.ndarray]:
    """(unpipelined, pipelined) masks of a column of pp values; a blank pp is in neither."""
    stages = pd.to_numeric(pd.Series(list(pp)), errors="coerce").to_numpy()
    return stages == 1, stages > 1


def _ranked(pred: pd.Series, measured: pd.Series, suffix: str) -> dict[str, float]:
    """Spearman and pick loss of one subset of a group (NaN below three layouts)."""
    tag = f"_{suffix}" if suffix else ""
    if len(pred) < 3:
        return {f"spearman{tag}": float("nan"), f"loss{tag}_%": float("nan")}
    return {
        f"spearman{tag}": spearmanr(pred, measured)[0],
        f"loss{tag}_%": pick_loss(pred, measured),
    }


def twin_ranking(out: pd.DataFrame, group: str = "Ultra-Scale Playbook") -> pd.DataFrame:
    """How well one measurement of a layout ranks another, without any model: within each (model,
    GPU count) group of a sweep, a layout's ZeRO-0 run against its ZeRO-1 twin, which differs
    from it by its data-parallel communication and optimizer step (see `repeat_spread`). A
    reference for the sweep's noise, not a bound: a model that predicted a layout's true speed
    would agree with each noisy run better than two noisy runs agree with each other. Per group,
    over the layouts measured with both stages (median of repeats): Spearman between the twins
    and the loss from running the layout whose twin measured best (the mean of both directions),
    beside the model's Spearman and loss on the same layouts (the mean against either twin)."""
    keep = (out["source_group"] == group) & (out["status"] == "ok") & out["measured_tps"].notna()
    sel = out.loc[keep & (out["error"] == "")].assign(zero=lambda f: f["zero"].astype(str))
    by = [c for c in LAYOUT if c != "source_group"]
    twins = zero_twins(sel.groupby([*by, "zero"], dropna=False)["measured_tps"].median())
    pred = sel.groupby(by, dropna=False)["pred_tokens_per_s_per_gpu"].median().astype(float)
    twins = twins.assign(pred=pred.reindex(twins.index))

    rows = []
    for (model, gpus), g in twins.groupby(level=["model", "num_gpus"]):
        if len(g) < 3:
            continue
        zero0, zero1, model_pred = g["0"], g["1"], g["pred"]
        rows.append(
            {
                "model": model,
                "num_gpus": int(gpus),
                "layouts": len(g),
                "twin_spearman": spearmanr(zero0, zero1)[0],
                "twin_loss_%": (pick_loss(zero0, zero1) + pick_loss(zero1, zero0)) / 2,
                "model_spearman": (
                    spearmanr(model_pred, zero0)[0] + spearmanr(model_pred, zero1)[0]
                )
                / 2,
                "model_loss_%": (pick_loss(model_pred, zero0) + pick_loss(model_pred, zero1)) / 2,
            }
        )
    return pd.DataFrame(rows)


TWIN_FIGURES = ["twin_spearman", "twin_loss_%", "model_spearman", "model_loss_%"]


def twin_ranking_by_pipelining(out: pd.DataFrame) -> pd.DataFrame:
    """`twin_ranking`'s medians over groups, for the unpipelined and the pipelined layouts
    apart."""
    flat, piped = pipelining(out["pp"])
    return pd.DataFrame(
        {"layouts": name, **twin_ranking(out[keep]).median(numeric_only=True)[TWIN_FIGURES]}
        for name, keep in (("pp 1", flat), ("pp > 1", piped))
    )


# What fixes a training run's speed in the reference table, short of the ZeRO stage.
LAYOUT = [
    "source_group",
    "model",
    "gpu",
    "num_gpus",
    "tp",
    "pp",
    "vp",
    "cp",
    "ep",
    "dp",
    "sp",
    "mbs",
    "gbs",
    "seq_len",
    "precision",
    "recompute",
]


# Sweeps in which every setting that varies between runs is a column of the table (the
# torchtitan rows, by contrast, differ in torch.compile, async TP and float8 only in `notes`).
SWEEPS = ("Ultra-Scale Playbook",)


def repeat_spread(
    runs: pd.DataFrame, measured: pd.Series, groups: tuple[str, ...] = SWEEPS
) -> pd.DataFrame:
    """How far apart the measured throughputs of one layout lie, without any model:

    - *repeated*: the same layout and ZeRO stage measured more than once (max / min);
    - *ZeRO-0 vs ZeRO-1*: one layout measured with both, over all layouts and apart for the
      unpipelined (pp 1) and pipelined ones. ZeRO-1 replaces the data-parallel all-reduce by a
      reduce-scatter and an all-gather of the same bytes and shards only the optimizer step
      (Rajbhandari et al. 2020, "ZeRO", Sec. 5 and 7); nanotron, which ran the Playbook sweep,
      keeps the all-reduce and adds the all-gather (with fp32 gradient accumulation its ZeRO-1
      skips DDP and all-reduces the whole gradient after the last backward: trainer.py
      `make_ddp`, `sync_gradients_across_dp`; optim/zero.py `_all_gather_params`). Either way
      a layout's two runs differ only in their data-parallel communication (its bytes and
      how much of it overlaps) and the optimizer step, and should agree within a few per
      cent where those are small against the step. The signed median (ZeRO-0 / ZeRO-1)
      shows which stage ran slower.

    A pair more than 1.5x apart cannot both lie within +-20% of one prediction (1.2 / 0.8 =
    1.5): that is the floor on the error any model that predicts them alike must show.
    """
    keep = (runs["status"] == "ok") & measured.notna() & runs["source_group"].isin(groups)
    ok = runs.assign(measured=measured, zero=runs["zero"].astype(str)).loc[keep]
    stats = ok.groupby([*LAYOUT, "zero"], dropna=False)["measured"].agg(
        ["count", "min", "max", "median"]
    )
    repeats = stats[stats["count"] > 1]
    by_zero = zero_twins(stats["median"])
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "comparison": "repeated",
                    "source_group": repeats.index.get_level_values("source_group"),
                    "ratio": (repeats["max"] / repeats["min"]).to_numpy(),
                }
            ),
            *(
                pd.DataFrame(
                    {
                        "comparison": name,
                        "source_group": pairs.index.get_level_values("source_group"),
                        "ratio": (pairs.max(axis=1) / pairs.min(axis=1)).to_numpy(),
                        "signed": (pairs["0"] / pairs["1"]).to_numpy(),
                    }
                )
                for name, pairs in _by_pipelining(by_zero)
            ),
        ]
    )
    rows = []
    for (kind, group), g in frame.groupby(["comparison", "source_group"]):
        rows.append(
            {
                "comparison": kind,
                "source_group": group,
                "pairs": len(g),
                "median_ratio": g["ratio"].median(),
                "over_1.2x_%": 100 * (g["ratio"] > 1.2).mean(),
                "over_1.5x_%": 100 * (g["ratio"] > 1.5).mean(),
                "over_2x_%": 100 * (g["ratio"] > 2.0).mean(),
                "median_zero0_over_zero1": g["signed"].median(),
            }
        )
    return pd.DataFrame(rows)


def _by_pipelining(by_zero: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The ZeRO twins over all layouts, then the unpipelined and the pipelined ones apart."""
    flat, piped = pipelining(by_zero.index.get_level_values("pp"))
    return [
        ("ZeRO-0 vs ZeRO-1", by_zero),
        ("ZeRO-0 vs ZeRO-1, pp 1", by_zero[flat]),
        ("ZeRO-0 vs ZeRO-1, pp > 1", by_zero[piped]),
    ]


# What a layout's per-GPU memory depends on besides the dimensions dominated_failures compares.
SAME_MEMORY_SETTINGS = [
    "source_group",
    "model",
    "gpu",
    "seq_len",
    "gbs",
    "precision",
    "cp",
    "ep",
    "vp",
    "sp",
    "recompute",
]


def first_rank_layers(runs: pd.DataFrame, layers: pd.Series, pp: pd.Series) -> np.ndarray:
    """Layers on the first pipeline rank as each row's framework splits them (vp > 1 rows
    are left out where this is used): layers/pp, or the framework's compute-cost split, read
    from the architecture as the model reads it (catalog values for blank cells)."""
    filled = fill_from_catalog(runs)
    shape = pd.DataFrame(
        {
            c: pd.to_numeric(filled.get(c, pd.Series(index=runs.index)), errors="coerce")
            for c in ("hidden", "heads", "kv_heads", "ffn_hidden", "vocab")
        }
    )
    gated = resolved_mlp(filled, shape) == Mlp.SWIGLU.value
    first = cost_split_layers(
        layers, shape["hidden"], shape["ffn_hidden"], shape["vocab"], pp, gated
    ).first
    # An unknown framework reads as megatron's (even), as everywhere rows are read.
    fws = read_frameworks(runs, Errors(runs.index))
    by_cost = np.array([fw.does.splits_by_cost for fw in fws]) & (pp > 1)
    return np.where(by_cost & np.isfinite(first), first, busiest_rank_layers(layers, pp, 1))


def dominated_failures(runs: pd.DataFrame) -> pd.Series:
    """Failed runs (crash_or_oom, oom) that a layout which ran needs at least as much memory
    as, in every term, without any model. The failed layout has tensor parallelism at least
    as wide, no more layers per stage, micro-batches no larger, a ZeRO stage at least as high
    (sharded over at least as many data-parallel ranks when both shard), and no more
    micro-batch-layers alive on the first stage under 1F1B (min(pp, micro-batches) in flight)
    or all-forward-all-backward (every micro-batch in flight), so whichever schedule ran; all
    else that sets memory (SAME_MEMORY_SETTINGS) is equal. Weights, gradients, optimizer
    states, saved activations and the logits buffer each shrink or hold under these moves,
    so the failed run needed no more memory than one that ran: it failed for another reason
    (a hang, a launch or network error), and no memory model can flag it without also
    flagging the run that ran. Settings a row leaves unknown count as equal between runs of
    one sweep (the Playbook states recompute and sp for none of its runs: one sweep, one
    setting). Interleaved schedules (vp > 1) and MoE rows (whose expert weights need not
    shrink with tp) are never counted as dominated."""
    num = {c: pd.to_numeric(runs[c], errors="coerce") for c in ("tp", "pp", "dp", "mbs", "zero")}
    layers = pd.to_numeric(runs["layers"], errors="coerce")
    micro = pd.to_numeric(runs["gbs"], errors="coerce") / (num["dp"] * num["mbs"])
    per_stage = first_rank_layers(runs, layers, num["pp"])
    table = pd.DataFrame(
        {
            **num,
            "per_stage": per_stage,
            "one_f_one_b": num["mbs"] * np.minimum(num["pp"], micro) * per_stage,
            # without a pipeline, accumulation keeps one micro-batch alive whatever the schedule
            "all_forward": num["mbs"] * np.where(num["pp"] > 1, micro, 1.0) * per_stage,
            "status": runs["status"],
        },
        index=runs.index,
    )
    settings = runs[SAME_MEMORY_SETTINGS].astype(str).agg("|".join, axis=1)
    vp = pd.to_numeric(runs["vp"], errors="coerce").fillna(1)
    experts = pd.to_numeric(runs["num_experts"], errors="coerce").fillna(0)
    plain = (vp <= 1) & (experts == 0)  # the rows the memory terms above describe
    out = pd.Series(False, index=runs.index)
    for _, group in table.groupby(settings):
        ran = group[group["status"] == "ok"]
        failed = group[group["status"].isin(["crash_or_oom", "oom"]) & plain[group.index]]
        if ran.empty or failed.empty:
            continue
        r = {c: ran[c].to_numpy()[None, :] for c in ran.columns if c != "status"}
        f = {c: failed[c].to_numpy()[:, None] for c in failed.columns if c != "status"}
        both_shard = (f["zero"] >= 1) & (r["zero"] >= 1)
        covers = (
            (f["tp"] >= r["tp"])
            & (f["per_stage"] <= r["per_stage"])
            & (f["mbs"] <= r["mbs"])
            & (f["zero"] >= r["zero"])
            & (~both_shard | (f["dp"] >= r["dp"]))
            & (f["one_f_one_b"] <= r["one_f_one_b"])
            & (f["all_forward"] <= r["all_forward"])
        )
        out[failed.index] = covers.any(axis=1)
    return out


def fits_table(out: pd.DataFrame) -> pd.DataFrame:
    """The fits verdict by status; for failed runs also the share a layout that ran dominates
    (dominated_failures: out of any memory model's reach) and the ceiling that leaves."""
    valid = out[out["error"] == ""]
    dominated = dominated_failures(out)
    rows = []
    for status, want in (("ok", True), ("crash_or_oom", False), ("oom", False)):
        g = valid[valid["status"] == status]
        if len(g):
            agree = (g["pred_fits"].astype(bool) == want).mean()
            row = {
                "status": status,
                "rows": len(g),
                "predicted_" + ("fit" if want else "not_fit") + "_%": 100 * agree,
            }
            if not want:
                row["dominated_by_a_run_that_ran_%"] = 100 * dominated[g.index].mean()
                row["reachable_%"] = 100 - row["dominated_by_a_run_that_ran_%"]
                reachable = g[~dominated[g.index]]
                row["predicted_not_fit_of_reachable_%"] = 100 * float(
                    (~reachable["pred_fits"].astype(bool)).mean()
                )
            rows.append(row)
    return pd.DataFrame(rows)


def memory_table(out: pd.DataFrame) -> pd.DataFrame:
    meas = pd.to_numeric(out["measured_peak_mem_gib"], errors="coerce")
    sel = out[meas.notna() & (out["error"] == "")]
    ape = (sel["pred_peak_mem_gib"].astype(float) / meas[sel.index] - 1).abs()
    rows = [
        {"source_group": grp, **error_stats(ape[g.index])} for grp, g in sel.groupby("source_group")
    ]
    rows.append({"source_group": "ALL", **error_stats(ape)})
    rows.append({"source_group": "ALL (held out)", **error_stats(ape[~sel["fit_set"]])})
    return pd.DataFrame(rows)


def measured_rows(out: pd.DataFrame) -> pd.Series:
    """Rows that ran (status ok) with a measured throughput."""
    return (out["status"] == "ok") & out["measured_tps"].notna()


THROUGHPUT_APART = ("Ultra-Scale Playbook",)  # its own repeats disagree by more than 1.5x


def group_table(out: pd.DataFrame) -> pd.DataFrame:
    """Per source group: measured rows, coverage (share that gets a prediction), the model's
    and the constant guess's median APE and share within +-20% (on the rows both predict), and
    the model's figures on the held-out two thirds."""
    measured = out[measured_rows(out)]
    rows = []
    for group, g in measured.groupby("source_group"):
        predicted = g[g["error"] == ""]
        both = predicted[predicted["guess_ape"].notna()]
        held = predicted[~predicted["fit_set"]]
        rows.append(
            {
                "source_group": group,
                "measured": len(g),
                "coverage_%": 100 * len(predicted) / len(g),
                "model_median_ape_%": 100 * predicted["ape"].median(),
                "model_within_20_%": 100 * (predicted["ape"] <= 0.2).mean(),
                "guess_median_ape_%": 100 * both["guess_ape"].median(),
                "model_median_ape_on_guess_rows_%": 100 * both["ape"].median(),
                "guess_within_20_%": 100 * (both["guess_ape"] <= 0.2).mean(),
                "held_out_rows": len(held),
                "held_out_median_ape_%": 100 * held["ape"].median(),
                "throughput_target": group not in THROUGHPUT_APART,
            }
        )
    return pd.DataFrame(rows)


def headline(out: pd.DataFrame, groups: pd.DataFrame) -> dict[str, float]:
    """The issue's figures: the median over groups of their median APE (each group once, the
    Playbook apart), coverage, and the fits verdict on both kinds of status."""
    targeted = groups[groups["throughput_target"]]
    valid = out[out["error"] == ""]
    ok = valid[valid["status"] == "ok"]
    failed = valid[valid["status"].isin(["crash_or_oom", "oom"])]
    measured = out[measured_rows(out)]
    return {
        "median_over_groups_%": float(targeted["model_median_ape_%"].median()),
        "held_out_median_over_groups_%": float(targeted["held_out_median_ape_%"].median()),
        "guess_median_over_groups_%": float(targeted["guess_median_ape_%"].median()),
        "coverage_%": 100 * float((measured["error"] == "").mean()),
        "ok_predicted_fit_%": 100 * float(ok["pred_fits"].astype(bool).mean()),
        "failed_predicted_not_fit_%": 100 * float((~failed["pred_fits"].astype(bool)).mean()),
    }
