"""Launch commands for the winning serving deployment in vLLM, SGLang or TensorRT-LLM (`infer
--emit`), with the settings the prediction assumed: tensor/pipeline/expert parallelism, the
running-batch limit, the per-iteration token budget with chunked prefill, the memory share,
weight quantisation, the K/V-cache format, prefix caching off (on with a prefix hit rate),
speculative decoding when the prediction assumed it (the drafter and its draft tokens per
step), and replicas (or the disaggregated prefill and decode servers, each pool's GPU type
named where the pools run on different types).

Flag names: vLLM `vllm serve --help` (0.8+), SGLang `python -m sglang.launch_server --help`
(0.4+), TensorRT-LLM `trtllm-serve --help` and its LLM API options (1.0). Speculative
decoding: vLLM 0.33's `--speculative-config` JSON (config/speculative.py: `method` eagle,
eagle3, mtp or ngram, `model` the draft head's checkpoint, `num_speculative_tokens`,
`prompt_lookup_max` for ngram); SGLang 0.5.23's `--speculative-algorithm` EAGLE, EAGLE3, NEXTN
(multi-token prediction) or NGRAM with `--speculative-num-steps`, `--speculative-eagle-topk`
and `--speculative-num-draft-tokens` (srt/arg_groups/fields/spec.py); TensorRT-LLM 1.0's
`speculative_config` in the LLM API options (decoding_type Eagle, MTP or NGram with
max_draft_len or num_nextn_predict_layers; from its docs, not read from code).
"""

from __future__ import annotations

import json

import pandas as pd

from autoconfig.serve.features import method_name
from autoconfig.serve.request import Request
from autoconfig.serve.result import ServingResult
from autoconfig.spec.schema import GPUSpec
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
DRAFT_VAR = "DRAFT_PATH"  # the draft head's checkpoint (EAGLE, EAGLE-3), left to the user
_SGLANG_SPEC = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM"}
_TRTLLM_SPEC = {"eagle": "Eagle", "eagle3": "Eagle", "mtp": "MTP", "ngram": "NGram"}


def speculation(req: Request) -> tuple[str, int] | None:
    """(drafter, draft tokens per step) the prediction assumed, or None without speculation."""
    if not req.speculative_tokens:
        return None
    return method_name(req.speculative_method), int(req.speculative_tokens)


def _speculative_flags(engine: Engine, spec: tuple[str, int] | None) -> list[str]:
    """vLLM's and SGLang's command-line flags for the drafter (TensorRT-LLM's go to extra.yaml)."""
    if spec is None or engine is Engine.TRTLLM:
        return []
    method, k = spec
    draft = method in ("eagle", "eagle3")
    if engine is Engine.VLLM:
        config: dict[str, object] = {"method": method, "num_speculative_tokens": k}
        if draft:
            config["model"] = DRAFT_VAR
        if method == "ngram":
            config["prompt_lookup_max"] = 5  # vLLM's own default when neither bound is given
        return [f"--speculative-config '{json.dumps(config)}'"]
    flags = [
        f"--speculative-algorithm {_SGLANG_SPEC[method]}",
        f"--speculative-num-steps {k}",
        "--speculative-eagle-topk 1",  # one chain of drafts, as the prediction counts them
        f"--speculative-num-draft-tokens {k + 1}",
    ]
    return flags + ([f"--speculative-draft-model-path {DRAFT_VAR}"] if draft else [])


def _trtllm_speculative(spec: tuple[str, int] | None) -> str:
    if spec is None:
        return ""
    method, k = spec
    if method == "mtp":
        return f"; speculative_config: {{decoding_type: MTP, num_nextn_predict_layers: {k}}}"
    extra = f", speculative_model_dir: {DRAFT_VAR}" if method in ("eagle", "eagle3") else ""
    eagle3 = ", eagle3_one_model: true" if method == "eagle3" else ""
    return (
        f"; speculative_config: {{decoding_type: {_TRTLLM_SPEC[method]}, max_draft_len: {k}"
        f"{extra}{eagle3}}}"
    )


