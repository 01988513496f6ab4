"""What one trainer run is: the configuration, its checks, and how a search result becomes one.

Everything that makes a layout impossible is rejected here, before any process starts, with
one line naming the field (`UserError`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from autoconfig.base import checks
from autoconfig.base.errors import UserError, pydantic_message
from autoconfig.cost.inputs import interleaves_by_counting_ends
from autoconfig.spec import catalog, layout
from autoconfig.spec.documents import DocLengths, doc_lengths, fixed
from autoconfig.spec.layout import Layout
from autoconfig.spec.schema import ModelSpec
from autoconfig.spec.task import DEFAULT_LORA_RANK, DEFAULT_LORA_TARGETS, TaskSpec
from autoconfig.spec.vocab import LoraTargets, Offload, OptimizerState, Task, ZeroStage

# QLoRA's block: weights per absmax (Dettmers et al. 2023, Sec. 3; trainer/nf4.py quantizes
# with it). Declared here so that checking a configuration needs no torch.
NF4_BLOCK = 64


def as_built(spec: ModelSpec) -> ModelSpec:
    """The model the bundled trainer builds from `spec`: every layer one attention block (full
    multi-head or grouped-query attention) and one MLP, or one MoE layer for an MoE model, whose
    shared experts are `shared_experts` experts of the routed width. Mamba blocks, MLA, latent
    MoE, dense first layers, MoE on every k-th layer only, sliding windows and MTP heads are not
    built, so the prediction printed beside a run and its memory check describe what ran."""
    return spec.model_copy(
        update={
            "attention_layers": None,
            "mlp_layers": None,
            "mamba": None,
            "mla": None,
            "moe_latent": None,
            "dense_layers": 0,
            "moe_every": 1,
            "sliding_window": None,
            "sliding_window_layers": 0,
            "mtp_layers": 0,
            "shared_expert_ffn": None,
        }
    )


class TrainConfig(Layout):
    """One trainer run: a layout (every dimension of autoconfig.spec.layout, with its defaults) and
    what the trainer needs besides. `model` is a catalog name, a config.json path, or a full
    spec."""

    model: str | ModelSpec
    task: Literal["pretrain", "sft", "lora", "qlora", "generate"] = Field(
        default="pretrain",
        description="pretrain and sft train every weight; lora trains rank-r adapters on the "
        "frozen base (spec.task, trainer/lora.py), qlora on a frozen base whose layers' linear "
        "weights are NF4 (trainer/nf4.py); generate times a static batch's prefill and decode "
        "('train' is pretrain's old name)",
    )
    lora_rank: int = Field(
        default=DEFAULT_LORA_RANK, gt=0, description="lora: the adapters' rank r"
    )
    lora_alpha: float | None = Field(
        default=None,
        gt=0,
        description="lora: adapter outputs are scaled by alpha / r (default 2r, as the exported "
        "NeMo, torchtune and PEFT settings have it)",
    )
    lora_targets: LoraTargets = Field(
        default=DEFAULT_LORA_TARGETS,
        description="lora: qkv, attention (and its output projection) or all (and the MLP)",
    )
    doc_lengths: str | None = Field(
        default=None,
        description="packed documents (spec.documents): a preset (squad), a length in tokens "
        "or a CSV of lengths; each sequence holds documents back to back, attention stays "
        "within each and positions restart at each (default: one document a sequence)",
    )
    input_len: int | None = Field(default=None, gt=0, description="generate: prompt tokens")
    output_len: int | None = Field(default=None, gt=0, description="generate: tokens out")
    layers: int | None = Field(default=None, gt=0, description="keep only this many layers")
    seq_len: int | None = Field(default=None, gt=0)
    gbs: int | None = Field(default=None, gt=0, description="default: dp*mbs*pp")
    zero: ZeroStage = Field(
        default=ZeroStage.NONE,
        description="the trainer runs plain data parallelism unless asked; ZeRO shards over the "
        "dp*cp ranks holding the same weights (nothing to shard when dp*cp is 1)",
    )
    capacity_factor: float | None = Field(
        default=None,
        gt=0,
        description="MoE: an expert takes at most ceil(c * tokens * topk / experts) of a rank's "
        "token assignments, the earliest first; the rest are dropped and counted (default: "
        "no limit)",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="auto: bf16 on GPU, fp32 on CPU. bf16 on GPU is autocast with fp32 master "
        "weights; on CPU it stores weights and activations in bf16 (for memory measurements)",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    steps: int = Field(default=10, gt=0)
    warmup: int = Field(default=2, ge=0, description="steps left out of the median time")
    seed: int = 1234
    lr: float = Field(default=3e-4, gt=0)
    optimizer: Literal["adamw", "sgd"] = Field(
        default="adamw", description="sgd: plain SGD, whose update shows any gradient error"
    )
    compile: bool = False
    slice: bool = Field(default=False, description="one device, per-rank shapes of tp")
    gpu: str | None = Field(default=None, description="GPU profile for MFU (default: detect)")
    world_size: int | None = Field(default=None, gt=0, description="default: tp*pp*dp*cp")
    memory_limit_gib: float | None = Field(
        default=None,
        gt=0,
        description="per-rank memory cap: the CUDA allocator's fraction on GPU, an address-space "
        "limit above what the process already holds on CPU; past it a run ends as oom",
    )
    fault: str = Field(
        default="",
        description="testing: make rank R fail at its second step, 'oom@R' (a CUDA OOM error), "
        "'alloc@R' (a real allocation past memory_limit_gib), 'crash@R', 'abort@R' (killed by "
        "SIGABRT, no result written) or 'sleep@R' (hang)",
    )
    timeout_s: float = Field(default=300.0, gt=0, description="collective timeout per rank")

    @model_validator(mode="before")
    @classmethod
    def _old_task_name(cls, data: Any) -> Any:
        """'train' (configurations written before the fine-tuning tasks) is pretrain."""
        if isinstance(data, dict) and data.get("task") == "train":
            return {**data, "task": Task.PRETRAIN.value}
        return data

    @model_validator(mode="before")
    @classmethod
    def _data_parallel(cls, data: Any) -> Any:
        """dp from the world size when not given (one replica without either)."""
        if isinstance(data, dict) and data.get("dp") is None:
            data = {k: v for k, v in data.items() if k != "dp"}
            world = data.get("world_size")
            if world:
                split = int(data.get("tp", 1)) * int(data.get("pp", 1)) * int(data.get("cp", 1))
                data["dp"] = max(int(world) // max(split, 1), 1)
        return data

    @model_validator(mode="before")
    @classmethod
    def _experts_follow_tp(cls, data: Any) -> Any:
        """An MoE model's experts split over the tp ranks unless etp is given (Megatron-Core's
        default: --expert-tensor-parallel-size absent means etp = tp)."""
        if not isinstance(data, dict) or data.get("etp") is not None or data.get("tp") is None:
            return data
        model = data.get("model")
        try:
            spec = model if isinstance(model, ModelSpec) else catalog.get_model(str(model))
        except UserError:
            return data  # the unknown model is reported where the spec is built
        return {**data, "etp": data["tp"]} if spec.is_moe else data

    @property
    def trains(self) -> bool:
        """Whether the run trains (any task but generate)."""
        return self.task != "generate"

    @property
    def adapters(self) -> bool:
        """Whether the run trains LoRA adapters on a frozen base (lora, qlora)."""
        return self.task in (Task.LORA.value, Task.QLORA.value)

    @property
    def quantized(self) -> bool:
        """Whether the frozen base's linear weights are held in NF4 (qlora: trainer/nf4.py)."""
        return self.task == Task.QLORA.value

    @property
    def alpha(self) -> float:
        """The adapters' alpha (their outputs are scaled by alpha / rank)."""
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    def documents(self) -> DocLengths | None:
        """The packed documents' length histogram (None: one document a sequence)."""
        if self.doc_lengths is None:
            return None
        text = self.doc_lengths.strip()
        try:
            length = float(text)
        except ValueError:
            return doc_lengths(text)  # a preset or a CSV file: one UserError line if bad
        if not (1 <= length <= checks.MAX_COUNT and length == int(length)):
            raise UserError(
                f"doc-lengths: a document length is a whole number of tokens in "
                f"1..{checks.MAX_COUNT:,} (got {checks.shown(text)})"
            )
        return fixed(length)

    def task_spec(self) -> TaskSpec:
        """The run as the cost model describes it (spec.task): the task, the adapters and the
        packed documents at the run's sequence length."""
        task = Task.PRETRAIN if not self.trains else Task.parse(self.task, "task")
        spec = TaskSpec(task, self.lora_rank, self.lora_targets)
        return spec.with_documents(self.documents(), self.seq(), packed=True)

    def base_spec(self) -> ModelSpec:
        """The model named, before the run's `layers` / `seq_len` overrides."""
        return self.model if isinstance(self.model, ModelSpec) else catalog.get_model(self.model)

    def spec(self) -> ModelSpec:
        """The model as trained: the catalog spec with `layers` / `seq_len` overrides."""
        base = self.base_spec()
        update: dict[str, object] = {}
        if self.layers is not None:
            update["layers"] = self.layers
        if self.seq_len is not None:
            update["seq_len"] = self.seq_len
            if base.max_seq_len is not None:  # a model without a stated context has none
                update["max_seq_len"] = max(base.max_seq_len, self.seq_len)
        return base.model_copy(update=update)

    def trained_spec(self) -> ModelSpec:
        """What one process builds: the model as the bundled trainer builds it (`as_built`),
        or in slice mode one TP rank's shapes (heads, kv_heads, ffn and vocab divided by tp)
        as a one-device model."""
        spec = as_built(self.spec())
        if not self.slice:
            return spec
        tp = self.tp
        return spec.model_copy(
            update={
                "name": f"{spec.name}-slice-tp{tp}",
                "heads": spec.heads // tp,
                "head_dim": spec.dhead,
                "kv_heads": max(spec.kv // tp, 1),
                "ffn_hidden": spec.ffn // tp,
                "moe_ffn_hidden": (spec.moe_ffn_hidden // tp) if spec.moe_ffn_hidden else None,
                "vocab": spec.vocab // tp,
            }
        )

    @property
    def resolved_dp(self) -> int:
        return self.dp

    @property
    def world(self) -> int:
        """Processes the run needs (one in slice mode)."""
        return 1 if self.slice else self.tp * self.pp * self.resolved_dp * self.cp

    @property
    def global_batch(self) -> int:
        if self.gbs is not None:
            return self.gbs
        return self.resolved_dp * self.mbs * (self.pp if self.pp > 1 else 1)

    @property
    def whole_experts(self) -> bool:
        """MoE experts kept whole on every tp rank (etp 1 under tp > 1): the expert grid is
        folded over tp*dp*cp (mesh.py) and each tp rank routes its share of the tokens."""
        return self.etp == 1 and self.tp > 1 and self.spec().is_moe

    @property
    def experts_apart(self) -> bool:
        """Whether expert gradients are reduced over their own group (edp) rather than with
        the dense weights over dp*cp: with expert parallelism, or whole experts under tp."""
        return self.ep > 1 or self.whole_experts

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.resolved_dp * self.mbs)

    def checked(self) -> TrainConfig:
        """Self, after every layout rule (raises UserError with one line)."""
        named = self.base_spec()
        if self.layers is not None and self.layers > named.layers:  # "keep only this many"
            raise UserError(
                f"layers: at most the {named.layers} layers {named.name} has (it keeps the "
                f"first n; got {self.layers})"
            )
        spec = self.spec()
        dp = self.resolved_dp
        shared = layout.first_broken(
            {
                **layout.columns(layout.frame_of(self.model_dump())),
                "heads": spec.heads,
                "kv_heads": spec.kv,
                "layers": spec.layers,
                "experts": spec.num_experts,
                "num_gpus": self.tp * self.pp * dp * self.cp,
                "gbs": self.global_batch,
                "seq": self.seq(spec),
            }
        )
        if shared:  # what makes the layout impossible anywhere (autoconfig.spec.layout)
            raise UserError(shared)
        counted = self.interleaves_counting_ends(spec.layers)
        width_split = self.etp if spec.is_moe else self.tp  # ranks sharing one MLP's width
        # What only the bundled trainer refuses: the rules above (autoconfig.spec.layout) are
        # not repeated here, since they have refused a layout before these run.
        rules = [
            (
                self.world_size is not None
                and not self.slice
                and self.world_size != self.tp * self.pp * dp * self.cp,
                f"world size: {self.world_size} processes but tp*pp*dp*cp = "
                f"{self.tp}*{self.pp}*{dp}*{self.cp} = {self.tp * self.pp * dp * self.cp}",
            ),
            (  # torch's sharded matmuls split a width in equal shares only
                not self.slice and (spec.expert_ffn if spec.is_moe else spec.ffn) % width_split,
                f"tp: {width_split} does not divide the MLP width "
                f"({spec.expert_ffn if spec.is_moe else spec.ffn})",
            ),
            (
                self.pp * self.vp > spec.layers and not counted,
                f"pp: pp*vp = {self.pp * self.vp} exceeds the {spec.layers} layers",
            ),
            (
                spec.layers % (self.pp * self.vp) != 0 and not counted,
                f"pp: pp*vp = {self.pp * self.vp} must divide the {spec.layers} layers (or, "
                f"interleaved, {spec.layers} + 2 with the embedding and the head as layers)",
            ),
            (
                self.pp > 1 and self.micro_batches < self.pp,
                f"gbs: {self.micro_batches} micro-batches per step but pp = {self.pp} needs at "
                f"least {self.pp} (raise gbs or lower mbs)",
            ),
            (
                self.vp > 1 and self.micro_batches % self.pp != 0,
                f"gbs: interleaved pipelining needs micro-batches ({self.micro_batches}) "
                f"divisible by pp ({self.pp})",
            ),
            (
                self.sp and self.slice,
                "sp: a slice runs one device, with no sequence to split; use --no-sp",
            ),
            (
                self.sp and (self.seq(spec) // self.cp) % self.tp != 0,
                f"sp: tp {self.tp} does not divide the {self.seq(spec) // self.cp} tokens of a "
                f"sequence on one cp rank (seq_len {self.seq(spec)} / cp {self.cp})",
            ),
            (
                spec.is_moe and self.etp not in (1, self.tp),
                f"etp: the bundled trainer splits experts over every tp rank (etp {self.tp}) "
                f"or keeps them whole (etp 1); got etp {self.etp}",
            ),
            (
                self.capacity_factor is not None and not spec.is_moe,
                f"capacity_factor: only MoE models route tokens to experts ({spec.name} has none)",
            ),
            (
                self.optimizer_state != OptimizerState.FP32,
                f"optimizer_state: the bundled trainer keeps torch AdamW state in fp32; got "
                f"{self.optimizer_state.value}",
            ),
            (
                self.offload != Offload.NONE,
                f"offload: the bundled trainer keeps weights and optimizer state on the device; "
                f"got {self.offload.value}",
            ),
            (
                self.activation_offload,
                "activation_offload: the bundled trainer keeps saved activations on the device",
            ),
            (
                self.hybrid_cp,
                "hybrid_cp: the bundled trainer splits every sequence over all cp ranks (static "
                "context parallelism)",
            ),
            (
                self.recompute == "op",
                "recompute: op-level selective checkpointing is not in the bundled trainer yet; "
                "use none, selective or full",
            ),
            (self.slice and self.pp > 1, "pp: slice mode runs one device; use pp 1"),
            (self.slice and self.cp > 1, "cp: slice mode runs one device; use cp 1"),
            (self.slice and self.ep > 1, "ep: slice mode runs one device; use ep 1"),
            (
                self.recompute_layers > spec.layers // self.pp,
                f"recompute_layers: at most {spec.layers // self.pp} layers per stage",
            ),
            (self.warmup >= self.steps, f"warmup: {self.warmup} must be below steps {self.steps}"),
            *self._generate_rules(spec),
            *self._finetune_rules(spec),
        ]
        for bad, message in rules:
            if bad:
                raise UserError(message)
        return self

    def _finetune_rules(self, spec: ModelSpec) -> list[tuple[bool, str]]:
        """What the trainer runs of the fine-tuning tasks (spec.task) and packed documents."""
        dp = self.resolved_dp
        if self.doc_lengths is not None:
            self.documents()  # a bad preset, length or file is its own one line
        return [
            (
                self.quantized and spec.hidden % NF4_BLOCK != 0,
                f"task: qlora quantizes blocks of {NF4_BLOCK} weights along the hidden width, "
                f"which {spec.name} ({spec.hidden}) is not a multiple of; use lora",
            ),
            (  # the NF4 storage is buffers, which fully_shard leaves whole on every rank
                self.quantized and self.zero >= 3 and self.pp == 1 and dp * self.cp > 1,
                "zero: qlora keeps the NF4 base whole on every data-parallel rank, but ZeRO-3 "
                "shards it (as the cost model counts it); use zero 0, 1 or 2",
            ),
            (
                self.adapters and spec.is_moe,
                f"task: the bundled trainer puts LoRA adapters on dense layers only; "
                f"{spec.name} has MoE layers (train it with pretrain or sft)",
            ),
            (
                self.adapters and self.pp > 1 and not self.stage_layer_ids(spec.layers, 0),
                f"vp: with lora the first pipeline chunk holds only the frozen embedding "
                f"(pp*vp = {self.pp * self.vp} chunks of {spec.layers} layers + 2), so it has "
                "nothing to train; lower vp",
            ),
            (
                self.doc_lengths is not None and not self.trains,
                "doc_lengths: packed documents are for training; generation takes input_len",
            ),
            (
                self.doc_lengths is not None and self.slice,
                "doc_lengths: slice mode times one layer on whole sequences; leave it out",
            ),
        ]

    def _generate_rules(self, spec: ModelSpec) -> list[tuple[bool, str]]:
        """What the bundled generator runs: one tensor-parallel replica."""
        if self.task != "generate":
            return []
        return [
            (
                self.input_len is None or self.output_len is None,
                "input_len: generation needs input_len and output_len",
            ),
            (
                spec.kv % self.tp != 0,
                f"tp: {self.tp} does not divide kv_heads ({spec.kv}); the bundled generator "
                "does not replicate K/V heads",
            ),
            (
                self.pp > 1,
                "pp: the bundled generator runs tensor parallelism only (pipeline-parallel "
                "decoding is not implemented)",
            ),
            (self.resolved_dp > 1, "dp: measure one replica (replicas are independent)"),
            (
                self.cp > 1 or self.ep > 1,
                "cp: the bundled generator runs tensor parallelism only (use cp 1 and ep 1)",
            ),
            (self.recompute != "none", "recompute: generation has no backward pass"),
            (self.slice, "slice: not available for generation"),
        ]

    def seq(self, spec: ModelSpec | None = None) -> int:
        return (spec or self.spec()).seq_len if self.seq_len is None else self.seq_len

    def interleaves_counting_ends(self, layers: int) -> bool:
        """Interleaved with the embedding and the head counted as a layer each, because only
        layers + 2 divide into the pp*vp chunks (as the cost model and Megatron's exported
        layout split it: cost.inputs.counts_ends)."""
        return bool(interleaves_by_counting_ends(layers, self.pp, self.vp))

    def stage_layer_ids(self, layers: int, stage: int) -> list[int]:
        """The layers pipeline stage `stage` (of pp*vp) holds: equal runs of layers, or of
        layers + 2 units (the embedding first, the head last) where only those divide, which
        leaves the first and the last stage one layer fewer."""
        stages = self.pp * self.vp
        if not self.interleaves_counting_ends(layers):
            per = layers // stages
            return list(range(stage * per, (stage + 1) * per))
        per = (layers + 2) // stages
        units = range(stage * per, (stage + 1) * per)
        return [u - 1 for u in units if 1 <= u <= layers]


def load_config(path: Path) -> TrainConfig:
    """A TrainConfig from a JSON file (the measured search writes these); a key given twice is
    refused (checks.json_text)."""
    data = checks.json_text(checks.text_file(path, "config"), f"config: {path}")
    if not isinstance(data, dict):
        raise UserError(f"config: {path} must hold a JSON object of fields")
    return make_config(**data)


def make_config(**fields: object) -> TrainConfig:
    try:
        return TrainConfig(**fields).checked()
    except ValidationError as exc:
        raise UserError(pydantic_message(exc)) from None


def config_from_search_row(
    row: Mapping[str, Any], model: str | ModelSpec, *, seq_len: int, gbs: int, **overrides: object
) -> TrainConfig:
    """The trainer configuration for one row of the search's results (every layout
    dimension), so the measured search can launch any ranked candidate. `overrides` (steps,
    layers, device, ...) win."""
    fields: dict[str, object] = {
        "model": model,
        "seq_len": seq_len,
        "gbs": gbs,
        **layout.plain(row),
    }
    fields.update(overrides)
    return make_config(**fields)


def task_fields(task: TaskSpec, doc_lengths: str | None = None) -> dict[str, object]:
    """The trainer fields of a search's task (spec.task.TaskSpec) and documents (the
    --doc-lengths value), as overrides of `config_from_search_row`: a lora search's layouts
    then train lora."""
    fields: dict[str, object] = {"task": task.task.value}
    if task.adapters:
        fields.update(lora_rank=task.lora_rank, lora_targets=task.lora_targets.value)
    if doc_lengths is not None:
        fields["doc_lengths"] = str(doc_lengths)
    return fields
