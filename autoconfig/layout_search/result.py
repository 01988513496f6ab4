"""What a training search was asked (SearchRequest, every default resolved) and what it found
(SearchResult): the ranked table plus the counts, the winner's explanation and the advice, as
typed fields instead of loose keys beside the table."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from autoconfig.layout_search.rank import Constraints
from autoconfig.spec.schema import ClusterSpec, FrameworkSpec, GPUSpec, ModelSpec, SearchSpace
from autoconfig.spec.task import PRETRAIN, TaskSpec


@dataclass(frozen=True)
class SearchRequest:
    model: ModelSpec
    gpu: GPUSpec
    cluster: ClusterSpec
    gpus: int
    seq_len: int
    gbs: int
    gbs_chosen: bool  # True when autoconfig picked the batch (no --gbs)
    precision: str
    space: SearchSpace
    constraints: Constraints
    framework: FrameworkSpec
    flash_attention: bool = True
    gbs_rule: str = ""  # where the batch came from (layout_search/batch.py), printed with results
    task: TaskSpec = PRETRAIN  # what the run trains (spec.task)


@dataclass
class SearchResult:
    request: SearchRequest
    table: pd.DataFrame  # every evaluated layout: feasible first (best first), then the pruned
    enumerated: int
    dropped: dict[str, int]  # combinations each divisibility rule removed
    left_out: dict[str, int]  # valid layouts the framework cannot run, by reason
    pruned: dict[str, int]  # evaluated layouts each pruning reason removed
    explanation: str = ""  # why #1 beats #2
    advice: list[str] = field(default_factory=list)  # when nothing fits: what would

    @property
    def evaluated(self) -> int:
        return len(self.table)

    @property
    def feasible(self) -> int:
        return int((self.table["pruned"] == "").sum())

    @property
    def ranked(self) -> pd.DataFrame:
        """The feasible layouts, best first."""
        return self.table[self.table["pruned"] == ""]

    @property
    def best(self) -> pd.Series | None:
        return self.table.iloc[0] if self.feasible else None

    def answers(self, tokens: float | None, gpu_hour_usd: float | None) -> pd.DataFrame:
        """The table with what training `tokens` takes at each layout's predicted throughput:
        `days` and `gpu_hours` (with --tokens), `cost_usd` (with --gpu-hour-usd as well);
        NaN for the pruned layouts."""
        table = self.table.copy()
        if not tokens:
            return table
        ok = table["pruned"] == ""
        rate = table["pred_tokens_per_s_per_gpu"].where(ok) * self.request.gpus
        seconds = tokens / rate
        table["days"] = seconds / 86400
        table["gpu_hours"] = seconds / 3600 * self.request.gpus
        if gpu_hour_usd:
            table["cost_usd"] = table["gpu_hours"] * gpu_hour_usd
        return table

    def context(self) -> dict[str, object]:
        """The inputs and counts, as plain values (best.json, reports)."""
        r = self.request
        return {
            "model": r.model.name,
            "gpu": r.gpu.name,
            "gpus": r.gpus,
            "seq_len": r.seq_len,
            "gbs": r.gbs,
            "gbs_chosen": r.gbs_chosen,
            "gbs_rule": r.gbs_rule,
            "precision": str(r.precision),
            "framework": r.framework.name,
            "task": r.task.label(),
            "layers": r.model.layers,
            "enumerated": self.enumerated,
            "dropped": self.dropped,
            "left_out": self.left_out,
            "evaluated": self.evaluated,
            "feasible": self.feasible,
            "pruned": self.pruned,
            "explanation": self.explanation,
        }
