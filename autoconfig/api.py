"""The Python API: search(), estimate(), estimate_frame(), infer(), infer_frame(),
infer_fewest_gpus(). Each turns
its arguments into typed specs and calls the layer that computes; nothing here models.

`search`, `estimate` and `infer` take the same leading arguments, in the same order: the
model, the number of GPUs, then the GPU type (autoconfig.spec.defaults.GPU when left out).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from autoconfig.base import checks
from autoconfig.base.errors import UserError, pydantic_message
from autoconfig.columns import frameworks
from autoconfig.columns.build import Behaviour, Hardware, training_inputs
from autoconfig.cost import PREDICTION_COLUMNS, CostInputs, comm, evaluate
from autoconfig.cost.inputs import busiest_rank_layers, interleaves_by_counting_ends
from autoconfig.layout_search import batch
from autoconfig.layout_search import run as search_run
from autoconfig.layout_search.result import SearchResult
from autoconfig.layout_search.space import mlp_split_rule
from autoconfig.rows.resolve import RESOLVED, as_framework_would, auto_settings, read_resolved
from autoconfig.rows.training import with_predictions
from autoconfig.spec import defaults, layout
from autoconfig.spec.documents import DocLengths
from autoconfig.spec.schema import FrameworkSpec, ModelSpec, ParallelConfig, SearchSpace
from autoconfig.spec.task import DEFAULT_LORA_RANK, DEFAULT_LORA_TARGETS, PRETRAIN, TaskSpec
from autoconfig.spec.vocab import Batching, Engine, Offload, OptimizerState, Task

if TYPE_CHECKING:
    from autoconfig.serve.fewest import Fewest
    from autoconfig.serve.result import ServingResult
    from autoconfig.serve.workload import Workload

# The serving functions below import the serving stack when called: a training search or
# estimate never loads it (start-up is most of a command line search's wall time).


def estimate_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Predictions for every row of `runs` (reference-CSV columns).

    Returns the input columns followed by the pred_* columns, the memory and time breakdowns,
    `error` ('' for rows that were estimated; the reason otherwise, with blank predictions),
    and the `resolved_*` values: a setting the row leaves unknown (zero, recompute, sp, vp,
    etp) is the fastest choice its framework can run that fits (autoconfig.rows.resolve).
    """
    resolved_columns = [f"resolved_{d}" for d in RESOLVED]
    if runs.empty:
        empty = {c: pd.Series(dtype=float) for c in [*PREDICTION_COLUMNS, *resolved_columns]}
        return runs.assign(**empty, error="")
    runs = runs.reset_index(drop=True)
    rows, resolved = read_resolved(runs)
    with np.errstate(all="ignore"):
        preds = evaluate(rows.inputs())
    refused = rows.errors.to_numpy() != ""  # nothing was chosen for a refused row
    resolved = pd.DataFrame(
        {c: np.where(refused, None, resolved[c].to_numpy(dtype=object)) for c in resolved},
        index=resolved.index,
    )
    return pd.concat([with_predictions(runs, preds, rows.errors), resolved], axis=1)


