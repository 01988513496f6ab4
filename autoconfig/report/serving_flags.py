"""Launch commands for the winning serving deployment in vLLM, SGLang or TensorRT-LLM (`infer
--emit`), with the settings the prediction assumed: tensor/pipeline/expert parallelism, the
running-batch limit, the per-iteration token budget with chunked prefill, the memory share,
weight quantisation, the K/V-cache format, prefix caching off, and replicas (or the
disaggregated prefill and decode servers).

Flag names: vLLM `vllm serve --help` (0.8+), SGLang `python -m sglang.launch_server --help`
(0.4+), TensorRT-LLM `trtllm-serve --help` and its LLM API options (1.0).
"""

from __future__ import annotations

import pandas as pd

from autoconfig.serve.result import ServingResult
from autoconfig.spec.vocab import Engine

# How each engine takes a quantised model: an online flag, or a checkpoint quantised offline.
_VLLM_QUANT = {
    "fp8": "--quantization fp8",
    "nvfp4": "--quantization modelopt_fp4  # an NVFP4 checkpoint (TensorRT Model Optimizer)",
    "int8": "--quantization compressed-tensors  # a W8A16 checkpoint (llm-compressor)",
    "int4": "--quantization awq_marlin  # an AWQ int4 checkpoint",
}
_SGLANG_QUANT = {
    "fp8": "--quantization fp8",
    "nvfp4": "--quantization modelopt_fp4  # an NVFP4 checkpoint",
    "int8": "--quantization w8a8_int8  # or a W8A16 checkpoint",
    "int4": "--quantization awq_marlin  # an AWQ int4 checkpoint",
}
_SGLANG_KV = {"fp8": "fp8_e4m3"}


def memory_share(row: pd.Series, capacity_gib: float, kv_fraction: float) -> float:
    """vLLM's gpu_memory_utilization / SGLang's mem_fraction_static for the same K/V cache:
    the memory the engine may take, of the GPU's total."""
    free = float(row["kv_cache_gib"]) / kv_fraction
    return round(min(0.98, 1.0 - (1.0 - kv_fraction) * free / capacity_gib), 3)


def launch_flags(result: ServingResult, engine: Engine) -> str:
    """Shell lines that launch the best deployment on `engine`."""
    row = result.best
    if row is None:
        return ""
    req = result.request
    cached = bool(req.prefix_hit_rate)  # the prediction assumed the prefix cache off without it
    model = f"MODEL_PATH  # {result.model.name}"
    header = (
        f"# {engine.value}: {result.model.name} on {req.gpus} x {result.gpu.name}, as predicted"
    )
    if row.get("mode") == "disaggregated":
        servers = _disaggregated(row, engine, model, result.gpu.memory_gib, req.kv_fraction, cached)
        return "\n".join([header, *servers])
    share = memory_share(row, result.gpu.memory_gib, req.kv_fraction)
    replicas = int(row["replicas"])
    lines = [header, _command(engine, row, model, share, req.kv_fraction, replicas, cached)]
    if replicas > 1 and engine is Engine.TRTLLM:
        lines.append(
            f"# run {replicas} such servers, one per {_gpus(row)} GPUs, behind a load balancer"
        )
    return "\n".join(lines)


def _gpus(row: pd.Series) -> int:
    return int(row["tp"]) * int(row["pp"])


