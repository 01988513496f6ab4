"""Unknown means "as the framework would run it": for a published row that leaves its ZeRO
stage, recompute, sequence parallelism, virtual stages or expert TP unknown, every choice its
framework can run is evaluated and the fastest that fits is taken (the least memory when none
fits), so a layout that ran is never refused because a default guessed wrong. A row that
failed (status oom or crash) takes the framework's defaults instead: nothing says its run
chose otherwise, and choosing what fits would hide the failure. `as_framework_would` does the
same for the settings one typed layout names (`autoconfig estimate --auto`)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from autoconfig.base.errors import UserError
from autoconfig.columns import frameworks
from autoconfig.columns.build import Behaviour, Hardware, training_inputs
from autoconfig.cost import evaluate
from autoconfig.cost.inputs import busiest_rank_layers
from autoconfig.rows.training import RESOLVABLE, TrainingRows, read_training_rows
from autoconfig.spec import layout
from autoconfig.spec.schema import FrameworkSpec, ModelSpec, ParallelConfig
from autoconfig.spec.vocab import Recompute

# The output columns: each resolvable dimension, and how many layers per stage full recompute
# covers, which partial recompute chooses along with it.
RESOLVED = (*RESOLVABLE, "recompute_layers")


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


def split_units(fw: FrameworkSpec, layers: int, ends_split: float, to_interleave: float) -> tuple:
    """What pp*vp chunks must divide for the framework to interleave: the layers; or either
    the layers or the layers + 2 where the split may count the embedding and the head as a
    layer each (its own split does, or it can be told to where only that divides); only the
    layers + 2 where a row states that a Megatron-style split counted them (with the
    account_for flags on, megatron-core 0.16.1 asks for layers + 2 divisible by pp*vp)."""
    if ends_split > 0 and not fw.does.counts_ends_as_layers:
        return (layers + 2,)
    if ends_split > 0 or to_interleave > 0:
        return (layers, layers + 2)
    return (layers,)


def options(
    fw: FrameworkSpec,
    row: pd.Series,
    unknown: pd.Series,
    layers: int,
    units: tuple | None = None,
) -> list[dict]:
    """Every combination of values the framework could have used for the row's unknowns.
    Virtual stages must cut one of `units` (`split_units`; the layers by default) into pp*vp
    equal chunks."""
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
        extra = [v for v in VP_CHOICES if any(n % (pp * v) == 0 for n in units or (layers,))]
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
    ends = np.broadcast_to(np.asarray(rows.behaviour.ends_split, float), (len(table),))
    told = np.broadcast_to(
        np.asarray(rows.behaviour.ends_split_to_interleave, float), (len(table),)
    )
    picks: list[tuple[int, dict]] = []
    for i in todo:
        fw, row, unknown = rows.frameworks[i], table.iloc[i], rows.unknown.iloc[i]
        if failed[i]:
            picks.append((int(i), defaults(fw, row, unknown)))
            continue
        layers = rows.models[i].layers
        units = split_units(fw, layers, ends[i], told[i])
        for choice in options(fw, row, unknown, layers, units):
            picks.append((int(i), choice))
    chosen = table.copy()
    winners = _fastest_fitting(rows, table, picks, todo)
    chosen.loc[winners.index] = winners
    # Megatron-style partial recompute: of the rows that ended on full recompute of every layer,
    # recompute only as many layers per stage as it takes to fit (fewer is faster).
    partial = _partial_recompute(rows, chosen, todo[~failed[todo]])
    winners = _fastest_fitting(rows, chosen, partial, todo)
    chosen.loc[winners.index] = winners
    resolved = pd.DataFrame(
        {f"resolved_{d}": chosen[d].to_numpy() for d in RESOLVED}, index=table.index
    )
    return replace(rows, layouts=chosen), resolved


def _partial_recompute(
    rows: TrainingRows, chosen: pd.DataFrame, todo: np.ndarray
) -> list[tuple[int, dict]]:
    """Each count of fully recomputed layers per stage, up to all of them, for the rows whose
    unknown recompute resolved to full under a framework that can recompute part of a stage."""
    picks: list[tuple[int, dict]] = []
    for i in todo:
        row = chosen.iloc[i]
        if not rows.unknown.iloc[i]["recompute"] or row["recompute"] != Recompute.FULL.value:
            continue
        if rows.frameworks[i].allows("partial_recompute"):
            counts = partial_counts(row, rows.models[i])
            picks += [(int(i), {"recompute_layers": k}) for k in counts]
    return picks


def partial_counts(run: Mapping[str, Any], spec: ModelSpec) -> range:
    """Layers per stage that full recompute of part of a stage can cover: whole layers in each
    of its vp chunks (Megatron-Core counts --recompute-num-layers per model chunk), up to all."""
    vp = int(run["vp"])
    return range(vp, int(busiest_rank_layers(spec.layers, int(run["pp"]), vp)) + 1, vp)


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
    x = rows.inputs().take(index)
    # Full recompute names its layers per stage, as a stated layout does; a row whose
    # recompute was unknown starts from every layer.
    full = trial["recompute"] == Recompute.FULL.value
    every = busiest_rank_layers(np.asarray(x.layers, float), trial["pp"], trial["vp"])
    stated = trial["recompute_layers"].where(trial["recompute_layers"] > 0, every)
    trial["recompute_layers"] = stated.where(full, 0).astype(int)
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
    best = _fastest_then_smallest(index, fits, runnable, out)
    winners = trial.loc[best]
    winners.index = table.index[index[best]]
    return winners


def _fastest_then_smallest(
    group: np.ndarray, fits: np.ndarray, runnable: np.ndarray, out: dict
) -> np.ndarray:
    """Per group of choices, the position of the fastest that fits, else of the runnable one
    needing the least memory (`out`: the cost model's predictions for every choice)."""
    speed = np.where(fits, np.asarray(out["pred_tokens_per_s_per_gpu"], float), -np.inf)
    memory = np.where(runnable, np.asarray(out["pred_peak_mem_gib"], float), np.inf)
    frame = pd.DataFrame({"group": group, "speed": speed, "memory": memory})
    best = frame.sort_values(["group", "speed", "memory"], ascending=[True, False, True])
    return best.drop_duplicates("group", keep="first").index.to_numpy()


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


def auto_settings(names: str | Collection[str]) -> list[str]:
    """The settings named (a comma list or a collection) in AUTO_SETTINGS order; an unknown
    name is one line naming it and what is allowed."""
    given = names.split(",") if isinstance(names, str) else list(names)
    given = [n.strip() for n in given if n.strip()]
    for name in given:
        if name not in AUTO_SETTINGS:
            raise UserError(f"auto: unknown setting '{name}'; allowed: {', '.join(AUTO_SETTINGS)}")
    return [name for name in AUTO_SETTINGS if name in given]


def as_framework_would(
    fw: FrameworkSpec,
    spec: ModelSpec,
    hardware: Hardware,
    does: Behaviour,
    run: ParallelConfig,
    auto: frozenset[str],
    limit_gib: float,
    shape: dict[str, int],
) -> ParallelConfig:
    """`run` with the settings in `auto` chosen as `fw` would run them: every choice it can
    run is evaluated and the fastest that fits is kept (the least memory when none fits);
    where that is full recompute of every layer and `fw` can recompute part of a stage, the
    fewest layers per stage that fit. `shape` holds the model and run figures the layout rules
    check (heads, kv_heads, layers, experts, num_gpus, gbs, seq)."""
    unknown = pd.Series({d: d in auto for d in RESOLVABLE})
    told = float(np.max(does.ends_split_to_interleave))
    units = split_units(fw, spec.layers, float(np.max(does.ends_split)), told)
    choices = options(fw, pd.Series(run.model_dump()), unknown, spec.layers, units)
    best = _fastest_config(fw, spec, hardware, does, run, choices, limit_gib, shape)
    if best.recompute.value == "full" and "recompute" in auto and fw.allows("partial_recompute"):
        partial = [{"recompute_layers": k} for k in partial_counts(best.model_dump(), spec)]
        best = _fastest_config(fw, spec, hardware, does, best, partial, limit_gib, shape)
    return best


def _fastest_config(
    fw: FrameworkSpec,
    spec: ModelSpec,
    hardware: Hardware,
    does: Behaviour,
    run: ParallelConfig,
    choices: list[dict],
    limit_gib: float,
    shape: dict[str, int],
) -> ParallelConfig:
    """Of `run` changed by each choice, the fastest that `fw` can run and fits `limit_gib`,
    else the one needing the least memory."""
    runs = []
    for choice in choices:
        values = run.model_dump() | choice
        if values["recompute"] != "full":
            values["recompute_layers"] = 0
        elif "recompute_layers" not in choice and not values["recompute_layers"]:
            every = busiest_rank_layers(spec.layers, values["pp"], values["vp"])
            values["recompute_layers"] = int(every)
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
    if not runnable.any():
        return run  # nothing the framework can run: the caller's checks name why
    fits = runnable & (np.asarray(preds["pred_peak_mem_gib"], float) <= limit_gib)
    best = _fastest_then_smallest(np.zeros(len(runs), int), fits, runnable, preds)
    return runs[int(best[0])]
