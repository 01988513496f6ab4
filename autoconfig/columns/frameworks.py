"""A framework as the model sees it: the layouts it cannot run (rules over layout columns, from
its profile's capabilities) and what it does (the Behaviour columns, from its profile)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autoconfig.columns.build import Behaviour, reduce_bits
from autoconfig.spec.schema import OFFLOAD_OVERLAPS, FrameworkSpec
from autoconfig.spec.task import PRETRAIN, TaskSpec
from autoconfig.spec.vocab import Offload, OptimizerState, Recompute


def _isin(values: Any, allowed: list) -> np.ndarray:
    return np.isin(np.asarray(values, dtype=float), np.asarray(allowed, dtype=float))


def layers_per_stage(layers: Any, stages: Any) -> np.ndarray:
    """The stage size L in layers, the embedding and the head counting as one each, that makes
    `stages` stages of ceil((layers + 2) / L) (torchtitan's pipeline_parallel_layers_per_stage);
    NaN where no L does."""
    units = np.asarray(layers, float) + 2.0
    stages = np.asarray(stages, float)
    with np.errstate(all="ignore"):
        per = np.ceil(units / stages)
        return np.where((stages >= 2) & (np.ceil(units / per) == stages), per, np.nan)


def rules(fw: FrameworkSpec, c: Mapping[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """(dimension, what the framework cannot do, mask of rows it rules out) for layouts in
    columns `c` (the layout dimensions as cost codes, plus layers, gbs)."""
    name = fw.name
    tp, pp, vp, cp, ep, dp = (np.asarray(c[k], float) for k in ("tp", "pp", "vp", "cp", "ep", "dp"))
    etp, sp, mbs = (np.asarray(c[k], float) for k in ("etp", "sp", "mbs"))
    zero, recompute = np.asarray(c["zero"], float), np.asarray(c["recompute"], float)
    layers, gbs = np.asarray(c["layers"], float), np.asarray(c["gbs"], float)
    rlayers = np.asarray(c["recompute_layers"], float)
    state = np.asarray(c.get("optimizer_state", 0.0), float)
    states = [OptimizerState(s).code for s in fw.allows("optimizer_states")]
    offload = np.asarray(c.get("offload", 0.0), float)
    offloads = [Offload(s).code for s in fw.allows("offloads")]
    optimizer_offload, params_offload = Offload.OPTIMIZER.code, Offload.PARAMS.code
    zeros, zeros_pp = fw.allows("zero"), fw.allows("zero_with_pp")
    modes = [Recompute(m).code for m in fw.allows("recompute")]
    with_tp = fw.allows("sequence_parallel")
    per_stage = np.ceil(layers / np.maximum(pp, 1.0))

    def lacks(capability: str) -> bool:
        return not fw.allows(capability)

    with np.errstate(all="ignore"):
        micro = gbs / (dp * mbs)
        return [
            ("zero", f"{name} runs ZeRO stages {_words(zeros)}", ~_isin(zero, zeros)),
            (
                "zero",
                f"{name} shards every data-parallel run (ZeRO 0 on one GPU only)",
                (zero == 0) & (dp * cp > 1) & lacks("replicated_data_parallel"),
            ),
            (
                "zero",
                f"{name} combines pipeline parallelism only with ZeRO {_words(zeros_pp)}",
                (pp > 1) & ~_isin(zero, zeros_pp),
            ),
            ("tp", f"{name} has no tensor parallelism", (tp > 1) & lacks("tensor_parallel")),
            (
                "sp",
                f"{name} always shards the sequence with tensor parallelism",
                (with_tp == "with_tp") & ((sp > 0) != (tp > 1)),
            ),
            ("sp", f"{name} has no sequence parallelism", (with_tp == "never") & (sp > 0)),
            ("pp", f"{name} has no pipeline parallelism", (pp > 1) & lacks("pipeline")),
            ("vp", f"{name} has no interleaved pipeline", (vp > 1) & lacks("interleaving")),
            (
                "vp",
                f"{name} interleaves only with micro-batches a multiple of pp",
                (vp > 1) & bool(fw.allows("interleave_needs_pp_multiple")) & (micro % pp != 0),
            ),
            (
                "vp",
                f"{name} cannot make pp*vp stages of these layers: no stage size (the embedding "
                "and the output counting as a layer each) gives that many, and only 2 stages "
                "per rank run without one",
                (vp > 2)
                & bool(fw.allows("stages_by_size"))
                & np.isnan(layers_per_stage(layers, pp * vp)),
            ),
            (
                "pp",
                f"{name} splits layers evenly over pipeline stages",
                (pp > 1) & (layers % pp != 0) & lacks("uneven_pipeline"),
            ),
            ("cp", f"{name} has no context parallelism", (cp > 1) & lacks("context_parallel")),
            (
                "activation_offload",
                f"{name} offloads activations "
                + (
                    f"only with recompute {_words(fw.allows('activation_offload'))}"
                    if fw.allows("activation_offload")
                    else "never"
                ),
                (np.asarray(c.get("activation_offload", 0.0), float) > 0)
                & ~_isin(recompute, [Recompute(m).code for m in fw.allows("activation_offload")]),
            ),
            (
                "hybrid_cp",
                f"{name} has no dynamic context parallelism",
                (np.asarray(c.get("hybrid_cp", 0.0), float) > 0) & lacks("hybrid_context_parallel"),
            ),
            ("ep", f"{name} has no expert parallelism", (ep > 1) & lacks("expert_parallel")),
            (
                "ep",
                f"{name} takes expert parallelism from dp*cp",
                ((dp * cp) % ep != 0) & lacks("expert_folding"),
            ),
            (
                "etp",
                f"{name} does not split experts over tensor-parallel ranks",
                (etp > 1) & lacks("expert_tensor_parallel"),
            ),
            (
                "recompute",
                f"{name} recomputes {_words(fw.allows('recompute'))}",
                ~_isin(recompute, modes),
            ),
            (
                "recompute_layers",
                f"{name} recomputes every layer of a stage or none",
                (recompute == Recompute.FULL.code)
                & (rlayers > 0)
                & (rlayers < per_stage)
                & lacks("partial_recompute"),
            ),
            (
                "optimizer_state",
                f"{name} keeps Adam state in {_words(fw.allows('optimizer_states'))}",
                ~_isin(state, states),
            ),
            (
                "optimizer_state",
                f"{name} keeps Adam state lighter than fp32 only with ZeRO "
                f"{_words(fw.allows('lighter_state_zero'))}",
                (state > 0) & ~_isin(zero, fw.allows("lighter_state_zero")),
            ),
            (
                "offload",
                f"{name} offloads {_words(fw.allows('offloads'))} to the CPU",
                ~_isin(offload, offloads),
            ),
            (
                "offload",
                f"{name} offloads the optimizer only with ZeRO {_words(fw.allows('offload_zero'))}",
                (offload == optimizer_offload) & ~_isin(zero, fw.allows("offload_zero")),
            ),
            (
                "offload",
                "offloading the parameters needs ZeRO 3 without pipeline parallelism (each "
                "layer's shard copied up at its gather)",
                (offload == params_offload) & ((zero != 3) | (pp > 1)),
            ),
            (
                "offload",
                "an offloaded optimizer runs the CPU's fp32 Adam: optimizer_state fp32 only",
                (offload > 0) & (state > 0),
            ),
        ]


def first_broken(fw: FrameworkSpec, c: Mapping[str, Any]) -> str:
    """The first thing `fw` cannot do for a single layout, as 'dimension: reason', or ''."""
    for name, rule, bad in rules(fw, c):
        if np.any(bad):
            return f"{name}: {rule}"
    return ""


def counts_ends_to_interleave(fw: FrameworkSpec) -> bool:
    """Whether `fw` splits an interleaved layout with the embedding and the head counted as a
    layer each where only that divides: its own split does, or it can be told to."""
    return bool(fw.allows("ends_as_layers_split")) or fw.does.counts_ends_as_layers


def behaviour(
    fw: FrameworkSpec, precision: Any, flash: Any = None, task: TaskSpec = PRETRAIN
) -> Behaviour:
    """The framework's Behaviour columns for runs at `precision` (one per row or one for all):
    fp8 weights only with 8-bit recipes; running `task` (spec.task, checked by the caller
    against what the framework runs: `task.check_framework`)."""
    does = fw.does
    eight_bit = np.isin(np.asarray(precision, dtype=object).astype(str), ("fp8", "mxfp8"))
    # DeepSpeed's BF16_Optimizer runs bf16 training only (fp16 keeps the ZeRO optimizer)
    bf16_optimizer = (np.asarray(precision, dtype=object).astype(str) == "bf16") & bool(
        does.bf16_optimizer.value
    )
    return Behaviour(
        flash_attention=float(does.flash_attention.value) if flash is None else flash,
        overlap_grad_reduce=float(does.overlap_grad_reduce.value),
        overlap_param_gather=float(does.overlap_param_gather.value),
        tp_overlap=float(does.tp_overlap.value),
        p2p_overlap=float(does.p2p_overlap.value),
        p2p_serial=1.0 if does.pipeline_p2p_serial.value else 0.0,
        cuda_graphs=float(does.cuda_graphs.value),
        fused_kernels=float(does.fused_kernels.value),
        ep_dedup=float(does.ep_dedup.value),
        param_bytes=np.where(eight_bit & bool(does.fp8_params.value), 1.0, 2.0),
        grad_comm_bytes=2.0 if does.grad_reduce_bf16.value else 4.0,
        sp_saves_gathered=float(does.sp_saves_gathered.value),
        cost_split=float(does.splits_by_cost),
        balanced_split=float(does.balances_by_hand),
        ends_split=float(does.counts_ends_as_layers),
        ends_split_to_interleave=float(counts_ends_to_interleave(fw)),
        grad_pass_bytes=float(does.grad_accumulation_bytes.value),
        bf16_optimizer=np.where(bf16_optimizer, 1.0, 0.0),
        bf16_pass_bytes=float(does.bf16_grad_pass_bytes.value),
        reduce_every_micro_batch=reduce_bits(does.grad_reduce_every_micro_batch.value),
        zero2_gathers_every_micro_batch=float(does.zero2_gathers_every_micro_batch.value),
        reduce_after_backward=reduce_bits(does.grad_reduce_after_backward.value),
        pipeline_reduce_after_backward=reduce_bits(does.pipeline_grad_reduce_after_backward.value),
        fsdp_copies=float(does.fsdp_copies.value),
        main_param_remainders=1.0 if does.main_param_remainders.value else 0.0,
        offload_upload_bytes=float(str(does.offload_upload_bytes.value)),
        offload_overlap=float(OFFLOAD_OVERLAPS.index(str(does.offload_overlap.value))),
        act_offload_resident=float(str(does.activation_offload_resident_layers.value)),
        **task.columns(),
        doc_classes=np.asarray(task.doc_classes, float).reshape(-1, 2),
    )


def _words(values: list) -> str:
    names = [str(v) for v in values] or ["none"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
