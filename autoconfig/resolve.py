"""Unknown means "as the framework would run it": for a published row that leaves its ZeRO
stage, recompute, sequence parallelism, virtual stages or expert TP unknown, every choice its
framework can run is evaluated and the fastest that fits is taken (the least memory when none
fits), so a layout that ran is never refused because a default guessed wrong. A row that
failed (status oom or crash) takes the framework's defaults instead: nothing says its run
chose otherwise, and choosing what fits would hide the failure. `as_framework_would` does the
same for the settings one typed layout names (`autoconfig estimate --auto`)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pandas as pd
from pydantic import ValidationError

from autoconfig import frameworks, layout
from autoconfig.columns import Behaviour, Hardware, training_inputs
from autoconfig.cost import evaluate
from autoconfig.errors import UserError
from autoconfig.frame import RESOLVABLE, TrainingRows, read_training_rows
from autoconfig.specs import FrameworkSpec, ModelSpec, ParallelConfig
from autoconfig.vocab import Recompute

# The output columns: each resolvable dimension, and how many layers per stage full recompute
# covers (0: every layer), which partial recompute chooses along with it.
RESOLVED = (*RESOLVABLE, "recompute_layers")


def stage_layer_count(layers: int, pp: int, vp: int) -> int:
    """Layers on the busiest pipeline rank: vp chunks of ceil(layers / (pp*vp)) each."""
    return -(-layers // (pp * vp)) * vp


VP_CHOICES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24)


def defaults(fw: FrameworkSpec, row: pd.Series, unknown: pd.Series) -> dict:
    """The framework's defaults for the row's unknowns."""
    tp, pp = int(row["tp"]), int(row["pp"])
    zeros = fw.allows("zero_with_pp") if pp > 1 else fw.allows("zero")
    zero = fw.defaults["zero"] if fw.defaults["zero"] in zeros else zeros[0]
    mode = fw.allows("sequence_parallel")
    values = {
        "zero": zero,
        "recompute": fw.defaults["recompute"],
        "sp": (tp > 1) and (mode == "with_tp" or (mode == "optional" and fw.defaults["sp"])),
        "vp": 1,
        "etp": 1,
    }
    return {k: v for k, v in values.items() if unknown[k]}


def options(fw: FrameworkSpec, row: pd.Series, unknown: pd.Series, layers: int) -> list[dict]:
    """Every combination of values the framework could have used for the row's unknowns."""
    tp, pp = int(row["tp"]), int(row["pp"])
    choices: dict[str, list] = {}
    if unknown["zero"]:
        choices["zero"] = list(fw.allows("zero_with_pp") if pp > 1 else fw.allows("zero"))
    if unknown["recompute"]:
        choices["recompute"] = list(fw.allows("recompute"))
    if unknown["sp"]:
        mode = fw.allows("sequence_parallel")
        choices["sp"] = [tp > 1] if mode == "with_tp" else ([False, True] if tp > 1 else [False])
        if mode == "never":
            choices["sp"] = [False]
    if unknown["vp"]:
        extra = [v for v in VP_CHOICES if layers % (pp * v) == 0]
        choices["vp"] = [1] + (extra if fw.allows("interleaving") else [])
    if unknown["etp"]:
        choices["etp"] = sorted({1, tp}) if fw.allows("expert_tensor_parallel") else [1]
    names = list(choices)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices.values())]


