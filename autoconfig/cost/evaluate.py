"""Runs the whole cost model over N candidates and names every output column."""

from __future__ import annotations

import numpy as np

from autoconfig.cost import hybrid_cp
from autoconfig.cost.flops import model_flops_per_token
from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.cost.layer import layer_ops
from autoconfig.cost.memory import memory, stage_params
from autoconfig.cost.timing import step_time
from autoconfig.spec.vocab import GIB

PREDICTION_COLUMNS = (
    "pred_step_time_s",
    "pred_tokens_per_s_per_gpu",
    "pred_model_tflops_per_gpu",
    "pred_mfu",
    "pred_peak_mem_gib",
    "pred_fits",
)


def evaluate(x: CostInputs) -> dict[str, Col]:
    """Predictions and their breakdowns, one array per column (all of length N); rows with
    dynamic context parallelism are timed as their per-document passes (cost.hybrid_cp)."""
    return hybrid_cp.apply(x, _evaluate(x), _evaluate)


def _evaluate(x: CostInputs) -> dict[str, Col]:
    ops = layer_ops(x)  # shared by every part below
    params = stage_params(x, ops)
    mem = memory(x, ops, params)
    time = step_time(x, ops, params)
    step = time.total
    num_gpus = x.dp * x.tp * x.pp * x.cp
    # Padding is computed but trains nothing: only the documents' tokens count (spec.documents).
    tokens_per_gpu = x.useful_share * x.gbs * x.seq / (step * num_gpus)
    tflops = model_flops_per_token(x) * tokens_per_gpu
    peak = mem.total / GIB
    out = {
        "pred_step_time_s": step,
        "pred_tokens_per_s_per_gpu": tokens_per_gpu,
        "pred_model_tflops_per_gpu": tflops / 1e12,
        "pred_mfu": tflops / x.peak_flops,
        "pred_peak_mem_gib": peak,
        "pred_fits": peak <= x.memory_gib,
        "mem_weights_gib": mem.weights / GIB,
        "mem_gradients_gib": mem.gradients / GIB,
        "mem_optimizer_gib": mem.optimizer / GIB,
        "mem_activations_gib": mem.activations / GIB,
        "mem_pipeline_in_flight_gib": mem.pipeline_in_flight / GIB,
        "mem_logits_embedding_gib": mem.logits_embedding / GIB,
        "mem_transient_gib": mem.transient / GIB,
        "mem_overhead_gib": mem.overhead / GIB,
        "mem_capacity_gib": x.memory_gib,
        # CPU offload (cost.offload): what the host holds for this GPU, and the host memory a
        # GPU has (NaN where the cluster profile does not state it)
        "mem_host_gib": mem.host / GIB,
        "host_capacity_gib": x.host_memory_gib,
        # bytes one layer saves for backward per micro-batch (the trainer measures this)
        "act_bytes_per_layer": mem.activation_per_layer,
        "time_compute_s": time.compute,
        "time_launch_s": time.launch,
        "time_tp_comm_s": time.tp_comm,
        "time_cp_comm_s": time.cp_comm,
        "time_ep_comm_s": time.ep_comm,
        "time_pp_comm_s": time.pp_comm,
        "time_bubble_s": time.bubble,
        "time_dp_comm_s": time.dp_comm,
        "time_optimizer_s": time.optimizer,
        "time_offload_s": time.offload,
        # one layer's forward and backward over one micro-batch (the trainer's slice mode
        # measures these)
        "layer_forward_s": time.layer_fwd,
        "layer_backward_s": time.layer_bwd,
    }
    n = x.n
    return {k: np.broadcast_to(np.asarray(v), (n,)) for k, v in out.items()}
