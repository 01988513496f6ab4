"""The validation helpers: the model-free spread of repeated measurements of one layout, the
failed runs that a run which ran dominates in memory, and the constant-MFU guess."""

from __future__ import annotations

import pandas as pd
import pytest

from autoconfig.calibrate.validation import (
    LAYOUT,
    SAME_MEMORY_SETTINGS,
    constant_guess,
    dominated_failures,
    load_training_runs,
    playbook_ranking,
    repeat_spread,
    twin_ranking,
)


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
    # every layout here is unpipelined: the pp 1 row repeats the whole, and no pipelined pair
    assert table.loc["ZeRO-0 vs ZeRO-1, pp 1", "pairs"] == 2
    assert "ZeRO-0 vs ZeRO-1, pp > 1" not in table.index


def test_repeat_spread_parts_pipelined_twins_and_signs_them() -> None:
    runs = _runs(
        [
            {"model": "A", "tps": 100.0},
            {"model": "A", "zero": "1", "tps": 110.0},
            # a pipelined layout whose ZeRO-0 run stalled at a quarter of its twin
            {"model": "D", "pp": "4", "tps": 100.0},
            {"model": "D", "pp": "4", "zero": "1", "tps": 400.0},
        ]
    )
    table = repeat_spread(runs, runs["tps"], groups=("sweep",)).set_index("comparison")
    assert table.loc["ZeRO-0 vs ZeRO-1", "pairs"] == 2
    flat, piped = table.loc["ZeRO-0 vs ZeRO-1, pp 1"], table.loc["ZeRO-0 vs ZeRO-1, pp > 1"]
    assert (flat["pairs"], piped["pairs"]) == (1, 1)
    assert flat["median_ratio"] == pytest.approx(1.1)
    assert piped["median_ratio"] == pytest.approx(4.0)
    assert piped["median_zero0_over_zero1"] == pytest.approx(0.25)
    assert flat["median_zero0_over_zero1"] == pytest.approx(100 / 110)


def test_playbook_ranking_scores_the_unpipelined_and_pipelined_layouts_apart() -> None:
    # Three unpipelined layouts ranked right, three pipelined ones ranked backwards; the
    # whole group's best is pipelined and predicted last.
    measured = [100.0, 200.0, 300.0, 150.0, 250.0, 400.0]
    pred = [1.0, 2.0, 3.0, 3.5, 2.5, 1.5]
    pp = ["1", "1", "1", "2", "2", "2"]
    out = pd.DataFrame(
        {
            "source_group": "Ultra-Scale Playbook",
            "status": "ok",
            "error": "",
            "model": "A",
            "num_gpus": "8",
            "pp": pp,
            "measured_tps": measured,
            "pred_tokens_per_s_per_gpu": pred,
        }
    )
    row = playbook_ranking(out).iloc[0]
    assert (row["configs"], row["configs_pp1"]) == (6, 3)
    assert row["spearman_pp1"] == pytest.approx(1.0)
    assert row["loss_pp1_%"] == pytest.approx(0.0)
    assert row["spearman_pipelined"] == pytest.approx(-1.0)
    # the whole group's pick (3.5) measured 150 of the best 400
    assert row["loss_%"] == pytest.approx(100 * (1 - 150 / 400))

    # Below three layouts a part has no figures, and a blank pp is in neither part.
    small = out.assign(pp=["1", "1", "", "2", "2", "2"])
    row = playbook_ranking(small).iloc[0]
    assert row["configs_pp1"] == 2
    assert pd.isna(row["spearman_pp1"]) and pd.isna(row["loss_pp1_%"])
    assert row["spearman_pipelined"] == pytest.approx(-1.0)


def _layouts(rows: list[dict[str, object]]) -> pd.DataFrame:
    base = {col: "x" for col in SAME_MEMORY_SETTINGS} | {"gbs": 64, "layers": 16, "vp": 1}
    base |= {"num_experts": ""}
    base |= {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "zero": 0, "status": "ok"}
    return pd.DataFrame([base | row for row in rows])


def test_a_failure_is_dominated_only_when_it_needs_no_more_memory_in_any_term() -> None:
    runs = _layouts(
        [
            {"tp": 2, "pp": 2, "mbs": 2},  # ran: 8 layers per stage, micro-batches of 2
            {"status": "crash_or_oom", "tp": 4, "pp": 2, "mbs": 2},  # wider tp: dominated
            {"status": "crash_or_oom", "tp": 2, "pp": 2, "mbs": 4},  # larger micro-batch
            {"status": "crash_or_oom", "tp": 1, "pp": 2, "mbs": 2},  # narrower tp
            {"status": "crash_or_oom", "tp": 2, "pp": 2, "mbs": 2, "recompute": "y"},  # other
            {"status": "oom", "tp": 2, "pp": 4, "mbs": 2},  # fewer layers per stage
            # ZeRO-1 over fewer data-parallel ranks than a ZeRO-1 run that ran: not dominated
            {"zero": 1, "dp": 8, "tp": 8},
            {"status": "crash_or_oom", "zero": 1, "dp": 4, "tp": 8},
            {"status": "crash_or_oom", "zero": 1, "dp": 16, "tp": 8},
        ]
    )
    got = dominated_failures(runs).tolist()
    assert got == [False, True, False, False, False, True, False, False, True]


