"""A serving question: the model, GPUs and request lengths, the latency/throughput budget, the
objective and which static batches to try."""

from __future__ import annotations

from dataclasses import dataclass

from autoconfig import checks
from autoconfig.specs import ModelSpec

DEFAULT_MAX_BATCH = 1024


@dataclass(frozen=True)
class Budget:
    """Upper bounds in milliseconds and a lower bound on the deployment's output tokens/s."""

    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    max_latency_ms: float | None = None
    min_throughput: float | None = None

    def check(self) -> None:
        for name, value in self.__dict__.items():
            if value is not None:
                checks.number(value, name.replace("_", "-"))

    def limits(self) -> list[tuple[str, str, float, str]]:
        """(column, label, limit, 'max' | 'min') of every bound that is set."""
        out = []
        for col, label, value, kind in (
            ("pred_ttft_ms", "TTFT", self.max_ttft_ms, "max"),
            ("pred_tpot_ms", "TPOT", self.max_tpot_ms, "max"),
            ("pred_latency_ms", "latency", self.max_latency_ms, "max"),
            ("pred_output_tokens_per_s", "throughput", self.min_throughput, "min"),
        ):
            if value is not None:
                out.append((col, label, float(value), kind))
        return out


@dataclass(frozen=True)
class Request:
    model: str | ModelSpec
    gpu: str
    gpus: int
    input_len: int
    output_len: int
    precision: str = "bf16"
    kv_precision: str = "auto"
    budget: Budget = Budget()
    objective: str = "throughput"
    max_batch: int = DEFAULT_MAX_BATCH
    batches: tuple[int, ...] | None = None
    gpus_per_node: int | None = None
    allow_tp_across_nodes: bool = False
