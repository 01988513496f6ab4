"""The measured search's candidates: the analytically feasible layouts, best predicted first,
each with its stable key (autoconfig.spec.layout.key) and the bundled trainer's verdict on whether
it can run it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.layout_search.result import SearchResult
from autoconfig.spec import layout
from autoconfig.spec.schema import ModelSpec
from autoconfig.trainer.config import TrainConfig, config_from_search_row

PREDICTED = ("pred_tokens_per_s_per_gpu", "pred_step_time_s", "pred_peak_mem_gib", "mem_limit_gib")


@dataclass
class Candidates:
    """`table` has one row per candidate: every layout dimension, `key`, `label`, the predicted
    figures, `analytical_rank` (1 = best predicted), `grid_order` and `refused` (the trainer's
    reason it cannot run the layout, '' when it can)."""

    table: pd.DataFrame
    model: str | ModelSpec
    seq_len: int
    gbs: int
    overrides: dict[str, object] = field(default_factory=dict)

    def runnable(self) -> pd.DataFrame:
        return self.table[self.table["refused"] == ""]

    def by_key(self, key: str) -> pd.Series:
        return self.table.loc[self.table["key"] == key].iloc[0]

    def config(self, key: str) -> TrainConfig:
        return config_from_search_row(
            self.by_key(key), self.model, seq_len=self.seq_len, gbs=self.gbs, **self.overrides
        )

    def fingerprint(self) -> str:
        """Hash of the candidate set: a resumed study must be searching the same space."""
        return hashlib.sha256("\n".join(sorted(self.table["key"])).encode()).hexdigest()[:16]


def with_grid_order(table: pd.DataFrame) -> pd.DataFrame:
    """`grid_order`: the nested-loop order over the layout dimensions (the grid sampler's)."""
    grid = table.sort_values(list(layout.NAMES), kind="stable").index
    table["grid_order"] = 0
    table.loc[grid, "grid_order"] = range(len(table))
    return table


def build(
    result: SearchResult, model: str | ModelSpec, limit: int, overrides: dict[str, object]
) -> Candidates:
    """The `limit` best feasible layouts of a search, checked against the trainer."""
    feasible = result.ranked.head(limit).reset_index(drop=True)
    if feasible.empty:
        raise UserError("measure: no layout fits in memory, so there is nothing to measure")
    seq_len, gbs = result.request.seq_len, result.request.gbs
    rows = []
    for i, row in feasible.iterrows():
        params = layout.plain(row)
        refused = ""
        try:
            config_from_search_row(row, model, seq_len=seq_len, gbs=gbs, **overrides)
        except UserError as exc:
            refused = str(exc)
        rows.append(
            {
                **params,
                "key": layout.key(params),
                "label": layout.full_label(params),
                **{p: float(row[p]) for p in PREDICTED},
                "analytical_rank": int(i) + 1,
                "refused": refused,
            }
        )
    table = with_grid_order(pd.DataFrame(rows))
    return Candidates(table, model, seq_len, gbs, dict(overrides))