def estimate(
    model: str | ModelSpec,
    gpus: int,
    gpu: str = defaults.GPU,
    *,
    tp: int = 1,
    pp: int = 1,
    vp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    dp: int | None = None,
    sp: bool | None = None,
    mbs: int = 1,
    gbs: int | None = None,
    seq_len: int | None = None,
    recompute: str = defaults.RECOMPUTE.value,
    recompute_layers: int | None = None,
    zero: int = defaults.ZERO,
    optimizer_state: str = OptimizerState.FP32.value,
    offload: str = Offload.NONE.value,
    hybrid_cp: bool = False,
    activation_offload: bool = False,
    precision: str = defaults.PRECISION.value,
    flash_attention: bool = True,
    gpus_per_node: int | None = None,
    sp_saves_gathered: bool | None = None,
    framework: str = defaults.FRAMEWORK.value,
    max_memory_gib: float | None = None,
    memory_headroom: float = defaults.MEMORY_HEADROOM,
    auto: Collection[str] = (),
    task: str = Task.PRETRAIN.value,
    lora_rank: int = DEFAULT_LORA_RANK,
    lora_targets: str = DEFAULT_LORA_TARGETS.value,
    doc_lengths: DocLengths | str | Path | None = None,
    packed: bool = True,
) -> pd.DataFrame:
    """One configuration's predictions and breakdown as a one-row DataFrame: the layout (every
    dimension, defaults resolved), the run, then the pred_* columns and breakdowns, for the
    layout run by `framework` (what it overlaps and fuses; a layout it cannot run is refused).
    Settings named in `auto` (zero, recompute, sp, vp) are chosen as the framework would run
    them: the fastest choice it can run that fits, else the one needing the least memory
    (autoconfig.rows.resolve); `auto` in the result names them.
    Without `gbs` the batch follows the search's rule (layout_search/batch.py) rounded to a multiple
    of dp*mbs; `gbs_rule` says which. `mem_limit_gib` is the capacity less `memory_headroom`,
    at most `max_memory_gib`; `pred_fits` compares the peak with it. `task` (pretrain, sft,
    lora, qlora) says what the run trains; lora and qlora train adapters of `lora_rank` on
    `lora_targets` (qkv, attention, all) over frozen base weights (spec/task.py).
    `optimizer_state` (fp32, bf16, fp8) is the precision of the Adam state
    (cost/optimizer.py), where the framework runs it. `offload` (none, optimizer,
    optimizer+params) is what stays in host memory, timed over the host link with the Adam
    step on the CPU (cost/offload.py; `mem_host_gib`, `time_offload_s`). `doc_lengths` (a
    preset name such as 'squad', a CSV of lengths, or a DocLengths) says how long the
    documents of a sequence are: `packed` into it (attention per document) or padded to it
    one a sequence (spec/documents.py). `hybrid_cp` splits each packed document over only the
    context-parallel ranks its length needs (Megatron-Core's dynamic CP; cost/hybrid_cp.py).
    `activation_offload` keeps the activations layers save for backward in host memory,
    copied beside compute (cost/activation_offload.py).

    Raises UserError with a one-line reason when the configuration is invalid.
    """
    # The model, GPUs, framework, precision, sequence, batch and memory limits are resolved
    # as the search resolves them (one resolver: the same refusals, the same defaults).
    request = search_run.make_request(
        model,
        gpus,
        gpu,
        seq_len=seq_len,
        gbs=gbs,
        precision=precision,
        max_memory_gib=max_memory_gib,
        memory_headroom=memory_headroom,
        gpus_per_node=gpus_per_node,
        flash_attention=flash_attention,
        framework=framework,
        task=task,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        doc_lengths=doc_lengths,
        packed=packed,
    )
    spec, gpu_spec, fw, num_gpus = request.model, request.gpu, request.framework, request.gpus
    sizes = {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "ep": ep, "etp": etp, "mbs": mbs}
    for name, value in sizes.items():
        checks.integer(value, name)
    if dp is not None:
        checks.integer(dp, "dp")
    dp = dp if dp is not None else num_gpus // (tp * pp * cp)
    full = str(recompute) == "full"
    per_stage = int(busiest_rank_layers(spec.layers, pp, vp))
    chosen = batch.default_batch(spec, request.seq_len) if request.gbs_chosen else None
    rule = batch.fitted_to(chosen, max(dp, 1) * mbs) if chosen is not None else None
    gbs = rule.gbs if rule is not None else request.gbs
    gbs_rule = rule.rule if rule is not None else request.gbs_rule
    try:  # the spec checks types and ranges and names the failing field
        run = ParallelConfig(
            dp=dp,
            tp=tp,
            pp=pp,
            vp=vp,
            cp=cp,
            ep=ep,
            etp=etp,
            sp=tp > 1 if sp is None else sp,
            mbs=mbs,
            recompute=recompute,
            recompute_layers=(recompute_layers if recompute_layers is not None else per_stage)
            if full
            else (recompute_layers or 0),
            zero=zero,
            optimizer_state=optimizer_state,
            offload=offload,
            hybrid_cp=hybrid_cp,
            activation_offload=activation_offload,
            gbs=gbs,
            seq_len=request.seq_len,
            precision=request.precision,
        )
    except ValidationError as exc:
        raise UserError(pydantic_message(exc)) from None
    search_run.check_hybrid_cp(fw, spec, request.task, run.hybrid_cp)
    hardware = Hardware(gpu_spec, request.cluster, run.precision)
    does = _behaviour(fw, run.precision.value, flash_attention, sp_saves_gathered, request.task)
    limit_gib = gpu_spec.memory_gib * (1 - request.constraints.memory_headroom)
    if request.constraints.max_memory_gib is not None:
        limit_gib = min(limit_gib, request.constraints.max_memory_gib)
    auto = auto_settings(auto)
    shape = _shape(spec, num_gpus, run)  # what --auto may change leaves these alone
    if auto:
        run = as_framework_would(fw, spec, hardware, does, run, frozenset(auto), limit_gib, shape)
    codes = {**layout.columns(layout.frame_of(run.model_dump())), **shape}
    broken = layout.first_broken(codes) or frameworks.first_broken(fw, codes)
    if broken:
        raise UserError(broken)
    # What `train` refuses beside the shared rules (trainer/config.py, in its words) and the
    # search never enumerates: interleaved chunks that split neither the layers nor, counting
    # the embedding and the head as a layer each where the framework can, the layers + 2; and
    # a stage recomputing more layers than it holds.
    chunks = run.pp * run.vp
    counted = bool(interleaves_by_counting_ends(spec.layers, run.pp, run.vp)) and (
        frameworks.counts_ends_to_interleave(fw)
    )
    held = int(busiest_rank_layers(spec.layers, run.pp, run.vp))
    for bad, message in (
        (
            run.vp > 1 and spec.layers % chunks != 0 and not counted,
            f"pp: pp*vp = {chunks} must divide the {spec.layers} layers (or, interleaved, "
            f"{spec.layers} + 2 with the embedding and the head as layers)",
        ),
        (
            run.recompute_layers > held,
            f"recompute_layers: at most {held} layers per stage",
        ),
        *(
            (bool(np.any(bad)), f"tp: {run.tp} does not divide the MLP width ({spec.ffn})")
            for _, bad in mlp_split_rule(
                {"tp": np.array([run.tp]), "etp": np.array([run.etp])}, spec
            )
        ),
    ):
        if bad:
            raise UserError(message)
    inputs = training_inputs(
        spec, hardware, layout.frame_of(run.model_dump()), run.gbs, run.seq_len, does
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
        "framework": fw.name,
        "task": request.task.label(),
        "gbs_rule": gbs_rule,
        "auto": ",".join(auto),
    }
    out = pd.concat([pd.DataFrame([row]), pd.DataFrame(preds), _links(inputs)], axis=1)
    out["mem_limit_gib"] = limit_gib
    out["pred_fits"] = out["pred_peak_mem_gib"] <= limit_gib
    return out


