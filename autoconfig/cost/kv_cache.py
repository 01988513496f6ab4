"""Paged K/V-cache capacity of a serving replica: what memory is left after the weights, the
largest iteration's activations and the runtime's reserve, in blocks of tokens, and how many
sequences of a given length it holds at once.

Engines size the cache once at start-up from the memory that profiling leaves free (Kwon et al.
2023, "PagedAttention", Sec. 4.1; TensorRT-LLM `kv_cache_free_gpu_mem_fraction`, default 0.9 of
the free memory; vLLM `gpu_memory_utilization` of the total). Memory is taken in fixed blocks
(vLLM 16 tokens, TensorRT-LLM 32), so a sequence wastes half a block on average. A request is
admitted only with blocks for its whole length (TensorRT-LLM's default GUARANTEED_NO_EVICT
capacity policy), so nothing is preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost.inference import ServeInputs, kv_bytes_per_token
from autoconfig.cost.inputs import SWIGLU, Col
from autoconfig.cost.memory import stage_params
from autoconfig.spec.vocab import GIB


@dataclass(frozen=True)
class KvCapacity:
    weights: Col  # bytes of the busiest rank's weights
    activations: Col  # bytes of the largest iteration's intermediates
    reserved: Col  # CUDA context, NCCL buffers, allocator slack
    cache: Col  # bytes given to K/V blocks
    token_bytes: Col  # one token's K and V over the stage's layers on one rank
    tokens: Col  # tokens the cache holds (whole blocks)

    @property
    def fits(self) -> Col:
        """The weights and one full iteration fit with room for at least one block."""
        return self.cache > 0

    def sequences(self, length: Col, block_tokens: Col) -> Col:
        """Sequences of `length` tokens the cache holds at once, each in whole blocks."""
        blocks = np.ceil(np.maximum(length, 1.0) / block_tokens)
        return np.floor(self.tokens / (blocks * block_tokens))


def weight_bytes(s: ServeInputs) -> Col:
    """The busiest rank's weights: its stage's layers and the embedding or LM head shard.
    Experts split tp ways either way: sharded inside (TP) or whole experts per rank (EP)."""
    p = stage_params(s.x)
    return (np.maximum(p.dense_first, p.dense_last) + p.expert) * s.weight_bytes


def iteration_activations(s: ServeInputs, tokens: Col) -> Col:
    """Peak intermediates of one iteration of `tokens` tokens: the widest projection's output
    beside the residual stream, and the logits of up to every sequence (fp32)."""
    x = s.x
    q_width, kv_width = x.heads * x.head_dim, x.kv_heads * x.head_dim
    up = np.where(x.mlp_kind == SWIGLU, 2.0, 1.0) * np.where(
        x.experts > 0, x.expert_ffn * x.topk + x.shared_ffn, x.ffn
    )
    widest = np.maximum(q_width + 2.0 * kv_width, up) / x.tp
    logits = 4.0 * np.minimum(tokens, s.max_seqs) * x.vocab / x.tp
    return tokens * 2.0 * (2.0 * x.hidden + widest) + logits


def kv_capacity(s: ServeInputs) -> KvCapacity:
    x = s.x
    weights = weight_bytes(s)
    activations = iteration_activations(s, s.max_tokens)
    reserved = x.mem_reserved_gib * GIB + x.mem_overhead * (weights + activations)
    free = x.memory_gib * GIB - weights - activations - reserved
    cache = np.maximum(free, 0.0) * s.kv_fraction
    token_bytes = kv_bytes_per_token(s, np.ceil(x.layers / x.pp))
    tokens = np.floor(cache / token_bytes / s.block_tokens) * s.block_tokens
    return KvCapacity(weights, activations, reserved, cache, token_bytes, tokens)
