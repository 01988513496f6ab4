"""Serving answers that read wrong: a disaggregated winner's launch flags (a NaN memory
fraction, the decode server's batch limit on the prefill server), a goodput silently capped
below the steady-state maximum, never-simulated candidates showing a measured-looking zero, a
measured trial that misses the SLOs classed "ok", the quantisation caveat on an fp32 report,
and the full plotly.js in the serving report."""

from __future__ import annotations

import csv
import html
import io
import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from helpers import run_cli
from rich.console import Console

from autoconfig import api
from autoconfig.measure import serving as measured_serving
from autoconfig.measure import session, summary
from autoconfig.measure.session import MeasureOptions
from autoconfig.report import serving
from autoconfig.report.measured import measured_view
from autoconfig.report.serving_flags import launch_flags
from autoconfig.serve.result import ServingResult
from autoconfig.spec.vocab import Engine
from autoconfig.trainer.serve_loop import LOAD_ENV

# Long prompts, short answers on 4 GPUs: disaggregated pools win, and pools pair layouts of
# different running-batch limits.
DISAGGREGATED = dict(
    model="llama3-8b",
    gpu="h100-sxm-80gb",
    gpus=4,
    max_num_seqs=(16, 128),
    max_num_batched_tokens=(2048,),
    requests=40,
    input_len=4000,
    output_len=64,
    max_ttft_ms=2000,
    max_tpot_ms=20,
)
DISAGGREGATED_FLAGS = [
    "infer", "--model", "llama3-8b", "--gpus", "4", "--max-num-seqs", "16", "--max-num-seqs",
    "128", "--max-num-batched-tokens", "2048", "--requests", "40", "--input-len", "4000",
    "--output-len", "64", "--max-ttft-ms", "2000", "--max-tpot-ms", "20",
]  # fmt: skip
# A small CPU deployment in fp32 (what `infer --device cpu` searches).
CPU = dict(
    model="tiny-llama",
    gpus=2,
    gpu="cpu-gloo",
    requests=20,
    precision="fp32",
    input_len="16:64",
    output_len="8:16",
)
SMALL = dict(
    model="llama3-8b",
    gpu="h100-sxm-80gb",
    gpus=2,
    max_num_seqs=(32, 128),
    max_num_batched_tokens=(2048,),
    requests=40,
)
BATCH_FLAG = {
    Engine.VLLM: "--max-num-seqs",
    Engine.SGLANG: "--max-running-requests",
    Engine.TRTLLM: "--max_batch_size",
}
SHARE_FLAG = {
    Engine.VLLM: "--gpu-memory-utilization",
    Engine.SGLANG: "--mem-fraction-static",
    Engine.TRTLLM: "--kv_cache_free_gpu_memory_fraction",
}
POOLS = re.compile(r"^prefill .*? seqs (\d+) tokens \d+ x\d+ \+ decode .*? seqs (\d+) tokens")


@pytest.fixture(scope="module")
def split() -> ServingResult:
    result = api.infer(**DISAGGREGATED)
    assert result.best is not None and result.best["mode"] == "disaggregated"
    return result


def _winning(result: ServingResult, row: int) -> ServingResult:
    """The result with table row `row` moved first, so --emit prints it."""
    order = [row, *(i for i in range(len(result.table)) if i != row)]
    return replace(result, table=result.table.iloc[order].reset_index(drop=True))


def _servers(text: str) -> dict[str, str]:
    """The prefill and the decode server's lines of a disaggregated launch."""
    prefill, _, decode = text.partition("# decode:")
    assert "# prefill:" in prefill and decode, text
    return {"prefill": prefill.split("# prefill:", 1)[1], "decode": decode}


def _text(view: object) -> str:
    console = Console(file=io.StringIO(), width=400)
    console.print(view)
    return console.file.getvalue()


# -- 1. the memory fraction of each disaggregated server is a number ------------------------


