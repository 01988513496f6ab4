"""The schema of a run's metrics.json, shared by the trainer and the measured search."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["ok", "oom", "error", "interrupted"]

# Exit codes of `autoconfig train` / `python -m autoconfig.trainer` (2 is bad input; 130 is
# a run stopped by Ctrl-C or SIGTERM, as a shell reports SIGINT: 128 + 2).
EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_OOM, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

LOST = "wrote no result"  # how assemble.py names the ranks that left no result file
# A rank that lost its peer says so; the peer's own message is the cause worth reporting.
COLLATERAL = ("Connection closed by peer", "Connection reset by peer", LOST, "KeyboardInterrupt")


def is_collateral(part: str) -> bool:
    """Whether one rank's message is only the loss of a peer (or an interrupt)."""
    return any(c in part for c in COLLATERAL)


class Environment(BaseModel):
    torch: str
    python: str
    backend: str
    device_type: str
    device_names: list[str]
    world_size: int
    hostname: str


class RankMemory(BaseModel):
    """One rank's memory. On GPU the allocator's peaks; everywhere the exact bytes of the
    local parameter, gradient and optimizer-state shards, and the bytes saved for backward."""

    rank: int
    pp_rank: int
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    parameters: int = Field(description="parameter elements held by this rank")
    saved_activation_bytes: int = Field(
        description="peak bytes saved for backward by one micro-batch (all its layers)"
    )
    saved_activation_bytes_per_layer: float


class RunMetrics(BaseModel):
    status: Status
    message: str = ""
    config: dict
    environment: Environment | None = None
    step_times_s: list[float] = []
    median_step_time_s: float | None = None
    tokens_per_step: int | None = None
    tokens_per_s_per_gpu: float | None = None
    ttft_ms: float | None = Field(default=None, description="generate: median prefill time")
    tpot_ms: float | None = Field(default=None, description="generate: median decode step")
    model_tflops_per_gpu: float | None = None
    mfu: float | None = Field(default=None, description="against the GPU profile's dense peak")
    gpu_profile: str | None = None
    losses: list[float] = []
    memory: list[RankMemory] = []
    slice_layer: dict | None = Field(
        default=None, description="slice mode: per-layer forward/backward times and bytes"
    )
    routing: dict | None = Field(
        default=None,
        description="MoE: the capacity factor, and the token-expert assignments routed and "
        "dropped (over capacity) per step, summed over all layers and ranks",
    )
    predicted: dict | None = Field(
        default=None, description="the cost model's figures for the same configuration"
    )


def read_metrics(path: Path) -> RunMetrics:
    return RunMetrics.model_validate_json(Path(path).read_text())


def median_after_warmup(times: list[float], warmup: int) -> float:
    return statistics.median(times[warmup:] if len(times) > warmup else times)
