"""The training task of a run (pretrain, sft, lora, qlora) with its adapter settings, checked
once for every entry point: the API, the commands and a --runs table's cells."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.spec.documents import DocLengths
from autoconfig.spec.schema import FrameworkSpec, ModelSpec
from autoconfig.spec.vocab import LoraTargets, Precision, Task

# Hu et al. 2021 ran ranks 1-64; 16 is the rank NeMo AutoModel's and Megatron-Bridge's LoRA
# recipes default to, and the middle of what torchtune's recipes use (8 for Llama 3 8B, 16 for
# 70B and 405B).
DEFAULT_LORA_RANK = 16
DEFAULT_LORA_TARGETS = LoraTargets.ALL


@dataclass(frozen=True)
class TaskSpec:
    """A run's task and, for lora and qlora, the adapters' rank and the layers they target."""

    task: Task = Task.PRETRAIN
    lora_rank: int = DEFAULT_LORA_RANK
    lora_targets: LoraTargets = DEFAULT_LORA_TARGETS
    # The documents the sequences hold, resolved at the run's sequence length
    # (spec.documents.DocLengths.columns): the packed documents' E[l^2]/E[l] (0: one document a
    # sequence), the share of tokens that are not padding, and how results name them.
    doc_len: float = 0.0
    useful_share: float = 1.0
    documents: str = ""
    # Packed: the documents as (length, share of documents) classes at the sequence length
    # (DocLengths.classes), which dynamic context parallelism times one by one
    # (cost.hybrid_cp); empty for whole or padded sequences.
    doc_classes: tuple[tuple[float, float], ...] = ()

    @property
    def adapters(self) -> bool:
        return self.task.adapters

    def columns(self) -> dict[str, float]:
        """The cost model's task columns (cost.inputs: task, lora_rank, lora_targets); a task
        without adapters has rank and targets 0."""
        return {
            "task": float(self.task.code),
            "lora_rank": float(self.lora_rank) if self.adapters else 0.0,
            "lora_targets": float(self.lora_targets.code) if self.adapters else 0.0,
            "doc_len": self.doc_len,
            "useful_share": self.useful_share,
        }

    def label(self) -> str:
        """How results name the task: 'lora r16 all', or the task alone, then the documents
        where they are not whole sequences."""
        name = self.task.value
        if self.adapters:
            name = f"{name} r{self.lora_rank} {self.lora_targets.value}"
        return f"{name}, {self.documents}" if self.documents else name

    def with_documents(self, docs: DocLengths | None, seq: int, packed: bool = True) -> TaskSpec:
        """The task with `docs` resolved at `seq` tokens a sequence (None: whole sequences)."""
        if docs is None:
            return self
        cols = docs.columns(seq, packed)
        return replace(
            self,
            doc_len=cols["doc_len"],
            useful_share=cols["useful_share"],
            documents=docs.describe(seq, packed),
            doc_classes=docs.classes(seq) if packed else (),
        )


PRETRAIN = TaskSpec()


def task_spec(
    task: str | Task = Task.PRETRAIN,
    lora_rank: object = DEFAULT_LORA_RANK,
    lora_targets: str | LoraTargets = DEFAULT_LORA_TARGETS,
) -> TaskSpec:
    """The task from its three settings; bad input is one UserError line naming the field and
    what is allowed."""
    parsed = task if isinstance(task, Task) else Task.parse(task, "task")
    try:
        rank = checks.integer(lora_rank, "lora-rank")
    except UserError:
        raise UserError(
            f"lora-rank: must be a positive integer (got {checks.shown(lora_rank)})"
        ) from None
    targets = (
        lora_targets
        if isinstance(lora_targets, LoraTargets)
        else LoraTargets.parse(lora_targets, "lora-targets")
    )
    return TaskSpec(parsed, rank, targets)


def check_model(spec: TaskSpec, model: ModelSpec) -> None:
    """A target the model lacks is one UserError line: attention targets on a model without
    attention layers (a pure Mamba stack)."""
    if spec.adapters and spec.lora_targets is not LoraTargets.ALL and model.attn_layers == 0:
        raise UserError(
            f"lora-targets: {model.name} has no attention layers for '{spec.lora_targets}' "
            f"adapters; allowed: {LoraTargets.ALL.value}"
        )


def check_framework(spec: TaskSpec, framework: FrameworkSpec, precision: str) -> None:
    """A task the framework cannot run, or QLoRA at a precision other than 16-bit (its NF4
    weights are dequantized to bf16 for every GEMM: Dettmers et al. 2023, Sec. 3), is one
    UserError line naming the framework or the precision and the task."""
    tasks = framework.allows("tasks")
    if spec.task.value not in tasks:
        raise UserError(
            f"task: {framework.name} cannot run {spec.task.value} (it runs {', '.join(tasks)})"
        )
    if spec.task is Task.QLORA and precision not in (Precision.BF16.value, Precision.FP16.value):
        raise UserError(
            f"precision: qlora computes in bf16 (its NF4 weights are dequantized for every "
            f"GEMM), not {precision}"
        )