def _links(inputs: CostInputs) -> pd.DataFrame:
    """Per parallel group: `comm_<group>_ranks`, `comm_<group>_link` (nvlink or network) and
    `comm_<group>_bus_gb_s` (the bus bandwidth its collectives get per GPU)."""

    def first(value: object) -> float:  # inputs of one layout: scalars or length-1 arrays
        return float(np.asarray(value).reshape(-1)[0])

    columns: dict[str, list] = {}
    for name, (ranks, link, network) in comm.group_links(inputs).items():
        columns[f"comm_{name}_ranks"] = [int(first(ranks))]
        columns[f"comm_{name}_link"] = ["network" if first(network) else "nvlink"]
        columns[f"comm_{name}_bus_gb_s"] = [first(link.bandwidth) / 1e9]
    return pd.DataFrame(columns)


def _shape(spec: ModelSpec, num_gpus: int, run: ParallelConfig) -> dict[str, int]:
    """The model and run figures the layout and framework rules check beside the layout."""
    return {
        "heads": spec.heads,
        "kv_heads": spec.kv,
        "layers": spec.layers,
        "experts": spec.num_experts,
        "num_gpus": num_gpus,
        "gbs": run.gbs,
        "seq": run.seq_len,
    }


def _behaviour(
    fw: FrameworkSpec,
    precision: str,
    flash: bool,
    sp_saves_gathered: bool | None,
    task: TaskSpec = PRETRAIN,
) -> Behaviour:
    does = frameworks.behaviour(fw, precision, float(flash), task)
    if sp_saves_gathered is None:
        return does
    return replace(does, sp_saves_gathered=float(sp_saves_gathered))


