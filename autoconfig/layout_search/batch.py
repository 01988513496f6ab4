"""The one rule for the global batch when none is given, shared by `search`, `plan` and
`estimate`: tokens per step by model size, from published pre-training runs, capped by a
critical batch size; never grown with the cluster. `--gbs` overrides it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.spec.schema import ModelSpec

M = 2**20
# (parameters below, tokens per batch, where that batch was published)
BY_SIZE: tuple[tuple[float, int, str], ...] = (
    (1e9, M // 2, "GPT-3 125M-760M: 0.5M tokens"),
    (6e9, 1 * M, "GPT-3 1.3B-2.7B: 1M"),
    (20e9, 2 * M, "GPT-3 6.7B-13B: 2M"),
    (200e9, 4 * M, "GPT-3 175B: 3.2M, Llama 2 7B-70B: 4M"),
    (float("inf"), 16 * M, "Llama 3 405B: 16M for most of its 15T tokens"),
)
SOURCES = "Brown et al. 2020, Table 2.1; Touvron et al. 2023; Llama 3 report, Dubey et al. 2024"
# Past the critical batch size, doubling the batch no longer halves the steps (McCandlish et
# al. 2018); 16M tokens is the largest batch a published dense model was trained with.
CRITICAL_BATCH_TOKENS = 16 * M


@dataclass(frozen=True)
class Batch:
    gbs: int  # sequences
    rule: str  # the sentence that says where it came from


def tokens_for(model: ModelSpec) -> tuple[int, str]:
    """Tokens per batch for the model's total parameter count, with the published example."""
    params = model.param_count()
    for below, tokens, source in BY_SIZE:
        if params < below:
            return min(tokens, CRITICAL_BATCH_TOKENS), source
    raise AssertionError("the last size bound is infinite")


def default_batch(model: ModelSpec, seq_len: int) -> Batch:
    """The batch in sequences (a power of two) nearest the model size's tokens per step, at
    most the critical batch size."""
    tokens, source = tokens_for(model)
    gbs = 2 ** max(0, round(np.log2(tokens / seq_len)))
    while gbs > 1 and gbs * seq_len > CRITICAL_BATCH_TOKENS:
        gbs //= 2
    return Batch(int(gbs), describe(int(gbs), seq_len, tokens, source))


def describe(gbs: int, seq_len: int, tokens: int, source: str) -> str:
    return (
        f"{gbs} sequences = {gbs * seq_len / M:.1f}M tokens per step: the batch for "
        f"{_size(tokens)} ({source}; {SOURCES}), at most the critical batch of "
        f"{CRITICAL_BATCH_TOKENS // M}M tokens; --gbs overrides"
    )


def _size(tokens: int) -> str:
    low = 0.0
    for below, t, _ in BY_SIZE:
        if t == tokens:
            return (
                f"models of {_b(low)} to {_b(below)} parameters"
                if below != float("inf")
                else f"models of {_b(low)} parameters or more"
            )
        low = below
    return "this model size"


def _b(n: float) -> str:
    return "0" if n == 0 else f"{n / 1e9:g}B"


def fitted_to(batch: Batch, group: int) -> Batch:
    """The rule's batch rounded to a multiple of `group` = dp*mbs (a single layout's batch)."""
    gbs = max(1, round(batch.gbs / group)) * group
    if gbs == batch.gbs:
        return batch
    return Batch(gbs, f"{batch.rule}; rounded to {gbs}, a multiple of dp*mbs = {group}")
