"""Measured GEMM rates of a stand-in-timed GPU (columns.gemm_rates): the ratio they give is the
one the cost model's efficiencies carry, attention takes the bf16 one, a profile naming rates
that do not cover it is one clear error, and the distiller keeps what it says it keeps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import assert_user_error, run_cli

from autoconfig.base.errors import UserError
from autoconfig.columns import gemm_rates, kernel_index
from autoconfig.cost.kernel_time import (
    TRAINING_OVER_TABLE,
    attention_efficiency,
    gemm_efficiency,
)
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


def test_the_cost_models_gemm_times_meet_the_measured_ones_at_their_median() -> None:
    """Independent of how the ratio is worked out: the cost model's training GEMM time at each
    measured shape (its efficiency, without the training-over-table factor, times the part's
    own peak) over the measured time has a median of exactly 1 per format, and spreads as
    the measurements do."""
    rows = gemm_rates.measured_gemm("amd_aiter")
    kernels = kernel_index.kernel_set()
    for name in ("mi300x", "mi355x"):
        gpu = catalog.get_gpu(name)
        code = np.float64(kernel_index.table_code(gpu))
        for fmt, nbytes in (("bf16", 2.0), ("fp8", 1.0)):
            mine = rows[(rows["cu_num"] == gpu.sms) & (rows["format"] == fmt)]
            if fmt == "bf16" and gpu.sms == 256:
                assert mine.empty  # no bf16 measured at 256 compute units: not rated
                continue
            fastest = mine.sort_values("us").drop_duplicates(["batch", "m", "n", "k"])
            m, n, k = (fastest[c].to_numpy(float) for c in ("m", "n", "k"))
            eff = gemm_efficiency(kernels, code, nbytes, m, n, k) / TRAINING_OVER_TABLE[fmt]
            seconds = fastest["batch"] * 2 * m * n * k / (eff * gpu.peak_tflops[fmt] * 1e12)
            over = seconds / (fastest["us"] * 1e-6)
            assert float(np.median(over)) == pytest.approx(1.0, rel=1e-4)
            assert over.min() < 0.95 and over.max() > 1.05  # the shapes scatter around it
    # MI300X's measured bf16 GEMMs run at about half the H200's share of their peaks
    assert _ratios("mi300x")["bf16"].ratio < 0.7
    assert _ratios("mi300x") == _ratios("mi325x")  # the same 304-CU die, the same measurements


def test_serving_keeps_the_stand_ins_efficiencies() -> None:
    """The ratios come from training-sized GEMMs; a serving step's few-row GEMMs and its
    attention run at the stand-in's efficiency."""
    kernels = kernel_index.kernel_set()
    rated = np.float64(kernel_index.table_code(catalog.get_gpu("mi300x")))
    plain = np.float64(kernel_index.table_code(catalog.get_gpu("h200-sxm-141gb")))
    for nbytes in (2.0, 1.0):
        args = (nbytes, *SHAPES)
        serve = [gemm_efficiency(kernels, c, *args, in_training=False) for c in (rated, plain)]
        assert serve[0] == pytest.approx(serve[1])
        train = [gemm_efficiency(kernels, c, *args) for c in (rated, plain)]
        assert np.all(train[0] < train[1])
    heads = (np.array([128.0]), np.array([4096.0]), np.array([32.0]))
    att = [attention_efficiency(kernels, c, *heads, in_training=False) for c in (rated, plain)]
    assert att[0] == pytest.approx(att[1])


def test_rates_that_do_not_cover_the_gpu_are_one_clear_error() -> None:
    gpu = catalog.get_gpu("mi300x")
    peaks = kernel_index.stand_in_peaks(gpu)
    with pytest.raises(UserError, match=r"^gpu: gemm_rates: 'amd_aiter' measured no GPU of 228 "):
        gemm_rates.gemm_ratios(gpu.model_copy(update={"sms": 228}), peaks)
    with pytest.raises(UserError, match=r"^gpu: gemm_rates: no measured GEMM rates named 'nope'"):
        gemm_rates.gemm_ratios(gpu.model_copy(update={"gemm_rates": "nope"}), peaks)
    assert gemm_rates.gemm_ratios(gpu.model_copy(update={"gemm_rates": ""}), peaks) == {}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"gemm_rates": "nope"}, "gemm_rates: no measured GEMM rates named 'nope'"),
        ({"sms": 80}, "measured no GPU of 80 compute units"),
        ({"kernel_table_stand_in": ""}, "gemm_rates: needs the stand-in tables they carry"),
    ],
)
def test_a_users_profile_with_rates_that_cannot_apply_is_one_line(
    tmp_path: Path, change: dict, needle: str
) -> None:
    profile = catalog.get_gpu("mi300x").model_dump(mode="json") | change
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(profile))
    kernel_index._told.add("mi300x")  # the stand-in note said already: stderr holds the error only
    result = run_cli("estimate", "--model", "llama3-8b", "--gpu", str(path), "--gpus", "8")
    assert_user_error(result, needle)


def test_a_renamed_copy_of_a_rated_profile_is_rated_the_same(tmp_path: Path) -> None:
    """A profile read from a file (a calibrated copy, renamed) is rated by what it says, not
    by its name: the same code as the catalog's part, and the same prediction."""
    profile = catalog.get_gpu("mi300x").model_dump(mode="json") | {"name": "mi300x-copy"}
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(profile))
    copy = catalog.get_gpu(str(path))
    assert kernel_index.table_code(copy) == kernel_index.table_code(catalog.get_gpu("mi300x"))
    args = ("estimate", "--model", "llama3-8b", "--gpus", "8")
    speeds = [run_cli(*args, "--gpu", gpu).stdout for gpu in ("mi300x", str(path))]
    first = [line for line in speeds[0].splitlines() if line.startswith("tokens/s/GPU")]
    assert first and first[0] in speeds[1]
    changed = profile | {"name": "mi300x-slower", "peak_tflops": {"bf16": 1000.0, "fp8": 2000.0}}
    path.write_text(yaml.safe_dump(changed))
    assert kernel_index.table_code(catalog.get_gpu(str(path))) != kernel_index.table_code(copy)


def _distiller() -> ModuleType:
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
    assert set(kept.loc[kept["family"].str.contains("batched"), "batch"]) == {16}
    # each family keeps both 304-CU rows of the kept shape and the 256-CU one
    assert set(kept["format"]) == {"bf16", "fp8"}
    assert len(kept) == len(distiller.FAMILIES) * 3


def test_the_catalogs_rated_copies_are_numbered_alike_in_every_process() -> None:
    """Codes travel in cost columns: the catalog's rated copies come right after the shipped
    tables, in name order, whatever asked first."""
    names = kernel_index._tables()[0]
    gpus = catalog.gpus().values()
    rated = sorted({kernel_index._rated_name(g) for g in gpus if g.gemm_rates})
    shipped = [n for n in names if "@" not in n]
    assert names[len(shipped) : len(shipped) + len(rated)] == rated
    assert len(rated) == 3  # MI300X and MI325X share theirs: same die, rates and peaks
