"""The GPUs and models the published RL runs (rl_runs.csv) name: A800 and H20 profiles from their
datasheets, the Qwen3 dense models and the LLaMA-2-architecture 34B (CodeLlama-34B), each with
the figures its source cites; and what the RL rows that named them are answered with."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from autoconfig import api
from autoconfig.columns import kernel_index
from autoconfig.rl import runs as rl_runs
from autoconfig.spec import catalog

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("AUTOCONFIG_REFERENCE", ROOT.parent / "shared" / "reference"))
needs_reference = pytest.mark.skipif(
    not (REFERENCE / "rl_runs.csv").exists(), reason="no ../shared/reference"
)


def test_a800_is_the_a100_80gb_with_400_gb_s_of_nvlink() -> None:
    a800, a100 = catalog.get_gpu("a800-sxm-80gb"), catalog.get_gpu("a100-sxm-80gb")
    assert a800.chip == "a100" and a800.sms == 108
    assert a800.peak_tflops["bf16"] == 312.0
    assert a800.memory_gib == 80.0 and a800.memory_tb_s == 2.039
    # 400 GB/s both directions together: 200 a direction, against the A100's 300
    assert a800.cluster.intra_node_gb_s == 200.0
    assert a800.cluster.intra_node_gb_s / a100.cluster.intra_node_gb_s == pytest.approx(2 / 3)
    assert a800.tdp_w == 400.0
    for figure in ("312 TFLOP/s", "2,039 GB/s", "NVLink 400 GB/s", "A800"):
        assert figure in a800.source
    # timed by the A100's measured tables, whose NCCL times are not scaled to its NVLink
    assert a800.kernel_table == "a100"
    assert "NOT scaled" in a800.kernel_table_stand_in
    assert kernel_index.table_code(a800) == kernel_index.table_code(a100)


def test_h20_figures_and_its_stand_in() -> None:
    h20, h100 = catalog.get_gpu("h20-96gb"), catalog.get_gpu("h100-sxm-80gb")
    assert h20.chip == "h100" and h20.sms == 78
    assert h20.peak_tflops["bf16"] == 148.0 and h20.peak_tflops["fp8"] == 296.0
    assert h20.memory_tb_s == 4.0 and 94.0 <= h20.memory_gib <= 96.0
    assert h20.cluster.intra_node_gb_s == 450.0 and h20.tdp_w == 400.0
    for figure in ("96 GB", "4.0 TB/s", "148 TFLOP/s", "296 TFLOP/s FP8", "NVLink 900 GB/s"):
        assert figure in h20.source
    assert h20.kernel_table == "h100" and "decode" in h20.kernel_table_stand_in
    assert kernel_index.table_code(h20) == kernel_index.table_code(h100)
    # the tables' owner stays the H100 SXM5, whose peaks turn rates into efficiencies
    names, kernels = kernel_index._tables()
    assert kernels.peaks[names.index("h100")]["bf16"] == 989.0


# name: (layers, hidden, heads, kv_heads, ffn, tied, total B, non-embedding B on the model card)
QWEN3 = {
    "qwen3-0.6b": (28, 1024, 16, 8, 3072, True, 0.6, 0.44),
    "qwen3-1.7b": (28, 2048, 16, 8, 6144, True, 1.7, 1.4),
    "qwen3-4b": (36, 2560, 32, 8, 9728, True, 4.0, 3.6),
    "qwen3-8b": (36, 4096, 32, 8, 12288, False, 8.2, 6.95),
    "qwen3-14b": (40, 5120, 40, 8, 17408, False, 14.8, 13.2),
    "qwen3-32b": (64, 5120, 64, 8, 25600, False, 32.8, 31.2),
}


@pytest.mark.parametrize("name", sorted(QWEN3))
def test_qwen3_dense_profiles_match_their_config_and_model_card(name: str) -> None:
    layers, hidden, heads, kv, ffn, tied, total, non_embedding = QWEN3[name]
    m = catalog.get_model(name)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden) == (
        layers,
        hidden,
        heads,
        kv,
        ffn,
    )
    assert m.dhead == 128 and m.vocab == 151936 and m.tied_embeddings is tied
    assert (m.norm, m.mlp, m.position) == ("rmsnorm", "swiglu", "rope")
    embedding = m.vocab * m.hidden * (1 if tied else 2)
    assert m.param_count() / 1e9 == pytest.approx(total, rel=0.02)
    assert (m.param_count() - embedding) / 1e9 == pytest.approx(non_embedding, rel=0.02)
    assert "Qwen3 Technical Report" in m.source and f"hidden_size {hidden}" in m.source
    # the spelling rl_runs.csv uses
    assert catalog.get_model("Qwen3-" + name.split("-", 1)[1].upper()) is m


def test_codellama_34b_is_the_llama2_architecture_at_34b() -> None:
    m = catalog.get_model("codellama-34b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (
        48,
        8192,
        64,
        8,
        22016,
        32000,
    )
    assert m.param_count() / 1e9 == pytest.approx(33.7, rel=0.01)
    assert catalog.get_model("CodeLlama-34B") is m


@needs_reference
def test_a800_rows_are_no_longer_refused_for_their_gpu() -> None:
    frame = pd.read_csv(REFERENCE / "rl_runs.csv", dtype=str, keep_default_na=False)
    result = api.rl_frame(frame[frame["gpu"] == "a800-sxm-80gb"])
    assert len(result) == 8
    assert not result["error"].str.contains("gpu:").any()
    # what stays: the OpenRLHF README gives no trainer layout, GPU split, samples or lengths
    sized = result[~result["model"].str.contains("34B")]
    assert sized["error"].str.startswith("train_layout:").all()


@needs_reference
def test_qwen3_32b_rows_predicted_from_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The four NeMo-RL Qwen3-32B rows, read with the published name mapped to the profile
    (autoconfig.rl.runs.PUBLISHED_MODELS maps it to None, 'not in the catalog', until it names
    qwen3-32b), are predicted and fit."""
    monkeypatch.setitem(rl_runs.PUBLISHED_MODELS, "qwen3-32b", "qwen3-32b")
    frame = pd.read_csv(REFERENCE / "rl_runs.csv", dtype=str, keep_default_na=False)
    result = api.rl_frame(frame[frame["model"] == "Qwen3-32B"])
    assert len(result) == 4
    assert (result["error"] == "").all()
    assert result["pred_fits"].astype(bool).all()
    assert (result["pred_step_time_s"].astype(float) > 0).all()
