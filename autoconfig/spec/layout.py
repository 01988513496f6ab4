"""The parallel layout: every dimension is declared once in DIMENSIONS (type, default, label,
trial-key part, search values, framework flags). `Layout`, the search space's fields, `--fix`,
labels, trial keys, cost-model columns, the trainer's configuration and the exporters all derive
from that declaration, and the rules that make a layout impossible are stated here once.

Adding a dimension is one `Dimension(...)` entry below plus its physics in `cost/`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, create_model

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.spec.vocab import (
    Choice,
    Framework,
    Offload,
    OptimizerState,
    Recompute,
    ZeroStage,
    boolean,
)

MEGATRON, NEMO, TORCHTITAN = Framework.MEGATRON, Framework.NEMO, Framework.TORCHTITAN
DEEPSPEED, NANOTRON, COMPOSER = Framework.DEEPSPEED, Framework.NANOTRON, Framework.COMPOSER
TORCHTUNE = Framework.TORCHTUNE
ANY = "*"

FlagSpec = str | tuple[str, ...] | Mapping[object, "str | tuple[str, ...]"]
"""How one dimension is written for a framework: a template for every value, or templates by
value (ANY for the rest). A value the mapping lacks is a layout the framework cannot run. The
templates are formatted with the export context (the layout, the run, derived values); a
template naming a value that is None there is left out (e.g. the uneven last-stage flag on an
even split)."""


@dataclass(frozen=True)
class Dimension:
    """One layout dimension."""

    name: str
    type: type
    default: Any
    help: str
    label: str = ""  # e.g. "tp{}": its part of the compact layout name ('' = a column of its own)
    always_labelled: bool = False  # in the name even at its default value
    searched: tuple | None = None  # default values the search tries (None: derived, not tried)
    flags: Mapping[Framework, FlagSpec] = field(default_factory=dict)
    minimum: int | None = 1  # for integers
    key: str = ""  # its part of the trial key, e.g. "z{}" ('' = name{})
    structural: bool = False  # shapes the rank grid (the search filters these first)
    # in trial keys at its default too; False for dimensions added after measured studies
    # were stored, whose keys (and resumable studies) stay as they were
    keyed_at_default: bool = True

    def key_part(self, value: Any) -> str:
        plain = self.plain(value)
        return (self.key or f"{self.name}{{}}").format(int(plain) if self.type is bool else plain)

    def parse(self, text: object, where: str = "") -> Any:
        """A value from text or a plain value, or a UserError naming the dimension."""
        name = f"{where}{self.name}"
        if isinstance(text, list | tuple | dict | set):  # YAML can nest; a value cannot
            raise UserError(f"{name}: must be a single value (got a {type(text).__name__})")
        # One reading of each kind wherever the text comes from (--fix, YAML, CSV rows):
        # integers by checks.integer, yes-or-no by vocab.boolean, choices by their enum.
        if self.type is int:  # exact, bounded, not a bool
            return checks.integer(text, name, 0 if self.minimum is None else self.minimum)
        if self.type is bool:
            return boolean(text, name)
        if self.type is ZeroStage:  # an integer that names a stage
            try:
                return ZeroStage(checks.integer(text, name, min(ZeroStage), max(ZeroStage)))
            except UserError:
                got = checks.shown(text)
                raise UserError(f"{name}: must be {ZeroStage.allowed()} (got {got})") from None
        if isinstance(text, self.type):
            return text
        return self.type.parse(text, name)

    def plain(self, value: Any) -> Any:
        """The value as plain Python (what CSV files, JSON and Optuna hold)."""
        if self.type is bool:
            return bool(value)
        if issubclass(self.type, Choice):
            return str(self.type(value).value)
        return int(value)

    def code(self, values: pd.Series | np.ndarray | Any) -> np.ndarray:
        """The cost model's numeric column for this dimension."""
        if self.type in (Recompute, OptimizerState, Offload):
            codes = {m.value: float(m.code) for m in self.type}
            return np.asarray(pd.Series(values, dtype=object).astype(str).map(codes), float)
        return np.asarray(values, dtype=float)


