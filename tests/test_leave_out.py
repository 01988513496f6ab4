"""The leave-one-source-group-out check: a group is predicted by constants fitted without it,
and a GPU family only it measured takes the h100 constants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autoconfig import catalog
from autoconfig.fit import TIME_PARAMS
from autoconfig.leave_out import complete, leave_group_out, left_out_table, predict_with

LAYOUTS = [(1, 8, 1), (2, 4, 1), (4, 2, 2), (8, 1, 4)]  # tp, dp, micro-batch


def _shipped() -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for gpu in catalog.gpus().values():
        values = gpu.efficiency.model_dump()
        out[gpu.chip] = {k: v for k, v in values.items() if k in TIME_PARAMS and v is not None}
    return out


def _runs() -> pd.DataFrame:
    """llama3-8b runs measured exactly as the shipped constants predict ('fast', h100 and
    'blackwell', b200), and the same h100 layouts measured at half that ('slow')."""
    rows = []
    for group, gpu in [("fast", "h100-sxm-80gb"), ("slow", "h100-sxm-80gb"), ("bw", "b200-180gb")]:
        for tp, dp, mbs in LAYOUTS:
            rows.append(
                {
                    "run_id": f"{group}-{tp}-{dp}-{mbs}",
                    "source_group": group,
                    "model": "llama3-8b",
                    "layers": "",
                    "hidden": "",
                    "heads": "",
                    "vocab": "",
                    "gpu": gpu,
                    "num_gpus": tp * dp,
                    "tp": tp,
                    "pp": 1,
                    "dp": dp,
                    "mbs": mbs,
                    "gbs": dp * mbs * 4,
                    "seq_len": 8192,
                    "precision": "bf16",
                    "framework": "megatron",
                    "zero": 1,
                    "recompute": "none",
                    "sp": "y" if tp > 1 else "n",
                    "status": "ok",
                }
            )
    runs = pd.DataFrame(rows).astype(str)
    predicted, _ = predict_with(runs, _shipped())
    halved = np.where(runs["source_group"] == "slow", 0.5, 1.0)
    runs["measured_tokens_per_s_per_gpu"] = (predicted * halved).astype(str)
    for col in ["measured_mfu", "measured_model_tflops_per_gpu", "measured_peak_mem_gb"]:
        runs[col] = ""
    runs["fit_set"] = True
    return runs


def test_a_family_without_constants_takes_h100s_and_a_missing_format_the_wider_ones() -> None:
    constants = {"h100": {"gemm": 0.7, "gemm_fp8": 0.6, "attention": 0.3}, "a100": {"gemm": 0.65}}
    out = complete(constants, {"h100", "a100", "b300"})
    assert out["b300"] == {"gemm": 0.7, "gemm_fp8": 0.6, "gemm_fp4": 0.6, "attention": 0.3}
    assert out["a100"] == {"gemm": 0.65, "gemm_fp8": 0.65, "gemm_fp4": 0.65}
    assert out["h100"]["gemm_fp4"] == 0.6
    assert "gemm_fp4" not in constants["h100"]  # the fit's own constants are not changed


@pytest.mark.slow  # three refits of every time constant: about half a minute
def test_each_group_is_predicted_by_a_fit_on_the_others_alone() -> None:
    left_out = leave_group_out(_runs(), ["slow", "fast", "bw"])
    by_group = left_out.groupby("source_group")["ape"]
    # Fitted on 'fast' and 'bw' alone, the shipped constants stay: 'slow' ran at half of them.
    assert by_group.median()["slow"] == pytest.approx(1.0, abs=0.03)
    # Fitted on 'slow' (and 'bw'), h100's constants move towards half speed: 'fast' is missed.
    assert by_group.median()["fast"] > 0.1
    table = left_out_table(left_out).set_index("source_group")
    assert table.loc["bw", "families_only_it_measured"] == "b200"
    assert table.loc["slow", "families_only_it_measured"] == "-"
    assert not left_out.loc[left_out["source_group"] == "bw", "chip_fitted"].any()
    assert left_out.loc[left_out["source_group"] != "bw", "chip_fitted"].all()
    assert (table["rows"] == len(LAYOUTS)).all()