# The value NVIDIA's GPU Feature Discovery gives the node label nvidia.com/gpu.product: the
# NVML device name with its spaces as dashes (`nvidia-smi --query-gpu=name --format=csv`).
# Only names this module is sure of; others get a placeholder to fill from
# `kubectl get nodes -L nvidia.com/gpu.product`.
PRODUCT_LABEL = "nvidia.com/gpu.product"
_PRODUCTS = {
    "a100-sxm-40gb": "NVIDIA-A100-SXM4-40GB",
    "a100-sxm-80gb": "NVIDIA-A100-SXM4-80GB",
    "a800-sxm-80gb": "NVIDIA-A800-SXM4-80GB",
    "h100-sxm-80gb": "NVIDIA-H100-80GB-HBM3",
    "h200-sxm-141gb": "NVIDIA-H200",
    "h20-96gb": "NVIDIA-H20",
    "b200-180gb": "NVIDIA-B200",
    "gb200": "NVIDIA-GB200",
    "rtx-a6000": "NVIDIA-RTX-A6000",
    "rtx-4090": "NVIDIA-GeForce-RTX-4090",
}


def product_label(gpu: GPUSpec) -> str:
    """The nvidia.com/gpu.product value of nodes holding `gpu`, or a placeholder (a valid
    label value no node carries, so a pod left unfilled stays pending, not misplaced)."""
    slug = "".join(c if c.isalnum() else "-" for c in gpu.name)[:40].strip("-")
    return _PRODUCTS.get(gpu.name, f"REPLACE-WITH-{slug}-PRODUCT")


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
    header = f"# {engine.value}: {result.model.name} on {result.hardware()}, as predicted"
    spec = speculation(req)
    if row.get("mode") == "disaggregated":
        # mixed pools: each pool's memory share of its own GPU type, and the type named
        decode_gpu = result.decode_gpu or result.gpu
        pools = (result.gpu, decode_gpu) if result.mixed else None
        servers = _disaggregated(
            row, engine, model, result.gpu.memory_gib, req.kv_fraction, cached, spec, pools
        )
        if pools is not None:
            spare = int(row["spare_prefill_gpus"]), int(row["spare_decode_gpus"])
            if any(spare):
                servers.append(
                    f"# spare: {spare[0]} {result.gpu.name} and {spare[1]} {decode_gpu.name} "
                    "GPUs the deployment does not need (the other pool limits it)"
                )
        return "\n".join([header, *servers])
    share = memory_share(row, result.gpu.memory_gib, req.kv_fraction)
    replicas = int(row["replicas"])
    lines = [header, _command(engine, row, model, share, req.kv_fraction, replicas, cached, spec)]
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
    spec: tuple[str, int] | None = None,
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
            *_speculative_flags(engine, spec),
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
            *_speculative_flags(engine, spec),
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
    if spec is not None and spec[0] in ("eagle", "eagle3"):
        lines.append(f"# {DRAFT_VAR}: the {spec[0].upper()} draft head trained for this model")
    if quant:
        flag, _, note = quant.partition("  # ")
        body += f" \\\n    {flag}"
        if note:
            lines.append(f"# weights: {note}")
    if engine is Engine.TRTLLM:
        lines.append(
            "# extra.yaml: enable_chunked_prefill: true; kv_cache_config: {enable_block_reuse: "
            f"{'true' if prefix_cache else 'false'}{', dtype: fp8' if kv == 'fp8' else ''}}}"
            + _trtllm_speculative(spec)
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
    spec: tuple[str, int] | None = None,
    pools: tuple[GPUSpec, GPUSpec] | None = None,
) -> list[str]:
    """The prefill and decode servers of a disaggregated deployment, each with the settings
    its pool was simulated with (its own layout, batch and token limits, K/V cache); only the
    decode servers speculate. `pools`: mixed pools' (prefill, decode) GPU types, each pool's
    memory share taken of its own type's memory and the type named."""
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
    for at, (role, r, count) in enumerate(roles):
        gpu = pools[at] if pools is not None else None
        share = memory_share(r, gpu.memory_gib if gpu else capacity_gib, kv_fraction)
        drafts = spec if role == "decode" else None
        command = _command(engine, r, model, share, kv_fraction, 1, prefix_cache, drafts)
        if engine is Engine.VLLM:
            command += (
                " \\\n    --kv-transfer-config "
                """'{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
            )
        elif engine is Engine.SGLANG:
            command += f" \\\n    --disaggregation-mode {role}"
        on = f" on {gpu.name} ({PRODUCT_LABEL}={product_label(gpu)})" if gpu else ""
        lines.append(f"# {role}: {count} server(s) of {_gpus(r)} GPUs each{on}")
        lines.append(command)
    if engine is Engine.TRTLLM:
        lines.append(
            "# then: trtllm-serve disaggregated -c disagg.yaml (context and generation servers)"
        )
    else:
        lines.append("# and a router that sends each request to a prefill, then a decode server")
    return lines