# The Adam state's precision (vocab.OptimizerState, bytes in cost.optimizer). Not crossed with
# the other dimensions: the search gives each layout the heaviest state its framework runs that
# fits (layout_search.run), so a layout that fits with fp32 state keeps it.
# Megatron-Core 0.16.1 OptimizerConfig (use_precision_aware_optimizer, exp_avg_dtype,
# exp_avg_sq_dtype, main_params_dtype; Megatron-LM maps 'fp8' to torch.uint8, Transformer
# Engine's FusedAdam fp8 state); NeMo 2 and Megatron-Bridge recipes hold the same
# OptimizerConfig as recipe.optim.config; torchtitan 0.3.0 [optimizer] implementation.
_PRECISION_AWARE = ("--use-precision-aware-optimizer", "--main-params-dtype fp32")
_NEMO_OPTIM = "recipe.optim.config."


# CPU offload (vocab.Offload, physics in cost.offload). Not crossed with the other dimensions
# either: the search gives a layout offload only where nothing lighter fits (layout_search.run).
# Megatron-Core 0.16.1 OptimizerConfig: optimizer_cpu_offload, optimizer_offload_fraction,
# overlap_cpu_optimizer_d2h_h2d (HybridDeviceOptimizer); the offload rides on the precision-
# aware optimizer's code path, which megatron/training/arguments.py asks for with it.
# DeepSpeed 0.19.8 runtime/zero/offload_config.py: zero_optimization.offload_optimizer (ZeRO
# 1-3) and offload_param (ZeRO 3 only), device cpu, pin_memory. torchtitan 0.3.0
# config/configs.py: [training] enable_cpu_offload (FSDP2 CPUOffloadPolicy: parameters,
# gradients and optimizer state).
def _off_only(*frameworks: Framework) -> dict[Framework, FlagSpec]:
    """The flags of a yes-or-no dimension for frameworks that run only its 'no' (nothing to
    write): a 'yes' is refused with the framework named (report.exports)."""
    return {fw: {False: ""} for fw in frameworks}


