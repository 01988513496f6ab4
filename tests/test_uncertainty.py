"""The left-out error carried into the ranking: group-weighted spreads by regime, regime
assignment, ranking by the conservative estimate, the memory-risk rule and the near-tie band."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from autoconfig import api
from autoconfig.base import resources
from autoconfig.layout_search import rank, spread


def _left_out(groups: dict[str, tuple[int, float]], **flags: bool) -> pd.DataFrame:
    """A fake leave_group_out frame: per group (rows, log ratio), every row in `flags`' regimes
    (the others False)."""
    parts = []
    for name, (n, value) in groups.items():
        cols = {r: flags.get(r, False) for r in spread.REGIMES}
        parts.append(
            pd.DataFrame({"source_group": name, "log_ratio": value, **cols}, index=range(n))
        )
    return pd.concat(parts, ignore_index=True)


def test_spread_quantiles_weigh_each_group_once() -> None:
    # one group of 280 rows over-predicted by e^0.5, three of 3 rows exact
    groups = {"big": (280, 0.5), "a": (3, 0.0), "b": (3, 0.0), "c": (3, 0.0)}
    frame = _left_out(groups, **{"pp 1": True})
    assert frame["log_ratio"].median() == 0.5  # pooled over rows the big group decides
    q = spread.weighted_quantiles(frame["log_ratio"], frame["source_group"], (0.5, 0.9))
    assert q[0] == pytest.approx(0.0) and q[1] > 0.0  # a quarter of the weight sits at 0.5
    # the big group's size does not matter, only that it is one group
    fewer = _left_out(groups | {"big": (2, 0.5)})
    assert spread.weighted_quantiles(
        fewer["log_ratio"], fewer["source_group"], (0.5, 0.9)
    ) == pytest.approx(q)
    spreads = spread.regime_spreads(frame)
    assert spreads["base"]["groups"] == 4 and spreads["base"]["rows"] == 289
    assert spreads["pp 1"]["quantiles"]["0.5"] == pytest.approx(0.0)


def test_a_regime_with_too_few_groups_takes_the_base_spread_and_says_so() -> None:
    frame = pd.concat(
        [
            _left_out({"a": (4, 0.1), "b": (4, -0.1), "c": (4, 0.0)}, **{"pp 1": True}),
            _left_out({"d": (50, 0.9)}, **{"pp > 8": True}),
        ],
        ignore_index=True,
    )
    spreads = spread.regime_spreads(frame)
    deep = spreads["pp > 8"]
    assert deep["groups"] == 1 < spread.MIN_GROUPS
    assert deep["quantiles"] == spreads["base"]["quantiles"] and "base" in deep["fallback"]
    assert deep["own_quantiles"]["0.5"] == pytest.approx(0.9)
    assert spreads["pp 1"]["fallback"] == "" and spreads["pp 1"]["groups"] == 3


def test_regimes_follow_depth_nodes_zero3_and_memory() -> None:
    t = pd.DataFrame(
        {
            "pp": [1, 4, 16, 1, 1, 1, 1],
            "tp": [8, 4, 4, 8, 2, 2, 1],
            "cp": [1, 2, 1, 2, 1, 1, 1],
            "dp": [1, 1, 1, 1, 4, 8, 1],
            "zero": [0, 1, 1, 1, 3, 3, 1],
            "pred_peak_mem_gib": [10, 10, 10, 10, 10, 10, 76],
            "mem_capacity_gib": [80] * 7,
        }
    )
    flags = spread.regimes(t, 8)
    assert flags["pp 1"].tolist() == [True, False, False, True, True, True, True]
    assert flags["pp 2-8"].tolist() == [False, True, False, False, False, False, False]
    assert flags["pp > 8"].tolist() == [False, False, True, False, False, False, False]
    # tp 8 fills a node; tp 8 x cp 2 spans two; tp 4 x cp 2 fits one
    assert flags["tp x cp across nodes"].tolist() == [False] * 3 + [True] + [False] * 3
    # ZeRO-3 over dp 4 x tp 2 = 8 GPUs stays in a node, over dp 8 x tp 2 it does not
    assert flags["zero-3 across nodes"].tolist() == [False] * 5 + [True, False]
    assert flags["memory > 90%"].tolist() == [False] * 6 + [True]
    assert spread.regimes(t, 16)["tp x cp across nodes"].sum() == 0


def test_a_row_in_several_regimes_takes_the_widest_side_of_each() -> None:
    s = spread.Spread(
        conservative={"pp 1": 0.1, "pp 2-8": 0.3, "memory > 90%": 0.2, "base": 0.1},
        optimistic={"pp 1": -0.1, "pp 2-8": 0.0, "memory > 90%": -0.4, "base": -0.1},
        safe_share=0.85,
        source="test",
        memory_source="test",
    )
    flags = pd.DataFrame(
        {"pp 1": [True, False], "pp 2-8": [False, True], "memory > 90%": [False, True]}
    )
    low, high, by = s.band(pd.Series([1000.0, 1000.0]), flags)
    assert low.tolist() == pytest.approx([1000 * np.exp(-0.1), 1000 * np.exp(-0.3)])
    assert high.tolist() == pytest.approx([1000 * np.exp(0.1), 1000 * np.exp(0.4)])
    assert by.tolist() == ["pp 1", "pp 2-8"]


def _row(**kw: object) -> dict:
    base = {"tp": 4, "cp": 1, "pp": 2, "vp": 1, "pred_peak_mem_gib": 40.0, "mem_limit_gib": 80.0,
            "mem_capacity_gib": 80.0, "memory_risk": False}  # fmt: skip
    return base | kw


def test_the_ranking_sorts_by_the_conservative_estimate() -> None:
    optimistic = _row(pred_tokens_per_s_per_gpu=1000.0, pred_tokens_per_s_per_gpu_low=600.0)
    steady = _row(pred_tokens_per_s_per_gpu=900.0, pred_tokens_per_s_per_gpu_low=850.0)
    ranked = rank.order_ties(pd.DataFrame([optimistic, steady]))
    assert ranked["pred_tokens_per_s_per_gpu_low"].tolist() == [850.0, 600.0]
    assert ranked["tie_break"].eq("").all()


@pytest.fixture(scope="module")
def searched() -> pd.DataFrame:
    return api.search("llama3-8b", 64, gpu="h100-sxm-80gb", seq_len=8192, gbs=512).ranked


def test_the_searched_ranking_is_monotone_in_its_conservative_estimate(searched) -> None:
    low = searched["pred_tokens_per_s_per_gpu_low"].to_numpy()
    rule = searched["tie_break"].to_numpy()
    risk = searched["memory_risk"].to_numpy(bool)
    assert len(low) > 10
    for i in range(len(low) - 1):
        if rule[i] == "":
            assert low[i] >= low[i + 1], i  # speed decided
        elif rule[i] == rank.MEMORY_RISK_RULE:  # against the nearest row below as fast
            j = i + 1 + int(np.argmax(low[i + 1 :] >= low[i]))
            assert not risk[i] and risk[j] and low[i] >= low[j] * (1 - rank.NEAR_TIE)
        else:
            assert low[i] >= low[i + 1] * (1 - rank.EQUAL_SPEED), (i, rule[i])
    # and nothing more than a near-tie slower is ever shown above a faster layout
    best_below = np.maximum.accumulate(low[::-1])[::-1]
    assert (low >= best_below * (1 - rank.NEAR_TIE) - 1e-9).all()
    # the band is ordered, and the flag is the line the spread asset states
    assert (searched["pred_tokens_per_s_per_gpu_high"] >= low).all()
    cap = searched["mem_capacity_gib"] * rank.SPREAD.safe_share
    assert (searched["memory_risk"] == (searched["pred_peak_mem_gib"] > cap)).all()


def test_memory_risk_puts_a_near_tie_below_a_safe_one_but_not_a_clear_win() -> None:
    top = 1000.0
    risky = _row(pred_tokens_per_s_per_gpu_low=top, pred_peak_mem_gib=79.0, memory_risk=True)
    near = _row(pred_tokens_per_s_per_gpu_low=top * (1 - rank.NEAR_TIE / 2))
    far = _row(pred_tokens_per_s_per_gpu_low=top * (1 - 2 * rank.NEAR_TIE))
    frame = pd.DataFrame([risky, near, far]).assign(
        pred_tokens_per_s_per_gpu=lambda t: t["pred_tokens_per_s_per_gpu_low"], pruned=""
    )
    ranked = rank.order_ties(frame)
    assert ranked["memory_risk"].tolist() == [False, True, False]
    assert ranked["tie_break"].tolist() == [rank.MEMORY_RISK_RULE, "", ""]
    assert "no memory risk" in rank.explain_winner(ranked)
    # a risky layout more than a near-tie ahead keeps its place
    ranked = rank.order_ties(frame.iloc[[0, 2]])
    assert ranked["memory_risk"].tolist() == [True, False] and ranked["tie_break"].eq("").all()


def test_the_near_tie_band_reads_the_left_out_figure(tmp_path, monkeypatch, searched) -> None:
    acc = json.loads(resources.asset("accuracy.json").read_text())
    assert abs(rank.NEAR_TIE - acc["left_out_median_over_groups_pct"] / 100) < 1e-9
    assert "left it out" in rank.NEAR_TIE_SOURCE
    best = searched["pred_tokens_per_s_per_gpu_low"].max()
    close = searched["pred_tokens_per_s_per_gpu_low"] >= (1 - rank.NEAR_TIE) * best
    assert (searched["near_tie"] == close).all()
    fake = tmp_path / "accuracy.json"
    monkeypatch.setattr(rank.resources, "asset", lambda name: tmp_path / name)
    fake.write_text(
        json.dumps({"median_over_groups_pct": 21.5, "left_out_median_over_groups_pct": 7.3})
    )
    assert rank._near_tie()[0] == pytest.approx(0.073)
    fake.write_text(json.dumps({"median_over_groups_pct": 21.5}))
    pct, source = rank._near_tie()
    assert pct == pytest.approx(0.215) and "in-sample" in source


def test_the_packaged_spread_covers_every_regime() -> None:
    data = json.loads(resources.asset(spread.ASSET).read_text())
    assert set(data["regimes"]) == {"base", *spread.REGIMES}
    for name, entry in data["regimes"].items():
        q = [entry["quantiles"][f"{level:g}"] for level in spread.LEVELS]
        assert q == sorted(q), name
        assert (entry["groups"] >= spread.MIN_GROUPS) != bool(entry["fallback"]) or name == "base"
    assert 0.5 < rank.SPREAD.safe_share < 1 and data["memory"]["oom_flagged"]
    assert "stand-in" not in rank.SPREAD.source


def test_the_table_rows_show_the_spread_and_the_flag(searched) -> None:
    cells = rank.top_row(searched.iloc[0])
    low, high = cells["tokens/s/GPU (low-high)"].replace(",", "").split("-")
    assert float(low) <= float(cells["tokens/s/GPU"].replace(",", "")) <= float(high)
    assert cells["memory risk"] in ("", "yes")
