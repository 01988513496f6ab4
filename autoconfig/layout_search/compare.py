"""Judge a layout: where the user's configuration ranks in the search over the same model,
GPUs, batch and framework, how much the best gains, and the single changes from the user's
layout that gain most."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from autoconfig.layout_search.advice import closest_fix, parallel_fix
from autoconfig.layout_search.rank import RANK_BY, with_spread
from autoconfig.layout_search.result import SearchRequest, SearchResult
from autoconfig.spec import layout

# One change = one of these dimensions moves; the ones that follow it (dp keeps the GPU count,
# vp and recompute_layers belong to pp and recompute, sp to tp) may move with it.
PRIMARY = ("tp", "pp", "cp", "ep", "etp", "mbs", "recompute", "zero")
FOLLOWERS = ("dp", "vp", "sp", "recompute_layers")


@dataclass(frozen=True)
class Change:
    text: str  # e.g. "pp 8 -> 4 with vp 2, dp 16 -> 32"
    gain: float  # fraction faster than the user's layout
    row: pd.Series


@dataclass
class Comparison:
    mine: pd.Series  # the user's estimate (one row of api.estimate)
    result: SearchResult
    fits: bool
    rank: int | None  # its rank among the feasible layouts (None: it does not fit)
    in_search: bool  # the search enumerated this exact layout
    best: pd.Series | None
    gain: float  # how much faster the best is than the user's layout (fraction)
    changes: list[Change] = field(default_factory=list)

    @property
    def feasible(self) -> int:
        return self.result.feasible


def _same(table: pd.DataFrame, row: pd.Series, names: tuple[str, ...]) -> pd.Series:
    mask = pd.Series(True, index=table.index)
    for name in names:
        mask &= table[name].astype(str) == str(layout.plain(row)[name])
    return mask


def _describe(mine: pd.Series, other: pd.Series, moved: str) -> str:
    a, b = layout.plain(mine), layout.plain(other)

    def step(name: str) -> str:
        return f"{name} {a[name]} -> {b[name]}"

    follows = [step(n) for n in FOLLOWERS if n != moved and str(a[n]) != str(b[n])]
    return step(moved) + (f" with {', '.join(follows)}" if follows else "")


def compare(mine: pd.Series, result: SearchResult, top: int = 2) -> Comparison:
    """`mine` placed in `result` (searched with the same model, GPUs, batch and framework)."""
    ranked = result.ranked
    speed = float(mine["pred_tokens_per_s_per_gpu"])
    limit = float(result.table["mem_limit_gib"].iloc[0]) if len(result.table) else float("inf")
    fits = float(mine["pred_peak_mem_gib"]) <= limit
    here = ranked[_same(ranked, mine, layout.NAMES)]
    in_search = bool(_same(result.table, mine, layout.NAMES).any())
    mine = _with_spread(mine, result)
    if not here.empty:
        rank: int | None = int(here["rank"].iloc[0])
        speed = float(here["pred_tokens_per_s_per_gpu"].iloc[0])
        mine[RANK_BY] = float(here[RANK_BY].iloc[0])
    elif fits:  # a layout the search leaves out: where the ranking's own quantity places it
        rank = int((ranked[RANK_BY] > mine[RANK_BY]).sum()) + 1
    else:
        rank = None
    best = result.best
    gain = float(best["pred_tokens_per_s_per_gpu"]) / speed - 1 if best is not None else 0.0
    changes: list[Change] = []
    for moved in PRIMARY:
        others = [n for n in PRIMARY if n != moved]
        near = ranked[_same(ranked, mine, tuple(others))]
        near = near[near[moved].astype(str) != str(layout.plain(mine)[moved])]
        if near.empty:
            continue
        row = near.iloc[0]  # best first
        g = float(row["pred_tokens_per_s_per_gpu"]) / speed - 1
        if g > 0:
            changes.append(Change(_describe(mine, row, moved), g, row))
    changes.sort(key=lambda c: -c.gain)
    return Comparison(mine, result, fits, rank, in_search, best, gain, changes[:top])


def _with_spread(mine: pd.Series, result: SearchResult) -> pd.Series:
    """`mine` with the conservative and optimistic estimates the ranking gives a layout
    (rank.SPREAD over its regimes), so that it is placed and shown by the ranking's quantity."""
    frame = with_spread(pd.DataFrame([mine.copy()]), result.request.cluster.gpus_per_node)
    return frame.iloc[0]


def fit_advice(mine: pd.Series, request: SearchRequest) -> list[str]:
    """When the user's layout does not fit: the search's advice for it (which single change
    of memory settings makes it fit) and the smallest tp/pp/cp change on the same GPUs that
    does, each re-evaluated with the cost model."""
    row = mine.copy()
    row["pruned"] = f"memory: {mine['pred_peak_mem_gib']:.1f} > {mine['mem_limit_gib']:.1f} GiB"
    return closest_fix(pd.DataFrame([row]), request) + parallel_fix(mine, request)