def resolve(
    rows: TrainingRows, failed: np.ndarray | None = None
) -> tuple[TrainingRows, pd.DataFrame]:
    """The rows with their unknowns chosen, and one `resolved_<dimension>` column per
    resolvable dimension (the value estimated, chosen or stated). `failed` marks rows whose
    run failed: they take the framework's defaults."""
    table = rows.layouts
    failed = np.zeros(len(table), bool) if failed is None else np.asarray(failed, bool)
    todo = np.flatnonzero(rows.unknown.any(axis=1).to_numpy())
    picks: list[tuple[int, dict]] = []
    for i in todo:
        fw, row, unknown = rows.frameworks[i], table.iloc[i], rows.unknown.iloc[i]
        if failed[i]:
            picks.append((int(i), defaults(fw, row, unknown)))
            continue
        for choice in options(fw, row, unknown, rows.models[i].layers):
            picks.append((int(i), choice))
    chosen = table.copy()
    winners = _fastest_fitting(rows, table, picks, todo)
    chosen.loc[winners.index] = winners
    # Megatron-style partial recompute: of the rows that ended on full recompute of every layer,
    # recompute only as many layers per stage as it takes to fit (fewer is faster).
    partial = _partial_recompute(rows, chosen, todo[~failed[todo]])
    winners = _fastest_fitting(rows, chosen, [*partial, *_as_picks(chosen, partial)], todo)
    chosen.loc[winners.index] = winners
    resolved = pd.DataFrame(
        {f"resolved_{d}": chosen[d].to_numpy() for d in RESOLVED}, index=table.index
    )
    # Full recompute names its layers per stage, as a stated layout does (0 meant all of them).
    layers = np.array([m.layers for m in rows.models], float)
    every = np.ceil(layers / (chosen["pp"] * chosen["vp"]).to_numpy(float)) * chosen["vp"]
    full = (resolved["resolved_recompute"] == Recompute.FULL.value) & (
        resolved["resolved_recompute_layers"] == 0
    )
    resolved["resolved_recompute_layers"] = resolved["resolved_recompute_layers"].where(
        ~full, every.astype(int)
    )
    return replace(rows, layouts=chosen), resolved


def _partial_recompute(
    rows: TrainingRows, chosen: pd.DataFrame, todo: np.ndarray
) -> list[tuple[int, dict]]:
    """Each count of fully recomputed layers per stage short of all of them, for the rows that
    resolved to full recompute of every layer under a framework that can recompute part."""
    picks: list[tuple[int, dict]] = []
    for i in todo:
        row = chosen.iloc[i]
        if not rows.unknown.iloc[i]["recompute"] or row["recompute"] != Recompute.FULL.value:
            continue
        if not rows.frameworks[i].allows("partial_recompute") or int(row["recompute_layers"]):
            continue
        per_stage = stage_layer_count(rows.models[i].layers, int(row["pp"]), int(row["vp"]))
        # whole layers in each virtual chunk (Megatron-Core counts them per model chunk)
        step = int(row["vp"])
        picks += [(int(i), {"recompute_layers": k}) for k in range(step, per_stage, step)]
    return picks