def _command(
    engine: Engine,
    row: pd.Series,
    model: str,
    share: float,
    kv_fraction: float,
    replicas: int,
    prefix_cache: bool = False,
) -> str:
    """One server's command line. `share` is the memory share of vLLM and SGLang; TensorRT-LLM
    takes the K/V share of the free memory itself, `kv_fraction` (the request's, not the
    row's: a disaggregated row has no column of its own for it). The prefix cache stays off,
    as the prediction assumed, unless the request gave a prefix hit rate."""
    tp, pp, ep = int(row["tp"]), int(row["pp"]), int(row.get("ep", 1))
    seqs, tokens = int(row["max_num_seqs"]), int(row["max_num_batched_tokens"])
    weights, kv = str(row["precision"]), str(row["kv_precision"])
    if engine is Engine.VLLM:
        parts = [
            "vllm serve",
            f"--tensor-parallel-size {tp}",
            f"--pipeline-parallel-size {pp}",
            *(["--enable-expert-parallel"] if ep > 1 else []),
            *([f"--data-parallel-size {replicas}"] if replicas > 1 else []),
            f"--max-num-seqs {seqs}",
            f"--max-num-batched-tokens {tokens}",
            "--enable-chunked-prefill",
            *([] if prefix_cache else ["--no-enable-prefix-caching"]),
            "--block-size 16",
            f"--gpu-memory-utilization {share}",
            *(["--kv-cache-dtype fp8"] if kv == "fp8" else []),
        ]
        quant = _VLLM_QUANT.get(weights)
    elif engine is Engine.SGLANG:
        parts = [
            "python -m sglang.launch_server",
            f"--tp-size {tp}",
            *([f"--pp-size {pp}"] if pp > 1 else []),
            *([f"--ep-size {ep}"] if ep > 1 else []),
            *([f"--dp-size {replicas}"] if replicas > 1 else []),
            f"--max-running-requests {seqs}",
            f"--chunked-prefill-size {tokens}",
            f"--max-prefill-tokens {tokens}",
            f"--mem-fraction-static {share}",
            *([] if prefix_cache else ["--disable-radix-cache"]),
            *([f"--kv-cache-dtype {_SGLANG_KV[kv]}"] if kv in _SGLANG_KV else []),
        ]
        quant = _SGLANG_QUANT.get(weights)
    else:
        parts = [
            "trtllm-serve",
            "--backend pytorch",
            f"--tp_size {tp}",
            f"--pp_size {pp}",
            *([f"--ep_size {ep}"] if ep > 1 else []),
            f"--max_batch_size {seqs}",
            f"--max_num_tokens {tokens}",
            f"--kv_cache_free_gpu_memory_fraction {kv_fraction:g}",
            "--extra_llm_api_options extra.yaml",
        ]
        quant = None
    # sglang.launch_server takes the model only as --model-path (SGLang 0.5 server_args.py).
    head = f"{parts[0]} {'--model-path ' if engine is Engine.SGLANG else ''}MODEL_PATH"
    body = " \\\n    ".join([head, *parts[1:]])
    lines = [f"# MODEL_PATH: {model.split('# ')[-1]} checkpoint"]
    if quant:
        flag, _, note = quant.partition("  # ")
        body += f" \\\n    {flag}"
        if note:
            lines.append(f"# weights: {note}")
    if engine is Engine.TRTLLM:
        lines.append(
            "# extra.yaml: enable_chunked_prefill: true; kv_cache_config: {enable_block_reuse: "
            f"{'true' if prefix_cache else 'false'}{', dtype: fp8' if kv == 'fp8' else ''}}}"
        )
        if weights in ("fp8", "nvfp4"):
            lines.append(
                f"# weights: a ModelOpt {weights.upper()} checkpoint (TensorRT Model Optimizer)"
            )
    return "\n".join([*lines, body])


def _disaggregated(
    row: pd.Series,
    engine: Engine,
    model: str,
    capacity_gib: float,
    kv_fraction: float,
    prefix_cache: bool = False,
) -> list[str]:
    """The prefill and decode servers of a disaggregated deployment, each with the settings
    its pool was simulated with (its own layout, batch and token limits, K/V cache)."""
    prefill = row.copy()
    prefill["tp"], prefill["pp"] = row["prefill_tp"], row["prefill_pp"]
    prefill["ep"] = row["prefill_ep"]
    prefill["precision"] = row["prefill_precision"]
    prefill["max_num_seqs"] = row["prefill_max_num_seqs"]
    prefill["max_num_batched_tokens"] = row["prefill_max_num_batched_tokens"]
    prefill["kv_cache_gib"] = row["prefill_kv_cache_gib"]
    roles = (
        ("prefill", prefill, int(row["prefill_replicas"])),
        ("decode", row, int(row["replicas"])),
    )
    lines = []
    for role, r, count in roles:
        share = memory_share(r, capacity_gib, kv_fraction)
        command = _command(engine, r, model, share, kv_fraction, 1, prefix_cache)
        if engine is Engine.VLLM:
            command += (
                " \\\n    --kv-transfer-config "
                """'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
            )
        elif engine is Engine.SGLANG:
            command += f" \\\n    --disaggregation-mode {role}"
        lines.append(f"# {role}: {count} server(s) of {_gpus(r)} GPUs each")
        lines.append(command)
    if engine is Engine.TRTLLM:
        lines.append(
            "# then: trtllm-serve disaggregated -c disagg.yaml (context and generation servers)"
        )
    else:
        lines.append("# and a router that sends each request to a prefill, then a decode server")
    return lines
