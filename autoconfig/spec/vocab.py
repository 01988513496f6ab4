"""The project's closed vocabularies as enums: every allowed value is declared here once, so
messages can list them and the cost model compares codes, not bare numbers."""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError

from autoconfig.base.checks import shown
from autoconfig.base.errors import UserError

GIB = float(2**30)
"""All "GB" figures in autoconfig are GiB (2^30 bytes), the unit PyTorch and nvidia-smi report."""


# Yes or no, however a CSV cell, a --fix value or a YAML entry spells it: pydantic's reading
# (true/false, yes/no, y/n, on/off, t/f, 1/0, any case), so every reader accepts the same words.
_BOOLEAN = TypeAdapter(bool)
BOOLEAN_WORDS = "true or false (yes/no, y/n, on/off, t/f, 1/0)"


def boolean_or_none(value: object) -> bool | None:
    """`value` as a bool, or None when it is no yes-or-no word."""
    if isinstance(value, str):
        value = value.strip()
    try:
        return _BOOLEAN.validate_python(value)
    except ValidationError:
        return None


def boolean(value: object, field: str) -> bool:
    """`value` as a bool, or a UserError naming the field and the words allowed."""
    parsed = boolean_or_none(value)
    if parsed is None:
        raise UserError(f"{field}: must be {BOOLEAN_WORDS} (got {shown(value)})")
    return parsed


_C = TypeVar("_C", bound="Choice")  # parse returns a member of the class it is called on


class Choice(str, Enum):
    """A text choice: compares and prints as its value."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def allowed(cls) -> str:
        """The values for a message: 'a, b or c'."""
        names = cls.values()
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]

    @classmethod
    def parse(cls: type[_C], text: object, field: str) -> _C:
        """The member named by `text` (case and spaces ignored), or a UserError naming the
        field and the allowed values."""
        key = str(text).strip().lower()
        for member in cls:
            if member.value == key:
                return member
        raise UserError(f"{field}: must be {cls.allowed()} (got '{text}')")


class Recompute(Choice):
    """Activation recomputation. selective = Megatron-LM's (the attention core is recomputed;
    Korthikanti et al. 2022, Sec. 5); op = torchtitan's op-level selective checkpointing
    (every other matmul output kept); full = whole layers (all, or the first k of a stage)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    OP = "op"

    @property
    def code(self) -> int:
        """The number the cost model's columns hold."""
        return _RECOMPUTE_CODES[self]


_RECOMPUTE_CODES = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2, Recompute.OP: 3}


class Task(Choice):
    """What a training run trains: pretrain and sft (full fine-tuning) train every weight and
    cost the same (the data differs); lora trains low-rank adapters on frozen 16-bit base
    weights (Hu et al. 2021, "LoRA"); qlora the same on 4-bit NF4 base weights (Dettmers et al.
    2023, "QLoRA")."""

    PRETRAIN = "pretrain"
    SFT = "sft"
    LORA = "lora"
    QLORA = "qlora"

    @property
    def code(self) -> int:
        """The number the cost model's `task` column holds."""
        return _TASK_CODES[self]

    @property
    def adapters(self) -> bool:
        """Whether the run trains adapters on a frozen base."""
        return self in (Task.LORA, Task.QLORA)


_TASK_CODES = {Task.PRETRAIN: 0, Task.SFT: 1, Task.LORA: 2, Task.QLORA: 3}


class LoraTargets(Choice):
    """The linear layers that carry adapters: qkv (the query, key and value projections),
    attention (those and the output projection), all (every linear layer of a transformer
    layer: attention, MLP and Mamba projections; not the LM head, the router or routed
    experts)."""

    QKV = "qkv"
    ATTENTION = "attention"
    ALL = "all"

    @property
    def code(self) -> int:
        """The number the cost model's `lora_targets` column holds."""
        return _TARGET_CODES[self]


_TARGET_CODES = {LoraTargets.QKV: 1, LoraTargets.ATTENTION: 2, LoraTargets.ALL: 3}