# Activation offload, physics in cost.activation_offload: megatron-core 0.16.1
# ModelParallelConfig cpu_offloading, cpu_offloading_num_layers (fewer than the layers:
# TransformerConfig raises otherwise, and with pipelining or recompute),
# cpu_offloading_activations (True) and cpu_offloading_weights (False), spelled as Megatron-LM's
# arguments spell them; NeMo 2 and Megatron-Bridge hold the same fields on the model config.
# torchtune 0.6.1 recipes: enable_activation_offloading (OffloadActivations, needs activation
# checkpointing).
_MEGATRON_ACT_OFFLOAD = ("--cpu-offloading", "--cpu-offloading-num-layers {offloaded_layers}")
_NEMO_ACT_OFFLOAD = (
    "recipe.model.config.cpu_offloading = True",
    "recipe.model.config.cpu_offloading_num_layers = {offloaded_layers}",
    "recipe.model.config.cpu_offloading_activations = True",
    "recipe.model.config.cpu_offloading_weights = False",
)
# Dynamic (hybrid) context parallelism, physics in cost.hybrid_cp: megatron-core 0.16.1
# ModelParallelConfig.hybrid_context_parallel and max_seqlen_per_dp_cp_rank (its docstring's
# starting point, the sequence length / cp, as the cost model assumes), spelled as Megatron-LM's
# arguments spell its config fields; only its schedule without pipelining runs it.
_MEGATRON_HYBRID_CP = (
    "--hybrid-context-parallel",
    "--max-seqlen-per-dp-cp-rank {cp_rank_tokens}",
)
_MEGATRON_OFFLOAD = (
    "--use-precision-aware-optimizer",
    "--optimizer-cpu-offload",
    "--optimizer-offload-fraction 1.0",
    "--overlap-cpu-optimizer-d2h-h2d",
)
_DS_OFFLOAD_OPTIMIZER = (
    'ds_config: zero_optimization.offload_optimizer = {{"device": "cpu", "pin_memory": true}}'
)
_DS_OFFLOAD_PARAM = (
    'ds_config: zero_optimization.offload_param = {{"device": "cpu", "pin_memory": true}}'
)
# Framework settings per dimension. Megatron-LM and Megatron-DeepSpeed take command-line flags,
# NeMo 2 recipe attributes, torchtitan TOML ("[section] key = value"), nanotron and Composer YAML
# ("section.key: value"). Sources: the frameworks' argument parsers and config classes
# (profiles/frameworks/*.yaml name the versions read).
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension(
        "dp",
        int,
        1,
        "data-parallel degree: model replicas (ZeRO shards over them)",
        label="dp{}",
        always_labelled=True,
        # Most frameworks derive it from the world size.
        flags={
            MEGATRON: "",
            NEMO: "",
            TORCHTITAN: "",
            DEEPSPEED: "",
            NANOTRON: "parallelism.dp: {dp}",
            COMPOSER: "",
            TORCHTUNE: "",
        },
    ),
    Dimension(
        "tp",
        int,
        1,
        "tensor-parallel degree",
        label="tp{}",
        always_labelled=True,
        searched=(1, 2, 4, 8),
        structural=True,
        flags={
            MEGATRON: "--tensor-model-parallel-size {tp}",
            NEMO: "recipe.trainer.strategy.tensor_model_parallel_size = {tp}",
            TORCHTITAN: "tensor_parallel_degree = {tp}",
            DEEPSPEED: "--tensor-model-parallel-size {tp}",
            NANOTRON: "parallelism.tp: {tp}",
            COMPOSER: {1: "", ANY: "parallelism_config.tp.tensor_parallel_degree: {tp}"},
            TORCHTUNE: {1: ""},
        },
    ),
    Dimension(
        "pp",
        int,
        1,
        "pipeline stages",
        label="pp{}",
        always_labelled=True,
        searched=(1, 2, 4, 8, 16),
        structural=True,
        flags={
            MEGATRON: (
                "--pipeline-model-parallel-size {pp}",
                "--decoder-last-pipeline-num-layers {uneven_last_stage_layers}",
                # an interleaved split counting the embedding and loss as layers (exports)
                '--pipeline-model-parallel-layout "{megatron_pipeline_layout}"',
            ),
            NEMO: (
                "recipe.trainer.strategy.pipeline_model_parallel_size = {pp}",
                "recipe.model.config.num_layers_in_last_pipeline_stage = "
                "{uneven_last_stage_layers}",
                # some recipes count the embedding and loss as layers (Llama 3.1 405B): the
                # prediction is for the even split (False), unless only counting them lets the
                # layout interleave (True)
                "recipe.trainer.strategy.account_for_embedding_in_pipeline_split = "
                "{nemo_ends_as_layers}",
                "recipe.trainer.strategy.account_for_loss_in_pipeline_split = "
                "{nemo_ends_as_layers}",
            ),
            TORCHTITAN: (
                "pipeline_parallel_degree = {pp}",
                'pipeline_parallel_schedule = "{pipeline_schedule}"',
                "pipeline_parallel_microbatch_size = {pipeline_microbatch}",
            ),
            DEEPSPEED: "--pipeline-model-parallel-size {pp}",
            NANOTRON: ("parallelism.pp: {pp}", "parallelism.pp_engine: 1f1b"),
            COMPOSER: {1: ""},
            TORCHTUNE: {1: ""},
        },
    ),
    Dimension(
        "vp",
        int,
        1,
        "virtual pipeline stages per rank (interleaved 1F1B)",
        label="vp{}",
        searched=(1, 2),
        structural=True,
        flags={
            MEGATRON: {
                1: "",
                ANY: "--num-layers-per-virtual-pipeline-stage {layers_per_virtual_stage}",
            },
            NEMO: {
                1: "recipe.trainer.strategy.virtual_pipeline_model_parallel_size = None",
                ANY: "recipe.trainer.strategy.virtual_pipeline_model_parallel_size = {vp}",
            },
            # the interleaved schedule is named with pp (pipeline_schedule); its stages by
            # their size (frameworks.layers_per_stage)
            TORCHTITAN: {1: "", ANY: "pipeline_parallel_layers_per_stage = {layers_per_stage}"},
            DEEPSPEED: {1: ""},
            NANOTRON: {1: ""},
            COMPOSER: {1: ""},
            TORCHTUNE: {1: ""},
        },
    ),
    Dimension(
        "cp",
        int,
        1,
        "context-parallel degree (the sequence split over ranks)",
        label="cp{}",
        searched=(1,),
        structural=True,
        flags={
            MEGATRON: "--context-parallel-size {cp}",
            NEMO: "recipe.trainer.strategy.context_parallel_size = {cp}",
            TORCHTITAN: "context_parallel_degree = {cp}",
            DEEPSPEED: {1: ""},
            NANOTRON: {1: ""},
            COMPOSER: {1: ""},
            TORCHTUNE: {1: ""},
        },
    ),
    Dimension(
        "ep",
        int,
        1,
        "expert-parallel degree (MoE experts split over ranks)",
        label="ep{}",
        searched=(1,),
        structural=True,
        flags={
            MEGATRON: {1: "", ANY: "--expert-model-parallel-size {ep}"},
            NEMO: "recipe.trainer.strategy.expert_model_parallel_size = {ep}",
            TORCHTITAN: "expert_parallel_degree = {ep}",
            DEEPSPEED: {1: "", ANY: "--moe-expert-parallel-size {ep}"},
            NANOTRON: {1: "", ANY: "parallelism.expert_parallel_size: {ep}"},
            COMPOSER: {1: ""},
            TORCHTUNE: {1: ""},
        },
    ),
    Dimension(
        "etp",
        int,
        1,
        "expert tensor-parallel degree: MoE experts split over this many ranks (Megatron-Core "
        "--expert-tensor-parallel-size; expert parallelism folds over tp*dp*cp)",
        label="etp{}",
        searched=(1,),
        structural=True,
        flags={
            MEGATRON: "--expert-tensor-parallel-size {megatron_etp}",  # absent: etp = tp
            NEMO: "recipe.trainer.strategy.expert_tensor_parallel_size = {etp}",
            TORCHTITAN: {1: "", ANY: "expert_tensor_parallel_degree = {etp}"},
            DEEPSPEED: {1: ""},
            NANOTRON: {1: ""},
            COMPOSER: {1: ""},
            TORCHTUNE: {1: ""},
        },
    ),
    Dimension(
        "sp",
        bool,
        False,
        "sequence parallelism (with tp > 1)",
        label="sp",
        searched=(True,),
        flags={
            # TP communication overlap needs sequence parallelism; both frameworks overlap it.
            MEGATRON: {True: ("--sequence-parallel", "--tp-comm-overlap"), False: ""},
            NEMO: {
                True: (
                    "recipe.trainer.strategy.sequence_parallel = True",
                    "recipe.comm_overlap.tp_comm_overlap = True",
                ),
                False: "recipe.trainer.strategy.sequence_parallel = False",
            },
            TORCHTITAN: "",  # torchtitan shards sequences whenever it shards tensors
            DEEPSPEED: {True: "--sequence-parallel", False: ""},
            NANOTRON: {
                True: "parallelism.tp_mode: REDUCE_SCATTER",
                False: "parallelism.tp_mode: ALL_REDUCE",
            },
            COMPOSER: {False: ""},
            TORCHTUNE: {False: ""},
        },
    ),
    Dimension(
        "mbs",
        int,
        1,
        "micro-batch size in sequences",
        searched=(1, 2, 4),
        flags={
            MEGATRON: "--micro-batch-size {mbs}",
            NEMO: "recipe.data.micro_batch_size = {mbs}",
            TORCHTITAN: "",  # written with pp (pipeline_microbatch) and the local batch
            DEEPSPEED: "--micro-batch-size {mbs}",
            NANOTRON: "tokens.micro_batch_size: {mbs}",
            COMPOSER: "device_train_microbatch_size: {mbs}",
            TORCHTUNE: "",
        },
    ),
    Dimension(
        "recompute",
        Recompute,
        Recompute.NONE,
        "activation recomputation: none, selective, full (on recompute_layers per stage), op",
        searched=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL),
        key="{}",
        flags={
            MEGATRON: {
                "none": "",
                "selective": "--recompute-granularity selective",
                "full": (
                    "--recompute-granularity full",
                    "--recompute-method block",
                    "--recompute-num-layers {recompute_layers_per_chunk}",
                ),
            },
            NEMO: {
                "none": "",
                "selective": 'recipe.model.config.recompute_granularity = "selective"',
                "full": (
                    'recipe.model.config.recompute_granularity = "full"',
                    'recipe.model.config.recompute_method = "block"',
                    "recipe.model.config.recompute_num_layers = {recompute_layers_per_chunk}",
                ),
            },
            TORCHTITAN: {
                "none": '[activation_checkpoint] mode = "none"',
                "full": '[activation_checkpoint] mode = "full"',
                "op": (
                    '[activation_checkpoint] mode = "selective"',
                    '[activation_checkpoint] selective_ac_option = "op"',
                ),
            },
            DEEPSPEED: {
                "none": "",
                "full": ("--checkpoint-activations", "--checkpoint-num-layers 1"),
            },
            NANOTRON: {
                "none": "model.recompute_layer: false",
                "full": "model.recompute_layer: true",
            },
            COMPOSER: {
                "none": "parallelism_config.fsdp.activation_checkpointing: false",
                "full": "parallelism_config.fsdp.activation_checkpointing: true",
            },
            TORCHTUNE: {
                "none": "enable_activation_checkpointing=False",
                "full": "enable_activation_checkpointing=True",
            },
        },
    ),
    Dimension(
        "recompute_layers",
        int,
        0,
        "with recompute full: layers per pipeline stage recomputed (0 = all of them); 0 otherwise",
        minimum=0,
        key="rl{}",
        # written with recompute
        flags={
            MEGATRON: "",
            NEMO: "",
            TORCHTITAN: "",
            DEEPSPEED: "",
            NANOTRON: "",
            COMPOSER: "",
            TORCHTUNE: "",
        },
    ),
    Dimension(
        "zero",
        ZeroStage,
        ZeroStage.OPTIMIZER,
        "ZeRO stage: 0 none, 1 distributed optimizer, 2 + gradients, 3 + weights (FSDP)",
        searched=tuple(ZeroStage),
        minimum=None,
        key="z{}",
        flags={
            MEGATRON: {
                0: "--overlap-grad-reduce",
                1: (
                    "--use-distributed-optimizer",
                    "--overlap-grad-reduce",
                    "--overlap-param-gather",
                ),
                3: "--use-torch-fsdp2",
            },
            NEMO: {
                0: "recipe.trainer.strategy.ddp.use_distributed_optimizer = False",
                1: "recipe.trainer.strategy.ddp.use_distributed_optimizer = True",
                3: (
                    "recipe.trainer.strategy.ddp.use_megatron_fsdp = True",
                    "recipe.trainer.strategy.ddp.data_parallel_sharding_strategy = "
                    '"optim_grads_params"',
                ),
            },
            TORCHTITAN: {
                0: ("data_parallel_replicate_degree = {dp}", "data_parallel_shard_degree = 1"),
                2: (
                    "data_parallel_shard_degree = {dp}",
                    'fsdp_reshard_after_forward = "never"',
                ),
                3: ("data_parallel_shard_degree = {dp}", 'fsdp_reshard_after_forward = "default"'),
            },
            DEEPSPEED: "--zero-stage {zero}",
            NANOTRON: "optimizer.zero_stage: {zero}",
            COMPOSER: {
                0: "parallelism_config.fsdp.sharding_strategy: NO_SHARD",
                2: "parallelism_config.fsdp.sharding_strategy: SHARD_GRAD_OP",
                3: "parallelism_config.fsdp.sharding_strategy: FULL_SHARD",
            },
            TORCHTUNE: {
                0: "",
                2: "fsdp_reshard_after_forward=False",
                3: "fsdp_reshard_after_forward=True",
            },
        },
    ),
    Dimension(
        "optimizer_state",
        OptimizerState,
        OptimizerState.FP32,
        "Adam state precision: fp32 (main params and moments), bf16 (bf16 moments), fp8 (fp8 "
        "first and bf16 second moment); main params stay fp32",
        label="adam-{}",
        key="os{}",
        flags={
            MEGATRON: {
                "fp32": "",
                "bf16": (*_PRECISION_AWARE, "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"),
                "fp8": (*_PRECISION_AWARE, "--exp-avg-dtype fp8", "--exp-avg-sq-dtype bf16"),
            },
            NEMO: {
                "fp32": "",
                "bf16": (
                    f"{_NEMO_OPTIM}use_precision_aware_optimizer = True",
                    f"{_NEMO_OPTIM}main_params_dtype = torch.float32",
                    f"{_NEMO_OPTIM}exp_avg_dtype = torch.bfloat16",
                    f"{_NEMO_OPTIM}exp_avg_sq_dtype = torch.bfloat16",
                ),
                "fp8": (
                    f"{_NEMO_OPTIM}use_precision_aware_optimizer = True",
                    f"{_NEMO_OPTIM}main_params_dtype = torch.float32",
                    f"{_NEMO_OPTIM}exp_avg_dtype = torch.uint8",
                    f"{_NEMO_OPTIM}exp_avg_sq_dtype = torch.bfloat16",
                ),
            },
            TORCHTITAN: {
                "fp32": "",
                "bf16": '[optimizer] implementation = "fused_opt_states_bf16"',
            },
            DEEPSPEED: {"fp32": ""},
            NANOTRON: {"fp32": ""},
            COMPOSER: {"fp32": ""},
            TORCHTUNE: {"fp32": "", "bf16": ""},
        },
    ),
    Dimension(
        "offload",
        Offload,
        Offload.NONE,
        "CPU offload: none, optimizer (fp32 main params and Adam moments in host memory, the "
        "Adam step on the CPU), optimizer+params (also the sharded weights and gradients: FSDP "
        "CPU offload, ZeRO-3 offload_param)",
        label="offload-{}",
        key="off{}",
        flags={
            MEGATRON: {"none": "", "optimizer": _MEGATRON_OFFLOAD},
            NEMO: {
                "none": "",
                "optimizer": (
                    f"{_NEMO_OPTIM}use_precision_aware_optimizer = True",
                    f"{_NEMO_OPTIM}optimizer_cpu_offload = True",
                    f"{_NEMO_OPTIM}optimizer_offload_fraction = 1.0",
                    f"{_NEMO_OPTIM}overlap_cpu_optimizer_d2h_h2d = True",
                ),
            },
            TORCHTITAN: {
                "none": "",
                "optimizer+params": "[training] enable_cpu_offload = true",
            },
            DEEPSPEED: {
                "none": "",
                "optimizer": _DS_OFFLOAD_OPTIMIZER,
                "optimizer+params": (_DS_OFFLOAD_OPTIMIZER, _DS_OFFLOAD_PARAM),
            },
            NANOTRON: {"none": ""},
            COMPOSER: {"none": ""},
            TORCHTUNE: {
                "none": "fsdp_cpu_offload=False",
                "optimizer+params": "fsdp_cpu_offload=True",
            },
        },
    ),
    Dimension(
        "activation_offload",
        bool,
        False,
        "activation offload: the activations each layer saves for backward copied to host "
        "memory in forward and back in backward, beside compute (pp 1 only)",
        label="act-off",
        key="ao{}",
        keyed_at_default=False,
        flags={
            MEGATRON: {False: "", True: _MEGATRON_ACT_OFFLOAD},
            NEMO: {False: "", True: _NEMO_ACT_OFFLOAD},
            **_off_only(TORCHTITAN, DEEPSPEED, NANOTRON, COMPOSER),
            TORCHTUNE: {
                False: "enable_activation_offloading=False",
                True: "enable_activation_offloading=True",
            },
        },
    ),
    Dimension(
        "hybrid_cp",
        bool,
        False,
        "dynamic context parallelism over packed documents: each document split over only "
        "the CP ranks its length needs (cp = the most), the rest of the dp x cp ranks taking "
        "other documents (pp 1 only)",
        label="hcp",
        key="hcp{}",
        keyed_at_default=False,
        flags={
            MEGATRON: {False: "", True: _MEGATRON_HYBRID_CP},
            **_off_only(NEMO, TORCHTITAN, DEEPSPEED, NANOTRON, COMPOSER, TORCHTUNE),
        },
    ),
)

