"""The shipped kernel tables against this project's own H100 and H200 kernel measurements: the
constants that carry the tables to a training step (cost.kernel_time) are what the two disagree
by."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from autoconfig.calibrate.leave_out import MEASURED_RANGES
from autoconfig.columns.kernel_catalog import kernel_tables
from autoconfig.cost.kernel_tables import grid_lookup
from autoconfig.cost.kernel_time import ATTENTION_BACKWARD_OVER_FORWARD, TRAINING_OVER_TABLE

MEASURED = Path(__file__).resolve().parents[1] / "docs" / "measured"
STARTS = ["h100_kernels.json", "h100_kernels_first_run.json"]  # two machine starts
# every start, each against its own chip's table (the H200's: two starts, 2026-11-28)
ALL_STARTS = [(name, "h100") for name in STARTS] + [
    ("h200_kernels.json", "h200"),
    ("h200_kernels_second.json", "h200"),
]


def _rows(name: str) -> list[dict]:
    return json.loads((MEASURED / name).read_text())["rows"]


def _gemm_ratios(name: str, chip: str = "h100") -> list[float]:
    """Own bf16 GEMM rate over the chip table's at the same shape, for each measured GEMM: the
    bench's shape is tokens x k x n; its input gradient runs (tokens, k, n) and its weight
    gradient (k, n, tokens) as (m, n, k)."""
    table = kernel_tables(chip)
    assert table is not None
    out = []
    for row in _rows(name):
        if row["kind"] != "gemm" or row["label"].startswith("fp8"):
            continue
        tokens, k, n = (float(v) for v in row["shape"].split("x"))
        if "input grad" in row["label"]:
            m_, n_, k_ = tokens, k, n
        elif "weight grad" in row["label"]:
            m_, n_, k_ = k, n, tokens
        else:
            m_, n_, k_ = tokens, n, k
        rate = float(grid_lookup(table.gemm["bf16"], np.array(m_), np.array(n_), np.array(k_)))
        out.append(row["measured"] / rate)
    return out


def _attention_rows(name: str, direction: str) -> dict[str, dict]:
    """The start's attention rows at head width 128 (the four shapes every start timed; the
    second H200 start added widths 80 and 64, which the tables do not hold)."""
    return {
        r["shape"]: r
        for r in _rows(name)
        if r["kind"] == "attention" and direction in r["label"] and r["shape"].endswith(" d128")
    }


def test_the_gemm_tables_run_faster_than_a_training_step_by_what_the_constant_says() -> None:
    medians = [statistics.median(_gemm_ratios(name, chip)) for name, chip in ALL_STARTS]
    assert all(len(_gemm_ratios(name, chip)) >= 30 for name, chip in ALL_STARTS)
    # the tables' engines are faster than torch's GEMMs on rotated operands, on every start
    assert max(medians) < 0.95
    assert min(medians) - 0.01 <= TRAINING_OVER_TABLE["bf16"] <= max(medians) + 0.01


def test_the_fp8_constant_is_what_the_h100s_fp8_gemms_ran_at_against_the_table() -> None:
    table = kernel_tables("h100")
    assert table is not None
    ratios = []
    for row in _rows(STARTS[0]):
        if row["kind"] == "gemm" and row["label"].startswith("fp8"):
            tokens, k, n = (float(v) for v in row["shape"].split("x"))
            rate = grid_lookup(table.gemm["fp8"], np.array(tokens), np.array(n), np.array(k))
            ratios.append(row["measured"] / float(rate))
    assert len(ratios) == 3
    assert TRAINING_OVER_TABLE["fp8"] == pytest.approx(statistics.median(ratios), abs=0.01)


def test_the_attention_constant_is_what_sdpa_ran_at_against_the_table() -> None:
    """SDPA's flash forward over the chip's table: a median 1.11 and 1.09 on two H100 starts,
    0.99 and 1.02 on two H200 starts; the one constant lies within what the starts measured."""
    medians = []
    for name, chip in ALL_STARTS:
        table = kernel_tables(chip)
        assert table is not None
        ratios = []
        for shape, row in _attention_rows(name, "forward").items():
            b, h, s, d = (float(p[1:]) for p in shape.split())
            rate = float(grid_lookup(table.attention, np.array(d), np.array(s), np.array(b * h)))
            ratios.append(row["measured"] / rate)
        assert len(ratios) == 4
        medians.append(statistics.median(ratios))
    assert min(medians) - 0.01 <= TRAINING_OVER_TABLE["attention"] <= max(medians) + 0.01


def test_attention_backward_takes_what_the_gpus_measured_over_its_forward() -> None:
    ratios = []
    for name, _ in ALL_STARTS:
        forward, backward = _attention_rows(name, "forward"), _attention_rows(name, "backward")
        assert forward.keys() == backward.keys()
        ratios += [backward[s]["median_ms"] / forward[s]["median_ms"] for s in forward]
    assert min(ratios) <= ATTENTION_BACKWARD_OVER_FORWARD <= max(ratios)
    assert pytest.approx(statistics.median(ratios), abs=0.1) == ATTENTION_BACKWARD_OVER_FORWARD


def test_the_memory_range_is_what_single_pass_kernels_reached() -> None:
    """Copies, casts and adds (one read and one write each) on the H100, as fractions of its
    3.35 TB/s: the fitted memory share may not leave them."""
    single_pass = ("device copy", "bf16 cast", "residual add")
    reached = [
        r["measured"] / 3.35
        for name in STARTS
        for r in _rows(name)
        if r["kind"] == "memory" and r["label"].startswith(single_pass)
    ]
    assert len(reached) >= 3
    low, high = MEASURED_RANGES["memory"]
    assert low == pytest.approx(min(reached), abs=0.01)
    assert high == pytest.approx(max(reached), abs=0.01)
