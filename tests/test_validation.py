"""The validation helpers: the model-free spread of repeated measurements of one layout."""

from __future__ import annotations

import pandas as pd
import pytest

from autoconfig.validation import LAYOUT, repeat_spread


def _runs(rows: list[dict[str, object]]) -> pd.DataFrame:
    base = {col: "1" for col in LAYOUT} | {"source_group": "sweep", "status": "ok", "zero": "0"}
    return pd.DataFrame([base | row for row in rows])


def test_repeat_spread_pairs_and_ratios() -> None:
    runs = _runs(
        [
            # layout A measured twice with ZeRO-0 (3x apart) and once with ZeRO-1
            {"model": "A", "tps": 100.0},
            {"model": "A", "tps": 300.0},
            {"model": "A", "zero": "1", "tps": 110.0},
            # layout B: ZeRO-0 and ZeRO-1 agree within 10%
            {"model": "B", "tps": 100.0},
            {"model": "B", "zero": "1", "tps": 110.0},
            # layout C: measured once; a failed twin and a blank measurement do not count
            {"model": "C", "tps": 50.0},
            {"model": "C", "status": "crash_or_oom", "tps": 500.0},
            {"model": "C", "zero": "1", "tps": float("nan")},
            # another source is left out
            {"model": "A", "source_group": "other", "tps": 1000.0},
        ]
    )
    table = repeat_spread(runs, runs["tps"], groups=("sweep",)).set_index("comparison")
    assert table.loc["repeated", "pairs"] == 1
    assert table.loc["repeated", "median_ratio"] == pytest.approx(3.0)
    assert table.loc["repeated", "over_2x_%"] == 100.0
    zero = table.loc["ZeRO-0 vs ZeRO-1"]
    assert zero["pairs"] == 2
    # A: median of its ZeRO-0 runs (200) vs 110; B: 110 vs 100
    assert zero["median_ratio"] == pytest.approx((200 / 110 + 1.1) / 2)
    assert zero["over_1.2x_%"] == 50.0
    assert zero["over_2x_%"] == 0.0