def test_disaggregated_memory_fraction_is_a_share_per_server(split: ServingResult) -> None:
    rows = np.flatnonzero((split.table["mode"] == "disaggregated").to_numpy())
    for i in rows:
        for engine in Engine:
            text = launch_flags(_winning(split, int(i)), engine)
            assert "nan" not in text.lower(), text
            for role, lines in _servers(text).items():
                found = re.findall(rf"{SHARE_FLAG[engine]} (\S+)", lines)
                assert len(found) == 1, (role, lines)
                share = float(found[0])
                assert 0 < share <= 1, (engine, role, share)
            if engine is Engine.TRTLLM:  # the K/V share of free memory asked for
                assert re.findall(r"--kv_cache_free_gpu_memory_fraction (\S+)", text) == [
                    "0.9",
                    "0.9",
                ]
    done = run_cli(*DISAGGREGATED_FLAGS, "--emit", "trtllm")
    assert done.returncode == 0, done.stderr
    assert "# prefill:" in done.stdout and "fraction nan" not in done.stdout
    assert done.stdout.count("--kv_cache_free_gpu_memory_fraction 0.9") == 2


# -- 2. the prefill server carries its own batch limit ----------------------------------------


def test_prefill_server_carries_its_own_batch_limit(split: ServingResult) -> None:
    table = split.table
    rows = np.flatnonzero((table["mode"] == "disaggregated").to_numpy())
    for i in rows:
        pools = POOLS.match(str(table.iloc[i]["label"]))  # each pool as it was simulated
        assert pools, table.iloc[i]["label"]
        want = {"prefill": int(pools.group(1)), "decode": int(pools.group(2))}
        for engine in Engine:
            servers = _servers(launch_flags(_winning(split, int(i)), engine))
            for role, lines in servers.items():
                found = re.findall(rf"{BATCH_FLAG[engine]} (\d+)", lines)
                assert [int(v) for v in found] == [want[role]], (engine, role, lines)
        assert int(table.iloc[i]["prefill_max_num_seqs"]) == want["prefill"]  # kept in the row
    # Pools of different running-batch limits: each server carries its own.
    first = _winning(split, int(rows[0]))
    decode_seqs = int(first.table.iloc[0]["max_num_seqs"])
    first.table.loc[0, "prefill_max_num_seqs"] = 2 * decode_seqs + 1
    for engine in Engine:
        servers = _servers(launch_flags(first, engine))
        for role, seqs in (("prefill", 2 * decode_seqs + 1), ("decode", decode_seqs)):
            found = re.findall(rf"{BATCH_FLAG[engine]} (\d+)", servers[role])
            assert [int(v) for v in found] == [seqs], (engine, role, servers[role])


# -- 3. goodput is not capped at the top of the ladder ----------------------------------------


def test_goodput_extends_the_ladder_to_the_steady_state_maximum() -> None:
    # No limits: every rate meets them, up to what the deployment sustains.
    loose = api.infer(**SMALL, disaggregation=False)
    sim = loose.table[loose.table["simulated"]]
    assert len(sim) > 0
    np.testing.assert_allclose(sim["goodput_rps"], sim["max_load_requests_per_s"], rtol=1e-9)
    assert sim["goodput_at_ladder_top"].all()
    cell = serving.row_cells(sim.iloc[0], loose.request.percentile)["goodput req/s total"]
    assert cell.startswith("≥"), cell
    assert "≥" in _text(serving.terminal_view(loose, 5))
    # Disaggregated pools that met the limits at their highest rate tried say so too.
    pools = api.infer(**SMALL).table
    pools = pools[pools["mode"] == "disaggregated"]
    assert len(pools) and pools["goodput_at_ladder_top"].all()
    assert pools["goodput_status"].str.startswith("lower bound").all()
    # Limits that bind: the goodput lies below the maximum and is not marked.
    tight = api.infer(**SMALL, disaggregation=False, max_ttft_ms=300, max_tpot_ms=12)
    sim = tight.table[tight.table["simulated"]]
    below = sim["goodput_rps"] < sim["max_load_requests_per_s"] * (1 - 1e-9)
    assert below.any() and not sim.loc[below, "goodput_at_ladder_top"].any()
    assert sim["goodput_at_ladder_top"].dtype == bool


