"""The serving engine is an input: its own all-reduce kernels from the measured tables, its
CUDA graphs from its profile, and its formats checked, each refusal one line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autoconfig.columns.build import serving_inputs
from autoconfig.columns.kernel_catalog import kernel_tables
from autoconfig.cost.inference import SERVING_ENGINES
from autoconfig.cost.kernel_tables import engine_all_reduce_seconds
from autoconfig.cost.serving_step import step_model
from autoconfig.spec import catalog
from tests.helpers import run_cli


def _inputs(engine: str, tp: float = 8.0, model: str = "llama3-70b"):
    spec, gpu = catalog.get_model(model), catalog.get_gpu("h100-sxm-80gb")
    frame = pd.DataFrame(
        {
            "tp": [tp],
            "pp": [1.0],
            "batch_size": [1.0],
            "input_len": [1000.0],
            "output_len": [200.0],
            "replicas": [1.0],
            "precision": ["fp8"],
            "kv_precision": ["fp8"],
            "engine": [float(SERVING_ENGINES.index(engine))],
        }
    )
    return serving_inputs(spec, (gpu, gpu.cluster), frame)


def test_each_engine_reduces_with_its_own_measured_kernels() -> None:
    """At tp 8 a decode step differs between engines by exactly their all-reduces: 80 layers x
    2 of the activations, each from the engine's own measured table."""
    steps = {e: step_model(_inputs(e)) for e in ("vllm", "trtllm")}
    one = {e: float(m.stage(1.0, 0.0, 0.0, 1100.0, 1.0)[0]) for e, m in steps.items()}
    table = kernel_tables("h100")
    hidden = catalog.get_model("llama3-70b").hidden
    each = {e: float(engine_all_reduce_seconds(table, e, 8, 2 * hidden)) for e in one}
    assert each["trtllm"] < each["vllm"]
    expected = 160 * (each["vllm"] - each["trtllm"])
    # the logits' gather differs too, by half an all-reduce of the vocabulary's logits
    assert one["vllm"] - one["trtllm"] == pytest.approx(expected, rel=0.1)


def test_a_step_outside_a_cuda_graph_waits_for_the_host() -> None:
    """TensorRT-LLM replays graphs for decode-only batches: a one-token prefill step waits for
    the host to launch every kernel, a decode step of the same size does not; vLLM captures
    mixed batches too."""
    small = {"tp": 1.0, "model": "gpt3-350m"}
    trt, vllm = step_model(_inputs("trtllm", **small)), step_model(_inputs("vllm", **small))
    host = float(trt.iteration_s[0] + trt.sequence_s[0])  # scheduling, before the launches
    prefill = float(trt.stage(1.0, 1.0, 1.0, 0.0, 1.0)[0]) - host
    decode = float(trt.stage(1.0, 0.0, 0.0, 1.0, 1.0)[0]) - host
    launches = float(trt.launch_s[0])
    assert launches > decode
    assert prefill == pytest.approx(launches)
    assert float(vllm.stage(1.0, 1.0, 1.0, 0.0, 1.0)[0]) - host < launches
    assert np.all(trt.graph_tokens > 0) and float(trt.graph_prefill[0]) == 0.0


def test_an_unknown_engine_is_one_line_naming_the_closest() -> None:
    done = run_cli("infer", "--model", "llama3-8b", "--gpus", "8", "--engine", "vlm")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: engine: unknown engine 'vlm' (closest: vllm)"
    ]


def test_a_format_the_engine_lacks_is_one_line() -> None:
    args = ("infer", "--model", "llama3-8b", "--gpus", "8", "--engine", "sglang")
    done = run_cli(*args, "--kv-precision", "int8")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: engine: sglang has no K/V format 'int8'")


def test_the_engine_reaches_the_search() -> None:
    from autoconfig import api

    result = api.infer("llama3-8b", 8, "h100-sxm-80gb", requests=100, engine="trtllm")
    assert result.request.engine == "trtllm"


def test_a_row_without_limits_runs_its_engines_defaults() -> None:
    """A published point that leaves max_num_seqs blank ran its engine's default running-batch
    limit (TensorRT-LLM's 2048, vLLM's 1024), not a fixed 256."""
    from autoconfig.rows.serving import read_serving_rows

    base = {
        "model": "llama3-8b",
        "gpu": "h100-sxm-80gb",
        "tp": 1,
        "pp": 1,
        "input_len": 1000,
        "output_len": 200,
        "batching": "inflight",
        "precision": "fp8",
    }
    frames = [
        {**base, "framework": "tensorrt-llm"},
        {**base, "framework": "vllm"},
        {**base, "framework": "fastertransformer"},
        {**base, "framework": "trtllm", "max_num_seqs": 64},
    ]
    rows = read_serving_rows(pd.DataFrame(frames))
    assert (rows.errors == "").all()
    assert rows.deployments["max_seqs"].tolist() == [2048.0, 1024.0, 256.0, 64.0]
