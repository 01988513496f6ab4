"""Measured GEMM rates of a stand-in-timed GPU (columns.gemm_rates): the ratio they give is the
one the cost model's efficiencies carry, attention takes the bf16 one, a profile naming rates
that do not cover it is one clear error, and the distiller keeps what it says it keeps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoconfig.columns import gemm_rates, kernel_index
from autoconfig.cost.kernel_time import attention_efficiency, gemm_efficiency
from autoconfig.spec import catalog

ROOT = Path(__file__).resolve().parent.parent
SHAPES = (np.array([8192.0, 4096.0]), np.array([8192.0, 28672.0]), np.array([8192.0, 8192.0]))


def _ratios(name: str) -> dict[str, gemm_rates.RateRatio]:
    gpu = catalog.get_gpu(name)
    return gemm_rates.gemm_ratios(gpu, kernel_index.stand_in_peaks(gpu))


@pytest.mark.parametrize("name", ["mi300x", "mi355x"])
def test_the_cost_models_efficiency_is_the_stand_ins_times_the_measured_ratio(name: str) -> None:
    gpu = catalog.get_gpu(name)
    own = kernel_index.table_code(gpu)
    stand_in = kernel_index.kernel_set()
    native = {"h200": "h200-sxm-141gb", "b200": "b200-180gb"}[gpu.kernel_table]
    base = kernel_index.table_code(catalog.get_gpu(native))
    assert own != base
    ratios = _ratios(name)
    assert "fp8" in ratios
    for fmt, nbytes in (("bf16", 2.0), ("fp8", 1.0)):
        rated = gemm_efficiency(stand_in, np.float64(own), nbytes, *SHAPES)
        plain = gemm_efficiency(stand_in, np.float64(base), nbytes, *SHAPES)
        want = ratios[fmt].ratio if fmt in ratios else 1.0
        assert rated / plain == pytest.approx(np.full(2, want), rel=1e-6)
    heads = (np.array([128.0]), np.array([8192.0]), np.array([64.0]))
    att = attention_efficiency(stand_in, np.float64(own), *heads)
    att_plain = attention_efficiency(stand_in, np.float64(base), *heads)
    want = ratios["bf16"].ratio if "bf16" in ratios else 1.0
    assert att / att_plain == pytest.approx(want, rel=1e-6)


def test_each_ratio_is_the_median_over_the_measured_shapes_of_its_compute_units() -> None:
    rows = gemm_rates.measured_gemm("amd_aiter")
    for name in ("mi300x", "mi325x", "mi350x", "mi355x"):
        gpu = catalog.get_gpu(name)
        for fmt, r in _ratios(name).items():
            mine = rows[(rows["cu_num"] == gpu.sms) & (rows["format"] == fmt)]
            assert r.shapes == len(mine.drop_duplicates(["batch", "m", "n", "k"]))
            assert r.low <= r.ratio <= r.high
    # MI300X's measured bf16 and fp8 GEMMs run well below the H200's share of their peaks
    cdna3 = _ratios("mi300x")
    assert cdna3["bf16"].ratio < 0.7 and cdna3["fp8"].ratio < 1.0
    assert cdna3 == _ratios("mi325x")  # the same 304-CU die, the same measurements


def test_rates_that_do_not_cover_the_gpu_are_one_clear_error() -> None:
    gpu = catalog.get_gpu("mi300x")
    peaks = kernel_index.stand_in_peaks(gpu)
    with pytest.raises(ValueError, match=r"gemm_rates: 'amd_aiter' measured no GPU of 228 "):
        gemm_rates.gemm_ratios(gpu.model_copy(update={"sms": 228}), peaks)
    with pytest.raises(ValueError, match=r"gemm_rates: no measured GEMM rates named 'nope'"):
        gemm_rates.gemm_ratios(gpu.model_copy(update={"gemm_rates": "nope"}), peaks)
    assert gemm_rates.gemm_ratios(gpu.model_copy(update={"gemm_rates": ""}), peaks) == {}


def _distiller():
    path = ROOT / "scripts" / "distill_amd_gemm.py"
    spec = importlib.util.spec_from_file_location("distill_amd_gemm", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["distill_amd_gemm"] = module
    spec.loader.exec_module(module)
    return module


def test_the_distiller_keeps_training_sized_shapes_of_the_named_chips(tmp_path: Path) -> None:
    distiller = _distiller()
    configs = tmp_path / "aiter" / "aiter" / "configs"
    configs.mkdir(parents=True)
    plain = pd.DataFrame(
        {
            "cu_num": [304, 304, 256, 80, 304, 304],
            "M": [8192, 1024, 8192, 8192, 8192, 8192],
            "N": [8192, 8192, 8192, 8192, 512, 8192],
            "K": [8192, 8192, 8192, 8192, 8192, 8192],
            "us": [1000.0, 200.0, 600.0, 4000.0, 90.0, 1100.0],
        }
    )
    for name in distiller.FAMILIES:
        frame = plain.assign(B=16) if "batched" in name else plain
        frame.to_csv(configs / name, index=False)
    frames, version = distiller.read_configs(tmp_path / "aiter")
    kept = distiller.distill(frames)
    assert version == "unpacked"
    assert (kept["m"] >= 4096).all() and (kept[["n", "k"]] >= 1024).all().all()
    assert set(kept["cu_num"]) == {304, 256}
    assert set(kept.loc[kept["format"] == "fp8_block", "cu_num"]) == {304}  # CDNA4: MX blocks
    assert set(kept.loc[kept["family"].str.contains("batched"), "batch"]) == {16}
    # each family keeps both 304-CU rows of the kept shape and the 256-CU one (blockscale: not)
    assert len(kept) == 6 * 3 - 2
