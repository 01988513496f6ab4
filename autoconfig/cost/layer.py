"""One description of a transformer layer: the list of operations every cost derives from.

Each `Op` gives, per token of one micro-batch on one rank, its forward FLOPs, the bytes it
saves for backward, the bytes a memory-bound kernel moves, and the GEMM shape. FLOPs
(flops.py), activation memory (memory.py) and time (timing.py) all sum over this list, so
GQA, SwiGLU, MoE top-k, dropout and flash-vs-unfused attention are each handled here once.

Saved-tensor accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198, Sec. 4): for a GPT layer, 16-bit, with dropout
and unfused attention, 34 bytes per token per hidden unit plus 5*a*s bytes per token for the
attention scores; 24 of the 34 are sharded by TP, the other 10 (norms, dropout masks, GEMM
inputs after norms) only with sequence parallelism. Llama-style layers are derived the same way
from what PyTorch autograd saves for each op (RMSNorm input, the three SwiGLU tensors, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost.inputs import SQUARED_RELU, SWIGLU, Col, CostInputs

ZERO = np.float64(0.0)


@dataclass(frozen=True)
class Op:
    """One operation of a layer, all figures per token on one rank (after TP/SP sharding)."""

    name: str
    kind: str  # "gemm" | "attention" | "memory"
    flops: Col | float = ZERO  # forward FLOPs per token
    saved: Col | float = ZERO  # bytes saved for backward per token
    moved: Col | float = ZERO  # bytes read+written per token by a memory-bound kernel (fwd)
    gemm_k: Col | float = ZERO  # GEMM reduction dim per rank
    gemm_n: Col | float = ZERO  # GEMM output dim per rank
    weight_bytes: Col | float = ZERO  # GEMM weight bytes read once per micro-batch
    kernels: float = 1.0  # forward kernel launches
    dropped_by_selective: bool = False  # saved tensors recomputed under selective recompute
    bwd_factor: float = 2.0  # backward FLOPs / forward FLOPs


def _sp_div(x: CostInputs) -> Col:
    """Divisor for norm/dropout regions: tp with sequence parallelism, 1 without."""
    return np.where(x.sp > 0, x.tp, 1.0)


def _act_bytes(x: CostInputs) -> Col:
    """Bytes per element of a saved GEMM input: fp8 recipes keep the fp8 cast for backward."""
    return np.where(x.fp8 > 0, 1.0, 2.0)


def _mlp_widths(x: CostInputs) -> tuple[Col, Col]:
    """(MLP width a token passes through, width of the up projection): a dense layer, or
    top-k routed plus shared experts; gated MLPs project up twice (gate and up)."""
    width = np.where(x.experts > 0, x.expert_ffn * (x.topk + x.shared_experts), x.ffn)
    return width, np.where(x.mlp_kind == SWIGLU, 2.0, 1.0) * width


def layer_ops(x: CostInputs) -> list[Op]:
    """The operations of one transformer layer for every candidate in `x`."""
    t, sp = x.tp, _sp_div(x)
    h, f = x.hidden, x.ffn
    # What the column-parallel GEMMs after a norm keep: the shard, or the gathered input.
    gathered_in = np.where(x.sp_saves_gathered > 0, 1.0, sp)
    q_width = x.heads * x.head_dim
    kv_width = x.kv_heads * x.head_dim
    gemm_in = _act_bytes(x)
    moe = x.experts > 0
    norm_saved = np.where(x.layernorm > 0, 2.0 * h + 8.0, 2.0 * h + 4.0)  # input + fp32 stats
    # Attention scores exist only without flash attention; s is the full sequence (with CP a
    # rank's queries still attend to all keys).
    s = x.seq
    unfused = 1.0 - x.flash
    scores = unfused * (2.0 + 3.0 * x.dropout) * x.heads * s / t  # softmax out, mask, dropout out
    lse = x.flash * 4.0 * x.heads / t  # flash keeps fp32 log-sum-exp per head

    mlp_width, up_width = _mlp_widths(x)
    gated = x.mlp_kind == SWIGLU
    act_saved = np.select([gated, x.mlp_kind == SQUARED_RELU], [6.0, 2.0], 2.0) * mlp_width
    act_moved = np.where(gated, 6.0, 4.0) * mlp_width  # read input(s), write output, 2 B each
    mlp_weights = np.where(moe, x.expert_ffn * (x.experts + x.shared_experts), f)

    return [
        Op("attn_norm", "memory", saved=norm_saved / sp, moved=4.0 * h / sp),
        Op(
            "qkv_proj",
            "gemm",
            flops=2.0 * h * (q_width + 2 * kv_width) / t,
            saved=gemm_in * h / gathered_in,
            gemm_k=h,
            gemm_n=(q_width + 2 * kv_width) / t,
            weight_bytes=2.0 * h * (q_width + 2 * kv_width) / t,
        ),
        Op(
            "rope",
            "memory",
            moved=x.rope * 4.0 * (q_width + kv_width) / t,
            kernels=2.0,
        ),
        Op(
            "attention",
            "attention",
            flops=4.0 * s * q_width / t,
            saved=(2.0 * q_width + 4.0 * kv_width) / t,
            kernels=1.0 + 3.0 * unfused,
            bwd_factor=2.5,
        ),
        # Flash attention's softmax statistics: recomputed with the core under selective.
        Op("attention_lse", "memory", saved=lse, kernels=0.0, dropped_by_selective=True),
        Op(
            "attention_scores",
            "memory",
            saved=scores,
            moved=unfused * 8.0 * x.heads * s / t,
            dropped_by_selective=True,
        ),
        Op(
            "out_proj",
            "gemm",
            flops=2.0 * q_width * h / t,
            saved=gemm_in * q_width / t,
            gemm_k=q_width / t,
            gemm_n=h,
            weight_bytes=2.0 * q_width * h / t,
        ),
        Op("attn_residual", "memory", saved=x.dropout * h / sp, moved=6.0 * h / sp),
        Op("mlp_norm", "memory", saved=norm_saved / sp, moved=4.0 * h / sp),
        Op(
            "router",
            "gemm",
            flops=moe * 2.0 * h * x.experts,
            saved=moe * 4.0 * x.experts,
            gemm_k=h,
            gemm_n=x.experts,
            weight_bytes=moe * 2.0 * h * x.experts,
        ),
        Op(
            "mlp_up",
            "gemm",
            flops=2.0 * h * up_width / t,
            saved=gemm_in * h / gathered_in,
            gemm_k=h,
            gemm_n=up_width / t,
            weight_bytes=2.0 * h * np.where(gated, 2.0, 1.0) * mlp_weights / t,
        ),
        # MoE: a token goes to its top-k experts as k copies, the expert GEMMs' inputs (the
        # router above keeps the token itself), and the combine keeps each expert output for
        # its gate's gradient (d gate = <d out, expert out>). Neither is split by tp: every
        # rank of a tp group holds all routed rows (its outputs are partial sums over its ffn
        # shard). The routing keeps per copy torch.topk's int64 expert index, the int64
        # permutation sorting the copies by expert, and the fp32 gate weight. Their time
        # (permutation kernels) is not modelled.
        Op("expert_dispatch", "memory", saved=moe * x.topk * gemm_in * h, kernels=0.0),
        Op("expert_combine", "memory", saved=moe * x.topk * 2.0 * h, kernels=0.0),
        Op("routing", "memory", saved=moe * x.topk * (8.0 + 8.0 + 4.0), kernels=0.0),
        Op("activation", "memory", saved=act_saved / t, moved=act_moved / t),
        Op(
            "mlp_down",
            "gemm",
            flops=2.0 * mlp_width * h / t,
            saved=gemm_in * mlp_width / t,
            gemm_k=mlp_width / t,
            gemm_n=h,
            weight_bytes=2.0 * mlp_weights * h / t,
        ),
        Op("mlp_residual", "memory", saved=x.dropout * h / sp, moved=6.0 * h / sp),
    ]


def op_level_sac_bytes(x: CostInputs) -> Col:
    """What torchtitan's op-level selective checkpointing keeps per token of a layer: the
    layer input, the attention output (with its log-sum-exp) and every other matmul output;
    everything else is recomputed (torchtitan `activation_checkpoint.selective_ac_option =
    "op"`, which saves mm outputs alternately and the SDPA output)."""
    t, sp = x.tp, _sp_div(x)
    q_width, kv_width = x.heads * x.head_dim, x.kv_heads * x.head_dim
    _, up_width = _mlp_widths(x)
    matmul_outputs = 2.0 * (
        (q_width + 2 * kv_width) / t + x.hidden / sp + up_width / t + x.hidden / sp
    )
    attention_output = 2.0 * q_width / t + x.flash * 4.0 * x.heads / t
    return layer_input_bytes(x) + attention_output + 0.5 * matmul_outputs


def layer_input_bytes(x: CostInputs) -> Col:
    """What a fully recomputed layer keeps: its 16-bit input (sharded with SP)."""
    return 2.0 * x.hidden / _sp_div(x)


def head_ops(x: CostInputs) -> list[Op]:
    """The last stage's final norm, LM head and cross-entropy (per token, one rank).

    Logits are kept in fp32 for a vocab-parallel cross-entropy (Korthikanti et al. 2022,
    Sec. 4.1: 4*s*b*v/t bytes).
    """
    t, sp, h, v = x.tp, _sp_div(x), x.hidden, x.vocab
    norm_saved = np.where(x.layernorm > 0, 2.0 * h + 8.0, 2.0 * h + 4.0)
    return [
        Op("final_norm", "memory", saved=norm_saved / sp, moved=4.0 * h / sp),
        Op(
            "lm_head",
            "gemm",
            flops=2.0 * h * v / t,
            saved=2.0 * h / sp,
            gemm_k=h,
            gemm_n=v / t,
            weight_bytes=2.0 * h * v / t,
        ),
        Op("cross_entropy", "memory", saved=4.0 * v / t, moved=12.0 * v / t, kernels=3.0),
    ]


def embedding_ops(x: CostInputs) -> list[Op]:
    """The first stage's embedding lookup (plus dropout mask where the model has dropout)."""
    sp = _sp_div(x)
    return [Op("embedding", "memory", saved=x.dropout * x.hidden / sp, moved=4.0 * x.hidden / sp)]


def total(ops: list[Op], attr: str) -> Col:
    """Sum of one per-token figure over a list of ops."""
    out: Col | float = ZERO
    for op in ops:
        out = out + getattr(op, attr)
    return np.asarray(out)
