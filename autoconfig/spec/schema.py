"""The project's specs: pydantic models for models, GPUs, clusters, runs and search spaces.

Everything that enters autoconfig (catalog files, CLI flags, CSV rows, HF configs) is turned
into these specs first; autoconfig.columns.build then builds the cost model's arrays from them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    create_model,
    field_validator,
    model_validator,
)

from autoconfig.base.checks import MAX_COUNT
from autoconfig.base.errors import UserError
from autoconfig.spec import layout
from autoconfig.spec.layout import Layout
from autoconfig.spec.vocab import (
    Mlp,
    Norm,
    Offload,
    OptimizerState,
    PipelineSplit,
    Position,
    Precision,
    Recompute,
)

# Limits on what sizes work: a model, profile or search space past one is refused on load.
# The deepest transformers trained have about a hundred layers (Megatron GPT 1T: 128) and
# DeepNet (Wang et al. 2022) 1,000; per-layer work (stages, recompute counts) stays small.
MAX_LAYERS = 1024
# About 280 times the largest models trained (~2e12): every byte count of weights, gradients
# and Adam states (at most 16 bytes a parameter) stays an exact integer in float64 (2^53).
MAX_PARAMETERS = 2**49
# Values one search-space list may hold: the default's longest (pp) holds 36, and every list
# multiplies the layouts the search walks.
MAX_SPACE_VALUES = 128
# Combinations of the structural lists (tp, pp, vp, cp, ep, etp; 48,384 by default) and of
# the setting lists (mbs, sp, recompute with its full_layers fractions, zero; 480 by default)
# a search may enumerate: a structure grid of 2^21 rows is a few seconds and a few hundred MB.
MAX_SPACE_STRUCTURES = 2**21
MAX_SPACE_SETTINGS = 2**14
# A datasheet figure of a GPU (TFLOP/s, GiB, TB/s, GB/s, watts): positive and finite, below a
# bound no chip approaches.
Datasheet = Annotated[float, Field(gt=0, le=1e9)]


class _Spec(BaseModel):
    # NaN and infinity are never a model's, a GPU's or a cluster's figure.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _gib_named_gib(cls, data: object) -> object:
        """A profile written before GiB was named GiB (`memory_gb`) reads as `memory_gib`: the
        figure was always GiB, only its name changed."""
        if not isinstance(data, dict):
            return data
        new_name = {k: f"{k[:-3]}_gib" for k in data if isinstance(k, str) and k.endswith("_gb")}
        if not new_name or any(new in data for new in new_name.values()):
            return data  # both names given: let the unknown one be refused
        return {new_name.get(k, k): v for k, v in data.items()}


class MLASpec(_Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; DeepSeek-AI 2024, "DeepSeek-V2",
    Sec. 2.1): queries and keys/values pass through low-rank latents; K/V cache the latent."""

    q_lora_rank: int = Field(
        default=0, ge=0, le=MAX_COUNT, description="query latent width (0: no query latent)"
    )
    kv_lora_rank: int = Field(gt=0, le=MAX_COUNT, description="key/value latent width")
    rope_head_dim: int = Field(
        gt=0, le=MAX_COUNT, description="decoupled rotary part of each q/k head"
    )
    v_head_dim: int = Field(gt=0, le=MAX_COUNT, description="value width per head")


class MambaSpec(_Spec):
    """Mamba-2 mixer blocks of a hybrid model (Dao and Gu 2024, "Transformers are SSMs";
    NVIDIA Nemotron-H): blocks without attention whose state-space scan is linear in length."""

    layers: int = Field(gt=0, le=MAX_COUNT, description="Mamba-2 blocks among the model's layers")
    heads: int = Field(gt=0, le=MAX_COUNT)
    head_dim: int = Field(gt=0, le=MAX_COUNT)
    state: int = Field(gt=0, le=MAX_COUNT, description="SSM state size per group")
    groups: int = Field(default=1, gt=0, le=MAX_COUNT)
    conv_kernel: int = Field(default=4, gt=0, le=MAX_COUNT)

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


