"""`autoconfig infer`: the serving search, its budgets and answers, batch mode and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.base.errors import UserError

LLAMA = dict(
    model="llama2-70b",
    gpu="h100-sxm-80gb",
    gpus=8,
    input_len=2048,
    output_len=256,
    batching="static",
)


def test_search_respects_the_budget_and_ranks_by_throughput() -> None:
    result = api.infer(**LLAMA, max_ttft_ms=1000, max_tpot_ms=50)
    out = result.table
    meets = out[out["meets"]]
    assert len(meets) == result.feasible > 0
    assert (meets["pred_ttft_ms"] <= 1000).all() and (meets["pred_tpot_ms"] <= 50).all()
    assert meets["pred_fits"].astype(bool).all()
    tput = meets["pred_output_tokens_per_s_per_gpu"].to_numpy()
    assert (tput[:-1] >= tput[1:]).all()
    assert meets["rank"].tolist() == list(range(1, len(meets) + 1))
    # every layout uses all GPUs, in replicas of tp*pp
    assert ((out["tp"] * out["pp"] * out["replicas"]) == 8).all()
    # the misses say why
    missed = out[~out["meets"]]
    assert missed["pruned"].str.match(r"^(memory|TTFT|TPOT)").all()
    # a tighter budget keeps a subset
    tight = api.infer(**LLAMA, max_ttft_ms=300, max_tpot_ms=50)
    assert 0 < tight.feasible < result.feasible


def test_latency_objective_and_pareto_front() -> None:
    out = api.infer(**LLAMA, objective="latency").table
    meets = out[out["meets"]]
    lat = meets["pred_latency_ms"].to_numpy()
    assert (lat[:-1] <= lat[1:]).all()
    front = meets[meets["pareto"]]
    assert len(front) >= 2
    # no fitting point beats a front point on both axes
    for _, p in front.iterrows():
        better = meets[
            (meets["pred_latency_ms"] < p["pred_latency_ms"])
            & (meets["pred_output_tokens_per_s_per_gpu"] > p["pred_output_tokens_per_s_per_gpu"])
        ]
        assert better.empty
    # and every point off the front is beaten by one on it
    for _, p in meets[~meets["pareto"]].head(30).iterrows():
        assert (
            (front["pred_latency_ms"] <= p["pred_latency_ms"])
            & (front["pred_output_tokens_per_s_per_gpu"] >= p["pred_output_tokens_per_s_per_gpu"])
        ).any()


def test_nothing_meets_the_budget_names_the_closest_point(tmp_path: Path) -> None:
    out = api.infer(**LLAMA, max_ttft_ms=5)
    assert out.feasible == 0
    assert "TTFT" in out.closest and "vs 5" in out.closest
    result = run(
        "infer", "--model", "llama2-70b", "--gpu", "h100-sxm-80gb", "--gpus", "8",
        "--input-len", "2048", "--output-len", "256", "--max-ttft-ms", "5",
        "--batching", "static",
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "nothing meets the budget; closest: tp" in result.stdout
    assert (tmp_path / "r" / "report.html").exists()


def test_gpt3_175b_serving_report(tmp_path: Path) -> None:
    result = run(
        "infer", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "16",
        "--input-len", "60", "--output-len", "20", "--max-latency-ms", "1500",
        "--batching", "static", "--out", str(tmp_path / "serve175"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "TTFT ms" in result.stdout and "tok/s/GPU" in result.stdout
    results = pd.read_csv(tmp_path / "serve175" / "results.csv")
    meets = results[results["meets"]]
    assert (meets["pred_latency_ms"] <= 1500).all() and len(meets) > 0
    assert set(results["tp"] * results["pp"] * results["replicas"]) == {16}
    best = json.loads((tmp_path / "serve175" / "best.json").read_text())["best"]
    assert best["pred_output_tokens_per_s_per_gpu"] == pytest.approx(
        meets["pred_output_tokens_per_s_per_gpu"].max()
    )
    page = (tmp_path / "serve175" / "report.html").read_text()
    assert "Pareto front" in page and "latency" in page
    assert not re.search(r"<script[^>]*\bsrc=", page)  # self-contained: no fetched scripts


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--max-ttft-ms", "-5"], ("max-ttft-ms", "positive")),
        (["--max-tpot-ms", "0"], ("max-tpot-ms", "positive")),
        (["--input-len", "4000", "--output-len", "200"], ("input-len", "4096")),
        (["--gpus", "1", "--precision", "bf16"], ("gpus", "does not fit", "needs at least 2 GPUs")),
        (["--precision", "fp8", "--gpu", "a100-sxm-80gb"], ("precision", "fp8")),
        (["--model", "llama2-70x"], ("llama2-70b",)),
        (["--gpu", "h900"], ("gpu",)),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needles: tuple[str, ...]) -> None:
    base = {
        "--model": "llama2-70b", "--gpu": "h100-sxm-80gb", "--gpus": "8",
        "--input-len": "1024", "--output-len": "128",
    }  # fmt: skip
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    flat = [x for pair in base.items() for x in pair]
    assert_user_error(run("infer", *flat), *needles)


def test_min_gpus_message_counts_the_smallest_split() -> None:
    with pytest.raises(UserError, match=r"needs at least 5 GPUs \(tp1 pp5\)"):
        api.infer("gpt3-175b", 2, "a100-sxm-80gb", input_len=60, output_len=20, batching="static")


def test_batch_mode_over_the_reference_table(tmp_path: Path, reference: Path) -> None:
    frame = pd.read_csv(reference / "inference_runs.csv", dtype=str, keep_default_na=False)
    # Static batches: in-flight points name no batch (their model is the serving issue's).
    frame = frame[frame["batching"] != "inflight"].reset_index(drop=True)
    frame.loc[3, "batch_size"] = "-1"
    frame.loc[5, "tp"] = "5"
    bad = tmp_path / "points.csv"
    frame.to_csv(bad, index=False)
    result = run("infer", "--runs", str(bad), "--out", str(tmp_path / "pred.csv"))
    assert result.returncode == 0, result.stderr
    out = pd.read_csv(tmp_path / "pred.csv", keep_default_na=False)
    assert list(out.columns[: len(frame.columns)]) == list(frame.columns)
    for col in (
        "pred_ttft_ms", "pred_tpot_ms", "pred_latency_ms",
        "pred_output_tokens_per_s_per_gpu", "pred_fits", "error",
    ):  # fmt: skip
        assert col in out.columns
    assert out.at[3, "error"].startswith("batch_size:")
    assert out.at[5, "error"].startswith("tp:")
    ok = out[out["error"] == ""]
    assert len(ok) == len(frame) - 2
    assert (pd.to_numeric(ok["pred_latency_ms"]) > 0).all()
    missing = run("infer", "--runs", str(tmp_path / "nope.csv"))
    assert_user_error(missing, "runs", "no such file")


def test_infer_announces_the_default_gpu_it_used() -> None:
    """Defaults are printed when used, in one stderr line, as in every command."""
    args = ("infer", "--model", "llama3-8b", "--gpus", "1", "--batching", "static")
    lengths = ("--input-len", "512", "--output-len", "64")
    used = run(*args, *lengths)
    assert used.returncode == 0, used.stderr
    assert "defaults (a flag changes each): gpu h100-sxm-80gb" in used.stderr
    given = run(*args, *lengths, "--gpu", "h100-sxm-80gb")
    assert given.returncode == 0 and "defaults" not in given.stderr