def search(
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
) -> SearchResult:
    """Every valid layout for `gpus` GPUs, evaluated and ranked. `result.table` holds every
    evaluated layout (feasible first, best first); the result's fields say what was asked,
    how many layouts each rule dropped, why the winner wins, and what would fit when nothing
    does. `task`, `lora_rank`, `lora_targets`, `doc_lengths` and `packed` as in
    `estimate`."""
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
        max_memory_gib=max_memory_gib,
        memory_headroom=memory_headroom,
        gpus_per_node=gpus_per_node,
        flash_attention=flash_attention,
        framework=framework,
        task=task,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        doc_lengths=doc_lengths,
        packed=packed,
    )
    return search_run.run(request)


def infer_frame(points: pd.DataFrame) -> pd.DataFrame:
    """Serving predictions for every row of `points` (inference_runs.csv columns): the input
    columns, then pred_ttft_ms, pred_tpot_ms, pred_latency_ms, pred_output_tokens_per_s_per_gpu,
    pred_fits, the breakdowns, and `error` ('' or the row's reason)."""
    from autoconfig.serve.predict import predict_frame

    return predict_frame(points)


def infer(
    model: str | ModelSpec,
    gpus: int,
    gpu: str = defaults.GPU,
    *,
    input_len: int | str | None = None,
    output_len: int | str | None = None,
    max_ttft_ms: float | None = None,
    max_tpot_ms: float | None = None,
    max_latency_ms: float | None = None,
    min_throughput: float | None = None,
    objective: str = "throughput",
    precision: str | tuple[str, ...] | None = None,
    kv_precision: str | tuple[str, ...] | None = None,
    max_batch: int = 1024,
    batches: tuple[int, ...] | None = None,
    gpus_per_node: int | None = None,
    allow_tp_across_nodes: bool = False,
    batching: str = "continuous",
    workload: Workload | str | Path | None = None,
    request_rate: float | None = None,
    percentile: float = 90.0,
    max_num_seqs: tuple[int, ...] | None = None,
    max_num_batched_tokens: tuple[int, ...] | None = None,
    kv_cache_fraction: float = 0.9,
    disaggregation: bool = True,
    requests: int | None = None,
    seed: int = 0,
    engine: str = "vllm",
    prefix_hit_rate: float | None = None,
    speculative_tokens: int | None = None,
    acceptance_rate: float | None = None,
    speculative_method: str | None = None,
    decode_gpu: str | None = None,
    decode_gpus: int | None = None,
    gpu_hour_usd: float | tuple[float, ...] | None = (),
) -> ServingResult:
    """Every serving candidate on `gpus` GPUs, best first.

    Continuous batching (the default): every (tp, pp, ep, replicas, weight and K/V precision,
    max-num-seqs, max-num-batched-tokens) replica, and disaggregated prefill/decode pools,
    ranked by goodput (requests/s within the TTFT/TPOT/latency limits at `percentile`) from a
    scheduler simulation of `workload` (a Workload, a CSV path, or the lengths given: an int
    or 'LOW:HIGH'; the typical chat turn without either). With `request_rate` the deployments
    that meet the limits at that rate come first. `engine` (vllm, sglang, trtllm) sets whose
    all-reduce kernels, CUDA graphs and formats the deployments run (spec/engines.py).

    `prefix_hit_rate` (0 <= F < 1): that share of each prompt is already in the prefix cache.
    `speculative_tokens` K with `acceptance_rate` a: each decode step verifies K draft tokens
    and emits (1 - a^(K+1)) / (1 - a) on average; `speculative_method` eagle (default),
    eagle3, mtp or ngram sets the draft's cost (serve/features.py states the assumptions).

    `decode_gpu` with `decode_gpus`: mixed pools, prefill instances on at most `gpus` GPUs of
    `gpu` and decode instances on at most `decode_gpus` of `decode_gpu`, each role simulated on
    its own type (serve/mixed.py); only disaggregated deployments are ranked, and
    `result.comparison` says what each type alone serves. `gpu_hour_usd` (one price for both
    types, or the prefill type's and the decode type's) adds goodput per USD.

    Static batching: every (tp, pp, batch, replicas) with its TTFT, TPOT and latency, ranked
    by throughput per GPU or latency (`objective`).

    `result.table` holds every candidate with `meets`, `pruned` (why not) and `rank`. Raises
    UserError with one line for bad input, including a model that fits on no split.
    """
    from autoconfig.serve import continuous
    from autoconfig.serve import search as serve_search
    from autoconfig.serve.request import Budget, Request
    from autoconfig.serve.workload import Lengths

    budget = Budget(max_ttft_ms, max_tpot_ms, max_latency_ms, min_throughput)
    kind = Batching.parse(batching, "batching")
    engine = Engine.parse(engine, "engine").value
    weights = (precision,) if isinstance(precision, str) else precision
    kvs = (kv_precision,) if isinstance(kv_precision, str) else kv_precision
    if gpu_hour_usd is None:
        prices: tuple[float, ...] = ()
    elif isinstance(gpu_hour_usd, int | float | str):
        prices = (checks.number(gpu_hour_usd, "gpu-hour-usd"),)
    else:
        prices = tuple(checks.number(p, "gpu-hour-usd") for p in gpu_hour_usd)
    if decode_gpus is not None:
        decode_gpus = checks.integer(decode_gpus, "decode-gpus")
    if decode_gpu is not None or decode_gpus is not None or prices:
        from autoconfig.serve.mixed import check

        # Before any work, and for static batching too (which has no pools to mix).
        asked = Request(model, gpu, gpus, 0, 0, batching=kind.value, disaggregation=disaggregation)
        check(replace(asked, decode_gpu=decode_gpu, decode_gpus=decode_gpus, gpu_hour_usd=prices))
    if kind is Batching.STATIC:
        for name, value in (
            ("prefix-hit-rate", prefix_hit_rate),
            ("speculative-tokens", speculative_tokens),
            ("acceptance-rate", acceptance_rate),
            ("speculative-method", speculative_method),
        ):
            if value is not None:
                raise UserError(f"{name}: modelled for continuous batching only")
        for name, value in (("input-len", input_len), ("output-len", output_len)):
            if value is None:
                raise UserError(f"{name}: required for static batching")
        fixed = [
            Lengths.parse(v, n) for n, v in (("input-len", input_len), ("output-len", output_len))
        ]
        for name, length in zip(("input-len", "output-len"), fixed, strict=True):
            if length.low != length.high:
                raise UserError(f"{name}: static batching takes one length, not a range")
        return serve_search.search(
            Request(
                model=model,
                gpu=gpu,
                gpus=gpus,
                input_len=fixed[0].low,
                output_len=fixed[1].low,
                precision=(weights or (defaults.PRECISION.value,))[0],
                kv_precision=(kvs or ("auto",))[0],
                budget=budget,
                objective=objective,
                max_batch=max_batch,
                batches=batches,
                gpus_per_node=gpus_per_node,
                allow_tp_across_nodes=allow_tp_across_nodes,
            )
        )
    load = make_workload(workload, input_len, output_len, requests, seed)
    return continuous.search(
        Request(
            model=model,
            gpu=gpu,
            gpus=gpus,
            input_len=round(load.input.mean),
            output_len=round(load.output.mean),
            budget=budget,
            objective=objective,
            gpus_per_node=gpus_per_node,
            allow_tp_across_nodes=allow_tp_across_nodes,
            batching=kind.value,
            workload=load,
            request_rate=request_rate,
            percentile=percentile,
            precisions=weights,
            kv_precisions=kvs,
            max_seqs=max_num_seqs,
            max_tokens=max_num_batched_tokens,
            kv_fraction=kv_cache_fraction,
            disaggregation=disaggregation,
            engine=engine,
            prefix_hit_rate=prefix_hit_rate,
            speculative_tokens=speculative_tokens,
            acceptance_rate=acceptance_rate,
            speculative_method=speculative_method,
            decode_gpu=decode_gpu,
            decode_gpus=decode_gpus,
            gpu_hour_usd=prices,
        )
    )