class ModelSpec(_Spec):
    """A decoder-only transformer architecture: by default every layer holds attention and an
    MLP; MoE, multi-head latent attention, sliding windows, hybrid Mamba blocks and
    multi-token prediction are declared by the fields below."""

    name: str = "custom"
    layers: int = Field(gt=0, le=MAX_LAYERS, description="number of transformer layers")
    hidden: int = Field(gt=0, le=MAX_COUNT, description="model width h")
    heads: int = Field(gt=0, le=MAX_COUNT, description="attention (query) heads")
    kv_heads: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="key/value heads (GQA); = heads"
    )
    head_dim: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="per-head width; = hidden/heads"
    )
    ffn_hidden: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="MLP width; = 4*hidden"
    )
    vocab: int = Field(gt=0, le=MAX_COUNT, description="vocabulary size")
    seq_len: int = Field(
        default=2048, gt=0, le=MAX_COUNT, description="default training sequence length"
    )
    max_seq_len: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="context limit of the model"
    )
    tied_embeddings: bool = False
    norm: Norm = Norm.LAYERNORM
    mlp: Mlp = Mlp.GELU
    position: Position = Position.LEARNED
    dropout: bool = Field(default=False, description="dropout layers present during training")
    num_experts: int = Field(
        default=0, ge=0, le=MAX_COUNT, description="routed experts per MoE layer (0 = dense)"
    )
    topk: int = Field(default=0, ge=0, le=MAX_COUNT, description="experts each token is routed to")
    moe_ffn_hidden: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="width of one expert MLP"
    )
    shared_experts: int = Field(
        default=0, ge=0, le=MAX_COUNT, description="always-on experts per MoE layer"
    )
    shared_expert_ffn: int | None = Field(
        default=None,
        gt=0,
        le=MAX_COUNT,
        description="width of all shared experts together; = shared*expert",
    )
    dense_layers: int = Field(
        default=0,
        ge=0,
        le=MAX_COUNT,
        description="MoE models: leading layers with a dense MLP (ffn_hidden)",
    )
    moe_every: int = Field(
        default=1,
        gt=0,
        le=MAX_COUNT,
        description="MoE models: every n-th layer after the dense ones is MoE",
    )
    mla: MLASpec | None = Field(default=None, description="multi-head latent attention")
    sliding_window: int | None = Field(
        default=None, gt=0, le=MAX_COUNT, description="local attention span"
    )
    sliding_window_layers: int = Field(
        default=0, ge=0, le=MAX_COUNT, description="layers attending only within the sliding window"
    )
    attention_layers: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description="hybrid models: layers with attention; = layers",
    )
    mlp_layers: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COUNT,
        description="hybrid models: layers with an MLP or MoE; = layers",
    )
    mamba: MambaSpec | None = Field(default=None, description="hybrid models: Mamba-2 blocks")
    mtp_layers: int = Field(
        default=0,
        ge=0,
        le=MAX_COUNT,
        description="multi-token-prediction blocks after the last layer",
    )
    moe_latent: int | None = Field(
        default=None,
        gt=0,
        le=MAX_COUNT,
        description="LatentMoE: width tokens are projected to for the experts",
    )
    source: str = Field(default="", description="where the architecture figures come from")
    aliases: tuple[str, ...] = Field(default=(), description="other names the catalog accepts")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise UserError(f"kv_heads: {kv} must divide heads ({self.heads})")
        if self.head_dim is None and self.hidden % self.heads:
            raise UserError(f"heads: {self.heads} must divide hidden ({self.hidden})")
        if self.num_experts and not (0 < self.topk <= self.num_experts):
            raise UserError(f"topk: must be in 1..num_experts ({self.num_experts}) for MoE")
        # Rotary embeddings turn each head's channels in pairs: an odd width has no rotary
        # form, and no trainer (the bundled one included) builds it.
        if self.position == Position.ROPE and self.dhead % 2:
            if self.head_dim is not None:
                raise UserError(
                    f"head_dim: rotary positions need an even head width (got {self.dhead})"
                )
            raise UserError(
                f"heads: hidden {self.hidden} / heads {self.heads} = {self.dhead}, an odd head "
                "width; rotary positions need an even one"
            )
        if self.mla is not None and self.mla.rope_head_dim % 2:
            raise UserError(
                f"mla.rope_head_dim: rotary positions need an even width, not "
                f"{self.mla.rope_head_dim}"
            )
        if self.mamba is not None and self.mamba.layers > self.layers:
            raise UserError(f"mamba.layers: {self.mamba.layers} exceeds layers ({self.layers})")
        parameters = self.param_count()
        if parameters > MAX_PARAMETERS:
            raise UserError(
                f"layers: {self.layers} layers of width {self.hidden} make {parameters:.3g} "
                f"parameters, more than the {MAX_PARAMETERS:.3g} a model may have"
            )
        return self

    # Derived sizes, resolved once so nothing downstream repeats the defaults.
    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dhead(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def shared_ffn(self) -> int:
        """Width of the always-on experts of an MoE layer together."""
        if self.shared_expert_ffn is not None:
            return self.shared_expert_ffn
        return self.shared_experts * self.expert_ffn

    @property
    def attn_layers(self) -> int:
        return self.layers if self.attention_layers is None else self.attention_layers

    @property
    def ffn_layers(self) -> int:
        return self.layers if self.mlp_layers is None else self.mlp_layers

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        if not self.is_moe:
            return 0
        return max(self.ffn_layers - self.dense_layers, 0) // self.moe_every

    def attention_params(self) -> int:
        h, d = self.hidden, self.dhead
        if self.mla is None:
            return h * d * (self.heads + 2 * self.kv) + self.heads * d * h
        m = self.mla
        qk = d + m.rope_head_dim
        q = (
            h * m.q_lora_rank + m.q_lora_rank * self.heads * qk
            if m.q_lora_rank
            else h * self.heads * qk
        )
        kv = h * (m.kv_lora_rank + m.rope_head_dim) + m.kv_lora_rank * self.heads * (
            d + m.v_head_dim
        )
        return q + kv + self.heads * m.v_head_dim * h

    def mamba_params(self) -> int:
        """One Mamba-2 block: in/out projections, convolution, per-head A, D, dt bias, norm."""
        if self.mamba is None:
            return 0
        m, h = self.mamba, self.hidden
        inner, bc = m.inner, 2 * m.groups * m.state
        in_proj = h * (2 * inner + bc + m.heads)
        return in_proj + (inner + bc) * m.conv_kernel + 3 * m.heads + inner + inner * h

    def mlp_params(self, active_only: bool = False) -> tuple[int, int]:
        """(dense MLP, MoE layer) parameters: routed experts (top-k of them when
        active_only), shared experts and the router."""
        mats = 3 if self.mlp == "swiglu" else 2
        dense = mats * self.hidden * self.ffn
        if not self.is_moe:
            return dense, 0
        routed = self.topk if active_only else self.num_experts
        moe = mats * self.hidden * (routed * self.expert_ffn + self.shared_ffn)
        return dense, moe + self.hidden * self.num_experts

    def layer_params(self, active_only: bool = False) -> float:
        """Parameters of an average layer (attention, MLP or MoE, Mamba, norms)."""
        dense, moe = self.mlp_params(active_only)
        n_moe = self.moe_layers
        norm = self.hidden * (2 if self.norm == "layernorm" else 1)
        blocks = (
            self.attn_layers * (self.attention_params() + norm)
            + (self.ffn_layers - n_moe) * (dense + norm)
            + n_moe * (moe + norm)
            + (self.mamba.layers * (self.mamba_params() + norm) if self.mamba else 0)
        )
        return blocks / self.layers

    def embedding_params(self) -> int:
        """Input embedding, learned positions, final norm and (untied) LM head."""
        h = self.hidden
        emb = self.vocab * h * (1 if self.tied_embeddings else 2)
        pos = (self.max_seq_len or self.seq_len) * h if self.position == "learned" else 0
        return emb + pos + h * (2 if self.norm == "layernorm" else 1)

    def param_count(self, active_only: bool = False) -> int:
        mtp = self.mtp_layers * (self.layer_params(active_only) + 2 * self.hidden**2)
        return round(self.layers * self.layer_params(active_only) + mtp + self.embedding_params())


class Efficiency(_Spec):
    """Physical efficiency constants of one GPU type, fitted from measurements.

    Each is a fraction of a datasheet figure (or a latency), so it stays meaningful when the
    model, the layout or the cluster size changes.
    """

    gemm: float = Field(gt=0, le=1, description="fraction of dense peak reached by large GEMMs")
    gemm_fp8: float | None = Field(
        default=None, gt=0, le=1, description="fraction of fp8 peak reached by fp8 GEMMs; = gemm"
    )
    gemm_fp4: float | None = Field(
        default=None, gt=0, le=1, description="fraction of fp4 peak reached by fp4 GEMMs; = fp8's"
    )
    attention: float = Field(gt=0, le=1, description="fraction of peak reached by attention")
    memory: float = Field(gt=0, le=1, description="fraction of HBM bandwidth for memory-bound ops")
    kernel_us: float = Field(ge=0, description="fixed cost per kernel launch/tail, microseconds")
    intra_node_bus: float = Field(gt=0, le=1, description="NVLink bus-bandwidth efficiency")
    inter_node_bus: float = Field(gt=0, le=1, description="network bus-bandwidth efficiency")
    intra_node_latency_us: float = Field(
        ge=0, description="per-step latency of an NVLink collective"
    )
    inter_node_latency_us: float = Field(ge=0, description="per-step latency across nodes")
    step_overhead_ms: float = Field(
        default=0.0, ge=0, description="fixed per-step cost: optimizer launch, grad norm, sync"
    )
    memory_overhead: float = Field(
        ge=0, le=1, description="allocator fragmentation + workspaces, fraction of the other memory"
    )
    memory_reserved_gib: float = Field(ge=0, description="CUDA context, NCCL and library buffers")
    provenance: str = Field(default="", description="what these constants were fitted on")

    def gemm_at(self, precision: str) -> float:
        """GEMM efficiency at a precision: 8-bit formats share one, 4-bit another."""
        if precision in ("fp8", "mxfp8"):
            return self.gemm_fp8 or self.gemm
        if precision == "nvfp4":
            return self.gemm_fp4 or self.gemm_fp8 or self.gemm
        return self.gemm


class InferenceEfficiency(_Spec):
    """Efficiency constants of an inference engine's fused kernels on one GPU type.

    Serving engines (FasterTransformer, TensorRT-LLM, vLLM) launch far fewer and cheaper
    kernels than an eager training step, and their small all-reduces take NCCL's
    latency-optimised algorithms, so these are fitted apart from the training constants.
    """

    memory: float = Field(gt=0, le=1, description="fraction of HBM bandwidth streaming weights/KV")
    gemm: float = Field(gt=0, le=1, description="fraction of dense peak reached by prefill GEMMs")
    kernel_us: float = Field(ge=0, description="fixed GPU cost per kernel, microseconds")
    allreduce_base_us: float = Field(ge=0, description="fixed cost of one small all-reduce")
    allreduce_step_us: float = Field(
        ge=0, description="latency per tree level (log2 of the group size) of a small all-reduce"
    )
    iteration_us: float = Field(
        default=0.0,
        ge=0,
        le=5000.0,
        description="host time per engine iteration (scheduling, input preparation, sampling), "
        "microseconds",
    )
    sequence_us: float = Field(
        default=0.0,
        ge=0,
        le=50.0,
        description="host time per running sequence per engine iteration (its scheduling, "
        "sampling and output bookkeeping), microseconds",
    )
    provenance: str = Field(default="", description="what these constants were fitted on")


class ClusterSpec(_Spec):
    """How GPUs are wired: node size and per-GPU link bandwidths (one direction)."""

    name: str = "default"
    gpus_per_node: int = Field(default=8, gt=0, le=MAX_COUNT)
    nvlink_domain: int | None = Field(
        default=None,
        gt=0,
        le=MAX_COUNT,
        description="GPUs one NVLink fabric joins (72 in an NVL72 rack); = gpus_per_node",
    )
    intra_node_gb_s: Datasheet = Field(description="NVLink GB/s per GPU, one direction")
    inter_node_gb_s: Datasheet = Field(description="network GB/s per GPU, one direction")
    # Host (CPU) memory of one node, GiB: what CPU offload (cost.offload) may fill. None where
    # the profile does not state it: the host bytes are then reported, not checked.
    host_memory_gib: Datasheet | None = Field(
        default=None, description="host memory per node, GiB (datasheet)"
    )

    @property
    def domain(self) -> int:
        """GPUs that reach each other over NVLink (or the node's own bus)."""
        return self.nvlink_domain or self.gpus_per_node


# The Efficiency constants that are fractions of a datasheet figure, which a kernel measurement
# can bound (MeasuredRange holds fractions).
MEASURABLE_EFFICIENCY = (
    "gemm",
    "gemm_fp8",
    "gemm_fp4",
    "attention",
    "memory",
    "intra_node_bus",
    "inter_node_bus",
)


class MeasuredRange(_Spec):
    """Where one efficiency constant was measured on the GPU's own kernels, and how."""

    low: float = Field(gt=0, le=1)
    high: float = Field(gt=0, le=1)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> MeasuredRange:
        if self.low > self.high:
            raise ValueError(f"measured range low {self.low} is above high {self.high}")
        return self


class GPUSpec(_Spec):
    """A GPU type: datasheet figures, efficiency constants and the usual cluster around it."""

    name: str
    chip: str = Field(description="silicon family sharing efficiency constants (a100, h100, ...)")
    peak_tflops: dict[str, Datasheet] = Field(description="dense peak TFLOP/s by precision")
    memory_gib: Datasheet = Field(description="usable HBM, GiB")
    memory_tb_s: Datasheet = Field(description="HBM bandwidth, TB/s")
    sms: int = Field(
        default=0,
        ge=0,
        le=MAX_COUNT,
        description="streaming multiprocessors: a GEMM's output tiles run in waves of this "
        "many (0: waves not modelled, as on a CPU)",
    )
    efficiency: Efficiency
    inference: InferenceEfficiency | None = Field(
        default=None, description="serving-engine constants (carried over from a fitted chip)"
    )
    cluster: ClusterSpec
    tdp_w: Datasheet | None = Field(default=None, description="board power, watts")
    source: str = ""
    measured_efficiency: dict[str, MeasuredRange] = Field(
        default_factory=dict,
        description="efficiency constants measured on this GPU's kernels: the published-run "
        "fit keeps the family's constant inside each range",
    )
    kernel_table: str = Field(
        default="",
        pattern=r"^[a-z0-9_]*$",
        description="the measured kernel tables (a folder of profiles/kernels/) that time this "
        "GPU's GEMMs and attention, at their efficiency times this GPU's own peak; '' for none "
        "(the efficiency constants time them)",
    )
    kernel_table_stand_in: str = Field(
        default="",
        description="why another GPU's tables stand in for this one's, with the datasheet "
        "ratios that differ; '' where the tables were measured on this GPU",
    )
    gemm_rates: str = Field(
        default="",
        pattern=r"^[a-z0-9_]*$",
        description="with a stand-in: measured GEMM times of this GPU (a folder of "
        "profiles/gemm_rates/, rows for its compute-unit count `sms`) that carry the stand-in "
        "tables' GEMM efficiencies to it, format by format (columns.gemm_rates); '' for none",
    )

    @field_validator("measured_efficiency")
    @classmethod
    def _efficiency_names(cls, v: dict[str, MeasuredRange]) -> dict[str, MeasuredRange]:
        unknown = set(v) - set(MEASURABLE_EFFICIENCY)
        if unknown:
            raise ValueError(
                f"measured_efficiency: {sorted(unknown)[0]} is not one of "
                f"{', '.join(MEASURABLE_EFFICIENCY)}"
            )
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        if "bf16" not in v:
            raise ValueError("peak_tflops needs at least bf16")
        unknown = set(v) - set(Precision.values())
        if unknown:
            raise ValueError(f"peak_tflops: unknown precision {sorted(unknown)[0]}")
        return v

    @model_validator(mode="after")
    def _rates_need_a_stand_in(self) -> GPUSpec:
        # measured GEMM rates carry a stand-in's tables to this GPU: without one, nothing to carry
        if self.gemm_rates and not (self.kernel_table and self.kernel_table_stand_in):
            raise ValueError(
                "gemm_rates: needs the stand-in tables they carry (kernel_table and "
                "kernel_table_stand_in)"
            )
        return self

    def supports(self, precision: str) -> bool:
        """Whether the GPU has tensor cores for `precision` (16-bit everywhere)."""
        return precision in ("bf16", "fp16") or precision in self.peak_tflops

    def peak(self, precision: str) -> float:
        return self.peak_tflops.get(precision) or self.peak_tflops["bf16"]


class Sourced(_Spec):
    """A framework fact and where it comes from (docs, flags or code of the framework)."""

    # strict list items: a YAML `[true]` must not pass for ZeRO stage 1
    value: bool | int | str | list[StrictInt] | list[str]
    source: str = Field(min_length=1)


def _zero_stages(stages: Sourced, allowed: tuple[int, ...]) -> Sourced:
    """`stages` if its value lists ZeRO stages among `allowed` (Sourced keeps list items
    integers, not true/false); else one line (the field's name leads it in the error)."""
    value = stages.value
    if not isinstance(value, list) or not all(v in allowed for v in value):
        names = ", ".join(str(a) for a in allowed)
        raise ValueError(f"must list ZeRO stages among {names}, not {value!r}")
    return stages


# What a framework does that is either so or not: each must be stated true or false.
_YES_OR_NO = (
    "flash_attention",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "tp_overlap",
    "p2p_overlap",
    "cuda_graphs",
    "fused_kernels",
    "ep_dedup",
    "fp8_params",
    "grad_reduce_bf16",
    "sp_saves_gathered",
    "zero2_gathers_every_micro_batch",
    "fsdp_copies",
    "bf16_optimizer",
    "pipeline_p2p_serial",
    "main_param_remainders",
)


def _true_or_false(stated: Sourced) -> Sourced:
    """`stated` if its value is true or false; else one line (the field's name leads it)."""
    if not isinstance(stated.value, bool):
        raise ValueError(f"must be true or false, not {stated.value!r}")
    return stated


# What a framework can run that it either can or cannot: stated true or false.
_CAN_OR_NOT = (
    "tensor_parallel",
    "pipeline",
    "interleaving",
    "interleave_needs_pp_multiple",
    "uneven_pipeline",
    "ends_as_layers_split",
    "stages_by_size",
    "context_parallel",
    "expert_parallel",
    "expert_folding",
    "expert_tensor_parallel",
    "partial_recompute",
    "replicated_data_parallel",
    "hybrid_context_parallel",
)


class FrameworkCapabilities(_Spec):
    """What a training framework can run: layouts outside these are never proposed for it."""

    zero: Sourced  # ZeRO stages it runs (0 none, 1 optimizer, 2 + gradients, 3 + weights)
    zero_with_pp: Sourced  # stages that combine with pipeline parallelism
    tensor_parallel: Sourced
    sequence_parallel: Sourced  # "optional", "with_tp" (always on with tp > 1) or "never"
    pipeline: Sourced
    interleaving: Sourced  # virtual pipeline stages
    interleave_needs_pp_multiple: Sourced  # micro-batches a multiple of pp when interleaved
    uneven_pipeline: Sourced
    # can be told to count the embedding and the LM head as a layer each in the pipeline
    # split, which lets an interleaved layout divide where the layers alone do not
    ends_as_layers_split: Sourced = Sourced(
        value=False, source="no option to count the embedding and the head as layers"
    )
    # interleaved stages are asked for by their size in layers, the embedding and the head
    # counting as one each (frameworks.layers_per_stage); above its default stages per rank a
    # layout needs a size that makes pp*vp of them
    stages_by_size: Sourced = Sourced(value=False, source="stages asked for by their count")
    context_parallel: Sourced
    expert_parallel: Sourced
    expert_folding: Sourced  # ep*etp over tp*dp*cp (MoE parallel folding), else within dp*cp
    expert_tensor_parallel: Sourced
    recompute: Sourced  # modes (vocab.Recompute values)
    partial_recompute: Sourced  # full recompute of only some layers of a stage
    precisions: Sourced  # vocab.Precision values
    # With pipelining, the size its schedule splits a rank's batch into, where a published
    # run states the rank's batch rather than the micro-batch (0: the stated batch is the
    # micro-batch).
    pipeline_microbatch: Sourced = Sourced(value=0, source="the stated batch is the micro-batch")
    # The training tasks it runs (vocab.Task values): sft is pretraining's physics on other
    # data, so every framework runs both; lora and qlora where it trains adapters on a frozen
    # (NF4) base.
    tasks: Sourced = Sourced(
        value=["pretrain", "sft"], source="no adapter training (LoRA, QLoRA) stated"
    )
    # The Adam state precisions it runs (vocab.OptimizerState values; bytes in cost.optimizer)
    optimizer_states: Sourced = Sourced(
        value=["fp32"], source="fp32 main parameters and Adam moments only"
    )
    # the ZeRO stages a state lighter than fp32 runs with
    lighter_state_zero: Sourced = Sourced(
        value=[0, 1, 2, 3], source="the optimizer's state precision is independent of sharding"
    )
    # runs ZeRO 0 (whole replicas, DDP) over more than one data-parallel rank; a framework
    # that shards every multi-GPU run runs ZeRO 0 on one GPU only
    replicated_data_parallel: Sourced = Sourced(
        value=True, source="plain data parallelism (DDP) beside its ZeRO stages"
    )
    # splits each packed document over only the context-parallel ranks its length needs
    # (layout hybrid_cp; cost.hybrid_cp)
    hybrid_context_parallel: Sourced = Sourced(
        value=False, source="no dynamic context parallelism stated"
    )
    # the recompute modes (vocab.Recompute values) it offloads the saved activations with (layout
    # activation_offload; cost.activation_offload); empty: no activation offload
    activation_offload: Sourced = Sourced(value=[], source="no activation offload stated")
    # What it can keep in host memory (vocab.Offload values; physics in cost.offload)
    offloads: Sourced = Sourced(value=["none"], source="no CPU offload stated")
    # the ZeRO stages optimizer offload runs with (parameter offload needs ZeRO 3 everywhere)
    offload_zero: Sourced = Sourced(
        value=[0, 1, 2, 3], source="optimizer offload independent of sharding"
    )

    @field_validator(*_CAN_OR_NOT)
    @classmethod
    def _true_or_false(cls, stated: Sourced) -> Sourced:
        return _true_or_false(stated)

    @field_validator("optimizer_states")
    @classmethod
    def _known_states(cls, states: Sourced) -> Sourced:
        return _lists_the_default(states, "optimizer_states", OptimizerState.FP32)

    @field_validator("offloads")
    @classmethod
    def _known_offloads(cls, modes: Sourced) -> Sourced:
        return _lists_the_default(modes, "offloads", Offload.NONE)

    @field_validator("activation_offload")
    @classmethod
    def _recompute_modes(cls, modes: Sourced) -> Sourced:
        listed = modes.value if isinstance(modes.value, list) else [modes.value]
        unknown = [m for m in listed if str(m) not in Recompute.values()]
        if unknown:
            raise ValueError(
                f"activation_offload lists recompute modes ({Recompute.allowed()}), not {unknown}"
            )
        return modes


def _lists_the_default(stated: Sourced, name: str, default: OptimizerState | Offload) -> Sourced:
    """`stated` when it lists `default` (what every layout starts from) and only values of its
    kind; else the ValueError naming `name` and what is allowed."""
    listed = [str(s) for s in stated.value] if isinstance(stated.value, list) else []
    kind = type(default)
    if not listed or any(s not in kind.values() for s in listed) or default.value not in listed:
        raise ValueError(
            f"{name} must list {default.value} and only {kind.allowed()}, not {stated.value!r}"
        )
    return stated


# How an offloading framework overlaps its host copies (cost.offload): not at all; with the
# CPU step, tensor by tensor (Megatron-Core's --overlap-cpu-optimizer-d2h-h2d); or with the
# backward and the forward (DeepSpeed's overlap_comm, FSDP2's copies on its own streams).
OFFLOAD_OVERLAPS = ("none", "with_step", "with_backward")


class FrameworkBehaviour(_Spec):
    """What a framework does in its performance configuration (and its exported flags ask
    for): each maps onto a column of columns.Behaviour."""

    flash_attention: Sourced
    overlap_grad_reduce: Sourced
    overlap_param_gather: Sourced
    tp_overlap: Sourced  # TP collectives overlapped with GEMMs (with sequence parallelism)
    p2p_overlap: Sourced  # pipeline sends overlapped, with interleaving
    cuda_graphs: Sourced
    fused_kernels: Sourced  # fused activation kernels (Transformer Engine, torch.compile)
    ep_dedup: Sourced  # MoE dispatch once per node, fanned out over NVLink
    fp8_params: Sourced  # weights kept and all-gathered in fp8 with fp8/mxfp8 recipes
    grad_reduce_bf16: Sourced  # gradients reduced in bf16 instead of fp32
    sp_saves_gathered: Sourced
    pipeline_split: Sourced = Sourced(value="even", source="layers split evenly over the stages")
    # bytes moved per parameter in every micro-batch to accumulate weight gradients outside
    # the weight-gradient GEMM (a memory-bound pass of their own)
    grad_accumulation_bytes: Sourced = Sourced(
        value=0, source="no accumulation pass outside the weight-gradient GEMM is modelled"
    )
    # the ZeRO stages below 3 whose gradient reduction runs in every micro-batch's backward,
    # not only the last one's (ZeRO-3 always does; a pipeline schedule never does)
    grad_reduce_every_micro_batch: Sourced = Sourced(
        value=[], source="gradients reduced once a step, in the last micro-batch's backward"
    )

    # ZeRO-2 reshards the weights after each backward (FSDP), so each micro-batch gathers them
    # again; else they stay whole and the updated shards are gathered once a step
    zero2_gathers_every_micro_batch: Sourced = Sourced(
        value=False, source="ZeRO-2 keeps whole weights between steps"
    )

    # the ZeRO stages whose gradient reduction starts only after the whole backward, so no
    # backward hides it: without a pipeline (stages 0-2; ZeRO-3 reduces layer by layer) and
    # under a pipeline schedule (stages 0-3)
    grad_reduce_after_backward: Sourced = Sourced(
        value=[], source="gradients reduced during the last micro-batch's backward"
    )
    pipeline_grad_reduce_after_backward: Sourced = Sourced(
        value=[], source="gradients reduced during the last micro-batch's backward"
    )
    # FSDP's ZeRO-2/3 copies on the compute stream: each all-gather's output out into the
    # per-parameter weights, each gradient into the reduce-scatter's input in the reduction
    # dtype (torch's fully_shard); flat-parameter designs gather and reduce in place
    fsdp_copies: Sourced = Sourced(value=False, source="gathered and reduced in place")
    # Whether bf16 runs at ZeRO 0/1 use DeepSpeed's BF16_Optimizer: a gradient copy of its own
    # beside the bf16 one, into which each micro-batch's gradients are added
    # (`bf16_grad_pass_bytes` per parameter, memory-bound), all-reduced whole before each rank
    # updates its shard. A run states it in its `bf16_optimizer` column; this is the default.
    bf16_optimizer: Sourced = Sourced(
        value=False, source="bf16 gradients reduced as the ZeRO stage says, no fp32 copy"
    )
    bf16_grad_pass_bytes: Sourced = Sourced(
        value=0, source="no fp32 gradient copy outside the weight-gradient GEMM"
    )
    # A pipeline stage's sends and receives one after another, each blocking, so each
    # micro-batch pays four transfers (activation in and out, gradient in and out); else the
    # send and the receive of each exchange go together as one batched operation, two.
    pipeline_p2p_serial: Sourced = Sourced(
        value=False,
        source="each exchange's send and receive batched together (Megatron-Core's "
        "send_forward_recv_backward; torch.distributed.pipelining's batch_isend_irecv)",
    )
    # With a lighter optimizer state, the fp32 main parameters kept as the 16 bits their bf16
    # working copy lacks (Transformer Engine FusedAdam store_param_remainders), not whole
    main_param_remainders: Sourced = Sourced(
        value=False, source="fp32 main parameters kept whole beside lighter moments"
    )
    # With CPU offload: bytes per parameter the host sends up (the updated weights after the
    # CPU step where the GPU keeps its working copy; the offloaded weights at every gather where
    # it does not), and how the copies overlap (OFFLOAD_OVERLAPS)
    offload_upload_bytes: Sourced = Sourced(value=2, source="the 16-bit working weights copied up")
    offload_overlap: Sourced = Sourced(value="none", source="host copies not overlapped")
    # With activation offload: the layers whose saved activations a rank keeps on the GPU (the
    # one computing and those not yet copied out or already copied back)
    activation_offload_resident_layers: Sourced = Sourced(
        value=2, source="the layer computing and the one whose copy is in flight"
    )

    @field_validator("grad_reduce_every_micro_batch", "grad_reduce_after_backward")
    @classmethod
    def _stages_below_three(cls, stages: Sourced) -> Sourced:
        return _zero_stages(stages, (0, 1, 2))

    @field_validator("pipeline_grad_reduce_after_backward")
    @classmethod
    def _any_stages(cls, stages: Sourced) -> Sourced:
        return _zero_stages(stages, (0, 1, 2, 3))

    @field_validator(*_YES_OR_NO)
    @classmethod
    def _true_or_false(cls, stated: Sourced) -> Sourced:
        return _true_or_false(stated)

    @field_validator("offload_overlap")
    @classmethod
    def _known_overlap(cls, overlap: Sourced) -> Sourced:
        if overlap.value not in OFFLOAD_OVERLAPS:
            raise ValueError(
                f"offload_overlap must be one of {', '.join(OFFLOAD_OVERLAPS)}, not "
                f"{overlap.value!r}"
            )
        return overlap

    @field_validator("activation_offload_resident_layers")
    @classmethod
    def _resident_layers(cls, stated: Sourced) -> Sourced:
        value = stated.value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"activation_offload_resident_layers must be a positive integer, not {value!r}"
            )
        return stated

    @field_validator("offload_upload_bytes")
    @classmethod
    def _upload_bytes(cls, stated: Sourced) -> Sourced:
        if isinstance(stated.value, bool) or stated.value not in (1, 2, 4):
            raise ValueError(f"offload_upload_bytes must be 1, 2 or 4, not {stated.value!r}")
        return stated

    @field_validator("pipeline_split")
    @classmethod
    def _known_split(cls, split: Sourced) -> Sourced:
        if split.value not in PipelineSplit.values():
            raise ValueError(
                f"pipeline_split must be {PipelineSplit.allowed()}, not {split.value!r}"
            )
        return split

    @property
    def balances_by_hand(self) -> bool:
        """Pipeline stages balanced by hand against the embedding and the LM head."""
        return self.pipeline_split.value == PipelineSplit.BALANCED

    @property
    def counts_ends_as_layers(self) -> bool:
        """The embedding and the LM head each count as one layer in the even split."""
        return self.pipeline_split.value == PipelineSplit.ENDS_AS_LAYERS

    @property
    def splits_by_cost(self) -> bool:
        """Pipeline blocks placed by the framework's own compute-cost estimate."""
        return self.pipeline_split.value == PipelineSplit.COMPUTE_COST


