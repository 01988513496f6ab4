"""One description of a transformer layer: the list of operations every cost derives from.

Each `Op` gives, per token of one micro-batch on one rank, its forward FLOPs, the bytes it
saves for backward, the bytes a memory-bound kernel moves, and the GEMM shape. FLOPs
(flops.py), activation memory (memory.py) and time (timing.py) all sum over this list, so
GQA, multi-head latent attention, SwiGLU, MoE top-k, shared experts, sliding windows, hybrid
Mamba blocks, dropout and flash-vs-unfused attention are each handled here once.

The list describes the *average* layer: a model whose layers differ (dense layers before MoE
ones, MoE on every other layer, Mamba blocks between attention blocks) weighs each block's ops
by the share of layers that have it (the `*_share` columns), so a stage of n layers costs n
average layers.

Saved-tensor accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198, Sec. 4): for a GPT layer, 16-bit, with dropout
and unfused attention, 34 bytes per token per hidden unit plus 5*a*s bytes per token for the
attention scores; 24 of the 34 are sharded by TP, the other 10 (norms, dropout masks, GEMM
inputs after norms) only with sequence parallelism. Llama-style layers are derived the same way
from what PyTorch autograd saves for each op (RMSNorm input, the three SwiGLU tensors, ...).
GEMM inputs are saved in the GEMM's format (1 byte with fp8 recipes, half a byte plus scales
with nvfp4: Transformer Engine keeps the quantized copy for backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import finetune
from autoconfig.cost.inputs import SQUARED_RELU, SWIGLU, Col, CostInputs

ZERO = np.float64(0.0)
SSD_CHUNK = 256.0  # tokens per chunk of Mamba-2's SSD scan (mamba_ssm's default chunk_size)
MAMBA_CONV_KERNEL = 4.0  # Mamba-2's causal convolution width (d_conv = 4 in every release)


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
    # Output dim per rank of the one kernel this GEMM runs in when fused with others (q, k and
    # v); 0: its own gemm_n. What the kernel's output tiles are counted on (timing's waves).
    kernel_n: Col | float = ZERO
    weight_bytes: Col | float = ZERO  # 16-bit GEMM weight bytes read once per micro-batch
    kernels: Col | float = 1.0  # forward kernel launches
    dropped_by_selective: bool = False  # saved tensors recomputed under selective recompute
    bwd_factor: float = 2.0  # backward FLOPs / forward FLOPs
    routed: bool = False  # routed-expert weights: a step reads only the experts it routes to
    params: Col | float = ZERO  # parameters outside GEMM weights on one rank (norm scales, ...)
    # A GEMM that 8- and 4-bit recipes leave in 16 bits (the LM head: Megatron's output layer
    # is a plain ColumnParallelLinear outside Transformer Engine's fp8 autocast, and
    # torchtitan's float8 conversion filters out its "output" module; the MoE router).
    sixteen_bit: bool = False
    # A LoRA adapter (cost.finetune): trained while the base is frozen; its parameters
    # (`adapter_params`, A and B on one rank) are counted apart from the base weights.
    adapter: bool = False
    adapter_params: Col | float = ZERO

    @property
    def present(self) -> np.ndarray:
        """Per candidate, whether the layer has this op's computation (a dense model's expert
        GEMMs, say, have none: they keep their shapes but do no FLOPs)."""
        return np.asarray(self.flops) > 0

    @property
    def tile_width(self) -> Col:
        """Output width per rank of the kernel this GEMM runs in (its own, or its fused one's)."""
        return np.where(np.asarray(self.kernel_n) > 0, self.kernel_n, self.gemm_n)

    @property
    def activation_width(self) -> Col:
        """Elements per token a GEMM reads and writes besides its weights (k in, n out): none
        for a GEMM the layer lacks, which moves nothing."""
        return (self.gemm_k + self.gemm_n) * self.present


def sp_div(x: CostInputs) -> Col:
    """Divisor for norm/dropout regions: tp with sequence parallelism, 1 without."""
    return np.where(x.sp > 0, x.tp, 1.0)


def mlp_widths(x: CostInputs) -> tuple[Col, Col, Col]:
    """Per token, before TP: (width of the dense MLP, of the routed experts it visits, of the
    shared experts), each weighted by the share of layers that have it."""
    dense = x.mlp_share * (1.0 - x.moe_share) * x.ffn
    routed = x.mlp_share * x.moe_share * x.topk * x.expert_ffn
    shared = x.mlp_share * x.moe_share * x.shared_ffn
    return dense, routed, shared


def attention_widths(x: CostInputs) -> tuple[Col, Col, Col]:
    """(q·k width, value width, K/V projection output width) per token, all heads, before TP:
    standard attention projects q, k, v of head_dim; multi-head latent attention adds a
    decoupled rotary part to q and k and has its own value width."""
    mla = x.kv_lora > 0
    qk = x.heads * (x.head_dim + x.rope_dim)
    v = x.heads * np.where(mla, x.v_dim, x.head_dim)
    return qk, v, np.where(mla, qk - x.heads * x.rope_dim + v, 2.0 * x.kv_heads * x.head_dim)


def attended_length(x: CostInputs) -> Col:
    """The length of the causal attention a token takes part in: the sequence, or for packed
    documents under flash attention E[l^2]/E[l] (spec.documents). Variable-length flash
    attention keeps a document to its own keys, so a sequence of documents l_i costs
    sum l_i^2 / 2 pairs, doc_len / seq of the whole sequence's; an unfused kernel masks the
    documents apart but still computes every score, so it keeps the sequence."""
    packed = (x.doc_len > 0) & (x.flash > 0)
    return np.where(packed, np.minimum(x.doc_len, x.seq), x.seq)


def attention_span(x: CostInputs) -> Col:
    """Keys each query attends to, as a full-sequence equivalent: causal attention averages
    s/2 keys (timing halves the full count), a sliding window of w keys min(w, s/2); s is the
    attended length (the packed documents' where they are apart)."""
    s = attended_length(x)
    window = np.where(x.window > 0, 2.0 * np.minimum(x.window, s / 2.0), s)
    return x.window_share * window + (1.0 - x.window_share) * s


def _column_parallel(
    name: str,
    k: Col,
    n: Col,
    share: Col,
    t: Col,
    saved: Col,
    kernels: Col | None = None,
    kernel_n: Col | float = ZERO,
) -> Op:
    """A GEMM of a (k x n) weight split over t ranks on its output side, weighted by the share
    of layers that have it; `saved` is what it keeps of its input for backward; `kernel_n` the
    full width (before TP) of the fused kernel it runs in, if any."""
    return Op(
        name,
        "gemm",
        flops=share * 2.0 * k * n / t,
        saved=saved,
        gemm_k=k,
        gemm_n=n / t,
        kernel_n=kernel_n / t,
        weight_bytes=share * 2.0 * k * n / t,
        kernels=np.where(share > 0, 1.0, 0.0) if kernels is None else kernels,
    )


def norm_params(x: CostInputs) -> Col:
    """Parameters of one norm: a scale (and a bias for LayerNorm) per hidden unit."""
    return np.where(x.layernorm > 0, 2.0, 1.0) * x.hidden


def layer_ops(x: CostInputs) -> list[Op]:
    """The operations of one (average) layer for every candidate in `x`: with LoRA, its
    adapters, and with QLoRA, the dequantization of its NF4 weights."""
    base = attention_ops(x) + mlp_ops(x) + mamba_ops(x)
    if not finetune.any_frozen(x):
        return base
    return base + adapter_ops(x, base) + [dequantize_op(x, base)]


def adapter_ops(x: CostInputs, base: list[Op]) -> list[Op]:
    """A LoRA adapter beside each targeted base GEMM of k inputs and n outputs per rank (Hu et
    al. 2021): A (k x r) then B (r x n), scaled and added to the base output. With tensor
    parallelism A or B is split as the base weight is, the other replicated (torchtitan 0.3.0
    components/lora.py; NeMo's ParallelLinearAdapter), so a rank holds r (k + n). Forward
    FLOPs 2 r (k + n), backward both gradients of both (2x). Their GEMMs are thin (n = r or
    k = r), so they run at memory speed (an arithmetic intensity of ~8 FLOP/byte at r 16, far
    below any GPU's ridge): forward reads x (k), writes and reads A's output (2r), writes B's
    output, scales it and adds it to the base output (6n, unfused as PEFT, torchtune and NeMo
    run it); backward moves about as much (5k + 4r + 4n: both gradients of A and B and the
    input gradient added into the base's), so `bwd_factor` 1. Each keeps A's output (r) for
    B's weight gradient; its input is the one the base GEMM keeps."""
    r = x.lora_rank
    out = []
    for op in base:
        on = finetune.adapts(x, op.name)
        if op.kind != "gemm" or op.routed or not np.any(on > 0) or not np.any(op.present):
            continue
        k, n = np.asarray(op.gemm_k, float), np.asarray(op.gemm_n, float)
        # the share of layers that have the base GEMM: its FLOPs over 2 k n
        share = on * np.asarray(op.flops) / np.maximum(2.0 * k * n, 1e-30)
        out.append(
            Op(
                f"lora_{op.name}",
                "memory",
                flops=share * 2.0 * r * (k + n),
                saved=share * 2.0 * r,
                moved=share * 2.0 * (k + 2.0 * r + 6.0 * n),
                kernels=np.where(share > 0, 4.0, 0.0),
                bwd_factor=1.0,
                adapter=True,
                adapter_params=share * r * (k + n),
            )
        )
    return out


def dequantize_op(x: CostInputs, base: list[Op]) -> Op:
    """QLoRA's dequantization of the layer's NF4 weights on one rank to bf16 before their GEMMs
    (Dettmers et al. 2023, Sec. 3): reads 4.127 bits and writes 2 bytes a parameter, once per
    micro-batch in forward and again in backward (bwd_factor 1), per token of the micro-batch.
    A recomputed forward dequantizes again, as the op list's recompute timing charges."""
    gemms = [op for op in base if op.kind == "gemm" and not op.sixteen_bit]
    params = total(gemms, "weight_bytes") / 2.0
    tokens = x.mbs * x.seq / x.cp
    per_param = finetune.NF4_BYTES_PER_PARAM + finetune.DEQUANTIZED_BYTES
    q = finetune.quantized(x)
    present = sum((np.asarray(op.flops) > 0).astype(float) for op in gemms)
    return Op(
        "nf4_dequant",
        "memory",
        moved=q * params * per_param / tokens,
        kernels=q * present,
        bwd_factor=1.0,
    )


def attention_ops(x: CostInputs) -> list[Op]:
    t, sp, h, a = x.tp, sp_div(x), x.hidden, x.attn_share
    # What the column-parallel GEMMs after a norm keep: the shard, or the gathered input.
    gathered_in = np.where(x.sp_saves_gathered > 0, 1.0, sp)
    gemm_in = x.gemm_bytes
    norm_saved = norm_saved_bytes(x)  # input + fp32 stats
    qk, v, kv_out = attention_widths(x)
    residual_moved = residual_moved_bytes(x)
    mla = x.kv_lora > 0
    # Multi-head latent attention: down-projections to the latents (replicated over TP, as
    # Megatron-Core's MLA keeps them), then column-parallel up-projections.
    q_down = np.where(mla & (x.q_lora > 0), x.q_lora, 0.0)
    kv_down = np.where(mla, x.kv_lora + x.rope_dim, 0.0)
    q_in = np.where(q_down > 0, q_down, h)
    kv_in = np.where(mla, x.kv_lora, h)
    fused_qkv = np.where(mla, 0.0, qk + kv_out)  # MLA runs its projections apart
    s = x.seq  # with CP a rank's queries still attend to all keys
    span = attention_span(x)
    unfused = 1.0 - x.flash
    heads = x.heads / t
    scores = unfused * (2.0 + 3.0 * x.dropout) * heads * s  # softmax out, mask, dropout out
    lse = x.flash * 4.0 * heads  # flash keeps fp32 log-sum-exp per head
    return [
        Op(
            "attn_norm",
            "memory",
            saved=a * norm_saved / sp,
            moved=a * norm_moved_bytes(x) / sp,
            kernels=a,
            params=a * norm_params(x),
        ),
        *eager_norm_passes("attn_norm_eager", x, a),
        # Under autocast q, k and v each cast the fp32 norm output to bf16 and keep their copy
        # (q_proj counts the first).
        _autocast_casts("attn_input_casts", x, a, np.where(mla, 0.0, 3.0), h / gathered_in),
        Op(
            "latent_down",
            "gemm",
            flops=a * 2.0 * h * (q_down + kv_down),
            saved=a * gemm_in * h / gathered_in * mla,
            gemm_k=h,
            gemm_n=q_down + kv_down,
            weight_bytes=a * 2.0 * h * (q_down + kv_down),
            kernels=np.where(mla, 2.0 * a, 0.0),
        ),
        # Standard attention runs q, k and v as one fused GEMM (one kernel, one saved input).
        # Its waves are counted on the fused width (timing.wave_utilization).
        _column_parallel(
            "q_proj",
            q_in,
            qk,
            a,
            t,
            a * gemm_in * q_in / gathered_in,
            kernel_n=fused_qkv,
        ),
        _column_parallel(
            "kv_proj",
            kv_in,
            kv_out,
            a,
            t,
            a * gemm_in * kv_in / gathered_in * mla,
            a * mla,
            kernel_n=fused_qkv,
        ),
        Op(
            "rope",
            "memory",
            moved=a * x.rope * 4.0 * (qk + np.where(mla, x.rope_dim, kv_out / 2.0)) / t,
            kernels=2.0 * a * x.rope,
        ),
        Op(
            "attention",
            "attention",
            flops=a * 2.0 * span * (qk + v) / t,
            # q, k and v (MLA's keys carry the rotary part for every head)
            saved=a * 2.0 * (qk + kv_out + mla * x.heads * x.rope_dim) / t,
            kernels=a * (1.0 + 3.0 * unfused),
            bwd_factor=2.5,
        ),
        # Flash attention's softmax statistics: recomputed with the core under selective.
        Op("attention_lse", "memory", saved=a * lse, kernels=0.0, dropped_by_selective=True),
        Op(
            "attention_scores",
            "memory",
            saved=a * scores,
            moved=a * unfused * 8.0 * heads * s,
            dropped_by_selective=True,
        ),
        Op(
            "out_proj",
            "gemm",
            flops=a * 2.0 * v * h / t,
            saved=a * gemm_in * v / t,
            gemm_k=v / t,
            gemm_n=h,
            weight_bytes=a * 2.0 * v * h / t,
            kernels=a,
        ),
        Op("attn_residual", "memory", saved=a * x.dropout * h / sp, moved=a * residual_moved / sp),
    ]


def mlp_ops(x: CostInputs) -> list[Op]:
    """Norm, router, dense MLP, routed experts and shared experts of an average layer. Expert
    weights are split over etp ranks (expert tensor parallelism; the dense parts over tp).

    The tp ranks of a group route different tokens: each its own 1/tp of the micro-batch's
    (Megatron-Core requires sequence parallelism for MoE with tp, and its dispatcher sends a
    rank's own sequence shard; DeepSpeed-MoE drops the copies tp ranks share before its
    all-to-all; the bundled trainer routes a rank's share). An expert-tensor-parallel group
    gathers the tokens of its etp ranks, so a rank computes etp/tp of the micro-batch's routed
    copies, each at 1/etp of an expert's width: routed work per rank is 1/tp of the
    micro-batch's, whatever etp."""
    t, sp, h, m = x.tp, sp_div(x), x.hidden, x.mlp_share
    gathered_in = np.where(x.sp_saves_gathered > 0, 1.0, sp)
    gemm_in = x.gemm_bytes
    norm_saved = norm_saved_bytes(x)
    gate = np.where(x.mlp_kind == SWIGLU, 2.0, 1.0)
    moe = x.moe_share * m
    dense_w, routed_w, shared_w = mlp_widths(x)
    et = x.etp
    routed_share = et / t  # of the micro-batch's routed token copies, those this rank holds
    # Latent MoE projects tokens to a narrower width before dispatch and back after.
    expert_h = np.where(x.moe_latent > 0, x.moe_latent, h)
    latent = np.where(x.moe_latent > 0, moe, 0.0)
    act_in = (dense_w + shared_w + routed_w) / t  # MLP width one token passes on a rank
    # SwiGLU keeps gate, up and silu(gate) in eager PyTorch; a fused kernel (Transformer
    # Engine, torch.compile) keeps only its input and recomputes silu in backward.
    swiglu = np.where(x.fused_kernels > 0, 4.0, 6.0)
    act_saved = np.select([x.mlp_kind == SWIGLU, x.mlp_kind == SQUARED_RELU], [swiglu, 2.0], 2.0)
    act_moved = np.where(x.mlp_kind == SWIGLU, 6.0, 4.0)
    all_routed = x.experts * x.expert_ffn  # weights of every expert, read by a full step
    return [
        Op(
            "mlp_norm",
            "memory",
            saved=m * norm_saved / sp,
            moved=m * norm_moved_bytes(x) / sp,
            kernels=m,
            params=m * norm_params(x),
        ),
        *eager_norm_passes("mlp_norm_eager", x, m),
        # Under autocast the dense MLP's up (and gate) projection casts its own bf16 copy.
        _autocast_casts("mlp_input_casts", x, m - moe, gate, h / gathered_in),
        Op(
            "router",
            "gemm",
            # a rank routes the tokens it holds: its 1/tp with sequence parallelism (training),
            # all of them without (serving, where every tp rank sees every token)
            flops=moe * 2.0 * h * x.experts / sp,
            # the token itself (the router GEMM's input, like a dense MLP's) and the fp32
            # logits of the tokens this rank routes
            saved=moe * (gemm_in * h / gathered_in + 4.0 * x.experts / sp),
            gemm_k=h,
            gemm_n=x.experts,
            weight_bytes=moe * 2.0 * h * x.experts,
            kernels=np.where(moe > 0, 3.0, 0.0),  # logits, top-k, permute
            # Megatron-Core's router is a plain linear outside Transformer Engine's fp8
            sixteen_bit=True,
        ),
        # Tokens copied to their experts' order and back (permute / unpermute): each reads and
        # writes the token and its top-k copies.
        Op(
            "moe_permute",
            "memory",
            # fp32 tokens under autocast
            moved=moe * (4.0 + 4.0 * x.autocast_fp32) * (x.topk + 1.0) * expert_h * routed_share,
            kernels=np.where(moe > 0, 2.0, 0.0),
        ),
        Op(
            "latent_proj",
            "gemm",
            # down to the latent width before dispatch and back after, on the tokens this
            # rank holds (whole weights on every rank)
            flops=latent * 4.0 * h * expert_h / sp,
            saved=latent * gemm_in * (h + expert_h) / sp,
            gemm_k=h,
            gemm_n=expert_h,
            weight_bytes=latent * 4.0 * h * expert_h,
            kernels=np.where(latent > 0, 2.0, 0.0),
        ),
        Op(
            "mlp_up",
            "gemm",
            flops=2.0 * h * gate * dense_w / t,
            saved=(m - moe) * gemm_in * h / gathered_in,
            gemm_k=h,
            gemm_n=gate * x.ffn / t,
            weight_bytes=2.0 * h * gate * dense_w / t,
            kernels=np.where(m - moe > 0, 1.0, 0.0),
        ),
        Op(
            "mlp_down",
            "gemm",
            flops=2.0 * dense_w * h / t,
            saved=gemm_in * dense_w / t,
            gemm_k=x.ffn / t,
            gemm_n=h,
            weight_bytes=2.0 * dense_w * h / t,
            kernels=np.where(m - moe > 0, 1.0, 0.0),
        ),
        # Under autocast each expert's up (and gate) projection casts its own bf16 copy of the
        # routed fp32 tokens, as the shared experts do of the layer's input.
        _autocast_casts("expert_input_casts", x, moe, gate, expert_h * x.topk * routed_share),
        _autocast_casts(
            "shared_input_casts", x, np.where(x.shared_ffn > 0, moe, 0.0), gate, h / gathered_in
        ),
        Op(
            "expert_up",
            "gemm",
            flops=2.0 * expert_h * gate * routed_w / t,
            saved=moe * gemm_in * expert_h * x.topk * routed_share,  # each routed copy
            gemm_k=expert_h,
            gemm_n=gate * x.expert_ffn / et,
            weight_bytes=moe * 2.0 * expert_h * gate * all_routed / (et * x.ep),
            kernels=np.where(moe > 0, 1.0, 0.0),  # one grouped GEMM
            routed=True,
        ),
        Op(
            "expert_down",
            "gemm",
            flops=2.0 * routed_w * expert_h / t,
            saved=gemm_in * routed_w / t,
            gemm_k=x.expert_ffn / et,
            gemm_n=expert_h,
            weight_bytes=moe * 2.0 * all_routed * expert_h / (et * x.ep),
            kernels=np.where(moe > 0, 1.0, 0.0),
            routed=True,
        ),
        # The combine keeps each expert output for its gate's gradient (d gate = <d out,
        # expert out>), and the routing keeps per copy the int64 expert index, the int64
        # permutation sorting copies by expert and the fp32 gate weight; like the routed
        # copies, for the copies this rank holds (measured against the bundled trainer, within
        # 1.3%).
        Op(
            "expert_combine",
            "memory",
            saved=moe * x.topk * 2.0 * expert_h * routed_share,
            kernels=0.0,
        ),
        Op("routing", "memory", saved=moe * x.topk * (8.0 + 8.0 + 4.0) * routed_share, kernels=0.0),
        Op(
            "shared_up",
            "gemm",
            flops=2.0 * h * gate * shared_w / t,
            saved=np.where(x.shared_ffn > 0, moe, 0.0) * gemm_in * h / gathered_in,
            gemm_k=h,
            gemm_n=gate * x.shared_ffn / t,
            weight_bytes=2.0 * h * gate * shared_w / t,
            kernels=np.where(shared_w > 0, 1.0, 0.0),
        ),
        Op(
            "shared_down",
            "gemm",
            flops=2.0 * shared_w * h / t,
            saved=gemm_in * shared_w / t,
            gemm_k=x.shared_ffn / t,
            gemm_n=h,
            weight_bytes=2.0 * shared_w * h / t,
            kernels=np.where(shared_w > 0, 1.0, 0.0),
        ),
        Op(
            "activation",
            "memory",
            saved=act_saved * act_in,
            moved=act_moved * act_in,
            kernels=np.where(m > 0, 1.0, 0.0),
        ),
        Op(
            "mlp_residual",
            "memory",
            saved=m * x.dropout * h / sp,
            moved=m * residual_moved_bytes(x) / sp,
        ),
    ]


def mamba_ops(x: CostInputs) -> list[Op]:
    """A Mamba-2 block (Dao and Gu 2024, Sec. 6-7): in-projection to z, x, B, C and dt, a short
    causal convolution, the chunked SSD scan and a gated norm, out-projection; heads and the
    inner width split over TP, as Megatron-Core's MambaMixer does."""
    t, sp, h, b = x.tp, sp_div(x), x.hidden, x.mamba_share
    inner, heads = x.mamba_heads * x.mamba_head_dim, x.mamba_heads
    bc = 2.0 * x.mamba_groups * x.mamba_state
    in_width = 2.0 * inner + bc + heads
    conv = inner + bc
    # SSD: within a chunk of Q tokens a masked (Q x Q) attention-like product over the state,
    # between chunks a state update: per token ~2Q(N + P) + 6NP FLOPs per head (N state, P
    # head width).
    ssd = heads * (2.0 * SSD_CHUNK * (x.mamba_state + x.mamba_head_dim))
    ssd = ssd + heads * 6.0 * x.mamba_state * x.mamba_head_dim
    present = np.where(b > 0, 1.0, 0.0)
    return [
        Op(
            "mamba_norm",
            "memory",
            saved=b * 2.0 * h / sp,
            moved=b * 4.0 * h / sp,
            kernels=b,
            params=b * norm_params(x),
        ),
        _column_parallel("mamba_in", h, in_width, b, t, b * x.gemm_bytes * h),
        Op(
            "mamba_conv",
            "memory",
            saved=b * 2.0 * conv / t,
            moved=b * 4.0 * conv / t,
            kernels=present,
            # the convolution's kernels and biases, and the per-head A, D and dt bias
            params=b * (conv * (MAMBA_CONV_KERNEL + 1.0) + 3.0 * heads) / t,
        ),
        Op(
            "ssd_scan",
            "attention",
            flops=b * ssd / t,
            saved=b * 2.0 * (inner + bc + heads) / t,
            kernels=4.0 * present,
            bwd_factor=2.0,
        ),
        Op(
            "mamba_gate_norm",
            "memory",
            saved=b * 4.0 * inner / t,
            moved=b * 6.0 * inner / t,
            params=b * inner / t,
        ),
        Op(
            "mamba_out",
            "gemm",
            flops=b * 2.0 * inner * h / t,
            saved=b * x.gemm_bytes * inner / t,
            gemm_k=inner / t,
            gemm_n=h,
            weight_bytes=b * 2.0 * inner * h / t,
            kernels=present,
        ),
    ]


def op_level_sac_bytes(x: CostInputs) -> Col:
    """What torchtitan's op-level selective checkpointing keeps per token of a layer: the
    layer input, the attention output (with its log-sum-exp) and every other matmul output;
    everything else is recomputed (torchtitan `activation_checkpoint.selective_ac_option =
    "op"`, which saves mm outputs alternately and the SDPA output)."""
    t, sp = x.tp, sp_div(x)
    qk, v, kv_out = attention_widths(x)
    gate = np.where(x.mlp_kind == SWIGLU, 2.0, 1.0)
    dense_w, routed_w, shared_w = mlp_widths(x)
    matmul_outputs = 2.0 * (
        x.attn_share * ((qk + kv_out) / t + x.hidden / sp)
        + gate * (dense_w + shared_w + routed_w) / t  # routed: 1/tp whatever etp (mlp_ops)
        + x.mlp_share * x.hidden / sp
    )
    attention_output = x.attn_share * (2.0 * v / t + x.flash * 4.0 * x.heads / t)
    return layer_input_bytes(x) + attention_output + 0.5 * matmul_outputs


def layer_input_bytes(x: CostInputs) -> Col:
    """What a fully recomputed layer keeps: its input (sharded with SP), 16-bit, or fp32 under
    autocast."""
    return (2.0 + 2.0 * x.autocast_fp32) * x.hidden / sp_div(x)


def norm_saved_bytes(x: CostInputs) -> Col:
    """What a norm keeps per token: its input (fp32 under autocast) and its fp32 statistics
    (LayerNorm's mean and rstd, RMSNorm's rstd)."""
    stats = np.where(x.layernorm > 0, 8.0, 4.0)
    return (2.0 + 2.0 * x.autocast_fp32) * x.hidden + stats


def norm_moved_bytes(x: CostInputs) -> Col:
    """A norm's reads and writes per token: its input and output, 16-bit or fp32."""
    return (4.0 + 4.0 * x.autocast_fp32) * x.hidden


def residual_moved_bytes(x: CostInputs) -> Col:
    """A residual add's reads and writes per token: the stream and the branch in, the stream
    out (the stream in fp32 under autocast)."""
    return (6.0 + 4.0 * x.autocast_fp32) * x.hidden


# The bundled trainer's RMSNorm (trainer/ops.py) is an autograd function of plain tensor ops,
# computed in fp32. Bytes read and written per element of its input:
# - fp32 input (the trainer under autocast; incoming gradient and weight fp32 too): forward
#   28 (pow 8, mean 4, the scaling by the inverse RMS 8, by the weight 8), backward 76 (the
#   normalized input rebuilt 8, the gradient scaled by the weight 8, their product 12, its
#   mean 4, the mean scaled 8, the difference 12, the inverse RMS applied 8, the weight
#   gradient's product 12 and sum 4);
# - 16-bit input (ranks whose FSDP casts the layers to bf16, CPU runs at bf16): the same ops
#   on fp32 copies made first and a cast back, forward 42 and backward 100.
# A fused kernel (Apex, Transformer Engine, Liger) reads the input and writes the output once
# forward and makes 4 such passes backward (`norm_moved_bytes`). Measured on one H200 over
# 8192 x 8192 fp32 elements: forward 0.643 ms (28 bytes an element at 2.9 TB/s), backward
# 1.697 ms (76 at 3.0 TB/s); 16-bit inputs not measured.
EAGER_NORM_BYTES = {4.0: (28.0, 76.0), 2.0: (42.0, 100.0)}  # element bytes: (forward, backward)
FUSED_NORM_PASSES = (2.0, 4.0)  # forward, backward
# launches beyond one kernel: pow, mean, add, rsqrt and two multiplies; a 16-bit input adds
# two fp32 copies and the cast back
EAGER_NORM_EXTRA_KERNELS = {4.0: 5.0, 2.0: 8.0}


def eager_norm_passes(name: str, x: CostInputs, share: Col | float) -> list[Op]:
    """What an RMSNorm run as eager tensor ops moves beyond a fused kernel, in the `share` of
    layers that have it, where the framework runs it so (`x.eager_rmsnorm`): one op for an
    fp32 input (under autocast) and one for a 16-bit input, each with its own backward over
    forward ratio; nothing for LayerNorm (torch's native kernel is fused)."""
    share = share * x.eager_rmsnorm * (x.layernorm == 0)
    ops = []
    for element, fp32 in ((4.0, x.autocast_fp32), (2.0, 1.0 - x.autocast_fp32)):
        forward, backward = EAGER_NORM_BYTES[element]
        extra_f = forward - FUSED_NORM_PASSES[0] * element
        extra_b = backward - FUSED_NORM_PASSES[1] * element
        ops.append(
            Op(
                f"{name}_{'fp32' if element == 4.0 else 'bf16'}",
                "memory",
                moved=share * fp32 * extra_f * x.hidden / sp_div(x),
                kernels=share * fp32 * EAGER_NORM_EXTRA_KERNELS[element],
                bwd_factor=extra_b / extra_f,
            )
        )
    return ops


def _autocast_casts(name: str, x: CostInputs, share: Col, copies: Col, width: Col) -> Op:
    """The bf16 casts of one fp32 input that `copies` linears make under autocast, in the
    `share` of layers that have them: each reads 4 and writes 2 bytes per element, and all but
    the first copy (which the GEMM's own `saved` counts) are kept for backward."""
    share = share * x.autocast_fp32
    return Op(
        name,
        "memory",
        saved=share * np.maximum(copies - 1.0, 0.0) * 2.0 * width,
        moved=share * copies * 6.0 * width,
        kernels=share * copies,
    )


def head_ops(x: CostInputs) -> list[Op]:
    """The last stage's final norm, LM head and cross-entropy (per token, one rank).

    Logits are kept in fp32 for a vocab-parallel cross-entropy (Korthikanti et al. 2022,
    Sec. 4.1: 4*s*b*v/t bytes).
    """
    t, sp, h, v = x.tp, sp_div(x), x.hidden, x.vocab
    return [
        Op("final_norm", "memory", saved=norm_saved_bytes(x) / sp, moved=norm_moved_bytes(x) / sp),
        *eager_norm_passes("final_norm_eager", x, 1.0),
        _autocast_casts("head_input_cast", x, 1.0, 1.0, h / sp),
        Op(
            "lm_head",
            "gemm",
            flops=2.0 * h * v / t,
            saved=2.0 * h / sp,
            gemm_k=h,
            gemm_n=v / t,
            weight_bytes=2.0 * h * v / t,
            sixteen_bit=True,
        ),
        Op("cross_entropy", "memory", saved=4.0 * v / t, moved=12.0 * v / t, kernels=3.0),
    ]


def mtp_ops(x: CostInputs) -> list[Op]:
    """One multi-token-prediction module (DeepSeek-V3, Sec. 2.2): the next token's embedding
    and the hidden state normed, concatenated and projected (2h -> h), one layer, and the
    shared LM head with its loss. The last pipeline stage runs `x.mtp` of them."""
    h, t = x.hidden, x.tp
    proj = Op(
        "mtp_proj",
        "gemm",
        flops=2.0 * 2.0 * h * h / t,
        saved=2.0 * 2.0 * h,
        gemm_k=2.0 * h,
        gemm_n=h / t,
        weight_bytes=2.0 * 2.0 * h * h / t,
    )
    return [proj, *layer_ops(x), *head_ops(x)]


def embedding_ops(x: CostInputs) -> list[Op]:
    """The first stage's embedding lookup (plus dropout mask where the model has dropout)."""
    sp = sp_div(x)
    moved = (4.0 + 4.0 * x.autocast_fp32) * x.hidden / sp  # fp32 rows under autocast
    return [Op("embedding", "memory", saved=x.dropout * x.hidden / sp, moved=moved)]


def total(ops: list[Op], attr: str) -> Col:
    """Sum of one per-token figure over a list of ops."""
    out: Col | float = ZERO
    for op in ops:
        out = out + getattr(op, attr)
    return np.asarray(out)
