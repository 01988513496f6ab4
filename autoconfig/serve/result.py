"""What a serving search found: the ranked table of deployments and its context as typed
fields (the request, how many meet the budget, whose constants, the closest miss)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from autoconfig.serve.request import Request
from autoconfig.spec.schema import GPUSpec, ModelSpec


@dataclass
class ServingResult:
    request: Request
    model: ModelSpec
    gpu: GPUSpec
    table: pd.DataFrame  # every candidate: those that meet the budget first, best first
    feasible: int  # candidates that fit and meet the budget
    constants: str  # provenance of the serving constants used
    closest: str = ""  # when none meets the budget: the nearest miss and by how much
    workload: str = ""  # continuous batching: the workload simulated, in words
    features: str = ""  # prefix caching / speculative decoding assumed, in words (or "")
    decode_gpu: GPUSpec | None = None  # mixed pools: the decode pool's type (`gpu` prefills)
    comparison: str = ""  # mixed pools: each type alone against the mixed pools, in words

    @property
    def mixed(self) -> bool:
        return self.decode_gpu is not None

    def hardware(self) -> str:
        """The GPUs in words: '16 x h100-sxm-80gb', or each pool's count and type."""
        r = self.request
        if self.decode_gpu is None:
            return f"{r.gpus} x {self.gpu.name}"
        decode = f"{r.decode_gpus} x {self.decode_gpu.name}"
        return f"{r.gpus} x {self.gpu.name} (prefill) + {decode} (decode)"

    @property
    def candidates(self) -> int:
        return len(self.table)

    @property
    def budget(self) -> dict[str, float]:
        return {label: limit for _, label, limit, _ in self.request.budget.limits()}

    @property
    def best(self) -> pd.Series | None:
        return self.table.iloc[0] if self.feasible else None

    def context(self) -> dict[str, object]:
        r = self.request
        return {
            "model": self.model.name,
            "gpu": self.gpu.name,
            "gpus": r.gpus,
            "input_len": r.input_len,
            "output_len": r.output_len,
            "batching": r.batching,
            "workload": self.workload,
            "request_rate": r.request_rate,
            "percentile": r.percentile,
            "precision": str(r.precision),
            "kv_precision": str(r.kv_precision),
            "objective": r.objective,
            "budget": self.budget,
            "candidates": self.candidates,
            "feasible": self.feasible,
            "constants": self.constants,
            "closest": self.closest,
            **({"features": self.features} if self.features else {}),
            **(
                {
                    "decode_gpu": self.decode_gpu.name,
                    "decode_gpus": r.decode_gpus,
                    "gpu_hour_usd": list(r.gpu_hour_usd),
                }
                if self.decode_gpu is not None
                else {}
            ),
        }