def infer_fewest_gpus(
    model: str | ModelSpec,
    gpu: str | tuple[str, ...],
    request_rate: float,
    *,
    gpu_hour_usd: tuple[float, ...] = (),
    max_gpus: int | None = None,
    gpus_per_node: int | None = None,
    **options: Any,
) -> Fewest:
    """The fewest GPUs of each type in `gpu` whose best continuous-batching deployment meets
    the limits at `request_rate` requests/s, and of those the cheapest (by `gpu_hour_usd`, USD
    per GPU-hour, one for all types or one per type; without prices, the fewest GPUs). GPU
    counts follow `autoconfig plan`'s grid (powers of two below a node, then 1, 2, 3, 4, 6, 8,
    ... nodes) up to `max_gpus` (128), with a bisection over whole nodes below the first count
    that meets. `options` go to every `infer` call (limits, percentile, workload, features).
    `.tried` holds every count's ServingResult; `.chosen` the answer (None: nothing meets)."""
    from autoconfig.serve.fewest import DEFAULT_MAX_GPUS, fewest_gpus

    if Batching.parse(str(options.get("batching", "continuous")), "batching") is Batching.STATIC:
        raise UserError("gpus: the fewest-GPU search needs continuous batching (give --gpus)")
    for name in ("gpus", "request_rate"):
        if name in options:
            raise UserError(f"{name.replace('_', '-')}: set by the fewest-GPU search itself")
    # One workload for every count: each is simulated on the same requests.
    options["workload"] = make_workload(
        options.pop("workload", None),
        options.pop("input_len", None),
        options.pop("output_len", None),
        options.pop("requests", None),
        int(options.get("seed", 0)),
    )
    types = (gpu,) if isinstance(gpu, str) else tuple(gpu)

    def search(name: str, count: int) -> ServingResult:
        return infer(
            model,
            count,
            name,
            request_rate=request_rate,
            gpus_per_node=gpus_per_node,
            **options,
        )

    return fewest_gpus(
        search,
        types,
        request_rate,
        tuple(gpu_hour_usd),
        DEFAULT_MAX_GPUS if max_gpus is None else max_gpus,
        gpus_per_node,
    )


