"""The leave-one-source-group-out check: a group is predicted by constants fitted without it,
from a start that owes nothing to the shipped fit, and a GPU family no other group measured
takes the h100 constants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autoconfig.calibrate import fit, leave_out
from autoconfig.calibrate.fit import GEMM_CLASSES, TIME_PARAMS
from autoconfig.calibrate.leave_out import (
    constants_for_chips,
    leave_group_out,
    left_out_table,
    neutral_start,
    predict_with,
)
from autoconfig.spec import catalog
from autoconfig.spec.schema import GPUSpec, MeasuredRange

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
    for col in ["measured_mfu", "measured_model_tflops_per_gpu", "measured_peak_mem_gib"]:
        runs[col] = ""
    runs["fit_set"] = True
    return runs


def _refit(**changes: float) -> dict[str, float]:
    """A refit's constants for one chip: every non-GEMM constant, with `changes`."""
    base = {name: 0.5 for name in TIME_PARAMS if name not in GEMM_CLASSES}
    return base | changes


def test_a_family_without_constants_takes_h100s_and_a_missing_format_the_wider_ones() -> None:
    h100 = _refit(gemm=0.7, gemm_fp8=0.6)
    constants = {"h100": h100, "a100": _refit(gemm=0.65), "b200": _refit(gemm_fp8=0.55)}
    out = constants_for_chips(constants, {"h100", "a100", "b200", "b300"})
    assert out["b300"] == h100 | {"gemm_fp4": 0.6}
    assert (out["a100"]["gemm_fp8"], out["a100"]["gemm_fp4"]) == (0.65, 0.65)
    # b200 measured only fp8: its 16-bit GEMMs take h100's, its fp4 its own fp8
    assert (out["b200"]["gemm"], out["b200"]["gemm_fp4"]) == (0.7, 0.55)
    assert "gemm_fp4" not in constants["h100"]  # the fit's own constants are not changed


def test_a_refit_that_lacks_a_constant_or_the_fallback_family_is_refused() -> None:
    with pytest.raises(ValueError, match="no h100 constants"):
        constants_for_chips({"a100": _refit(gemm=0.65)}, {"a100"})
    partial = {"h100": {"gemm": 0.7, "attention": 0.3}}  # the shipped memory etc. would stay
    with pytest.raises(ValueError, match="h100: the refit lacks"):
        constants_for_chips(partial, {"h100"})


def test_a_chip_without_refit_constants_is_predicted_with_h100s_not_its_shipped_ones() -> None:
    """A b200 row left without refitted constants takes h100's, whatever the profile ships:
    moving h100's kernel launch cost moves the b200 predictions, and only through h100's."""
    runs = _runs()
    bw = runs[runs["source_group"] == "bw"]
    h100 = {**_shipped()["h100"], "kernel_us": 20.0, "step_overhead_ms": 40.0}
    alone, _ = predict_with(bw, {"h100": h100})
    as_h100, _ = predict_with(bw, {"h100": h100, "b200": h100})
    shipped, _ = predict_with(bw, _shipped())
    assert np.allclose(alone, as_h100)
    assert not np.allclose(alone, shipped, rtol=1e-3)


def test_the_left_out_fit_starts_from_the_middle_of_every_constants_range(monkeypatch) -> None:
    for efficiency in neutral_start().values():
        for name, (_, _, lo, hi) in TIME_PARAMS.items():
            assert getattr(efficiency, name) == pytest.approx((lo + hi) / 2)
    # and leave_group_out refits from there, not from the shipped constants
    starts = []

    def fit(train, start=None):  # stands in for the refit
        starts.append(start)
        return _shipped(), 0.0, {}

    monkeypatch.setattr(leave_out, "fit_time_constants", fit)
    leave_out.leave_group_out(_runs(), ["slow"])
    assert starts and starts[0] is not None
    assert starts[0]["h100"].gemm == pytest.approx(sum(TIME_PARAMS["gemm"][2:]) / 2)


