"""A serving question: the model, GPUs and workload, the latency/throughput budget (SLOs at a
percentile), the objective, and which engine settings to try (static batch sizes, or for
continuous batching the running-batch and per-iteration token limits, precisions, expert
parallelism, disaggregated prefill, and a decode pool on a GPU type of its own)."""

from __future__ import annotations

from dataclasses import dataclass

from autoconfig.base import checks
from autoconfig.serve.workload import Workload
from autoconfig.spec.schema import ModelSpec

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
    """`input_len`/`output_len` are the static search's lengths and, for continuous batching,
    the means of `workload` (filled in from it)."""

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
    batching: str = "static"
    workload: Workload | None = None
    request_rate: float | None = None  # requests/s offered to the whole deployment
    percentile: float = 90.0
    precisions: tuple[str, ...] | None = None  # weights tried (None: the GPU's defaults)
    kv_precisions: tuple[str, ...] | None = None
    max_seqs: tuple[int, ...] | None = None  # running-batch limits tried
    max_tokens: tuple[int, ...] | None = None  # per-iteration token budgets (chunk sizes)
    kv_fraction: float = 0.9
    disaggregation: bool = True
    engine: str = "vllm"  # spec/engines.py: its all-reduce kernels, CUDA graphs and formats
    simulate_top: int = 16
    # serve/features.py: the share of each prompt already in the prefix cache, and speculative
    # decoding (draft tokens verified per step, the chance each is accepted, the drafter)
    prefix_hit_rate: float | None = None
    speculative_tokens: int | None = None
    acceptance_rate: float | None = None
    speculative_method: str | None = None
    # Mixed pools (serve/mixed.py): the decode pool on `decode_gpus` GPUs of `decode_gpu`, the
    # prefill pool on `gpus` of `gpu`; USD per GPU-hour, one for both types or (prefill, decode)
    decode_gpu: str | None = None
    decode_gpus: int | None = None
    gpu_hour_usd: tuple[float, ...] = ()

    @property
    def mixed(self) -> bool:
        """Whether the prefill and decode pools run on GPU types of their own."""
        return self.decode_gpu is not None