def test_more_micro_batches_in_flight_is_not_dominated() -> None:
    # pp 2 with one micro-batch per step keeps one alive; pp 4 with 16 keeps four: the deeper
    # pipeline has fewer layers per stage but twice the micro-batch-layers on its first stage
    runs = _layouts(
        [
            {"pp": 2, "dp": 64, "gbs": 64},
            {"status": "crash_or_oom", "pp": 4, "dp": 4, "gbs": 64},
        ]
    )
    assert dominated_failures(runs).tolist() == [False, False]
    ran_more = runs.assign(dp=[4, 4])  # the run that ran: 2 of 16 micro-batches alive, 8 layers
    assert dominated_failures(ran_more).tolist() == [False, True]


def test_interleaved_and_moe_failures_are_never_counted_dominated() -> None:
    ran = {"tp": 2, "pp": 2, "mbs": 2}
    failed = {"status": "crash_or_oom", "tp": 4, "pp": 2, "mbs": 2}
    assert dominated_failures(_layouts([ran, failed])).tolist() == [False, True]
    for other in ({"vp": 2}, {"num_experts": 8}):
        assert dominated_failures(_layouts([ran | other, failed | other])).tolist() == [False] * 2


def _guess_row(**cells: object) -> dict[str, object]:
    shape = {"layers": "32", "hidden": "4096", "heads": "32", "kv_heads": "8"}
    return (
        {"model": "row", "ffn_hidden": "14336", "vocab": "128256", "seq_len": "8192"}
        | {"gpu": "h100-sxm-80gb", "precision": "bf16", "mlp": "", "tied_embeddings": ""}
        | shape
        | cells
    )


def test_guess_counts_a_blank_llama_mlp_as_swiglu_and_fills_catalog_cells() -> None:
    """The guess reads a row's architecture as the model does: a Llama-shaped row whose MLP
    cell is blank is SwiGLU (3 h ffn, not 2), and a catalog-named row's blank cells are filled."""
    runs = pd.DataFrame(
        [
            _guess_row(mlp="swiglu"),
            _guess_row(),
            _guess_row(mlp="gelu"),
            _guess_row(model="llama3-8b", vocab=""),
            _guess_row(model="not-in-catalog", vocab=""),
        ]
    )
    guess = constant_guess(runs)
    h, ffn, layers = 4096, 14336, 32
    attention = 2 * h * h + 2 * h * h * 8 / 32
    embed = 2 * 128256 * h
    swiglu_flops = 6 * (layers * (attention + 3 * h * ffn) + embed) + 12 * layers * h * 8192
    assert guess[0] == pytest.approx(0.4 * 989e12 / swiglu_flops)
    assert guess[1] == pytest.approx(guess[0])
    assert guess[2] > 1.1 * guess[0]  # a stated GELU MLP has two matrices
    assert guess[3] == pytest.approx(guess[0])  # llama3-8b's vocab comes from the catalog
    assert pd.isna(guess[4])


def test_guess_counts_a_moe_row_as_dense_with_its_own_ffn() -> None:
    """The reference's guess counts a MoE row as dense with its ffn_hidden cell (blank: 4h);
    the catalog's ffn_hidden of a MoE model is one expert's width and is not taken."""
    moe = {"num_experts": "8", "topk": "2", "vocab": "32000", "ffn_hidden": ""}
    named, unnamed = constant_guess(
        pd.DataFrame([_guess_row(model="mixtral-8x7b", **moe), _guess_row(**moe)])
    )
    assert named == pytest.approx(unnamed)  # both 4h = 16384, not the catalog's 14336
    h, layers = 4096, 32
    attention = 2 * h * h + 2 * h * h * 8 / 32
    flops = 6 * (layers * (attention + 3 * h * 4 * h) + 2 * 32000 * h) + 12 * layers * h * 8192
    assert named == pytest.approx(0.4 * 989e12 / flops)


def test_twin_ranking_ranks_one_zero_stage_by_the_other() -> None:
    """Four layouts measured with both ZeRO stages: the twins agree on the order but for the
    last two, so the twin Spearman is 0.8 and picking by one twin loses what the other twin
    measured; a model that ranks them backwards picks the slowest layout."""
    zero0 = [100.0, 200.0, 300.0, 400.0]
    zero1 = [110.0, 210.0, 420.0, 400.0]
    pred = [4.0, 3.0, 2.0, 1.0]
    rows = []
    for i in range(4):
        for zero, tps in (("0", zero0[i]), ("1", zero1[i])):
            rows.append({"model": "A", "tp": str(i + 1), "zero": zero, "tps": tps, "p": pred[i]})
    runs = _runs(rows)
    out = runs.assign(
        source_group="Ultra-Scale Playbook",
        num_gpus="8",
        measured_tps=runs["tps"],
        pred_tokens_per_s_per_gpu=runs["p"],
        error="",
    )
    table = twin_ranking(out)
    assert len(table) == 1
    row = table.iloc[0]
    assert row["layouts"] == 4
    assert row["twin_spearman"] == pytest.approx(0.8)
    # picking by ZeRO-0 runs layout 4, whose ZeRO-1 run gives 400 of 420; by ZeRO-1, layout 3,
    # whose ZeRO-0 run gives 300 of 400
    assert row["twin_loss_%"] == pytest.approx((100 * (1 - 400 / 420) + 100 * (1 - 300 / 400)) / 2)
    assert row["model_spearman"] == pytest.approx((-1.0 + -0.8) / 2)
    assert row["model_loss_%"] == pytest.approx((100 * (1 - 100 / 400) + 100 * (1 - 110 / 420)) / 2)