def make_workload(
    workload: Workload | str | Path | None,
    input_len: int | str | None,
    output_len: int | str | None,
    requests: int | None = None,
    seed: int = 0,
) -> Workload:
    """The workload asked for: a Workload, a CSV of lengths (and arrival times), the lengths
    given, or the typical chat turn."""
    from autoconfig.serve.workload import DEFAULT_REQUESTS, Lengths, Workload, chat, read_workload

    count = requests or DEFAULT_REQUESTS
    if requests is not None and requests < 20:
        raise UserError(f"requests: simulate at least 20 requests (got {requests})")
    if isinstance(workload, Workload):
        return workload
    if workload is not None:
        if input_len is not None or output_len is not None:
            raise UserError("workload: give either --workload or --input-len/--output-len")
        return read_workload(Path(workload), seed, count)
    base = chat()
    given = Workload(
        Lengths.parse(input_len, "input-len") if input_len is not None else base.input,
        Lengths.parse(output_len, "output-len") if output_len is not None else base.output,
        requests=count,
        seed=seed,
        source="typical chat" if input_len is None and output_len is None else "given lengths",
    )
    return given


if TYPE_CHECKING:
    from autoconfig.rl.plan import RLPlans


def rl_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """RL step predictions for every row of `runs` (rl_runs.csv columns): the input columns,
    then pred_step_time_s and its phases (rollout, logprob, update, critic, sync, switch),
    pred_tokens_per_s_per_gpu, pred_fits, ape_step_time, `note` (how the row's text was read)
    and `error` ('' or why the row was not predicted)."""
    from autoconfig.rl.runs import predict_runs

    return predict_runs(runs)