class OptimizerState(Choice):
    """The precision of the Adam state (cost.optimizer holds the bytes each keeps): fp32 main
    parameters and moments (every framework's default); bf16 moments; fp8 first moment with a
    bf16 second moment (the second moment's range needs more than fp8's: Peng et al. 2023,
    "FP8-LM", Sec. 3.2, keeps it in 16 bits). Megatron-Core's --use-precision-aware-optimizer
    (Transformer Engine's FusedAdam) and torchtitan's fused_opt_states_bf16 run the lighter
    ones; each framework profile says which it runs (`can: optimizer_states`)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP8 = "fp8"

    @property
    def code(self) -> int:
        """The number the cost model's `optimizer_state` column holds."""
        return _STATE_CODES[self]


_STATE_CODES = {OptimizerState.FP32: 0, OptimizerState.BF16: 1, OptimizerState.FP8: 2}


class Offload(Choice):
    """What a training run keeps in host memory instead of GPU memory (cost.offload holds the
    bytes and the seconds): nothing; the optimizer (fp32 main parameters and Adam moments, the
    Adam step run on the CPU: Megatron-Core's --optimizer-cpu-offload, DeepSpeed's
    zero_optimization.offload_optimizer); or the optimizer with the sharded parameters and
    gradients (FSDP2's CPUOffloadPolicy, torchtitan's enable_cpu_offload, torchtune's
    fsdp_cpu_offload; DeepSpeed ZeRO-3's offload_param beside offload_optimizer). Each
    framework profile says which it runs (`can: offloads`)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    PARAMS = "optimizer+params"

    @property
    def code(self) -> int:
        """The number the cost model's `offload` column holds."""
        return _OFFLOAD_CODES[self]


_OFFLOAD_CODES = {Offload.NONE: 0, Offload.OPTIMIZER: 1, Offload.PARAMS: 2}


class ZeroStage(IntEnum):
    """What data-parallel ranks shard (Rajbhandari et al. 2020, "ZeRO", Sec. 5): 1 = the
    optimizer states (Megatron's distributed optimizer), 2 = + gradients, 3 = + weights (FSDP
    full shard)."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    WEIGHTS = 3

    @classmethod
    def allowed(cls) -> str:
        return "0, 1, 2 or 3"


class Precision(Choice):
    """Training precision: the GEMM format (weights' master copies stay fp32). fp8 is per-tensor
    scaled (delayed or current scaling), mxfp8 block-scaled 8-bit and nvfp4 block-scaled 4-bit
    (Blackwell; Transformer Engine recipes MXFP8BlockScaling, NVFP4BlockScaling)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class ServePrecision(Choice):
    """Serving weight format (int8/int4 = weight-only; nvfp4 = block-scaled 4-bit weights and
    activations on Blackwell; fp32 = the bundled model on CPU)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    INT8 = "int8"
    INT4 = "int4"
    FP32 = "fp32"

    @property
    def bytes(self) -> float:
        return _SERVE_BYTES[self.value]


class KvPrecision(Choice):
    """K/V-cache element format; auto = the weights' 16-bit type (fp32 with fp32 weights)."""

    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    FP32 = "fp32"

    def resolve(self, weights: ServePrecision) -> KvPrecision:
        if self is not KvPrecision.AUTO:
            return self
        same = {"bf16": KvPrecision.BF16, "fp32": KvPrecision.FP32}
        return same.get(weights.value, KvPrecision.FP16)

    @property
    def bytes(self) -> float:
        return _SERVE_BYTES[self.value]


# nvfp4: 4-bit values plus one fp8 scale per 16 (NVIDIA, "Introducing NVFP4", 2025).
_SERVE_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "nvfp4": 0.5 + 1.0 / 16,
    "int8": 1.0,
    "int4": 0.5,
    "fp32": 4.0,
}


class Norm(Choice):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class Mlp(Choice):
    GELU = "gelu"
    SWIGLU = "swiglu"
    SQUARED_RELU = "squared_relu"

    @property
    def code(self) -> int:
        return _MLP_CODES[self]


