"""The Python API: search(), estimate(), estimate_frame(), infer(), infer_frame(). Each turns
its arguments into typed specs and calls the layer that computes; nothing here models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from autoconfig import catalog, checks, layout
from autoconfig.columns import Behaviour, Hardware, training_inputs
from autoconfig.cost import PREDICTION_COLUMNS, evaluate
from autoconfig.errors import UserError, pydantic_message
from autoconfig.frame import read_training_rows, with_predictions
from autoconfig.serve import search as serve_search
from autoconfig.serve.predict import predict_frame
from autoconfig.serve.request import Budget, Request
from autoconfig.serve.result import ServingResult
from autoconfig.specs import ModelSpec, ParallelConfig, SearchSpace
from autoconfig.training import run as search_run
from autoconfig.training.result import SearchResult


def estimate_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Predictions for every row of `runs` (reference-CSV columns).

    Returns the input columns followed by the pred_* columns, the memory and time breakdowns,
    and `error` ('' for rows that were estimated; the reason otherwise, with blank predictions).
    """
    if runs.empty:
        return runs.assign(**{c: pd.Series(dtype=float) for c in PREDICTION_COLUMNS}, error="")
    runs = runs.reset_index(drop=True)
    rows = read_training_rows(runs)
    with np.errstate(all="ignore"):
        preds = evaluate(rows.inputs())
    return with_predictions(runs, preds, rows.errors)


