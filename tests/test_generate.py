"""The bundled generator: its K/V cache reproduces the full forward pass, tensor parallelism
generates the same tokens, and measured serving trials run through the study end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from autoconfig.trainer.config import make_config
from autoconfig.trainer.generate import KVCache, forward
from autoconfig.trainer.launch import launch_local
from autoconfig.trainer.model import Transformer


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])  # rotary+GQA, learned+MHA
def test_cached_decoding_matches_the_full_forward(model: str) -> None:
    cfg = make_config(model=model, task="generate", input_len=12, output_len=6, seq_len=18)
    spec = cfg.spec()
    net = Transformer(spec, 18)
    net.init_weights(7)
    net.eval()
    tokens = torch.randint(0, spec.vocab, (3, 18), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = net(tokens)  # the training forward, no cache
    caches = [KVCache((3, spec.kv, 18, spec.dhead), torch.float32, "cpu") for _ in net.layers]
    logits = forward(net, tokens[:, :12], caches, 0)
    torch.testing.assert_close(logits[:, -1], full[:, 11], rtol=1e-4, atol=1e-4)
    for pos in range(12, 18):
        logits = forward(net, tokens[:, pos : pos + 1], caches, pos)
        torch.testing.assert_close(logits[:, -1], full[:, pos], rtol=1e-4, atol=1e-4)


def test_tensor_parallel_generation_matches_one_rank(tmp_path: Path) -> None:
    generated, metrics = {}, {}
    for tp in (1, 2):
        cfg = make_config(
            model="tiny-llama", task="generate", tp=tp, mbs=2, input_len=16, output_len=6,
            seq_len=22, steps=2, warmup=1, device="cpu",
        )  # fmt: skip
        code, m = launch_local(cfg, tmp_path / f"tp{tp}")
        assert code == 0 and m.status == "ok", m.message
        rank0 = pd.read_json(tmp_path / f"tp{tp}" / "rank0.json", typ="series")
        generated[tp] = list(rank0["generated"])
        metrics[tp] = m
    assert len(generated[1]) == 6
    assert generated[1] == generated[2]
    for m in metrics.values():
        assert m.ttft_ms > 0 and m.tpot_ms > 0
        assert m.tokens_per_s_per_gpu == pytest.approx(
            2 * 6 / m.median_step_time_s / m.config["tp"]
        )
        assert m.predicted and m.predicted["pred_tpot_ms"] > 0  # the serving model's figures
    # each TP rank holds half the K/V heads: half the cache
    mem1 = metrics[1].memory[0].saved_activation_bytes
    assert metrics[2].memory[0].saved_activation_bytes * 2 == mem1


def test_generator_refuses_what_it_cannot_run() -> None:
    from autoconfig.base.errors import UserError

    with pytest.raises(UserError, match=r"^pp: the bundled generator runs tensor parallelism"):
        make_config(model="tiny-llama", task="generate", pp=2, input_len=8, output_len=4)


@pytest.mark.slow
def test_measured_serving_search_end_to_end(tmp_path: Path) -> None:
    """Two trials through the Optuna study and submitit's local executor: the best predicted
    point generates for real; the second is made to crash and is classified so."""
    out = tmp_path / "serve"
    env = {**os.environ, "AUTOCONFIG_MEASURE_FAULTS": "1:crash@0"}
    result = subprocess.run(
        [
            sys.executable, "-m", "autoconfig.cli", "infer", "--model", "tiny-llama",
            "--gpus", "2", "--input-len", "32", "--output-len", "8", "--batch", "4",
            "--batching", "static",
            "--measure", "--device", "cpu", "--trials", "2", "--steps", "3", "--warmup", "1",
            "--out", str(out),
        ],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv")
    assert sorted(trials["class"]) == ["crash", "ok"]
    ok = trials[trials["class"] == "ok"].iloc[0]
    assert ok["measured_tokens_per_s_per_gpu"] > 0
    assert ok["measured_ttft_ms"] > 0 and ok["measured_tpot_ms"] > 0
    assert ok["pred_ttft_ms"] > 0 and ok["source"] == "analytical top-k"
    crash = trials[trials["class"] == "crash"].iloc[0]
    assert "crash injected" in crash["reason"]
    layouts = set(trials["layout"])
    assert layouts == {"tp1 pp1 batch 4", "tp2 pp1 batch 4"}
    assert (out / "measured.csv").exists() and (out / "study.db").exists()
    page = (out / "report.html").read_text()
    assert "Measured trials" in page
    # the pipeline-parallel point was predicted but the generator cannot run it
    assert "tp1 pp2 batch 4" in pd.read_csv(out / "measured.csv")["label"].tolist()


@pytest.mark.slow
def test_measured_serving_trial_through_slurm(tmp_path: Path, slurm) -> None:
    """A serving trial as one sbatch job whose srun starts the 2 TP ranks."""
    out = tmp_path / "serve-slurm"
    result = subprocess.run(
        [
            sys.executable, "-m", "autoconfig.cli", "infer", "--model", "tiny-llama",
            "--gpus", "2", "--input-len", "16", "--output-len", "4", "--batch", "2",
            "--batching", "static",
            "--objective", "latency", "--max-latency-ms", "100000", "--measure",
            "--device", "cpu", "--executor", "slurm", "--gpus-per-node", "2", "--trials", "2",
            "--steps", "2", "--warmup", "1", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv")
    assert (trials["class"] == "ok").all() and len(trials) == 2
    assert set(trials["layout"]) == {"tp1 pp1 batch 2", "tp2 pp1 batch 2"}
    import optuna

    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    assert {t.user_attrs["executor"] for t in study.trials if "executor" in t.user_attrs} == {
        "slurm"
    }
    assert all(int(t.user_attrs["job_id"]) > 0 for t in study.trials if "job_id" in t.user_attrs)