def test_a_failure_is_weighed_with_its_frameworks_pipeline_split() -> None:
    # A 16-layer model whose LM head costs four layers: split evenly, pp 4 holds 4 x 4 and
    # pp 2 holds 2 x 8 layer-micro-batches on the first rank, a tie; nanotron's split puts
    # 6 layers on pp 4's first rank (24) and 11 on pp 2's (22), so the failure needed more.
    shape = {"hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 8192, "vocab": 131072}
    shape |= {"mlp": "swiglu"}
    ran = shape | {"pp": 2, "dp": 4, "gbs": 64}
    failed = shape | {"status": "crash_or_oom", "pp": 4, "dp": 2, "gbs": 64}
    for framework, dominated in (("megatron", True), ("nanotron", False)):
        runs = _layouts([ran | {"framework": framework}, failed | {"framework": framework}])
        assert dominated_failures(runs).tolist() == [False, dominated]


def test_a_fixed_cost_per_micro_batch_shows_as_a_line_in_the_micro_batch_count() -> None:
    """Two families cut the same 256 sequences into micro-batches of 1 to 16: one pays 0.5 s
    per micro-batch on top of a 2 s step, the other only its work (2 s whatever the cut)."""
    from autoconfig.calibrate.micro_batches import micro_batch_lines, micro_batch_summary

    rows = []
    for tp, stall in ((16, 0.5), (2, 0.0)):
        for mbs in (1, 2, 4, 16):
            micro = 256 / (4 * mbs)
            step = 2.0 + stall * micro
            rows.append(
                {
                    "source_group": "sweep", "status": "ok", "error": "", "model": "m",
                    "num_gpus": 4 * tp, "gpus_per_node": "", "tp": tp, "pp": 1, "dp": 4,
                    "zero": 1, "mbs": mbs, "gbs": 256, "seq_len": 4096,
                    "measured_tps": 256 * 4096 / (step * 4 * tp), "pred_step_time_s": 2.0,
                }
            )  # fmt: skip
    lines = micro_batch_lines(pd.DataFrame(rows), "sweep").set_index("tp")
    assert lines.loc[16, "slope_s"] == pytest.approx(0.5) and lines.loc[16, "r2"] == 1.0
    assert lines.loc[16, "kind"] == "tp across nodes"
    assert lines.loc[16, "model_slope_s"] == pytest.approx(0.0, abs=1e-9)
    assert lines.loc[2, "slope_s"] == pytest.approx(0.0, abs=1e-9)
    summary = micro_batch_summary(lines.reset_index()).set_index("layouts")
    assert summary.loc["tp across nodes", "stall_bound_%"] == 100.0
    assert summary.loc["pp 1, tp in a node", "stall_bound_%"] == 0.0
    # sizes spanning less than asked for, or too few of them, say nothing
    narrow = pd.DataFrame(rows)[lambda d: d["mbs"] < 16]  # 1, 2 and 4: a 4x span
    assert len(micro_batch_lines(narrow, "sweep")) == 2
    assert micro_batch_lines(narrow, "sweep", min_span=5.0).empty
    assert micro_batch_lines(narrow, "sweep", min_sizes=4).empty


def test_published_peaks_are_read_in_gib_whatever_unit_the_table_holds(tmp_path) -> None:
    """The table's decimal GB are read back in GiB, the unit the memory model predicts in;
    the Playbook's figures, GiB as nanotron logs them, are kept; a blank stays blank."""
    rows = [
        {"run_id": "titan", "source_group": "torchtitan", "measured_peak_mem_gb": "78.061"},
        {"run_id": "sweep", "source_group": "Ultra-Scale Playbook", "measured_peak_mem_gb": "19.5"},
        {"run_id": "blank", "source_group": "torchtitan", "measured_peak_mem_gb": ""},
    ]
    cols = {"model": "llama3-8b", "recompute": ""}
    pd.DataFrame([cols | r for r in rows]).to_csv(tmp_path / "runs.csv", index=False)
    peaks = load_training_runs(tmp_path / "runs.csv").set_index("run_id")["measured_peak_mem_gib"]
    assert float(peaks["titan"]) == pytest.approx(72.7, abs=0.001)  # its source's "72.7 GiB"
    assert float(peaks["sweep"]) == 19.5
    assert peaks["blank"] == ""
