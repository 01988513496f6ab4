"""The measured search's candidates: the analytically feasible layouts, best predicted first,
each with a stable key and the bundled trainer's verdict on whether it can run it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import pandas as pd

from autoconfig.errors import UserError
from autoconfig.rank import layout_label, recompute_label
from autoconfig.specs import ModelSpec
from autoconfig.trainer.config import TrainConfig, config_from_search_row

# The layout dimensions a trial is made of: its Optuna parameters, in grid (nested-loop) order.
DIMS = ("tp", "pp", "vp", "dp", "cp", "ep", "sp", "mbs", "recompute", "recompute_layers", "zero")
PREDICTED = ("pred_tokens_per_s_per_gpu", "pred_step_time_s", "pred_peak_mem_gb", "mem_limit_gb")


def params_of(row: pd.Series | dict) -> dict[str, object]:
    """Plain-Python parameter values of one layout (Optuna stores these)."""
    out: dict[str, object] = {}
    for dim in DIMS:
        value = row[dim]
        if dim == "sp":
            out[dim] = bool(value)
        elif dim == "recompute":
            out[dim] = str(value)
        else:
            out[dim] = int(value)
    return out


def key_of(params: dict[str, object]) -> str:
    """A layout's name across sessions, e.g. 'tp2-pp1-vp1-dp2-cp1-ep1-sp1-mbs4-none-rl0-z0'."""
    p = params
    return (
        f"tp{p['tp']}-pp{p['pp']}-vp{p['vp']}-dp{p['dp']}-cp{p['cp']}-ep{p['ep']}-"
        f"sp{int(bool(p['sp']))}-mbs{p['mbs']}-{p['recompute']}-rl{p['recompute_layers']}-"
        f"z{p['zero']}"
    )


@dataclass
class Candidates:
    """`table` has one row per candidate: DIMS, `key`, `label`, the predicted figures,
    `analytical_rank` (1 = best predicted), `grid_order` and `refused` (the trainer's reason
    it cannot run the layout, '' when it can)."""

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


def build(
    ranked: pd.DataFrame,
    model: str | ModelSpec,
    limit: int,
    overrides: dict[str, object],
) -> Candidates:
    """The `limit` best feasible rows of `api.search`'s ranking, checked against the trainer."""
    feasible = ranked[ranked["pruned"] == ""].head(limit).reset_index(drop=True)
    if feasible.empty:
        raise UserError("measure: no layout fits in memory, so there is nothing to measure")
    rows = []
    for i, row in feasible.iterrows():
        params = params_of(row)
        refused = ""
        try:
            config_from_search_row(
                row, model, seq_len=ranked.attrs["seq_len"], gbs=ranked.attrs["gbs"], **overrides
            )
        except UserError as exc:
            refused = str(exc)
        rows.append(
            {
                **params,
                "key": key_of(params),
                "label": f"{layout_label(row)} mbs{row['mbs']} {recompute_label(row)} "
                f"z{row['zero']}",
                **{p: float(row[p]) for p in PREDICTED},
                "analytical_rank": int(i) + 1,
                "refused": refused,
            }
        )
    table = pd.DataFrame(rows)
    grid = table.sort_values(list(DIMS), kind="stable").index
    table["grid_order"] = 0
    table.loc[grid, "grid_order"] = range(len(table))
    return Candidates(
        table, model, int(ranked.attrs["seq_len"]), int(ranked.attrs["gbs"]), dict(overrides)
    )
