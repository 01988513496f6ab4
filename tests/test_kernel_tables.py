"""The measured kernel tables: lookups reproduce and interpolate the grids, every shipped chip
loads, and the numbers are physically possible (no kernel beats its chip's datasheet peak) and land
where published measurements put them."""

from __future__ import annotations

import fnmatch
import gzip
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from autoconfig.columns.kernel_catalog import kernel_chips, kernel_tables, kernels_folder
from autoconfig.cost.kernel_tables import (
    Grid,
    KernelTables,
    attention_seconds,
    collective_seconds,
    gemm_seconds,
    grid_lookup,
)

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "autoconfig" / "profiles" / "kernels"
GPUS = ROOT / "autoconfig" / "profiles" / "gpus"

# The GPU profiles each table's chip stands for: the chips the profiles name, plus the parts
# measured apart from the chip their profile names (h200 under h100, gb200 under b200, ...).
PROFILES = {
    "a100": ["a100-sxm-40gb", "a100-sxm-80gb"],
    "h100": ["h100-sxm-80gb", "h100-sxm-96gb"],
    "h200": ["h200-sxm-141gb"],
    "b200": ["b200-180gb"],
    "b300": ["b300"],
    "gb200": ["gb200"],
    "gb300": ["gb300"],
    "gb202": ["rtx-pro-6000-blackwell"],
}
# The datasheet peak that bounds each GEMM dtype.
PEAK_KEY = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4"}


def _profile(name: str) -> dict:
    return yaml.safe_load((GPUS / f"{name}.yaml").read_text())


def _csv(chip: str, name: str) -> pd.DataFrame:
    plain, packed = KERNELS / chip / name, KERNELS / chip / f"{name}.gz"
    if plain.exists():
        return pd.read_csv(plain)
    return pd.read_csv(io.BytesIO(gzip.decompress(packed.read_bytes())))


def _toy() -> Grid:
    # Values rising along both axes, unevenly, so interpolation has something to get wrong.
    axes = (np.array([1.0, 4.0, 16.0]), np.array([2.0, 8.0]))
    values = np.array([[1.0, 3.0], [2.0, 9.0], [5.0, 20.0]])
    return Grid(axes, values)


# --- grid_lookup --------------------------------------------------------------------------


def test_lookup_reproduces_grid_points() -> None:
    g = _toy()
    a, b = np.meshgrid(*g.axes, indexing="ij")
    np.testing.assert_allclose(grid_lookup(g, a, b), g.values, rtol=1e-12)
    np.testing.assert_allclose(
        grid_lookup(g, a.astype(np.float32), b.astype(np.float32)), g.values, rtol=1e-6
    )


def test_lookup_reproduces_a_shipped_grid() -> None:
    g = kernel_tables("h100").gemm["bf16"]
    m, n, k = np.meshgrid(*g.axes, indexing="ij")
    np.testing.assert_allclose(grid_lookup(g, m, n, k), g.values, rtol=1e-12)


def test_lookup_is_log_linear_and_monotone_between_points() -> None:
    g = _toy()
    x = np.geomspace(1.0, 16.0, 101)
    y = grid_lookup(g, x, np.full_like(x, 2.0))
    assert np.all(np.diff(y) > 0)
    # Halfway in log2 between 1 and 4 is 2: the geometric mean of 1 and 2.
    assert grid_lookup(g, 2.0, 2.0) == pytest.approx(np.sqrt(2.0), rel=1e-12)
    # Bilinear in the logs at a cell's centre: the geometric mean of its four corners.
    assert grid_lookup(g, 2.0, 4.0) == pytest.approx((1 * 3 * 2 * 9) ** 0.25, rel=1e-12)


def test_lookup_clamps_to_the_axes_ends() -> None:
    g = _toy()
    assert grid_lookup(g, 0.01, 0.5) == pytest.approx(1.0)
    assert grid_lookup(g, 1e6, 1e6) == pytest.approx(20.0)
    assert grid_lookup(g, 1e6, 2.0) == pytest.approx(5.0)


def test_lookup_broadcasts_and_keeps_float32() -> None:
    g = _toy()
    out = grid_lookup(g, np.array([[1.0], [16.0]], dtype=np.float32), np.float32(8.0))
    assert out.shape == (2, 1) and out.dtype == np.float32
    assert grid_lookup(g, 4.0, 8.0).shape == ()


def test_lookup_agrees_with_a_reference_interpolator() -> None:
    from scipy.interpolate import RegularGridInterpolator

    g = kernel_tables("b200").gemm["fp8"]
    rng = np.random.default_rng(0)
    pts = [np.exp(rng.uniform(np.log(a[0]), np.log(a[-1]), 2000)) for a in g.axes]
    ref = RegularGridInterpolator(tuple(np.log2(a) for a in g.axes), np.log(g.values))
    want = np.exp(ref(np.stack([np.log2(p) for p in pts], axis=-1)))
    np.testing.assert_allclose(grid_lookup(g, *pts), want, rtol=1e-10)