# -- 4. never simulated: no goodput, and why --------------------------------------------------


def test_unsimulated_candidates_show_no_goodput_and_say_why(tmp_path: Path) -> None:
    result = api.infer(**SMALL, max_ttft_ms=400, max_tpot_ms=25)
    serving.write(result, tmp_path)
    with (tmp_path / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    unsimulated = [r for r in rows if r["simulated"] == "False"]
    simulated = [r for r in rows if r["simulated"] == "True"]
    assert unsimulated and simulated
    for r in unsimulated:
        assert r["goodput_rps"] == "" and r["goodput_rps_per_gpu"] == "", r
        assert r["goodput_status"].startswith("not simulated: "), r["goodput_status"]
        assert len(r["goodput_status"]) > len("not simulated: ")
    assert any("steady-state" in r["goodput_status"] for r in unsimulated)
    for r in simulated:
        assert r["goodput_rps"] != "" and float(r["goodput_rps"]) >= 0
        assert not r["goodput_status"].startswith("not simulated")


# -- 5. a measured trial that misses the SLOs is not "ok" ------------------------------------


def test_measured_trial_missing_the_slos_has_its_own_class(tmp_path: Path, monkeypatch) -> None:
    served = api.infer(**CPU, max_ttft_ms=1000, max_tpot_ms=100, max_latency_ms=5000)
    within = {"ttft": 20.0, "tpot": 5.0, "latency": 200.0}
    # trial 0 within every limit; 1 misses TTFT at p90 only; 2 misses the latency at p90
    measured_p90 = [within, {**within, "ttft": 4000.0}, {**within, "latency": 9000.0}]

    def fake_measure(cands, opts, settings, device, fingerprint, what):
        keys = cands.runnable()["key"].tolist()[: len(measured_p90)]
        assert len(keys) == len(measured_p90)
        rows, attrs = [], []
        for n, (key, p90) in enumerate(zip(keys, measured_p90, strict=True)):
            folder = tmp_path / f"trial{n}"
            folder.mkdir()
            serve = {
                f"{m}_p{q}_ms": p90[m] * {50: 0.5, 90: 1.0, 99: 1.2}[q]
                for m in ("ttft", "tpot", "latency")
                for q in (50, 90, 99)
            }
            (folder / "rank0.json").write_text(json.dumps({"serve": serve}))
            label = cands.by_key(key)["label"]
            rows.append(
                {
                    **dict.fromkeys(summary.COLUMNS),
                    "trial": n,
                    "state": "complete",
                    "class": "ok",
                    "key": key,
                    "layout": label,
                    "source": "analytical top-k",
                    "analytical_rank": n + 1,
                    "pred_tokens_per_s_per_gpu": 100.0,
                    "measured_tokens_per_s_per_gpu": 90.0,
                    "error_pct": 11.1,
                    "reason": "",
                    "run_dir": str(folder),
                }
            )
            attrs.append(SimpleNamespace(number=n, user_attrs={}))
        trials = pd.DataFrame(rows, columns=summary.COLUMNS)
        study = SimpleNamespace(get_trials=lambda deepcopy=False: attrs)
        return trials, summary.ranking(cands, trials), study

    monkeypatch.setattr(session, "measure", fake_measure)
    monkeypatch.delenv(LOAD_ENV, raising=False)
    opts = MeasureOptions(out=tmp_path / "m", device="cpu", trials=3, steps=2, warmup=1)
    measured = measured_serving.run(served, "tiny-llama", "cpu-gloo", opts)
    trials = measured.trials.set_index("trial")
    assert trials.loc[0, "class"] == "ok"
    assert trials.loc[1, "class"] == "missed_slo"
    assert "TTFT p90" in trials.loc[1, "reason"] and "1,000" in trials.loc[1, "reason"]
    assert trials.loc[2, "class"] == "missed_slo"
    assert "latency p90" in trials.loc[2, "reason"]
    assert measured.counts() == {"ok": 1, "missed_slo": 2}
    ranking = measured.ranking.set_index("key")
    assert ranking.loc[trials.loc[1, "key"], "class"] == "missed_slo"
    # the one that met the limits ranks above those that missed them
    ranked = measured.ranking[measured.ranking["class"] != ""]
    assert ranked.iloc[0]["class"] == "ok"
    assert measured.summary()["by_class"] == {"ok": 1, "missed_slo": 2}
    assert "missed_slo" in _text(measured_view(measured, 10))
    # every trial missing them: no trial succeeded, and the summary says why
    measured_p90[0] = {**within, "tpot": 500.0}
    for n in range(3):
        (tmp_path / f"trial{n}" / "rank0.json").unlink()
        (tmp_path / f"trial{n}").rmdir()
    missed = measured_serving.run(served, "tiny-llama", "cpu-gloo", opts)
    assert set(missed.trials["class"]) == {"missed_slo"} and not missed.any_ok
    assert any("limits" in line for line in missed.diagnosis()), missed.diagnosis()


# -- 6. the quantisation caveat only for quantised deployments --------------------------------


def test_quantisation_caveat_only_where_a_quantised_format_is_shown(tmp_path: Path) -> None:
    caveat = html.escape(serving.QUANTISATION_CAVEAT)  # as the page writes it
    cpu = api.infer(**CPU)
    assert set(cpu.table["precision"]) == {"fp32"}
    assert caveat not in serving.render(cpu)
    assert serving.QUANTISATION_CAVEAT not in _text(serving.terminal_view(cpu, 5))
    one = dict(SMALL, gpus=1, max_num_seqs=(32,), requests=20, disaggregation=False)
    plain = api.infer(**one, precision="bf16", kv_precision="auto")
    assert caveat not in serving.render(plain)
    fp8_kv = api.infer(**one, precision="bf16", kv_precision="fp8")
    assert set(fp8_kv.table["kv_precision"]) == {"fp8"}
    assert caveat in serving.render(fp8_kv)
    assert "accuracy: fp8" in _text(serving.terminal_view(fp8_kv, 5))


# -- 7. the serving report embeds the basic plotly bundle, once --------------------------------


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_serving_report_embeds_the_basic_bundle_once(tmp_path: Path, batching: str) -> None:
    lengths = {"input_len": 32, "output_len": 8} if batching == "static" else {}
    result = api.infer(**{**CPU, **lengths}, batching=batching)
    serving.write(result, tmp_path)
    page = tmp_path / "report.html"
    assert page.stat().st_size < 1.5e6, page.stat().st_size
    text = page.read_text()
    assert text.count("plotly.js (basic") == 1
    assert text.count("* plotly.js v") == 0  # the full library's banner
    assert text.count("Plotly.newPlot") >= 1


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_serving_report_draws_with_the_basic_bundle(tmp_path: Path, batching: str) -> None:
    """The basic bundle holds what the serving figures use (scatter traces, subplots, the
    limit lines): headless Chromium draws the figure with no script error and no fetch."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    lengths = {"input_len": 32, "output_len": 8} if batching == "static" else {}
    limits = {"max_latency_ms": 1000} if batching == "static" else {"max_tpot_ms": 100}
    serving.write(api.infer(**{**CPU, **lengths}, batching=batching, **limits), tmp_path / "r")
    done = subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom",
            (tmp_path / "r" / "report.html").resolve().as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r'id="plot0"[^>]*class="[^"]*js-plotly-plot', done.stdout)
    assert done.stdout.count('class="main-svg"') >= 1
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