_MLP_CODES = {Mlp.GELU: 0, Mlp.SWIGLU: 1, Mlp.SQUARED_RELU: 2}


class Position(Choice):
    LEARNED = "learned"
    ROPE = "rope"
    ALIBI = "alibi"
    NONE = "none"


class PipelineSplit(Choice):
    """How a framework cuts its pipeline:
    - even: layers/pp per stage, the last stage short of the remainder when pp does not divide
      them (Megatron's --decoder-last-pipeline-num-layers), the embedding and the LM head on
      top of the first and the last;
    - ends_as_layers: the embedding and the LM head each counted as one layer in that split
      (Megatron's --account-for-embedding/loss-in-pipeline-split, torchtitan's
      pipeline_parallel_first/last_stage_less_layers);
    - balanced: whole layers placed by hand against what the embedding and head cost (an
      explicit pipeline layout);
    - compute_cost: blocks placed in order by the framework's own cost estimate (nanotron)."""

    EVEN = "even"
    ENDS_AS_LAYERS = "ends_as_layers"
    BALANCED = "balanced"
    COMPUTE_COST = "compute_cost"


class Framework(Choice):
    """Training frameworks autoconfig models (profiles/frameworks/) and writes settings for."""

    MEGATRON = "megatron"
    NEMO = "nemo"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"
    NANOTRON = "nanotron"
    COMPOSER = "composer"
    TORCHTUNE = "torchtune"
    PRIMUS = "primus"  # Megatron-LM on ROCm: its settings are Megatron's (report.primus_export)


class FailureClass(Choice):
    """How a measured trial ended. `counted` classes used a run and count toward --trials."""

    OK = "ok"  # measured
    OOM = "oom"  # ran out of memory (the cost model's fits verdict was wrong)
    TIMEOUT = "timeout"  # killed at the trial time limit
    CRASH = "crash"  # exited without a result; the log tail says why
    LAUNCH = "launch"  # the scheduler or launcher refused the job
    INVALID = "invalid"  # the trainer cannot run the layout: never launched
    INTERRUPTED = "interrupted"  # the search stopped while it ran; re-run once on --resume

    @property
    def counted(self) -> bool:
        return self in _COUNTED

    @property
    def failed(self) -> bool:
        return self is not FailureClass.OK


_COUNTED = {
    FailureClass.OK,
    FailureClass.OOM,
    FailureClass.TIMEOUT,
    FailureClass.CRASH,
    FailureClass.LAUNCH,
}


class Sampler(Choice):
    """How a measured search picks the next layout after the analytical top-k."""

    MODEL = "model"  # the best prediction, corrected by what was measured nearby
    TPE = "tpe"
    GP = "gp"
    GRID = "grid"  # nested-loop order, the baseline of NeMo-style sweeps
    RANDOM = "random"


class Executor(Choice):
    LOCAL = "local"
    SLURM = "slurm"
    RAY = "ray"  # a placement group per trial on a Ray cluster (the `ray` extra)


class Device(Choice):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class Objective(Choice):
    """What the serving search ranks by."""

    THROUGHPUT = "throughput"
    LATENCY = "latency"


class Batching(Choice):
    """How a serving engine batches requests: `static` batches run to completion together;
    `continuous` (in-flight, iteration-level) batches admit and retire requests every
    iteration (Yu et al. 2022, "Orca"), as vLLM, SGLang and TensorRT-LLM do."""

    CONTINUOUS = "continuous"
    STATIC = "static"

    @classmethod
    def parse(cls, text: object, field: str) -> Batching:
        # TensorRT-LLM calls continuous batching "in-flight batching".
        if str(text).strip().lower() in ("inflight", "in-flight"):
            return cls.CONTINUOUS
        return super().parse(text, field)  # type: ignore[return-value]


class Engine(Choice):
    """Serving engines whose launch flags `infer --emit` writes."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Arrival(Choice):
    """How requests arrive: a Poisson process at the request rate, all at once (an offline
    benchmark at maximum load), or at the times of a given trace."""

    POISSON = "poisson"
    BURST = "burst"
    TRACE = "trace"