class FrameworkSpec(_Spec):
    """A training framework: what it can run, what it does, and its defaults."""

    name: str
    title: str
    aliases: tuple[str, ...] = ()
    source: str
    can: FrameworkCapabilities
    does: FrameworkBehaviour
    defaults: dict[str, Any] = Field(description="default zero, recompute and sp of its users")

    def allows(self, capability: str) -> Any:
        return getattr(self.can, capability).value


class ParallelConfig(Layout):
    """One training run's layout (every dimension of autoconfig.spec.layout) and its batch."""

    gbs: int = Field(gt=0, description="global batch size, sequences")
    seq_len: int = Field(gt=0, description="training sequence length")
    precision: Precision = Precision.BF16

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.dp * self.mbs)


class SpaceOptions(_Spec):
    """How the training search walks its dimensions (search_spaces/*.yaml)."""

    allow_tp_across_nodes: bool = False
    uneven_pipeline: bool = Field(
        default=True, description="without interleaving, let stages hold ceil/floor layers"
    )
    min_tokens_per_cp_rank: int = Field(
        default=2048, ge=1, description="context parallelism only while seq/cp stays this long"
    )
    full_layers: list[float] = Field(
        default=[1.0],
        min_length=1,
        max_length=MAX_SPACE_VALUES,
        description="with recompute full: fractions of each stage's layers recomputed",
    )

    @model_validator(mode="before")
    @classmethod
    def _dimension_values(cls, data: Any) -> Any:
        """Each searched dimension's list, parsed by its declaration (sorted, no repeats)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for d in layout.SEARCHED:
            if d.name in out:
                values = out[d.name]
                if not isinstance(values, list) or not values:
                    raise UserError(f"{d.name}: must be a non-empty list")
                if len(values) > MAX_SPACE_VALUES:  # before parsing each of them
                    raise UserError(
                        f"{d.name}: {len(values):,} values, more than the {MAX_SPACE_VALUES} "
                        "a search-space list may hold"
                    )
                parsed = list(dict.fromkeys(d.parse(v) for v in values))
                # Numbers in ascending order; choices in the order given (the tie order).
                out[d.name] = sorted(parsed) if d.type in (int,) else parsed
        return out

    @field_validator("full_layers")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if any(not 0 < x <= 1 for x in v):
            raise ValueError("values must be fractions in (0, 1]")
        return sorted(set(v))

    @model_validator(mode="after")
    def _bounded(self) -> SpaceOptions:
        """The lists cross to at most MAX_SPACE_STRUCTURES structures and MAX_SPACE_SETTINGS
        settings, checked before the search enumerates any of them."""
        lists = {d.name: getattr(self, d.name) for d in layout.SEARCHED if hasattr(self, d.name)}
        if not lists:  # the options alone, without the dimensions' lists
            return self
        sizes = {name: len(values) for name, values in lists.items()}
        if Recompute.FULL in lists.get("recompute", []):  # full once per fraction
            sizes["recompute"] += len(self.full_layers) - 1
        for structural, limit in ((True, MAX_SPACE_STRUCTURES), (False, MAX_SPACE_SETTINGS)):
            names = [d.name for d in layout.SEARCHED if d.structural is structural]
            crossed = math.prod(sizes.get(n, 1) for n in names)
            if crossed > limit:
                longest = max(names, key=lambda n: sizes.get(n, 1))
                raise UserError(
                    f"{longest}: the lists {', '.join(names)} cross to {crossed:,} "
                    f"combinations ({longest} holds {sizes[longest]}), more than the "
                    f"{limit:,} one search enumerates"
                )
        return self


SearchSpace = create_model(  # type: ignore[call-overload]
    "SearchSpace",
    __base__=SpaceOptions,
    __doc__="What the training search tries: the values of every searched layout dimension "
    "(derived from autoconfig.spec.layout) and how it walks them. CLI constraints narrow it.",
    **{
        d.name: (list[d.type], Field(default=list(d.searched), min_length=1, description=d.help))
        for d in layout.SEARCHED
    },
)