def _as_picks(chosen: pd.DataFrame, partial: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """The resolved value of each row `partial` tries to improve on, as one more choice."""
    return [
        (i, {"recompute_layers": int(chosen.iloc[i]["recompute_layers"])})
        for i in sorted({i for i, _ in partial})
    ]


def _fastest_fitting(
    rows: TrainingRows, table: pd.DataFrame, picks: list[tuple[int, dict]], todo: np.ndarray
) -> pd.DataFrame:
    """Of each row's choices (row position, values set over `table`'s row), the fastest that
    fits and the framework can run, else the one needing the least memory; indexed like
    `table`."""
    if not picks:
        return table.iloc[:0]
    index = np.array([i for i, _ in picks])
    trial = table.iloc[index].reset_index(drop=True)
    chosen_values = pd.DataFrame([c for _, c in picks])
    trial = chosen_values.combine_first(trial)[list(table.columns)]
    trial = trial.astype(table.dtypes.to_dict())
    full = trial["recompute"] == Recompute.FULL.value
    trial["recompute_layers"] = trial["recompute_layers"].where(full, 0)
    x = rows.inputs().take(index)
    codes = layout.columns(trial)
    x = replace(x, **{k: v.astype(x.tp.dtype) for k, v in codes.items()})
    with np.errstate(all="ignore"):
        out = evaluate(x)
    runnable = np.ones(len(index), bool)
    owners = np.array([id(rows.frameworks[i]) for i in index])
    shape = {
        "layers": np.broadcast_to(x.layers, (len(index),)),
        "gbs": np.broadcast_to(x.gbs, (len(index),)),
    }
    for fw in {id(f): f for f in (rows.frameworks[i] for i in todo)}.values():
        mine = owners == id(fw)
        cols = {k: np.asarray(v)[mine] for k, v in {**codes, **shape}.items()}
        for _, _, bad in frameworks.rules(fw, cols):
            runnable[mine] &= ~np.broadcast_to(bad, (int(mine.sum()),))
    fits = np.asarray(out["pred_fits"], bool) & runnable
    speed = np.where(fits, out["pred_tokens_per_s_per_gpu"], -np.inf)
    memory = np.where(runnable, out["pred_peak_mem_gb"], np.inf)
    frame = pd.DataFrame({"row": index, "speed": speed, "memory": memory})
    # The fastest that fits, else the smallest.
    best = frame.sort_values(["row", "speed", "memory"], ascending=[True, False, True])
    best = best.drop_duplicates("row", keep="first")
    winners = trial.loc[best.index]
    winners.index = table.index[best["row"].to_numpy()]
    return winners


def read_resolved(df: pd.DataFrame) -> tuple[TrainingRows, pd.DataFrame]:
    """A table of runs read and its unknowns resolved (a `status` column of oom or crash
    marks failed runs)."""
    status = (
        df["status"].astype(str).str.lower() if "status" in df else pd.Series("", index=df.index)
    )
    failed = status.isin(["oom", "crash", "crash_or_oom"]).to_numpy()
    return resolve(read_training_rows(df), failed)


# Settings `autoconfig estimate --auto` may leave to the framework (the flag-side RESOLVABLE).
AUTO_SETTINGS = ("zero", "recompute", "sp", "vp")


def as_framework_would(
    fw: FrameworkSpec,
    spec: ModelSpec,
    hardware: Hardware,
    does: Behaviour,
    run: ParallelConfig,
    auto: frozenset[str],
    limit_gb: float,
    shape: dict[str, int],
) -> ParallelConfig:
    """`run` with the settings in `auto` chosen as `fw` would run them: every choice it can
    run is evaluated and the fastest that fits is kept (the least memory when none fits);
    where that is full recompute of every layer and `fw` can recompute part of a stage, the
    fewest layers per stage that fit. `shape` holds the model and run figures the layout rules
    check (heads, kv_heads, layers, experts, num_gpus, gbs, seq)."""
    unknown_names = sorted(auto - set(AUTO_SETTINGS))
    if unknown_names:
        raise UserError(
            f"auto: unknown setting '{unknown_names[0]}'; allowed: {', '.join(AUTO_SETTINGS)}"
        )
    unknown = pd.Series({d: d in auto for d in RESOLVABLE})
    choices = options(fw, pd.Series(run.model_dump()), unknown, spec.layers)
    best = _fastest_config(fw, spec, hardware, does, run, choices, limit_gb, shape)
    if best.recompute.value == "full" and "recompute" in auto and fw.allows("partial_recompute"):
        per_stage = stage_layer_count(spec.layers, best.pp, best.vp)
        partial = [{"recompute_layers": k} for k in range(best.vp, per_stage + 1, best.vp)]
        best = _fastest_config(fw, spec, hardware, does, best, partial, limit_gb, shape)
    return best


def _fastest_config(
    fw: FrameworkSpec,
    spec: ModelSpec,
    hardware: Hardware,
    does: Behaviour,
    run: ParallelConfig,
    choices: list[dict],
    limit_gb: float,
    shape: dict[str, int],
) -> ParallelConfig:
    """Of `run` changed by each choice, the fastest that `fw` can run and fits `limit_gb`,
    else the one needing the least memory."""
    runs = []
    for choice in choices:
        values = run.model_dump() | choice
        if values["recompute"] != "full":
            values["recompute_layers"] = 0
        elif "recompute_layers" not in choice and not values["recompute_layers"]:
            values["recompute_layers"] = stage_layer_count(spec.layers, values["pp"], values["vp"])
        try:
            runs.append(ParallelConfig(**values))
        except ValidationError:
            continue  # a combination the layout itself rules out (vp without pp, say)
    if not runs:
        return run
    table = layout.frame_of([r.model_dump() for r in runs])
    codes = {**layout.columns(table), **shape}
    runnable = np.ones(len(runs), bool)
    for _, _, bad in [*layout.rules(codes), *frameworks.rules(fw, codes)]:
        runnable &= ~np.broadcast_to(np.asarray(bad, bool), runnable.shape)
    inputs = training_inputs(spec, hardware, table, run.gbs, run.seq_len, does)
    with np.errstate(all="ignore"):
        preds = evaluate(inputs)
    peak = np.broadcast_to(np.asarray(preds["pred_peak_mem_gb"], float), runnable.shape)
    speed = np.broadcast_to(np.asarray(preds["pred_tokens_per_s_per_gpu"], float), peak.shape)
    fits = runnable & (peak <= limit_gb)
    if fits.any():
        return runs[int(np.argmax(np.where(fits, speed, -np.inf)))]
    if runnable.any():
        return runs[int(np.argmin(np.where(runnable, peak, np.inf)))]
    return run  # nothing the framework can run: the checks below name why