@pytest.mark.slow  # three refits of every time constant: about half a minute
def test_each_group_is_predicted_by_a_fit_on_the_others_alone() -> None:
    runs = _runs()
    left_out = leave_group_out(runs, ["slow", "fast", "bw"])
    by_group = left_out.groupby("source_group")["ape"]
    # Fitted on 'fast' and 'bw' alone, the refit reproduces the shipped predictions on these
    # layouts: 'slow' ran at half of them.
    assert by_group.median()["slow"] == pytest.approx(1.0, abs=0.03)
    # With 'bw' beside it, measured as the shipped constants predict, the robust fit sides
    # with 'bw' and 'fast' comes out exact: the constants are shared by every GPU.
    assert by_group.median()["fast"] == pytest.approx(0.0, abs=0.03)
    # Fitted on a group measured at 1.5x the shipped predictions alone, the shared constants
    # move towards faster steps (the shipped ones sit on their slow bounds, so half speed
    # cannot move them): 'fast' is missed.
    quick = runs[runs["source_group"] != "bw"].copy()
    measured = pd.to_numeric(quick["measured_tokens_per_s_per_gpu"])
    quick["measured_tokens_per_s_per_gpu"] = measured.where(
        quick["source_group"] != "slow", 3 * measured
    )
    assert leave_group_out(quick, ["fast"])["ape"].median() > 0.03
    table = left_out_table(left_out).set_index("source_group")
    assert table.loc["bw", "families_from_h100_fit"] == "b200"
    assert table.loc["slow", "families_from_h100_fit"] == "-"
    assert (table["predicted_%"] == 100.0).all()
    assert not left_out.loc[left_out["source_group"] == "bw", "chip_fitted"].any()
    assert left_out.loc[left_out["source_group"] != "bw", "chip_fitted"].all()
    assert (table["rows"] == len(LAYOUTS)).all()


def test_the_fit_leaves_kernel_rates_to_the_tables_and_shares_its_constants() -> None:
    """Rows measured at half the prediction cannot pull GEMM or attention rates down (the
    measured kernel tables time them, and their constants are not fitted); the overheads the
    fit moves are one value for every chip, and memory stays inside the range its kernels
    were measured at."""
    slow = _runs()
    slow = slow[slow["source_group"].isin(["slow", "bw"])]
    start = neutral_start()
    refit, _, _ = leave_out.fit_time_constants(slow, start)
    assert set(refit) == {"h100", "b200"}
    for name in leave_out.KERNEL_CONSTANTS:
        if name in refit["h100"]:
            assert refit["h100"][name] == pytest.approx(getattr(start["h100"], name))
    for name in leave_out.SHARED_CONSTANTS:
        assert refit["h100"][name] == refit["b200"][name]
    low, high = leave_out.MEASURED_RANGES["memory"]
    assert low <= refit["h100"]["memory"] <= high
    # the slow rows pulled the shared overheads up from the middle of their ranges
    middle = sum(TIME_PARAMS["kernel_us"][2:]) / 2
    assert refit["h100"]["kernel_us"] > middle or refit["h100"]["step_overhead_ms"] > 25.0


def test_measured_ranges_of_one_chip_meet_and_bad_ones_are_refused() -> None:
    h100 = catalog.get_gpu("h100-sxm-80gb")
    wide = MeasuredRange(low=0.6, high=0.75, source="a test")
    other = h100.model_copy(update={"measured_efficiency": {"gemm": wide}})
    low, high = h100.measured_efficiency["gemm"].low, h100.measured_efficiency["gemm"].high
    assert fit.measured_bounds([h100, other])["h100"]["gemm"] == (low, min(high, 0.75))
    apart = MeasuredRange(low=0.3, high=0.4, source="a test")
    with pytest.raises(ValueError, match="leaves no range"):
        fit.measured_bounds(
            [h100, h100.model_copy(update={"measured_efficiency": {"gemm": apart}})]
        )
    raw = h100.model_dump()
    raw["measured_efficiency"] = {"gemm": {"low": 0.8, "high": 0.7, "source": "a test"}}
    with pytest.raises(ValueError, match=r"low 0\.8 is above high 0\.7"):
        GPUSpec.model_validate(raw)
    raw["measured_efficiency"] = {"gemms": {"low": 0.6, "high": 0.7, "source": "a test"}}
    with pytest.raises(ValueError, match="gemms is not one of gemm, gemm_fp8"):
        GPUSpec.model_validate(raw)