def rl(
    model: str | ModelSpec,
    gpus: int,
    gpu: str = defaults.GPU,
    *,
    algorithm: str = "grpo",
    prompts: int = 64,
    samples: int = 16,
    prompt_len: int = 256,
    max_response_len: int | None = None,
    mean_response_len: float | None = None,
    critic: str | ModelSpec | None = None,
    reference: bool = True,
    staleness: int = 1,
    precision: str = defaults.PRECISION.value,
    top: int | None = None,
    placement: str | None = None,
    rollout_gpus: int | None = None,
    gpu_hour_usd: float | None = None,
    framework: str | None = None,
    gpu_memory_utilization: float | None = None,
    lengths: str | Path | None = None,
) -> RLPlans:
    """RL post-training plans for `gpus` GPUs, fastest step first: colocated, disaggregated
    and async (`staleness` steps behind) placements, each rollout tp and a small set of
    trainer layouts (autoconfig.rl). The rollout batch is `prompts` x `samples` sequences of a
    `prompt_len` prompt and a response of at most `max_response_len` tokens (4,096 when not
    given) averaging `mean_response_len` (half the maximum when not given), or of the measured
    lengths in the CSV `lengths` (`output_len` or `length` column), drawn from an exponential
    truncated at the maximum. `critic` (PPO only) is the value model, the actor's shape when
    not given. `placement` (colocated, disaggregated, async) and `rollout_gpus` (the GPUs that
    generate when the pools are separate) narrow the plans tried. Every plan's table row holds
    the GPU-hours of 1,000 steps and, with `gpu_hour_usd` (USD per GPU-hour), their cost.
    `framework` (nemo-rl, verl, openrlhf) sets the rollout engine's share of GPU memory to
    that framework's default, `gpu_memory_utilization` to a given share (vLLM's own default
    when neither is given). Raises UserError with one line naming the bad field."""
    from autoconfig.rl.frameworks import RLFramework, engine_memory_fraction
    from autoconfig.rl.job import Algorithm, Job, Placement
    from autoconfig.rl.lengths import ResponseLengths, read_response_lengths
    from autoconfig.rl.plan import plan
    from autoconfig.spec import catalog
    from autoconfig.spec.vocab import Precision

    gpus = checks.integer(gpus, "gpus")
    for name, value in (
        ("prompts", prompts),
        ("prompt-len", prompt_len),
        ("staleness", staleness),
    ):
        checks.integer(value, name)
    if max_response_len is not None:
        checks.integer(max_response_len, "max-response-len")
    spec = catalog.get_model(model) if isinstance(model, str) else model
    gpu_spec = catalog.get_gpu(gpu)
    kind = Algorithm.parse(algorithm)
    if critic is not None and not kind.has_critic:
        raise UserError(f"critic: {kind.value} trains no value model; drop --critic")
    critic_spec = catalog.get_model(critic) if isinstance(critic, str) else critic
    if lengths is not None:
        if mean_response_len is not None:
            raise UserError(
                "mean-response-len: the lengths file sets the mean; give one or the other"
            )
        drawn = read_response_lengths(Path(lengths))
        if max_response_len is not None and drawn.max_tokens > max_response_len:
            raise UserError(
                f"lengths: '{lengths}' holds a {drawn.max_tokens:,.0f}-token response, above "
                f"max-response-len {max_response_len:,}"
            )
    else:
        longest = 4096 if max_response_len is None else max_response_len
        mean = float(mean_response_len) if mean_response_len is not None else longest / 2
        drawn = ResponseLengths(float(longest), mean)
    share = None
    if framework is not None:
        share = engine_memory_fraction(RLFramework.parse(framework, "rl-framework"))
    if gpu_memory_utilization is not None:
        share = checks.number(gpu_memory_utilization, "gpu-memory-utilization", high=1.0)
    job = Job(
        spec,
        gpu_spec,
        gpu_spec.cluster,
        gpus,
        kind,
        prompts,
        checks.integer(samples, "samples", low=0),  # Job.checked says why under 1
        prompt_len,
        drawn,
        critic=critic_spec,
        reference=reference,
        precision=Precision.parse(precision, "precision").value,
        engine_memory_fraction=share,
    )
    where = Placement.parse(placement) if placement is not None else None
    if rollout_gpus is not None:
        checks.integer(rollout_gpus, "rollout-gpus", low=0)  # Plan.checked says why under 1
    if gpu_hour_usd is not None:
        checks.number(gpu_hour_usd, "gpu-hour-usd")
    plans = plan(job.checked(), staleness, top, where, rollout_gpus)
    if gpu_hour_usd is not None:
        plans.table["usd_per_1000_steps"] = plans.table["gpu_hours_per_1000_steps"] * gpu_hour_usd
    return plans
