"""Serving questions beyond one deployment on N GPUs: the colocated-vs-disaggregated summary
line, the fewest (and cheapest) GPUs for a target rate, a prefix-cache hit rate, speculative
decoding with an acceptance rate, and their bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_user_error
from helpers import run_cli as run
from rich.console import Console
from test_serving_continuous import inputs

from autoconfig import api
from autoconfig.cost.serving_sim import Limits, Trace, simulate
from autoconfig.cost.serving_step import step_model
from autoconfig.report import serving
from autoconfig.serve.features import tokens_per_step

SMALL = dict(
    model="llama3-8b",
    gpu="h100-sxm-80gb",
    max_num_seqs=(32, 128),
    max_num_batched_tokens=(2048,),
    requests=100,
    max_ttft_ms=400,
    max_tpot_ms=25,
)
# One deployment (tp1 x2, bf16 weights and K/V, 128 sequences): features compared on it alone.
ONE = dict(
    SMALL,
    gpus=2,
    max_num_seqs=(128,),
    precision="bf16",
    kv_precision="auto",
    disaggregation=False,
)
FLAGS = [
    "infer", "--model", "llama3-8b", "--max-num-seqs", "32", "--max-num-seqs", "128",
    "--max-num-batched-tokens", "2048", "--requests", "100", "--max-ttft-ms", "400",
    "--max-tpot-ms", "25",
]  # fmt: skip


def text_of(view: object) -> str:
    console = Console(width=400, record=True)
    console.print(view)
    return console.export_text()


def tp1(result: object) -> object:
    table = result.table  # type: ignore[attr-defined]
    return table[(table["tp"] == 1) & (table["pp"] == 1) & table["simulated"]].iloc[0]


# -- 1. colocated against disaggregated in one line --------------------------------------------


def test_the_summary_line_names_both_modes_and_the_winner(tmp_path: Path) -> None:
    result = api.infer(**SMALL, gpus=4)
    line = serving.mode_comparison(result)
    assert line is not None
    out = result.table
    best = {
        m: out[(out["mode"] == m) & out["meets"]].iloc[0] for m in ("colocated", "disaggregated")
    }
    assert line.startswith("colocated vs disaggregated: colocated ")
    assert "; disaggregated P tp" in line
    for row in best.values():
        assert f"{row['goodput_rps_per_gpu']:,.3f} req/s/GPU" in line
        assert f"TTFT p90 {row['ttft_p90_ms']:,.0f} ms" in line
        assert f"TPOT p90 {row['tpot_p90_ms']:,.1f} ms" in line
    a, b = (best[m]["goodput_rps_per_gpu"] for m in ("colocated", "disaggregated"))
    winner = "colocated" if a > b else "disaggregated"
    assert f"{winner} wins" in line
    assert f"{max(a, b) / min(a, b) - 1:.0%} more goodput per GPU" in line
    assert line in text_of(serving.terminal_view(result, 5))
    page = serving.render(result)
    assert "id='modes'" in page and "colocated vs disaggregated" in page
    # without disaggregated pools there is nothing to compare
    alone = api.infer(**SMALL, gpus=4, disaggregation=False)
    assert serving.mode_comparison(alone) is None
    assert "colocated vs disaggregated" not in text_of(serving.terminal_view(alone, 5))


def test_the_summary_line_reaches_the_command_and_best_json(tmp_path: Path) -> None:
    done = run(*FLAGS, "--gpus", "4", "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert "colocated vs disaggregated: colocated" in done.stdout
    best = json.loads((tmp_path / "r" / "best.json").read_text())
    assert "wins" in best["colocated_vs_disaggregated"]


# -- 2. the fewest GPUs for a rate, the cheapest GPU type ---------------------------------------


def test_the_fewest_gpus_meet_the_slos_and_the_next_smaller_count_does_not() -> None:
    found = api.infer_fewest_gpus("llama3-8b", "h100-sxm-80gb", 60.0, max_gpus=16, **_options())
    chosen = found.chosen
    assert chosen is not None and chosen.result is not None
    best = chosen.result.best
    assert best is not None and bool(best["meets"])
    assert best["rate_rps"] == pytest.approx(60.0)
    assert best["ttft_p90_ms"] <= 400 and best["tpot_p90_ms"] <= 25
    smaller = [c for c in found.tried if c.gpus < chosen.gpus]
    assert smaller and not any(c.meets for c in smaller)
    below = max(smaller, key=lambda c: c.gpus)
    assert below.result is not None and below.result.feasible == 0
    # the walk stops at the answer: nothing larger was searched
    assert max(c.gpus for c in found.tried) == chosen.gpus


def test_the_cheapest_gpu_type_by_price_else_by_count() -> None:
    types = ("h100-sxm-80gb", "a100-sxm-80gb")
    unpriced = api.infer_fewest_gpus("llama3-8b", types, 60.0, max_gpus=16, **_options())
    h100, a100 = (unpriced.answers[t] for t in types)
    assert h100 is not None and a100 is not None and h100.gpus < a100.gpus
    assert unpriced.chosen is h100 and not unpriced.priced
    # priced so that the A100s cost less per hour in all: they win
    price_h100 = a100.gpus * 1.0 / h100.gpus * 2.0
    priced = api.infer_fewest_gpus(
        "llama3-8b", types, 60.0, gpu_hour_usd=(price_h100, 1.0), max_gpus=16, **_options()
    )
    assert priced.chosen is not None and priced.chosen.gpu == "a100-sxm-80gb"
    assert priced.chosen.usd_per_hour == pytest.approx(a100.gpus * 1.0)
    assert "cheapest: " in serving.fewest_answer(priced)


def test_the_fewest_gpu_command_prints_the_counts_tried(tmp_path: Path) -> None:
    done = run(
        *FLAGS, "--gpu", "h100-sxm-80gb", "--request-rate", "60", "--max-gpus", "16",
        "--precision", "bf16", "--no-disaggregation", "--out", str(tmp_path / "f"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "GPU counts tried for 60 requests/s" in done.stdout
    assert "fewest GPUs: " in done.stdout and "yes (chosen)" in done.stdout
    counts = (tmp_path / "f" / "gpu_counts.csv").read_text().splitlines()
    assert counts[0].startswith("gpu,gpus,meets") and len(counts) >= 3
    assert "id='answer'" in (tmp_path / "f" / "report.html").read_text()
    # nothing up to the limit takes the rate: exit 1, said in a line
    short = run(*FLAGS, "--request-rate", "60", "--max-gpus", "2", "--no-disaggregation")
    assert short.returncode == 1, short.stderr
    assert "no GPU count tried (up to 2) takes 60 requests/s" in short.stdout


def _options() -> dict[str, object]:
    """The fast settings of SMALL, for the fewest-GPU search (one deployment kind)."""
    keep = {k: v for k, v in SMALL.items() if k not in ("model", "gpu")}
    return {**keep, "precision": "bf16", "disaggregation": False}


# -- 3. a prefix-cache hit rate -----------------------------------------------------------------


def test_a_higher_prefix_hit_rate_lowers_the_predicted_ttft() -> None:
    ttft = [
        tp1(api.infer(**ONE, request_rate=8.0, prefix_hit_rate=f))["ttft_p90_ms"]
        for f in (None, 0.5, 0.9)
    ]
    assert ttft[0] > ttft[1] > ttft[2]
    # and the steady-state capacity (less prefill per request) rises
    caps = [
        tp1(api.infer(**ONE, prefix_hit_rate=f))["max_load_requests_per_s"] for f in (None, 0.9)
    ]
    assert caps[1] > caps[0]


def test_cached_prompt_tokens_skip_prefill_compute_but_not_attention() -> None:
    """One request alone: the first token comes after the computed tokens' iteration, which
    attends to the cached prefix too; decoding reads the whole prompt."""
    s = inputs(model="llama3-8b", tp=1.0, precision="bf16", kv_precision="bf16")
    step = step_model(s)
    one = Limits(
        rate=np.ones(1),
        max_seqs=np.full(1, 16.0),
        max_tokens=np.full(1, 8192.0),
        kv_tokens=np.full(1, 1e6),
        block_tokens=np.full(1, 16.0),
        static=np.zeros(1),
        prefill_only=np.zeros(1),
        prompt_cached=np.zeros(1),
    )
    prompt, cached = 4000.0, 3000.0
    base = Trace(np.zeros(1), np.array([prompt]), np.array([2.0]))
    hit = Trace(np.zeros(1), np.array([prompt]), np.array([2.0]), np.array([cached]))
    t_base, t_hit = (simulate(step, tr, one).ttft[0, 0] for tr in (base, hit))
    computed = prompt - cached
    pairs = computed * (computed + 1) / 2 + computed * cached
    expected = step.stage(computed, pairs, computed, 0.0, 1.0)[0]
    assert t_hit == pytest.approx(expected, rel=1e-9)
    assert t_hit < t_base
    # the decode step after it reads the whole prompt's K/V and the first token
    tpot = simulate(step, hit, one).tpot[0, 0]
    assert tpot == pytest.approx(step.stage(1.0, 0.0, 0.0, prompt + 1.0, 1.0)[0], rel=1e-9)


# -- 4. speculative decoding --------------------------------------------------------------------


def test_tokens_per_step_follow_the_formula() -> None:
    for k, a in ((1, 0.5), (3, 0.7), (5, 0.9), (4, 0.0)):
        assert tokens_per_step(k, a) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    assert tokens_per_step(4, 1.0) == 5.0 and tokens_per_step(0, 0.9) == 1.0
    # more accepted tokens per step
    assert tokens_per_step(3, 0.8) > tokens_per_step(3, 0.6)


def test_a_request_takes_the_steps_the_acceptance_rate_gives() -> None:
    """One request alone decodes in 1 + ceil((O - 1) / E) iterations of K + 1 queries."""
    s = inputs(model="llama3-8b", tp=1.0, precision="bf16", kv_precision="bf16")
    step = step_model(s)
    out_len, k, a = 101.0, 3, 0.7
    e = tokens_per_step(k, a)
    trace = Trace(np.zeros(1), np.array([500.0]), np.array([out_len]))
    base = dict(
        rate=np.ones(1),
        max_seqs=np.full(1, 16.0),
        max_tokens=np.full(1, 8192.0),
        kv_tokens=np.full(1, 1e6),
        block_tokens=np.full(1, 16.0),
        static=np.zeros(1),
        prefill_only=np.zeros(1),
        prompt_cached=np.zeros(1),
    )
    plain = simulate(step, trace, Limits(**base))
    spec = simulate(
        step,
        trace,
        Limits(
            **base,
            queries_per_step=np.full(1, k + 1.0),
            tokens_per_step=np.full(1, e),
            draft_share=np.zeros(1),
        ),
    )
    assert plain.iterations[0] == out_len
    assert spec.iterations[0] == 1 + math.ceil((out_len - 1) / e)
    # each step verifies K + 1 tokens: dearer than a plain step, but fewer of them
    assert spec.tpot[0, 0] < plain.tpot[0, 0]


def test_a_higher_acceptance_rate_lowers_tpot_and_raises_capacity() -> None:
    rows = [
        tp1(api.infer(**ONE, request_rate=4.0, speculative_tokens=3, acceptance_rate=a))
        for a in (0.3, 0.6, 0.9)
    ]
    plain = tp1(api.infer(**ONE, request_rate=4.0))
    tpot = [r["tpot_p90_ms"] for r in rows]
    assert tpot[0] > tpot[1] > tpot[2]
    assert tpot[2] < plain["tpot_p90_ms"]
    caps = [r["max_load_requests_per_s"] for r in rows]
    assert caps[0] < caps[1] < caps[2]
    done = api.infer(**ONE, speculative_tokens=3, acceptance_rate=0.9)
    assert "3 draft tokens a step at acceptance 0.9" in done.features


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--prefix-hit-rate", "1"], ["prefix-hit-rate", "[0, 1)"]),
        (["--prefix-hit-rate", "-0.1"], ["prefix-hit-rate"]),
        (
            ["--speculative-tokens", "17", "--acceptance-rate", "0.5"],
            ["speculative-tokens", "0..16"],
        ),
        (
            ["--speculative-tokens", "3", "--acceptance-rate", "1.5"],
            ["acceptance-rate", "at most 1"],
        ),
        (["--speculative-tokens", "3"], ["speculative-tokens", "--acceptance-rate"]),
        (["--acceptance-rate", "0.5"], ["acceptance-rate", "--speculative-tokens"]),
        (
            [
                "--speculative-tokens",
                "2",
                "--acceptance-rate",
                "0.5",
                "--speculative-method",
                "medusa",
            ],
            ["speculative-method", "allowed: eagle, eagle3, mtp, ngram"],
        ),
        (["--request-rate", "5", "--max-gpus", "0"], ["max-gpus"]),
        (["--request-rate", "5", "--gpu-hour-usd", "-1"], ["gpu-hour-usd"]),
        (
            [
                "--request-rate",
                "5",
                "--gpu",
                "h100-sxm-80gb,a100-sxm-80gb",
                "--gpu-hour-usd",
                "1",
                "--gpu-hour-usd",
                "2",
                "--gpu-hour-usd",
                "3",
            ],
            ["gpu-hour-usd", "one per --gpu"],
        ),
        (["--gpu", "h100-sxm-80gb,a100-sxm-80gb", "--gpus", "2"], ["gpu", "leave out --gpus"]),
        (["--gpus", "2", "--max-gpus", "8"], ["max-gpus", "--gpus left out"]),
        ([], ["gpus", "--request-rate"]),
    ],
)
def test_bad_feature_flags_are_one_line(extra: list[str], needles: list[str]) -> None:
    assert_user_error(run(*FLAGS, *extra), *needles)


def test_emit_keeps_the_prefix_cache_on_when_a_hit_rate_was_predicted() -> None:
    """The launch flags run what was predicted: the prefix cache off without a hit rate, on
    (no --no-enable-prefix-caching / --disable-radix-cache) with one."""
    from autoconfig import api
    from autoconfig.report.serving_flags import launch_flags
    from autoconfig.spec.vocab import Engine

    args = ("llama3-8b", 8, "h100-sxm-80gb")
    plain = api.infer(*args, requests=100, disaggregation=False)
    cached = api.infer(*args, requests=100, disaggregation=False, prefix_hit_rate=0.5)
    assert "--no-enable-prefix-caching" in launch_flags(plain, Engine.VLLM)
    assert "--no-enable-prefix-caching" not in launch_flags(cached, Engine.VLLM)
    assert "--disable-radix-cache" not in launch_flags(cached, Engine.SGLANG)
    assert "enable_block_reuse: true" in launch_flags(cached, Engine.TRTLLM)
