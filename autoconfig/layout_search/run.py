"""The training search from a request to a result: check and resolve the inputs, enumerate,
evaluate and rank every layout, explain the winner, and when nothing fits say what would."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.columns import frameworks
from autoconfig.columns.build import Behaviour, Hardware, training_inputs
from autoconfig.cost import evaluate, optimizer
from autoconfig.layout_search.advice import closest_fix, fixed_values_missing, runs
from autoconfig.layout_search.batch import default_batch
from autoconfig.layout_search.rank import Constraints, explain_winner, memory_limit_gib, rank
from autoconfig.layout_search.result import SearchRequest, SearchResult
from autoconfig.layout_search.space import enumerate_candidates, load_space
from autoconfig.spec import catalog, defaults, layout
from autoconfig.spec.documents import DocLengths
from autoconfig.spec.documents import doc_lengths as read_doc_lengths
from autoconfig.spec.schema import FrameworkSpec, ModelSpec, SearchSpace
from autoconfig.spec.task import (
    DEFAULT_LORA_RANK,
    DEFAULT_LORA_TARGETS,
    TaskSpec,
    check_framework,
    check_model,
    task_spec,
)
from autoconfig.spec.vocab import Choice, Offload, OptimizerState, Precision, Task


def make_request(
    model: str | ModelSpec,
    gpus: int,
    gpu: str = defaults.GPU,
    *,
    seq_len: int | None = None,
    gbs: int | None = None,
    precision: str = defaults.PRECISION.value,
    space: SearchSpace | str | Path | None = None,
    fix: dict[str, object] | None = None,
    max_tp: int | None = None,
    max_pp: int | None = None,
    min_dp: int | None = None,
    max_memory_gib: float | None = None,
    memory_headroom: float = defaults.MEMORY_HEADROOM,
    gpus_per_node: int | None = None,
    flash_attention: bool = True,
    framework: str = defaults.FRAMEWORK.value,
    task: str = Task.PRETRAIN.value,
    lora_rank: int = DEFAULT_LORA_RANK,
    lora_targets: str = DEFAULT_LORA_TARGETS.value,
    doc_lengths: DocLengths | str | Path | None = None,
    packed: bool = True,
) -> SearchRequest:
    """The request with every default resolved; bad input is one UserError line. The one
    resolver of a training question: the search, `estimate` and `plan` all ask it, so each
    refuses and defaults alike."""
    gpus = checks.integer(gpus, "gpus")
    seq_len = None if seq_len is None else checks.integer(seq_len, "seq-len")
    gbs = None if gbs is None else checks.integer(gbs, "gbs")
    memory_headroom = checks.fraction(memory_headroom, "memory-headroom")
    if max_memory_gib is not None:
        max_memory_gib = checks.number(max_memory_gib, "max-memory-gib")
    for name, bound in (("max-tp", max_tp), ("max-pp", max_pp), ("min-dp", min_dp)):
        if bound is not None:
            checks.integer(bound, name)
    if gpus_per_node is not None:
        gpus_per_node = checks.integer(gpus_per_node, "gpus-per-node")
    spec = catalog.get_model(model) if isinstance(model, str) else model
    fw = catalog.get_framework(framework)
    gpu_spec = catalog.get_gpu(gpu)
    precision = Precision.parse(precision, "precision").value
    if not gpu_spec.supports(precision):
        raise UserError(f"precision: {gpu_spec.name} has no {precision} tensor cores")
    if precision not in fw.allows("precisions"):
        allowed = ", ".join(fw.allows("precisions"))
        raise UserError(f"precision: {fw.name} trains in {allowed}, not {precision}")
    what = task_spec(task, lora_rank, lora_targets)
    check_framework(what, fw, precision)
    check_model(what, spec)
    cluster = catalog.cluster_for(gpu_spec, gpus_per_node)
    seq = seq_len or spec.seq_len
    if spec.max_seq_len and seq > spec.max_seq_len:
        raise UserError(f"seq-len: {seq} exceeds {spec.name}'s context of {spec.max_seq_len}")
    if doc_lengths is not None:
        docs = doc_lengths if isinstance(doc_lengths, DocLengths) else read_doc_lengths(doc_lengths)
        what = what.with_documents(docs, seq, packed)
    rule = default_batch(spec, seq) if gbs is None else None
    batch = gbs if rule is None else rule.gbs
    if batch < 1:
        raise UserError(f"gbs: must be a positive integer (got {batch})")
    space_spec = space if isinstance(space, SearchSpace) else load_space(space)
    fixed: dict[str, object] = {}
    for key, value in (fix or {}).items():
        if key not in layout.BY_NAME:
            allowed = ", ".join(layout.NAMES)
            raise UserError(f"fix: unknown dimension '{key}' (allowed: {allowed})")
        fixed[key] = layout.BY_NAME[key].parse(value, "fix: ")
    check_state(fw, fixed.get("optimizer_state"))
    check_offload(fw, fixed.get("offload"))
    check_hybrid_cp(fw, spec, what, fixed.get("hybrid_cp"), fixed)
    if max_tp is not None and min(space_spec.tp) > max_tp:
        raise UserError(f"max-tp: {max_tp} is below every tp in the space {space_spec.tp}")
    if "tp" in fixed and max_tp is not None and int(fixed["tp"]) > max_tp:
        raise UserError(f"fix: tp={fixed['tp']} contradicts --max-tp {max_tp}")
    if "pp" in fixed and max_pp is not None and int(fixed["pp"]) > max_pp:
        raise UserError(f"fix: pp={fixed['pp']} contradicts --max-pp {max_pp}")
    return SearchRequest(
        model=spec,
        gpu=gpu_spec,
        cluster=cluster,
        gpus=gpus,
        seq_len=seq,
        gbs=batch,
        gbs_chosen=gbs is None,
        gbs_rule=rule.rule if rule is not None else f"{batch} sequences (given)",
        precision=precision,
        space=space_spec,
        constraints=Constraints(fixed, max_tp, max_pp, min_dp, max_memory_gib, memory_headroom),
        framework=fw,
        flash_attention=flash_attention,
        task=what,
    )


def check_state(fw: FrameworkSpec, state: object) -> None:
    """A fixed optimizer state the framework cannot keep is one UserError line naming both."""
    if state is not None and str(state) not in fw.allows("optimizer_states"):
        runs = ", ".join(fw.allows("optimizer_states"))
        raise UserError(
            f"optimizer_state: {fw.name} cannot keep Adam state in {state} (it keeps {runs})"
        )


def check_offload(fw: FrameworkSpec, mode: object) -> None:
    """A fixed offload the framework cannot run is one UserError line naming both."""
    if mode is not None and str(mode) not in fw.allows("offloads"):
        runs = ", ".join(fw.allows("offloads"))
        raise UserError(f"offload: {fw.name} cannot offload {mode} to the CPU (it runs {runs})")


def check_hybrid_cp(
    fw: FrameworkSpec,
    model: ModelSpec,
    task: TaskSpec,
    on: object,
    fixed: dict[str, object] | None = None,
) -> None:
    """Dynamic context parallelism fixed on where it cannot run is one UserError line: it
    splits packed documents (--doc-lengths), needs a framework that runs it, Megatron-Core
    refuses it with multi-latent attention (cost.hybrid_cp), and a value `fixed` beside it
    that its layout rules refuse (spec.layout.rules) is named with it."""
    if not on:
        return
    fixed = fixed or {}
    conflicts: dict[str, Callable[[Any], bool]] = {  # on each dimension's plain value
        "zero": lambda v: v >= 2,
        "pp": lambda v: v > 1,
        "mbs": lambda v: v != 1,
        "ep": lambda v: v > 1,
        "cp": lambda v: v < 2 or v & (v - 1) != 0,
        "activation_offload": bool,
    }
    for name, refuses in conflicts.items():
        value = layout.BY_NAME[name].plain(fixed[name]) if name in fixed else None
        if value is not None and refuses(value):
            raise UserError(
                f"hybrid_cp: dynamic context parallelism cannot run with {name}="
                f"{value} (it needs cp a power of two above "
                "1, pp 1, mbs 1, ZeRO 0 or 1, no expert parallelism or activation offload)"
            )
    if not fw.allows("hybrid_context_parallel"):
        raise UserError(f"hybrid_cp: {fw.name} has no dynamic context parallelism")
    if not task.doc_classes:
        raise UserError(
            "hybrid_cp: dynamic context parallelism splits packed documents; give their "
            "lengths with --doc-lengths (packed)"
        )
    if model.mla is not None:
        raise UserError(f"hybrid_cp: {model.name}'s multi-latent attention cannot run it")


def with_hybrid_cp(req: SearchRequest, table: pd.DataFrame) -> pd.DataFrame:
    """The layouts, with a dynamic-CP twin of each layout with cp > 1 and pp 1 where the run
    packs documents and the framework runs it (cost.hybrid_cp); all of them dynamic where
    --fix hybrid_cp=true asks. The twin differs only in speed (its ring and attention blocks
    follow each document's length), so both are ranked."""
    fixed = req.constraints.fixed.get("hybrid_cp")
    eligible = (
        bool(req.task.doc_classes)
        and req.framework.allows("hybrid_context_parallel")
        and req.model.mla is None
    )
    if not eligible or fixed is False:
        return table
    twins = table[table["cp"] > 1].assign(hybrid_cp=True)
    twins = twins[runs(req, twins)[0]]  # cp a power of two, pp 1, mbs 1 ...
    if fixed:
        return twins.reset_index(drop=True)
    return pd.concat([table, twins], ignore_index=True)


def evaluate_all(req: SearchRequest) -> SearchResult:
    """Enumerate, evaluate and rank; raises UserError when no layout uses the GPUs."""
    cands = enumerate_candidates(
        req.model, req.gpus, req.gbs, req.seq_len, req.space, req.cluster.domain, req.framework
    )
    if cands.table.empty:
        reasons = ", ".join(f"{k} ({v})" for k, v in cands.dropped.items())
        left = sum(cands.left_out.values())
        cannot = f"; {left:,} that {req.framework.name} cannot run" if left else ""
        raise UserError(
            f"gpus: no layout of {req.model.name} uses {req.gpus} GPUs with gbs {req.gbs} "
            f"(dropped: {reasons}{cannot})"
        )
    table = with_hybrid_cp(req, cands.table)
    fixed_state = req.constraints.fixed.get("optimizer_state")
    if fixed_state is not None:
        # a fixed state is every layout's state, not a filter on the derived ones
        table = table.assign(optimizer_state=OptimizerState(fixed_state).value)
    fixed_offload = req.constraints.fixed.get("offload")
    if fixed_offload is not None and Offload(fixed_offload) is not Offload.NONE:
        # a fixed offload is every layout's, where the framework runs it with that layout
        table = table.assign(offload=Offload(fixed_offload).value)
        ok, why = runs(req, table, layout_rules=False)
        if not ok.any():
            raise UserError(why)
        table = table[ok].reset_index(drop=True)
    if req.constraints.fixed.get("activation_offload"):
        # every layout's, where the framework and the layout rules let it run
        table = table.assign(activation_offload=True)
        ok, why = runs(req, table)
        if not ok.any():
            raise UserError(why)
        table = table[ok].reset_index(drop=True)
    hardware = Hardware(req.gpu, req.cluster, req.precision)
    does = frameworks.behaviour(req.framework, req.precision, float(req.flash_attention), req.task)
    inputs = training_inputs(req.model, hardware, table, req.gbs, req.seq_len, does)
    with np.errstate(all="ignore"):
        preds = {k: np.array(v) for k, v in evaluate(inputs).items()}
        if fixed_state is None:
            lighter_state(req, table, preds, hardware, does)
        offloaded(req, table, preds, hardware, does)
        # rank reads only the cluster's GPUs per node from `inputs`; the predictions carry
        # each layout's optimizer state
        table = rank(table, inputs, req.constraints, preds)
    pruned = table.loc[table["pruned"] != "", "pruned"].str.split(":").str[0].value_counts()
    return SearchResult(
        request=req,
        table=table,
        enumerated=cands.enumerated,
        dropped=cands.dropped,
        left_out=cands.left_out,
        pruned=pruned.to_dict(),
        explanation=explain_winner(table),
    )


def lighter_state(
    req: SearchRequest,
    table: pd.DataFrame,
    preds: dict[str, np.ndarray],
    hardware: Hardware,
    does: Behaviour,
) -> None:
    """Gives each layout that does not fit with fp32 Adam state the heaviest lighter state its
    framework runs that fits (bf16, then fp8 moments), in place in `table` and `preds`.

    The state is not crossed with the other dimensions: lighter state changes the numerics,
    so a layout that fits with fp32 state keeps it, and only the layouts short of memory are
    evaluated again, which keeps the search as fast as before where everything fits. A
    layout that cannot fit even without any optimizer state is not tried."""
    states = [
        s
        for s in OptimizerState
        if s is not OptimizerState.FP32 and s.value in req.framework.allows("optimizer_states")
    ]
    if not states:
        return
    limit = memory_limit_gib(preds["mem_capacity_gib"], req.constraints)
    peak, over = preds["pred_peak_mem_gib"], preds["mem_overhead_gib"]
    # the lightest state (fp8 and bf16 moments, 16-bit main-parameter remainders: 5 of fp32's
    # 12 bytes) and the overhead charged on what it drops bound what any lighter state saves
    share = over / np.maximum(peak - over, 1e-9)
    lightest = optimizer.REMAINDER_BYTES + sum(optimizer.MOMENT_BYTES[optimizer.FP8_STATE])
    saved = 1.0 - lightest / 12.0
    bound = peak - preds["mem_optimizer_gib"] * saved * (1.0 + share)
    runs_lighter = table["zero"].astype(int).isin(req.framework.allows("lighter_state_zero"))
    todo = np.flatnonzero((peak > limit) & (bound <= limit) & runs_lighter.to_numpy())
    first_that_fits(req, table, preds, hardware, does, "optimizer_state", states, todo, limit)


def offloaded(
    req: SearchRequest,
    table: pd.DataFrame,
    preds: dict[str, np.ndarray],
    hardware: Hardware,
    does: Behaviour,
) -> None:
    """Gives each layout that fits neither with fp32 nor with a lighter Adam state the fastest
    host offload its framework runs that makes it fit, in place in `table` and `preds`: the
    optimizer's, or the optimizer's with the sharded weights and gradients (cost.offload), the
    saved activations' (cost.activation_offload), or one of each. A value --fix names stays.

    Offload is the last resort: it keeps the numerics but pays the host link (and a CPU Adam
    step at a fraction of HBM's bandwidth), so a layout that fits on the GPU never takes it,
    and lighter state (faster, not slower) is tried first. Which offload costs least depends
    on the layout (activation copies hide behind long layers; the CPU step does not), so
    every one the framework runs is evaluated and the fastest that fits kept. Only layouts
    short of memory whose GPU peak without everything movable (and the overhead charged on
    it) would fit are evaluated again."""
    fixed = req.constraints.fixed
    modes = [m for m in Offload if m.value in req.framework.allows("offloads")]
    state_ok = fixed.get("optimizer_state") in (None, OptimizerState.FP32)
    offloads: list[Offload | None] = [None]
    if "offload" not in fixed and state_ok:
        offloads += modes[1:]
    activations: list[bool | None] = [None]
    if "activation_offload" not in fixed and req.framework.allows("activation_offload"):
        activations.append(True)
    options = [
        {k: v for k, v in (("offload", o), ("activation_offload", a)) if v is not None}
        for o in offloads
        for a in activations
    ]
    options = [o for o in options if o]  # the layout as it is was evaluated already
    if not options:
        return
    limit = memory_limit_gib(preds["mem_capacity_gib"], req.constraints)
    peak, over = preds["pred_peak_mem_gib"], preds["mem_overhead_gib"]
    share = over / np.maximum(peak - over, 1e-9)
    movable = np.zeros_like(peak)
    if any("offload" in o for o in options):
        movable = movable + preds["mem_optimizer_gib"]
    if Offload.PARAMS in offloads:
        movable = movable + preds["mem_weights_gib"] + preds["mem_gradients_gib"]
    if True in activations:
        movable = movable + preds["mem_activations_gib"] + preds["mem_pipeline_in_flight_gib"]
    todo = np.flatnonzero((peak > limit) & (peak - movable * (1.0 + share) <= limit))
    if not len(todo):
        return
    best_step = np.full(len(todo), np.inf)
    got_rows: dict[str, np.ndarray] = {k: preds[k][todo].copy() for k in preds}
    names = ("offload", "activation_offload")
    original = {n: table[n].to_numpy(dtype=object)[todo] for n in names}
    chosen = {n: column.copy() for n, column in original.items()}
    for option in options:
        plain = {k: v.value if isinstance(v, Choice) else v for k, v in option.items()}
        subset = table.iloc[todo].assign(**plain)
        ok = runs(req, subset)[0]
        if not ok.any():
            continue
        x = training_inputs(req.model, hardware, subset[ok], req.gbs, req.seq_len, does)
        got = evaluate(x)
        tried = np.flatnonzero(ok)
        fits = (got["pred_peak_mem_gib"] <= limit[todo][tried]) & ~(
            got["mem_host_gib"] > got["host_capacity_gib"]
        )
        faster = fits & (got["pred_step_time_s"] < best_step[tried])
        rows = tried[faster]
        best_step[rows] = got["pred_step_time_s"][faster]
        for key, values in got.items():
            got_rows[key][rows] = values[faster]
        for name in names:  # an option leaves what it does not name as the layout had it
            chosen[name][rows] = plain[name] if name in plain else original[name][rows]
    taken = np.isfinite(best_step)
    for key in preds:
        preds[key][todo[taken]] = got_rows[key][taken]
    for name in names:
        column = table[name].to_numpy(dtype=object, copy=True)
        column[todo[taken]] = chosen[name][taken]
        table[name] = column.astype(bool) if name == "activation_offload" else column


def first_that_fits(
    req: SearchRequest,
    table: pd.DataFrame,
    preds: dict[str, np.ndarray],
    hardware: Hardware,
    does: Behaviour,
    dimension: str,
    values: Sequence[Choice],
    todo: np.ndarray,
    limit: np.ndarray,
) -> None:
    """Evaluates the rows `todo` of `table` again with `dimension` set to each of `values` in
    turn and gives each row the first that fits the GPU memory `limit` (and the host memory,
    where the evaluation reports it), in place in `table` and `preds`."""
    column = table[dimension].to_numpy(dtype=object, copy=True)
    for value in values:
        if not len(todo):
            break
        subset = table.iloc[todo].assign(**{dimension: value.value})
        x = training_inputs(req.model, hardware, subset, req.gbs, req.seq_len, does)
        got = evaluate(x)
        fits = (got["pred_peak_mem_gib"] <= limit[todo]) & ~(
            got["mem_host_gib"] > got["host_capacity_gib"]
        )
        rows = todo[fits]
        for key, got_values in got.items():
            preds[key][rows] = got_values[fits]
        column[rows] = value.value
        todo = np.setdiff1d(todo, rows)
    table[dimension] = column


def run(req: SearchRequest) -> SearchResult:
    """The search; when nothing fits, advice on the closest layout and on more GPUs."""
    result = evaluate_all(req)
    if result.feasible:
        return result
    advice = fixed_values_missing(result.table, req) + closest_fix(result.table, req)
    if not result.table["pruned"].str.startswith("memory").any():
        result.advice = advice  # constraints, not memory: more GPUs would not help
        return result
    for factor in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        more = req.gpus * factor
        batch = req.gbs  # the batch rule does not depend on the GPU count
        try:
            bigger = evaluate_all(replace(req, gpus=more))
        except UserError:
            continue
        if bigger.feasible:
            top = bigger.table.iloc[0]
            advice.append(
                f"  with {more} GPUs (gbs {batch}): {layout.label(top)} "
                f"fits at {top['pred_peak_mem_gib']:.1f} GiB"
            )
            break
    result.advice = advice
    return result
