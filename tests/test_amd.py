"""AMD Instinct profiles: datasheet figures, a search that uses their memory, the stand-in
kernel tables said once on stderr, and the validation against the published AMD runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from autoconfig import api
from autoconfig.calibrate import amd_validation as amd
from autoconfig.calibrate import validation
from autoconfig.columns import gemm_rates, kernel_index
from autoconfig.spec import catalog

ROOT = Path(__file__).resolve().parent.parent

# The datasheet figures each profile cites in its `source` (AMD's data sheets for the GPU
# and its 8-GPU platform): dense bf16 / fp8 TFLOP/s, HBM (binary GB, so GiB), TB/s, compute
# units, board power, Infinity Fabric GB/s a direction, NIC GB/s; and the stand-in tables.
DATASHEETS = {
    "mi300x": (1307.4, 2614.9, 192.0, 5.3, 304, 750.0, 448.0, 50.0, "h200"),
    "mi325x": (1307.4, 2614.9, 256.0, 6.0, 304, 1000.0, 448.0, 50.0, "h200"),
    "mi350x": (2306.9, 4613.7, 288.0, 8.0, 256, 1000.0, 537.6, 50.0, "b200"),
    "mi355x": (2516.6, 5033.2, 288.0, 8.0, 256, 1400.0, 537.6, 50.0, "b200"),
}


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_profile_loads_with_its_datasheet_figures(name: str) -> None:
    bf16, fp8, hbm, tb_s, cus, watts, fabric, nic, table = DATASHEETS[name]
    gpu = catalog.get_gpu(name)
    assert gpu.peak_tflops["bf16"] == gpu.peak_tflops["fp16"] == bf16
    assert gpu.peak_tflops["fp8"] == fp8 == pytest.approx(2 * bf16, abs=0.2)  # each rounded
    assert "nvfp4" not in gpu.peak_tflops  # AMD's 4-bit format is MXFP4, not NVIDIA's
    assert (gpu.memory_gib, gpu.memory_tb_s, gpu.sms, gpu.tdp_w) == (hbm, tb_s, cus, watts)
    assert gpu.cluster.gpus_per_node == 8
    assert (gpu.cluster.intra_node_gb_s, gpu.cluster.inter_node_gb_s) == (fabric, nic)
    assert gpu.kernel_table == table and gpu.kernel_table_stand_in
    # the cited figures are written in the source string, which names AMD's data sheet
    assert "AMD Instinct" in gpu.source and "data sheet" in gpu.source
    assert f"{bf16:,}" in gpu.source or f"{bf16 / 1000:.1f} PFLOP/s" in gpu.source
    # the shared constants, as every other profile carries them
    shared = catalog.get_gpu("h100-sxm-80gb").efficiency
    for field in ("memory", "kernel_us", "intra_node_bus", "inter_node_bus", "step_overhead_ms"):
        assert getattr(gpu.efficiency, field) == getattr(shared, field)
    assert "not fitted on any AMD run" in gpu.efficiency.provenance


def test_cdna4_parts_list_mxfp8_and_cdna3_parts_do_not() -> None:
    assert "mxfp8" in catalog.get_gpu("mi355x").peak_tflops
    assert "mxfp8" not in catalog.get_gpu("mi300x").peak_tflops


def test_a_search_on_mi300x_runs_against_its_192_gib() -> None:
    # 70B on one node: more than an H100's 79.6 GiB, within the MI300X's 192
    result = api.search("llama3-70b", 8, gpu="mi300x", seq_len=8192, gbs=64)
    table = result.table
    fits = table[table["pred_fits"].astype(bool)]
    assert len(fits) > 0
    assert (table["mem_capacity_gib"] == 192.0).all()
    assert fits["pred_peak_mem_gib"].max() > 79.6
    assert fits["pred_peak_mem_gib"].max() <= 192.0
    assert result.best["pred_tokens_per_s_per_gpu"] > 0


def test_the_stand_in_line_names_the_stand_in_chip(capsys: pytest.CaptureFixture[str]) -> None:
    for name, stand_in in (("mi300x", "H200"), ("mi355x", "B200")):
        kernel_index._told.discard(name)  # said once per process: say it again here
        assert kernel_index.table_code(catalog.get_gpu(name)) >= 0
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"{name}: timed by the {stand_in} ")
        # the measured GEMM ratios the profile's rates give, computed, not copied
        ratios = gemm_rates.gemm_ratios(
            catalog.get_gpu(name), kernel_index.stand_in_peaks(catalog.get_gpu(name))
        )
        assert f"fp8 {ratios['fp8'].ratio:.2f}x" in line and "\n" not in line


def _pretraining_rows() -> pd.DataFrame:
    """The Llama 3.1 8B MLPerf layout on each AMD GPU, as the CSV writes a row."""
    rows = [
        {
            "run_id": f"test_{gpu}",
            "source_group": "test",
            "task": "pretrain",
            "model": "Llama-3.1-8B",
            "layers": "32",
            "hidden": "4096",
            "heads": "32",
            "kv_heads": "8",
            "ffn_hidden": "14336",
            "vocab": "128256",
            "seq_len": "8192",
            "gpu": gpu,
            "num_gpus": "8",
            "tp": "1",
            "pp": "1",
            "cp": "1",
            "dp": "8",
            "mbs": "2",
            "gbs": "32",
            "precision": "fp8",
            "framework": "nemo",
            "measured_tokens_per_s_per_gpu": "20000",
        }
        for gpu in amd.AMD_GPUS
    ]
    return pd.DataFrame(rows)


def test_amd_rows_are_predicted_with_a_guess_at_their_own_peak(tmp_path: Path) -> None:
    path = tmp_path / "amd.csv"
    _pretraining_rows().to_csv(path, index=False)
    out = amd.amd_predictions(amd.load_amd_runs(path))
    assert (out["outcome"] == "predicted").all()
    assert out["pred_tokens_per_s_per_gpu"].gt(0).all()
    # the guess scales with the bf16 peak: MI355X over MI300X is 2,516.6 / 1,307.4
    guess = out.set_index("gpu")["guess_tps"]
    assert guess["mi355x"] / guess["mi300x"] == pytest.approx(2516.6 / 1307.4)


def _script():
    spec = importlib.util.spec_from_file_location("validate_amd", ROOT / "scripts/validate_amd.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate_amd"] = module
    spec.loader.exec_module(module)
    return module


def test_the_validation_table_has_a_row_per_amd_gpu(tmp_path: Path) -> None:
    runs = tmp_path / "amd.csv"
    _pretraining_rows().to_csv(runs, index=False)
    doc = tmp_path / "amd_validation.md"
    text = _script().main(["--runs", str(runs), "--out", str(doc)])
    assert doc.read_text() == text
    by_gpu = text.split("## By GPU")[1].split("##")[0]
    for gpu in amd.AMD_GPUS:
        assert sum(line.startswith(f"| {gpu} ") for line in by_gpu.splitlines()) == 1


def test_published_amd_runs_report_every_row() -> None:
    reference = validation.reference_dir()
    if reference is None or not (reference / amd.RUNS_FILE).exists():
        pytest.skip("no published AMD runs beside the checkout")
    out = amd.amd_predictions(amd.load_amd_runs(reference / amd.RUNS_FILE))
    assert len(out) == 18
    table = amd.gpu_table(out)
    assert list(table["gpu"]) == list(amd.AMD_GPUS)
    assert table["rows"].sum() == len(out)
    # every row is predicted, pending the fine-tuning task, or not predicted with a reason
    assert out["outcome"].str.match(r"^(predicted|pending: .+|not predicted: .+)$").all()
    linear = out["source_group"].str.startswith("Primus hybrid-models guide")
    assert out.loc[linear, "outcome"].str.contains("linear attention").all()
    pretrain = out["task"] == amd.PRETRAIN
    assert (out.loc[pretrain & ~linear, "outcome"] == "predicted").all()
