"""The serving cost model against hand-computed cases, and its properties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoconfig.cost.inference import (
    _expert_share,
    serve_memory,
    serve_time,
    small_all_reduce,
)
from autoconfig.cost.serving_step import step_model
from autoconfig.rows.serving import read_serving_rows
from autoconfig.rows.training import model_columns_of
from autoconfig.serve.predict import predict_frame
from autoconfig.spec import catalog
from autoconfig.spec.vocab import GIB


def points(model: str = "llama2-70b", gpu: str = "a100-sxm-80gb", **cols) -> pd.DataFrame:
    base = {
        "model": model,
        **model_columns_of(catalog.get_model(model)),
        "gpu": gpu,
        "tp": 1,
        "pp": 1,
        "batch_size": 1,
        "input_len": 128,
        "output_len": 32,
        "precision": "bf16",
    }
    n = max((len(v) for v in cols.values() if isinstance(v, list)), default=1)
    rows = pd.DataFrame([base] * n)
    for key, value in cols.items():
        rows[key] = value
    return rows


def serve_inputs(frame: pd.DataFrame, **constants: float):
    rows = read_serving_rows(frame)
    assert (rows.errors == "").all(), rows.errors.tolist()
    s = rows.inputs()
    return dataclasses.replace(s, **constants) if constants else s


def test_kv_cache_is_gqa_aware_and_replicated_past_kv_heads() -> None:
    # llama2-70b: 80 layers, 8 K/V heads of 128: K and V of one token and layer at tp 8 is
    # 2 * 1 * 128 * 2 bytes = 512 B per GPU; at tp 16 the 8 K/V heads are replicated, so
    # each GPU still holds one head (512 B), not half of one.
    for tp in (8, 16):
        out = predict_frame(points(tp=tp, batch_size=4, input_len=1000, output_len=24))
        expected = 4 * 1024 * 80 * 512 / GIB
        assert out.at[0, "mem_kv_cache_gib"] == pytest.approx(expected, rel=1e-5)
    mha = predict_frame(points("gpt3-175b", tp=8, batch_size=2, input_len=100, output_len=28))
    # gpt3-175b: 96 layers, 96 heads of 128 -> 12 heads per GPU at tp 8.
    assert mha.at[0, "mem_kv_cache_gib"] == pytest.approx(2 * 128 * 96 * 2 * 12 * 128 * 2 / GIB)


def test_fp8_kv_and_int8_weights_halve_their_bytes() -> None:
    base = predict_frame(points(tp=8, batch_size=8))
    int8 = predict_frame(points(tp=8, batch_size=8, precision="int8", kv_precision="fp8"))
    assert int8.at[0, "mem_kv_cache_gib"] == pytest.approx(base.at[0, "mem_kv_cache_gib"] / 2)
    assert int8.at[0, "mem_weights_gib"] == pytest.approx(base.at[0, "mem_weights_gib"] / 2)
    # the decode step streams half the bytes (its all-reduces do not change)
    assert int8.at[0, "time_decode_compute_ms"] < 0.6 * base.at[0, "time_decode_compute_ms"]
    assert int8.at[0, "time_decode_tp_ms"] == pytest.approx(base.at[0, "time_decode_tp_ms"])


def test_batch_one_decode_is_weight_streaming() -> None:
    """On a chip without kernel tables, with launch and all-reduce costs zeroed, a batch-1
    decode step of a dense GPT is its weight bytes plus the K/V it reads, at the streaming
    bandwidth (Pope et al. 2022)."""
    frame = points("gpt3-20b", batch_size=1, input_len=64, output_len=64, flash_attention="y")
    s = serve_inputs(frame, kernel_s=np.array([0.0]), ar_base_s=np.array([0.0]))
    s = dataclasses.replace(s, x=dataclasses.replace(s.x, kernel_chip=np.array([-1.0])))
    spec, gpu = catalog.get_model("gpt3-20b"), catalog.get_gpu("a100-sxm-80gb")
    h, layers, vocab = spec.hidden, spec.layers, spec.vocab
    weights = layers * 2 * 12 * h * h + 2 * h * vocab  # 16-bit layer GEMMs + LM head
    context = 64 + 64 / 2
    kv = layers * context * 2 * h * 2
    bandwidth = gpu.memory_tb_s * 1e12 * float(s.eff_memory[0])
    tpot = serve_time(s).tpot[0] - float(s.iteration_s[0]) - float(s.sequence_s[0])
    assert tpot == pytest.approx((weights + kv) / bandwidth, rel=0.02)


def test_batch_one_decode_is_the_sum_of_its_measured_kernels() -> None:
    """With kernel tables, a batch-1 decode step of Llama 3 70B in fp8 at tp 4 on H100 is the
    sum of its measured kernels: each GEMM at m = 1 from the GEMM table, the engine's two
    all-reduces a layer from its all-reduce table, every other kernel at the chip's smallest
    kernel's time, the LM head's 16-bit GEMM and its logits' gather, and the engine's host work
    per step. It is slower than streaming the weights at the datasheet bandwidth: the fp8
    GEMMs reach about half of it at m = 1."""
    from autoconfig.columns.kernel_catalog import kernel_tables
    from autoconfig.cost.kernel_tables import engine_all_reduce_seconds, gemm_seconds

    frame = points(
        "llama3-70b",
        gpu="h100-sxm-80gb",
        tp=4,
        batch_size=1,
        input_len=1024,
        output_len=256,
        precision="fp8",
        kv_precision="fp8",
        flash_attention="y",
        framework="vllm",
    )
    s = serve_inputs(frame)
    tpot = float(serve_time(s).tpot[0])
    spec, table = catalog.get_model("llama3-70b"), kernel_tables("h100")
    h, layers = spec.hidden, spec.layers
    kv, ffn = (spec.kv_heads or spec.heads) * (h // spec.heads), spec.ffn_hidden
    shapes = [(h + 2 * kv) // 4, h], [h, h // 4], [2 * ffn // 4, h], [h, ffn // 4]
    gemms = layers * sum(float(gemm_seconds(table, "fp8", 1, n, k)) for n, k in shapes)
    reduce = 2 * layers * float(engine_all_reduce_seconds(table, "vllm", 4, 2 * h))
    head = float(gemm_seconds(table, "bf16", 1, spec.vocab // 4, h))
    weights = layers * sum(n * k for n, k in shapes)  # fp8: a byte each
    streaming = weights / (catalog.get_gpu("h100-sxm-80gb").memory_tb_s * 1e12)
    assert tpot > gemms + reduce + head > 1.5 * streaming
    # the rest: the floors of the layer's other kernels, the K/V read and the host's work
    assert tpot == pytest.approx(gemms + reduce + head, rel=0.4)


def test_small_all_reduce_is_a_tree_latency() -> None:
    frame = points(tp=[1, 2, 8])
    s = serve_inputs(frame)
    t = small_all_reduce(s, np.zeros(3))
    base, step = float(s.ar_base_s[0]), float(s.ar_step_s[0])
    assert t.tolist() == pytest.approx([0.0, base + step, base + 3 * step])


def test_pipeline_micro_batches() -> None:
    """pp 4 with batch 4: 4 micro-batches of 1; prefill fills and drains the pipeline
    (4 + 4 - 1 slots) and a decode round keeps every stage busy (4 slots)."""
    s = serve_inputs(points(pp=4, batch_size=4))
    t = serve_time(s)
    host = float(s.iteration_s[0])  # the engine's host work, once a step
    prefill = 7 * t.prefill_stage.total[0] + 3 * t.pp_hop_prefill[0]
    assert t.ttft[0] == pytest.approx(prefill + host)
    decode = 4 * t.decode_stage.total[0] + 4 * t.pp_hop_decode[0]
    assert t.tpot[0] == pytest.approx(decode + host + 4 * float(s.sequence_s[0]))
    one = serve_time(serve_inputs(points(pp=4, batch_size=1)))
    alone = 4 * one.prefill_stage.total[0] + 3 * one.pp_hop_prefill[0]
    assert one.ttft[0] == pytest.approx(alone + host)


def test_moe_reads_only_the_experts_its_tokens_touch() -> None:
    s = serve_inputs(points("mixtral-8x7b", batch_size=[1, 4, 512]))
    share = _expert_share(s.x, np.array([1.0, 4.0, 512.0]))
    # 8 experts, top-2: one token touches 2 of 8; four tokens 8 * (1 - (6/8)^4) in expectation.
    assert share.tolist() == pytest.approx([0.25, 1 - 0.75**4, 1.0], rel=1e-5)
    mem = serve_memory(s)
    assert np.ptp(mem.weights) == 0  # every expert is held whatever the batch


def test_vectorized_equals_one_at_a_time() -> None:
    frame = points(
        tp=[1, 2, 4, 8, 2],
        pp=[1, 2, 1, 2, 4],
        batch_size=[1, 7, 64, 3, 16],
        input_len=[16, 2048, 512, 100, 1000],
        output_len=[1, 256, 64, 8, 2000],
    )
    together = predict_frame(frame)
    for i in range(len(frame)):
        alone = predict_frame(frame.iloc[[i]])
        for col in ("pred_ttft_ms", "pred_tpot_ms", "pred_latency_ms", "pred_peak_mem_gib"):
            assert together.at[i, col] == pytest.approx(alone.at[0, col], rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    model=st.sampled_from(["llama2-70b", "gpt3-175b", "mixtral-8x7b", "llama3-8b"]),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    batch=st.integers(1, 256),
    input_len=st.integers(1, 1000),  # within every sampled model's context
    output_len=st.integers(1, 1000),
)
def test_properties(model, tp, pp, batch, input_len, output_len) -> None:
    frame = points(
        model,
        tp=[tp, 2 * tp, tp, tp, tp],
        pp=[pp, pp, 2 * pp, pp, pp],
        batch_size=[batch, batch, batch, batch + 1, batch],
        input_len=input_len,
        output_len=output_len,
    )
    frame.loc[4, "kv_precision"] = "fp8"
    out = predict_frame(frame)
    assert (out["error"] == "").all(), out["error"].tolist()
    for col in ("pred_ttft_ms", "pred_tpot_ms", "pred_latency_ms"):
        values = out[col].astype(float)
        assert np.isfinite(values).all() and (values > 0).all()
    mem = out["pred_peak_mem_gib"].astype(float)
    assert mem[1] <= mem[0] * (1 + 1e-6)  # wider TP holds less per GPU
    assert mem[2] <= mem[0] * (1 + 1e-6)  # more stages hold less per GPU
    assert mem[4] <= mem[0] * (1 + 1e-6)  # a narrower K/V cache holds less
    assert mem[3] >= mem[0]  # one more sequence never needs less
    assert out.at[3, "pred_tpot_ms"] >= out.at[0, "pred_tpot_ms"] * (1 - 1e-6)
    assert out.at[3, "pred_ttft_ms"] >= out.at[0, "pred_ttft_ms"] * (1 - 1e-6)
    lat = out.at[0, "pred_ttft_ms"] + (output_len - 1) * out.at[0, "pred_tpot_ms"]
    assert out.at[0, "pred_latency_ms"] == pytest.approx(lat, rel=1e-5)


def test_rows_with_bad_values_keep_the_others_going() -> None:
    frame = points(batch_size=["4", "0", "4", "4", "4"], tp=[8, 8, 3, 8, 8])
    frame["precision"] = ["bf16", "bf16", "bf16", "fp4", "bf16"]
    frame.loc[4, "input_len"] = 4090  # + 32 output > llama2-70b's 4096 context
    out = predict_frame(frame)
    assert out.at[0, "error"] == ""
    assert out.at[1, "error"].startswith("batch_size:")
    assert out.at[2, "error"].startswith("tp:")
    assert out.at[3, "error"].startswith("precision:")
    assert out.at[4, "error"].startswith("input_len:") and "4096" in out.at[4, "error"]
    assert out.loc[1:, "pred_latency_ms"].isna().all()


def test_a_dense_model_has_no_expert_traffic_and_experts_split_over_tp() -> None:
    """The expert GEMMs a dense model lacks move no activations (its prediction does not
    depend on the unused expert width), and a MoE deployment holds 1/tp of the experts per
    GPU, as serving engines split them (vLLM, TensorRT-LLM)."""
    dense = serve_inputs(points("llama2-70b", tp=[2, 4]))
    unused = dataclasses.replace(dense.x, expert_ffn=dense.x.expert_ffn * 3)
    wider = dataclasses.replace(dense, x=unused)
    assert serve_time(dense).tpot.tolist() == pytest.approx(serve_time(wider).tpot.tolist())
    continuous = step_model(dense).gemm_act_s, step_model(wider).gemm_act_s
    assert np.allclose(continuous[0], continuous[1], rtol=1e-12, atol=0.0)
    moe = serve_memory(serve_inputs(points("mixtral-8x7b", tp=[1, 2, 4])))
    assert moe.weights[1] == pytest.approx(moe.weights[0] / 2, rel=0.01)
    assert moe.weights[2] == pytest.approx(moe.weights[0] / 4, rel=0.01)
