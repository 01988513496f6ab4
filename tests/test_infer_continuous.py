"""`autoconfig infer` with continuous batching: goodput within SLOs, a requested rate, the
workload file, disaggregation, launch flags, bad input, and the accuracy on the published
in-flight points."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api

SMALL = dict(
    model="llama3-8b",
    gpu="h100-sxm-80gb",
    gpus=2,
    max_num_seqs=(32, 128),
    max_num_batched_tokens=(2048,),
    requests=100,
)
FLAGS = [
    "infer", "--model", "llama3-8b", "--gpus", "2", "--max-num-seqs", "32",
    "--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--requests", "100",
]  # fmt: skip


def test_goodput_within_the_slos_ranked_per_gpu() -> None:
    result = api.infer(**SMALL, max_ttft_ms=400, max_tpot_ms=25)
    out = result.table
    meets = out[out["meets"]]
    assert len(meets) == result.feasible > 0
    assert (meets["ttft_p90_ms"] <= 400).all() and (meets["tpot_p90_ms"] <= 25).all()
    assert (meets["goodput_rps"] > 0).all()
    per_gpu = meets["goodput_rps_per_gpu"].to_numpy()
    assert (per_gpu[:-1] >= per_gpu[1:]).all()
    assert meets["rank"].tolist() == list(range(1, len(meets) + 1))
    # every colocated deployment uses all GPUs in identical replicas
    colocated = out[out["mode"] == "colocated"]
    assert ((colocated["tp"] * colocated["pp"] * colocated["replicas"]) == 2).all()
    # the analytic maximum bounds what the simulation found
    together = meets[meets["mode"] == "colocated"]
    assert (together["goodput_rps"] <= together["max_load_requests_per_s"] * 1.0001).all()
    tighter = api.infer(**SMALL, max_ttft_ms=400, max_tpot_ms=12)
    assert tighter.table.iloc[0]["goodput_rps"] <= out.iloc[0]["goodput_rps"]


def test_a_rate_nothing_can_take_names_the_closest(tmp_path: Path) -> None:
    result = api.infer(**SMALL, max_ttft_ms=300, max_tpot_ms=30, request_rate=10_000)
    assert result.feasible == 0
    assert "capacity" in result.table.iloc[0]["pruned"]
    # the closest is the deployment that fits and takes the most requests/s
    fit = result.table[result.table["fits"].fillna(False).astype(bool)]
    most = fit.loc[fit["max_load_requests_per_s"].idxmax()]
    assert result.closest.endswith(most["pruned"]) and "capacity" in result.closest
    done = run(*FLAGS, "--max-ttft-ms", "300", "--max-tpot-ms", "30", "--request-rate", "10000")
    assert done.returncode == 1, done.stderr
    assert "nothing meets the budget; closest: tp" in done.stdout


def test_a_rate_that_fits_reports_its_percentiles(tmp_path: Path) -> None:
    result = api.infer(**SMALL, max_ttft_ms=1000, max_tpot_ms=40, request_rate=2.0)
    best = result.best
    assert best is not None
    assert best["rate_rps"] == pytest.approx(2.0)
    assert best["ttft_p50_ms"] <= best["ttft_p90_ms"] <= best["ttft_p99_ms"]
    assert best["tpot_p90_ms"] <= 40 and best["goodput_rps"] >= 2.0


def test_emit_launch_flags_match_the_best(tmp_path: Path) -> None:
    done = run(
        *FLAGS, "--max-ttft-ms", "500", "--max-tpot-ms", "30", "--emit", "vllm",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    best = json.loads((tmp_path / "r" / "best.json").read_text())["best"]
    text = done.stdout
    assert "workload: typical chat" in text
    if best["mode"] == "colocated":
        assert f"--tensor-parallel-size {best['tp']}" in text
        assert f"--max-num-seqs {best['max_num_seqs']}" in text
        assert f"--max-num-batched-tokens {best['max_num_batched_tokens']}" in text
    assert ("--kv-cache-dtype fp8" in text) == (best["kv_precision"] == "fp8")
    page = (tmp_path / "r" / "report.html").read_text()
    assert "goodput" in page and "typical chat" in page
    for engine, needle in (("sglang", "--max-running-requests"), ("trtllm", "--max_batch_size")):
        other = run(*FLAGS, "--max-ttft-ms", "500", "--max-tpot-ms", "30", "--emit", engine)
        assert other.returncode == 0 and needle in other.stdout, other.stderr


def test_disaggregated_pools_are_candidates() -> None:
    # Long prompts, short answers: the case prefill/decode separation is made for.
    result = api.infer(
        **{**SMALL, "gpus": 4}, input_len=4000, output_len=64, max_ttft_ms=2000, max_tpot_ms=20
    )
    split = result.table[result.table["mode"] == "disaggregated"]
    assert len(split) > 0
    row = split.iloc[0]
    gpus = row["prefill_tp"] * row["prefill_pp"] * row["prefill_replicas"]
    gpus += row["tp"] * row["pp"] * row["replicas"]
    assert gpus <= 4 and row["kv_transfer_ms"] > 0
    assert row["goodput_rps"] > 0
    none = api.infer(**{**SMALL, "gpus": 4}, max_tpot_ms=20, disaggregation=False)
    assert (none.table["mode"] == "colocated").all()


def test_workload_file_and_its_bad_rows(tmp_path: Path) -> None:
    good = tmp_path / "w.csv"
    pd.DataFrame({"input_len": [100, 900, 3000] * 20, "output_len": [50, 200, 400] * 20}).to_csv(
        good, index=False
    )
    done = run(*FLAGS[:-2], "--workload", str(good), "--max-tpot-ms", "30")
    assert done.returncode == 0, done.stderr
    assert "workload: w.csv: input sampled from 60 lengths" in done.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("input_len,output_len\n100,50\n200,x\n")
    assert_user_error(run(*FLAGS, "--workload", str(bad)), "workload", "row 3", "output_len")
    trace = tmp_path / "trace.csv"
    trace.write_text("input_len,output_len,arrival_s\n100,50,0\n200,40,0.5\n300,30,0.2\n")
    assert_user_error(run(*FLAGS, "--workload", str(trace)), "arrival_s")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--max-tpot-ms", "0"], ("max-tpot-ms", "positive")),
        (["--percentile", "100"], ("percentile",)),
        (["--request-rate", "-1"], ("request-rate",)),
        (["--input-len", "10:5"], ("input-len", "LOW:HIGH")),
        (["--precision", "nvfp4"], ("precision", "nvfp4")),
        (["--batching", "dynamic"], ("batching",)),
        (["--model", "llama3-70b", "--gpus", "1", "--precision", "bf16"], ("gpus", "at least")),
    ],
)
def test_bad_input_is_one_line(args: list[str], needles: tuple[str, ...]) -> None:
    assert_user_error(run(*FLAGS, *args), *needles)


def test_published_inflight_accuracy(reference: Path) -> None:
    """The max-load model on TensorRT-LLM's published points: the issue's targets, the
    held-out third apart."""
    from autoconfig.calibrate.serving_validation import (
        inflight_table,
        load_inference_runs,
        predictions,
    )

    table = inflight_table(predictions(load_inference_runs())).set_index("group")
    for group in ("ALL", "held-out (not fitted)"):
        assert table.loc[group, "median APE %"] <= 15.0
        assert table.loc[group, "within ±20% %"] >= 70.0