def test_lookup_on_a_single_value_axis_is_constant_along_it() -> None:
    g = Grid((np.array([128.0]), np.array([1.0, 4.0])), np.array([[2.0, 8.0]]))
    np.testing.assert_allclose(grid_lookup(g, np.array([64.0, 128.0, 256.0]), 2.0), 4.0)


def test_grid_rejects_unsorted_axes() -> None:
    with pytest.raises(ValueError):
        Grid((np.array([1.0, 1.0]),), np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        Grid((np.array([1.0, 2.0]),), np.array([1.0, 2.0, 3.0]))


# --- the shipped tables -----------------------------------------------------------------


def test_every_profiled_gpu_chip_has_tables() -> None:
    """Every GPU is timed by measured tables: its chip's own, or (no measured kernels of its
    chip shipping, as for AMD Instinct) a stand-in chip's that its profile names and says why."""
    profiles = [_profile(p.stem) for p in GPUS.glob("*.yaml")]
    own = {p["chip"] for p in profiles if not p.get("kernel_table_stand_in")} - {"cpu"}
    assert own <= set(kernel_chips())
    for p in profiles:
        if p.get("kernel_table_stand_in"):
            assert p["kernel_table"] in kernel_chips(), p["name"]
    assert kernel_tables("cpu") is None and kernel_tables("no-such-chip") is None


@pytest.mark.parametrize("chip", sorted(PROFILES))
def test_chip_loads_and_covers_bf16(chip: str) -> None:
    t = kernel_tables(chip)
    assert t is not None and t.chip == chip
    assert "bf16" in t.gemm and t.source.endswith(f"{chip}/provenance.yaml")
    provenance = yaml.safe_load((kernels_folder() / chip / "provenance.yaml").read_text())
    assert provenance["source"]["package"] == "aiconfigurator-core"
    assert provenance["source"]["license"] == "Apache-2.0"
    assert {"all_reduce", "all_gather", "reduce_scatter", "alltoall"} <= set(t.nccl)
    assert 128 in t.attention.axes[0]


def test_every_shipped_chip_is_checked_against_a_profile() -> None:
    assert set(kernel_chips()) == set(PROFILES)


@pytest.mark.parametrize("chip", sorted(PROFILES))
def test_no_kernel_beats_the_datasheet_peak(chip: str) -> None:
    t = kernel_tables(chip)
    peaks = [_profile(p)["peak_tflops"] for p in PROFILES[chip]]
    for dtype, g in t.gemm.items():
        peak = min(p[PEAK_KEY[dtype]] for p in peaks)
        assert g.values.max() <= peak, (chip, dtype, g.values.max(), peak)
    bf16 = min(p["bf16"] for p in peaks)
    assert t.attention.values.max() <= bf16, (chip, t.attention.values.max(), bf16)


@pytest.mark.parametrize("chip", ["h100", "b200", "gb202"])
def test_gemm_seconds_reproduces_the_csv(chip: str) -> None:
    t = kernel_tables(chip)
    rows = _csv(chip, "gemm.csv")
    pick = rows[
        (rows.m.isin([256, 4096, 16384]))
        & (rows.n.isin([4096, 14336, 65536]))
        & (rows.k.isin([4096, 5120, 16384]))
    ]
    assert len(pick) >= 9
    for dtype, g in pick.groupby("dtype"):
        want = 2.0 * g.m * g.n * g.k / (g.tflops * 1e12)
        got = gemm_seconds(t, str(dtype), g.m.to_numpy(), g.n.to_numpy(), g.k.to_numpy())
        np.testing.assert_allclose(got, want, rtol=1e-3)


def test_gemm_floors_and_zeros() -> None:
    t = kernel_tables("h100")
    one = gemm_seconds(t, "bf16", 1, 4096, 4096)
    assert gemm_seconds(t, "bf16", 0.25, 4096, 4096) == pytest.approx(one)
    assert gemm_seconds(t, "bf16", 0, 4096, 4096) == 0.0
    # Beyond the largest m the achieved TFLOP/s holds: time grows in proportion.
    big = gemm_seconds(t, "bf16", np.array([32768.0, 65536.0]), 8192, 8192)
    assert big[1] == pytest.approx(2 * big[0])
    with pytest.raises(ValueError, match="fp8"):
        gemm_seconds(kernel_tables("a100"), "fp8", 8192, 4096, 4096)


def test_h100_bf16_gemm_matches_published_throughput() -> None:
    # cuBLAS bf16 8192^3 on H100 SXM reaches roughly 650-800 TFLOP/s of the 989 dense peak.
    t = kernel_tables("h100")
    s = gemm_seconds(t, "bf16", 8192, 8192, 8192)
    frac = 2 * 8192**3 / s / 1e12 / 989
    assert 0.6 <= frac <= 0.85, frac
    # fp8 beats bf16 at a large shape, and by less than the peaks' factor of 2.
    ratio = s / gemm_seconds(t, "fp8", 8192, 8192, 8192)
    assert 1.1 <= ratio <= 2.0, ratio


def test_a100_bf16_gemm_matches_published_throughput() -> None:
    t = kernel_tables("a100")
    frac = 2 * 8192**3 / gemm_seconds(t, "bf16", 8192, 8192, 8192) / 1e12 / 312
    assert 0.6 <= frac <= 0.95, frac


def test_h100_flash_attention_matches_published_throughput() -> None:
    # FlashAttention-3 forward, causal, head_dim 128, 8k tokens: ~500-650 TFLOP/s (Shah et al.
    # 2024, Fig. 5), here measured through vLLM's build.
    t = kernel_tables("h100")
    s = attention_seconds(t, 128, 8192, 32)
    frac = 2 * 32 * 8192**2 * 128 / s / 1e12 / 989
    assert 0.4 <= frac <= 0.8, frac
    assert attention_seconds(t, 128, 8192, 0) == 0.0


def test_attention_time_grows_with_sequence_and_heads() -> None:
    # Measured as is: below a few heads the kernel is latency-bound and the measurements
    # scatter, so growth in heads is checked from a training-sized 32 heads up.
    for chip in kernel_chips():
        t = kernel_tables(chip)
        seq = np.geomspace(128, 65536, 40)
        s = attention_seconds(t, 128, seq, 32)
        assert np.all(np.diff(s) > 0), chip
        h = attention_seconds(t, 128, 4096, np.geomspace(32, 8192, 40))
        assert np.all(np.diff(h) > 0), chip
        assert h[-1] > 100 * h[0], chip


def test_collective_time_grows_with_bytes() -> None:
    sizes = np.geomspace(1e3, 1e10, 200)
    for chip in kernel_chips():
        t = kernel_tables(chip)
        for op, g in t.nccl.items():
            for gpus in g.axes[0]:
                us = collective_seconds(t, op, gpus, sizes)
                assert np.all(np.diff(us) >= 0), (chip, op, gpus)
                assert us[-1] > 100 * us[0], (chip, op, gpus)


def test_collective_edges() -> None:
    t = kernel_tables("h100")
    top = t.nccl["all_reduce"].axes[1][-1]
    assert collective_seconds(t, "all_reduce", 1, 1e9) == 0.0
    assert collective_seconds(t, "all_reduce", 8, 0) == 0.0
    at_top = collective_seconds(t, "all_reduce", 8, top)
    assert collective_seconds(t, "all_reduce", 8, 4 * top) == pytest.approx(4 * at_top)
    first = t.nccl["all_reduce"].axes[1][0]
    assert collective_seconds(t, "all_reduce", 8, 1.0) == pytest.approx(
        collective_seconds(t, "all_reduce", 8, first)
    )
    # more ranks than were measured together: left to the caller's model, not clamped
    assert np.isnan(collective_seconds(t, "all_reduce", 16, top))
    rack = kernel_tables("gb200")
    assert np.isnan(collective_seconds(rack, "all_reduce", 8, top))
    assert np.isfinite(collective_seconds(rack, "all_reduce", 4, top))


def test_h100_nvlink_all_reduce_bus_bandwidth() -> None:
    # 8 x H100 SXM over NVSwitch: nccl-tests all-reduce bus bandwidth at large sizes is about
    # 350-480 GB/s (450 GB/s NVLink per direction, more with NVLS in-switch reduction).
    t = kernel_tables("h100")
    nbytes = 256e6
    s = collective_seconds(t, "all_reduce", 8, nbytes)
    bus = nbytes / s * 2 * 7 / 8 / 1e9
    assert 300 <= bus <= 500, bus


def test_kernel_tables_is_a_plain_value() -> None:
    t = kernel_tables("h100")
    assert isinstance(t, KernelTables) and kernel_tables("h100") is t  # cached


def test_package_data_ships_the_tables() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["autoconfig"]
    shipped = [
        p.relative_to(ROOT / "autoconfig").as_posix() for p in KERNELS.rglob("*") if p.is_file()
    ]
    assert shipped
    missing = [f for f in shipped if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, missing


def test_tables_stay_small() -> None:
    total = sum(p.stat().st_size for p in KERNELS.rglob("*") if p.is_file())
    assert total < 3e6, total
