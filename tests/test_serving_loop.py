"""The bundled generator's continuous-batching loop: one flat iteration of prompt chunks and
decodes reproduces the full forward pass, and a trace served end to end reports percentiles
and a throughput consistent with its own timings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from autoconfig.cost.serving_sim import poisson_arrivals
from autoconfig.trainer.config import make_config
from autoconfig.trainer.launch import launch_local
from autoconfig.trainer.model import Transformer
from autoconfig.trainer.serve_loop import LOAD_ENV, Chunk, ServeLoad, SlotCache, iteration


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])  # rotary+GQA, learned+MHA
def test_mixed_iterations_match_the_full_forward(model: str) -> None:
    cfg = make_config(model=model, task="generate", input_len=12, output_len=6, seq_len=24)
    spec = cfg.spec()
    net = Transformer(spec, 24)
    net.init_weights(5)
    net.eval()
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, spec.vocab, (1, 24), generator=gen)
    b = torch.randint(0, spec.vocab, (1, 24), generator=gen)
    with torch.no_grad():
        full_a, full_b = net(a)[0], net(b)[0]
    caches = [SlotCache((3, spec.kv, 24, spec.dhead), torch.float32, "cpu") for _ in net.layers]
    none = torch.zeros(0, dtype=torch.long)
    # Iteration 1: a's prompt in two chunks would not fit one budget: its first 7 tokens.
    iteration(net, caches, [Chunk(2, 0, a[:, :7])], none, none, none)
    # Iteration 2: the rest of a's prompt and all of b's, in one flat batch.
    chunks = [Chunk(2, 7, a[:, 7:12]), Chunk(0, 0, b[:, :10])]
    logits = iteration(net, caches, chunks, none, none, none)
    torch.testing.assert_close(logits[0], full_a[11], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[1], full_b[9], rtol=1e-4, atol=1e-4)
    # Then both decode together at their own positions, beside nothing else.
    for step in range(4):
        slots = torch.tensor([2, 0])
        positions = torch.tensor([12 + step, 10 + step])
        tokens = torch.stack([a[0, 12 + step], b[0, 10 + step]])
        logits = iteration(net, caches, [], slots, tokens, positions)
        torch.testing.assert_close(logits[0], full_a[12 + step], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(logits[1], full_b[10 + step], rtol=1e-4, atol=1e-4)


def test_a_trace_served_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = 30
    rng = np.random.default_rng(0)
    inputs = rng.integers(8, 64, r).tolist()
    outputs = rng.integers(2, 20, r).tolist()
    load = {
        "arrivals": poisson_arrivals(r, 0).tolist(),
        "inputs": inputs,
        "outputs": outputs,
        "layouts": {ServeLoad.key(1, 8): {"rate": 30.0, "max_tokens": 64}},
    }
    monkeypatch.setenv(LOAD_ENV, json.dumps(load))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = make_config(
        model="tiny-llama", task="generate", mbs=8, input_len=max(inputs),
        output_len=max(outputs), seq_len=max(inputs) + max(outputs), steps=2, warmup=1,
        device="cpu",
    )  # fmt: skip
    code, metrics = launch_local(cfg, tmp_path)
    assert code == 0, metrics.message
    serve = json.loads((tmp_path / "rank0.json").read_text())["serve"]
    assert serve["requests"] == r and serve["counted"] == r - 3
    for m in ("ttft", "tpot", "latency"):
        assert 0 < serve[f"{m}_p50_ms"] <= serve[f"{m}_p90_ms"] <= serve[f"{m}_p99_ms"]
    # metrics.json's throughput is the trace's output tokens over its makespan
    assert metrics.tokens_per_s_per_gpu == pytest.approx(sum(outputs) / serve["makespan_s"])
    assert metrics.ttft_ms == pytest.approx(serve["ttft_p90_ms"])
    records = json.loads((tmp_path / "rank0.json").read_text())["iterations"]
    assert sum(rec[0] for rec in records) == sum(inputs)  # every prompt token once
    assert len(records) == serve["iterations"]


@pytest.mark.slow
def test_measured_goodput_search_end_to_end(tmp_path: Path) -> None:
    """The best simulated deployments serve the simulated trace through the study: measured
    TTFT/TPOT percentiles land beside the simulated ones; layouts the generator cannot run
    are recorded as invalid with their reason."""
    import subprocess
    import sys

    import pandas as pd

    out = tmp_path / "goodput"
    done = subprocess.run(
        [
            sys.executable, "-m", "autoconfig.cli", "infer", "--model", "tiny-llama",
            "--gpus", "2", "--device", "cpu", "--measure", "--max-ttft-ms", "500",
            "--max-tpot-ms", "80", "--input-len", "16:64", "--output-len", "4:16",
            "--requests", "40", "--max-num-seqs", "8", "--max-num-batched-tokens", "128",
            "--trials", "2", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv")
    ok = trials[trials["class"] == "ok"]
    assert len(ok) >= 1
    for m in ("ttft", "tpot"):
        assert (ok[f"measured_{m}_p90_ms"] > 0).all() and (ok[f"pred_{m}_p90_ms"] > 0).all()
        assert (ok[f"measured_{m}_p50_ms"] <= ok[f"measured_{m}_p99_ms"]).all()
    assert "req/s" in ok.iloc[0]["layout"]
    refused = trials[trials["class"] == "invalid"]
    assert refused["reason"].astype(str).str.startswith("pp:").all()