def estimate(
    model: str | ModelSpec,
    gpu: str,
    num_gpus: int,
    *,
    tp: int = 1,
    pp: int = 1,
    vp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp: int | None = None,
    sp: bool | None = None,
    mbs: int = 1,
    gbs: int | None = None,
    seq_len: int | None = None,
    recompute: str = "none",
    recompute_layers: int | None = None,
    zero: int = 1,
    precision: str = "bf16",
    flash_attention: bool = True,
    gpus_per_node: int | None = None,
    sp_saves_gathered: bool = False,
) -> pd.DataFrame:
    """One configuration's predictions and breakdown as a one-row DataFrame: the layout (every
    dimension, defaults resolved), the run, then the pred_* columns and breakdowns.

    Raises UserError with a one-line reason when the configuration is invalid.
    """
    num_gpus = checks.integer(num_gpus, "gpus")
    for name, value in (("tp", tp), ("pp", pp), ("vp", vp), ("cp", cp), ("ep", ep), ("mbs", mbs)):
        checks.integer(value, name)
    for name, value in (
        ("dp", dp),
        ("gbs", gbs),
        ("seq-len", seq_len),
        ("gpus-per-node", gpus_per_node),
    ):
        if value is not None:
            checks.integer(value, name)
    spec = catalog.get_model(model) if isinstance(model, str) else model
    gpu_spec = catalog.get_gpu(gpu)
    dp = dp if dp is not None else num_gpus // max(tp * pp * cp, 1)
    full = str(recompute) == "full"
    per_stage = -(-spec.layers // max(pp, 1))
    try:  # the spec checks types and ranges and names the failing field
        run = ParallelConfig(
            dp=dp,
            tp=tp,
            pp=pp,
            vp=vp,
            cp=cp,
            ep=ep,
            sp=tp > 1 if sp is None else sp,
            mbs=mbs,
            recompute=recompute,
            recompute_layers=(recompute_layers if recompute_layers is not None else per_stage)
            if full
            else (recompute_layers or 0),
            zero=zero,
            gbs=gbs if gbs is not None else max(dp, 1) * mbs,
            seq_len=seq_len or spec.seq_len,
            precision=precision,
        )
    except ValidationError as exc:
        raise UserError(pydantic_message(exc)) from None
    if not gpu_spec.supports(run.precision.value):
        raise UserError(f"precision: {gpu_spec.name} has no {run.precision.value} tensor cores")
    shape = {
        "heads": spec.heads,
        "kv_heads": spec.kv,
        "layers": spec.layers,
        "experts": spec.num_experts,
        "num_gpus": num_gpus,
        "gbs": run.gbs,
        "seq": run.seq_len,
    }
    broken = layout.first_broken({**layout.columns(layout.frame_of(run.model_dump())), **shape})
    if broken:
        raise UserError(broken)
    hardware = Hardware(gpu_spec, catalog.cluster_for(gpu_spec, gpus_per_node), run.precision)
    inputs = training_inputs(
        spec,
        hardware,
        layout.frame_of(run.model_dump()),
        run.gbs,
        run.seq_len,
        Behaviour(float(flash_attention), 1.0, float(sp_saves_gathered)),
    )
    with np.errstate(all="ignore"):
        preds = evaluate(inputs)
    row = {
        "model": spec.name,
        "gpu": gpu_spec.name,
        "num_gpus": num_gpus,
        **layout.plain(run.model_dump()),
        "gbs": run.gbs,
        "seq_len": run.seq_len,
        "precision": run.precision.value,
        "flash_attention": flash_attention,
    }
    return pd.concat([pd.DataFrame([row]), pd.DataFrame(preds)], axis=1)


def search(
    model: str | ModelSpec,
    gpus: int,
    gpu: str = "h100-sxm-80gb",
    *,
    seq_len: int | None = None,
    gbs: int | None = None,
    precision: str = "bf16",
    space: SearchSpace | str | Path | None = None,
    fix: dict[str, object] | None = None,
    max_tp: int | None = None,
    max_pp: int | None = None,
    min_dp: int | None = None,
    max_memory_gb: float | None = None,
    memory_headroom: float = 0.0,
    gpus_per_node: int | None = None,
    flash_attention: bool = True,
) -> SearchResult:
    """Every valid layout for `gpus` GPUs, evaluated and ranked. `result.table` holds every
    evaluated layout (feasible first, best first); the result's fields say what was asked,
    how many layouts each rule dropped, why the winner wins, and what would fit when nothing
    does."""
    request = search_run.make_request(
        model,
        gpus,
        gpu,
        seq_len=seq_len,
        gbs=gbs,
        precision=precision,
        space=space,
        fix=fix,
        max_tp=max_tp,
        max_pp=max_pp,
        min_dp=min_dp,
        max_memory_gb=max_memory_gb,
        memory_headroom=memory_headroom,
        gpus_per_node=gpus_per_node,
        flash_attention=flash_attention,
    )
    return search_run.run(request)


def infer_frame(points: pd.DataFrame) -> pd.DataFrame:
    """Serving predictions for every row of `points` (inference_runs.csv columns): the input
    columns, then pred_ttft_ms, pred_tpot_ms, pred_latency_ms, pred_output_tokens_per_s_per_gpu,
    pred_fits, the breakdowns, and `error` ('' or the row's reason)."""
    return predict_frame(points)


def infer(
    model: str | ModelSpec,
    gpu: str,
    gpus: int,
    *,
    input_len: int,
    output_len: int,
    max_ttft_ms: float | None = None,
    max_tpot_ms: float | None = None,
    max_latency_ms: float | None = None,
    min_throughput: float | None = None,
    objective: str = "throughput",
    precision: str = "bf16",
    kv_precision: str = "auto",
    max_batch: int = 1024,
    batches: tuple[int, ...] | None = None,
    gpus_per_node: int | None = None,
    allow_tp_across_nodes: bool = False,
) -> ServingResult:
    """Every (tp, pp, batch, replicas) serving candidate on `gpus` GPUs, best first.

    `result.table` columns: the layout, pred_* figures, memory and time breakdowns, `meets`
    (fits and within the budget), `pruned` (why not), `rank`, `pareto`. Raises UserError with
    one line for bad input, including a model that fits on no split of the GPUs.
    """
    return serve_search.search(
        Request(
            model=model,
            gpu=gpu,
            gpus=gpus,
            input_len=input_len,
            output_len=output_len,
            precision=precision,
            kv_precision=kv_precision,
            budget=Budget(max_ttft_ms, max_tpot_ms, max_latency_ms, min_throughput),
            objective=objective,
            max_batch=max_batch,
            batches=batches,
            gpus_per_node=gpus_per_node,
            allow_tp_across_nodes=allow_tp_across_nodes,
        )
    )
