"""Steady-state throughput of a continuously batched replica at maximum load (every request
waiting at once, as offline benchmarks run them: trtllm-bench throughput, vLLM
benchmark_throughput): the running batch the K/V cache and max-num-seqs allow, and the mixed
iteration that keeps it full.

In steady state x requests finish per iteration; the batch then holds x*O decoding sequences
and the iteration carries x*I prefill tokens beside them (chunked prefill), so x is the largest
value with x*O <= running sequences and x*(I + O) <= tokens per iteration (Agrawal et al. 2024,
"Sarathi-Serve", Sec. 3: piggybacked prefills keep decode batches full). Throughput is the
decode tokens of one iteration over its time. With pipeline stages the running batch is split
into pp micro-batches that keep every stage busy (vLLM's and TensorRT-LLM's pipeline engines),
so a sequence advances once every pp stage slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost.inference import ServeInputs
from autoconfig.cost.inputs import Col
from autoconfig.cost.kv_cache import KvCapacity, kv_capacity
from autoconfig.cost.serving_step import StepModel, step_model
from autoconfig.spec.vocab import GIB

# What limits the running batch, in the `bound` column.
BOUNDS = ("max-num-seqs", "kv-cache", "tokens-per-iteration")


@dataclass(frozen=True)
class MaxLoad:
    running: Col  # sequences in the batch (decoding and prefilling)
    bound: Col  # index into BOUNDS
    decodes: Col  # decoding sequences per micro-batch iteration
    prefill_tokens: Col  # prompt tokens per micro-batch iteration
    slot_s: Col  # one micro-batch through one stage, hand-off included
    tpot_s: Col  # between two tokens of one sequence
    ttft_s: Col  # from admission to the first token
    output_tokens_per_s: Col  # one replica
    requests_per_s: Col  # one replica


def max_load(s: ServeInputs, step: StepModel, cap: KvCapacity) -> MaxLoad:
    x = s.x
    prompt, out = s.input_len, np.maximum(s.output_len, 1.0)
    by_kv = cap.sequences(prompt + out, s.block_tokens)
    running = np.minimum(s.max_seqs, by_kv)
    per_micro = running / x.pp
    finish = np.minimum(per_micro / out, s.max_tokens / (prompt + out))
    decodes = finish * out
    prefill = finish * prompt
    bound = np.where(
        finish * (prompt + out) >= s.max_tokens * (1 - 1e-9), 2, np.where(by_kv < s.max_seqs, 1, 0)
    )
    # Each prompt token attends to the earlier ones of its prompt (half of it on average) and
    # reads, chunk by chunk, what earlier chunks cached.
    pairs = prefill * (prompt + 1.0) / 2.0
    context = decodes * (prompt + out / 2.0)
    tokens = decodes + prefill
    slot = step.stage(tokens, pairs, prefill, context, decodes + finish) + step.hop(tokens)
    tpot = x.pp * slot
    # A prompt is prefilled in the budget the decodes leave, over this many iterations.
    chunks = np.ceil(prompt / np.maximum(s.max_tokens - decodes, 1.0))
    ttft = chunks * tpot
    return MaxLoad(
        running=running,
        bound=bound,
        decodes=decodes,
        prefill_tokens=prefill,
        slot_s=slot,
        tpot_s=tpot,
        ttft_s=ttft,
        output_tokens_per_s=decodes / slot,
        requests_per_s=finish / slot,
    )


MAX_LOAD_COLUMNS = (
    "pred_output_tokens_per_s_per_gpu",
    "pred_running",
    "pred_tpot_ms",
    "pred_fits",
)


def evaluate_max_load(s: ServeInputs) -> dict[str, Col]:
    """Max-load predictions per deployment, one array per column (per GPU figures divide one
    replica's by tp*pp)."""
    x = s.x
    cap = kv_capacity(s)
    load = max_load(s, step_model(s), cap)
    gpus = x.tp * x.pp
    fits = cap.fits & (load.running >= 1)
    out = {
        "pred_output_tokens_per_s_per_gpu": load.output_tokens_per_s / gpus,
        "pred_output_tokens_per_s": load.output_tokens_per_s * s.replicas,
        "pred_requests_per_s": load.requests_per_s * s.replicas,
        "pred_running": load.running,
        "pred_bound": np.asarray(BOUNDS, dtype=object)[load.bound.astype(int)],
        "pred_tpot_ms": 1e3 * load.tpot_s,
        "pred_ttft_ms": 1e3 * load.ttft_s,
        "pred_iteration_ms": 1e3 * load.slot_s,
        "pred_prefill_tokens_per_iteration": load.prefill_tokens,
        "pred_fits": fits,
        "mem_weights_gib": cap.weights / GIB,
        "mem_activations_gib": cap.activations / GIB,
        "mem_kv_cache_gib": cap.cache / GIB,
        "kv_cache_tokens": cap.tokens,
        "mem_capacity_gib": x.memory_gib,
    }
    n = x.n
    return {k: np.broadcast_to(np.asarray(v), (n,)) for k, v in out.items()}