BY_NAME: dict[str, Dimension] = {d.name: d for d in DIMENSIONS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
SEARCHED: tuple[Dimension, ...] = tuple(d for d in DIMENSIONS if d.searched is not None)
NUMERIC: tuple[str, ...] = tuple(
    d.name for d in DIMENSIONS if d.type is not bool and not issubclass(d.type, Choice)
)


def _field(d: Dimension) -> tuple[type, Any]:
    bounds = {"ge": d.minimum} if d.type is int and d.minimum is not None else {}
    return d.type, Field(default=d.default, description=d.help, **bounds)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Layout = create_model(  # type: ignore[call-overload]
    "Layout",
    __base__=_Frozen,
    __doc__="One parallel layout: a value for every dimension in DIMENSIONS.",
    **{d.name: _field(d) for d in DIMENSIONS},
)


def plain(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every dimension of a row or mapping as plain Python values."""
    return {d.name: d.plain(values[d.name]) for d in DIMENSIONS}


def parse_fix(items: list[str] | None, where: str = "fix") -> dict[str, Any]:
    """`--fix tp=8,pp=8 --fix zero=1` as typed values; one line naming what is wrong."""
    out: dict[str, Any] = {}
    for item in items or []:
        for part in (p.strip() for p in str(item).split(",")):
            if not part:
                raise UserError(f"{where}: empty item in '{item}' (expected dimension=value,...)")
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or not key or not value.strip():
                raise UserError(f"{where}: expected dimension=value (got '{part}')")
            if key not in BY_NAME:
                raise UserError(f"{where}: unknown dimension '{key}' (allowed: {', '.join(NAMES)})")
            if key in out:
                raise UserError(f"{where}: dimension '{key}' given twice (give each once)")
            out[key] = BY_NAME[key].parse(value, f"{where}: ")
    return out


# -- names -------------------------------------------------------------------------------------


def labels(frame: pd.DataFrame) -> pd.Series:
    """Compact layout names, e.g. 'dp16 tp8 pp8 vp2 sp', for every row at once: the labelled
    dimensions, each when it is always shown or differs from its default."""
    out = pd.Series("", index=frame.index, dtype=object)
    for d in DIMENSIONS:
        if not d.label:
            continue
        values = frame[d.name]
        if d.type is bool:
            text = pd.Series(d.label, index=frame.index, dtype=object)
            shown = values.astype(bool).to_numpy()
        elif issubclass(d.type, Choice):
            words = values.astype(str)
            text = d.label.replace("{}", "") + words
            shown = (words != str(d.default)).to_numpy()
        else:
            text = d.label.replace("{}", "") + values.astype(int).astype(str)
            shown = (values.astype(int) != int(d.default)).to_numpy()
        if d.always_labelled:
            shown = np.ones(len(frame), bool)
        out = out.where(~shown, out + " " + text)
    return out.str.strip()


def label(row: Mapping[str, Any]) -> str:
    """Compact layout name of one row."""
    return labels(pd.DataFrame([{d.name: row[d.name] for d in DIMENSIONS}])).iloc[0]


def recompute_label(row: Mapping[str, Any]) -> str:
    if str(row["recompute"]) != Recompute.FULL.value:
        return str(Recompute(str(row["recompute"])).value)
    return f"full {int(row['recompute_layers'])}/stage"


def full_label(row: Mapping[str, Any]) -> str:
    """Every dimension in words: the structure, micro-batch, recompute and ZeRO stage."""
    return f"{label(row)} mbs{int(row['mbs'])} {recompute_label(row)} z{int(row['zero'])}"


def key(values: Mapping[str, Any]) -> str:
    """A layout's stable name across sessions (trial keys), every dimension in order."""
    return "-".join(
        d.key_part(values[d.name])
        for d in DIMENSIONS
        if d.keyed_at_default or d.plain(values[d.name]) != d.plain(d.default)
    )


def columns(layouts: pd.DataFrame | Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The cost model's layout columns (one float array per dimension)."""
    return {d.name: d.code(layouts[d.name]) for d in DIMENSIONS}


def frame_of(rows: list[Mapping[str, Any]] | Mapping[str, Any]) -> pd.DataFrame:
    """Layouts as a table with one typed column per dimension (plain values)."""
    rows = [rows] if isinstance(rows, Mapping) else rows
    return pd.DataFrame([plain(r) for r in rows], columns=list(NAMES))


# -- the rules that make a layout impossible ----------------------------------------------------


def rules(c: Mapping[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """(dimension, rule, mask of rows breaking it) for layouts in columns `c`: the layout
    dimensions plus the model's heads, kv_heads, layers and experts, the run's num_gpus, gbs
    and seq. Vectorized: every entry of `c` may be a scalar or an array."""
    tp, pp, vp, cp, ep, dp = (np.asarray(c[k], float) for k in ("tp", "pp", "vp", "cp", "ep", "dp"))
    etp = np.asarray(c["etp"], float)
    heads, kv, layers = (np.asarray(c[k], float) for k in ("heads", "kv_heads", "layers"))
    experts, gbs, mbs = (np.asarray(c[k], float) for k in ("experts", "gbs", "mbs"))
    seq, gpus = np.asarray(c["seq"], float), np.asarray(c["num_gpus"], float)
    sp, recompute = np.asarray(c["sp"], float), np.asarray(c["recompute"], float)
    rlayers = np.asarray(c["recompute_layers"], float)
    hybrid = np.asarray(c.get("hybrid_cp", 0.0), float) > 0
    with np.errstate(all="ignore"):
        return [
            (
                "tp",
                "must divide heads, and divide kv_heads or be a multiple of them",
                (heads % tp != 0) | ((kv % tp != 0) & (tp % kv != 0)),
            ),
            ("dp", "tp*pp*cp must divide the GPU count", (dp != np.round(dp)) | (dp < 1)),
            ("dp", "tp*pp*cp*dp must equal the GPU count", dp * tp * pp * cp != gpus),
            ("pp", "cannot exceed layers", pp > layers),
            ("vp", "virtual stages need pp > 1", (vp > 1) & (pp == 1)),
            (
                "activation_offload",
                "activation offload runs without pipeline parallelism (Megatron-Core raises "
                "with it; torchtune has none)",
                (np.asarray(c.get("activation_offload", 0.0), float) > 0) & (pp > 1),
            ),
            (
                "hybrid_cp",
                "dynamic context parallelism needs cp > 1 and pp 1 (Megatron-Core runs it "
                "only in its schedule without pipelining)",
                hybrid & ((cp == 1) | (pp > 1)),
            ),
            (
                "hybrid_cp",
                "dynamic context parallelism is modelled with ZeRO 0 or 1 (each document's own "
                "pass would reduce-scatter ZeRO 2's gradients or gather ZeRO 3's weights again)",
                hybrid & (np.asarray(c["zero"], float) >= 2),
            ),
            (
                "hybrid_cp",
                "dynamic context parallelism needs cp a power of two and dp*cp even (Megatron-"
                "Core builds its groups of 2, 4, 8 ... ranks over dp x cp and asserts an even "
                "count: parallel_state.py)",
                hybrid & ((np.log2(np.maximum(cp, 1.0)) % 1 != 0) | ((dp * cp) % 2 != 0)),
            ),
            (
                "hybrid_cp",
                "dynamic context parallelism runs each document as a micro-batch of one "
                "sequence: mbs 1 (utils.py get_batch_on_this_hybrid_cp_rank)",
                hybrid & (np.asarray(c["mbs"], float) != 1),
            ),
            (
                "hybrid_cp",
                "dynamic context parallelism is not modelled with expert parallelism (its ranks "
                "run different numbers of document passes; the experts' all-to-all needs every "
                "rank of dp x cp) nor with activation offload",
                hybrid & ((ep > 1) | (np.asarray(c.get("activation_offload", 0.0), float) > 0)),
            ),
            (
                "cp",
                "2*cp must divide seq_len (load-balanced chunks)",
                (cp > 1) & (seq % (2 * cp) != 0),
            ),
            ("ep", "expert parallelism needs an MoE model", (ep > 1) & (experts == 0)),
            ("ep", "must divide num_experts", (experts > 0) & (experts % ep != 0)),
            ("etp", "expert tensor parallelism needs an MoE model", (etp > 1) & (experts == 0)),
            # MoE parallel folding (Liu et al. 2025, Megatron-Core): the expert grid etp x ep x
            # expert-dp re-partitions the same tp*dp*cp ranks as the attention grid.
            ("ep", "ep*etp must divide tp*dp*cp", (tp * dp * cp) % (ep * etp) != 0),
            ("gbs", "must be divisible by dp*mbs", gbs % (dp * mbs) != 0),
            ("sp", "sequence parallelism needs tp > 1", (sp > 0) & (tp == 1)),
            (
                "recompute_layers",
                "only meaningful with recompute full",
                (recompute != Recompute.FULL.code) & (rlayers > 0),
            ),
        ]


def first_broken(c: Mapping[str, Any]) -> str:
    """The first rule a single layout breaks, as 'dimension: rule', or ''."""
    for name, rule, bad in rules(c):
        if np.any(bad):
            return f"{name}: {rule}"
    return ""
