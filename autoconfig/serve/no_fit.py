"""Why no serving deployment fits when a flag, not the GPU count, is to blame: a per-iteration
token budget (max-num-batched-tokens) whose activations leave no K/V cache, a K/V share
(kv-cache-fraction) too small for one request, or static batches too large for memory. Each
answer is one line naming the flag and the values that fit; None leaves the verdict to the
GPU count."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from autoconfig.serve.request import Request

# Values tried per round when searching for the largest that fits (one vectorized evaluation).
PROBES = 64

# A continuous-batching evaluation: the candidate table (max_num_batched_tokens,
# kv_cache_tokens, fits) at these token budgets (None: those asked for) and K/V share.
Evaluate = Callable[[tuple[int, ...] | None, float], pd.DataFrame]


def largest_passing(test: Callable[[np.ndarray], np.ndarray], low: int, high: int) -> int | None:
    """The largest integer in low..high that passes `test` (values in, which pass out), when
    those that pass are every value up to some point; None when `low` fails. Each round tries
    PROBES values spread geometrically between the last that passed and the first that
    failed, so a range of 2^24 takes a handful of rounds."""
    if high < low or not test(np.array([low]))[0]:
        return None
    if test(np.array([high]))[0]:
        return high
    good, bad = low, high
    while bad - good > 1:
        tries = np.unique(np.geomspace(good, bad, PROBES + 2).astype(np.int64))
        tries = tries[(tries > good) & (tries < bad)]
        if not len(tries):
            tries = np.arange(good + 1, bad)
        ok = np.asarray(test(tries), dtype=bool)
        if ok.any():
            good = int(tries[ok].max())
        if (~ok).any():
            bad = int(tries[~ok].min())
    return good


def _where(req: Request) -> str:
    return f"on any split of {req.gpus} {req.gpu} GPU{'s' if req.gpus > 1 else ''}"


def _round_up(value: float, digits: int = 3) -> float:
    """`value` rounded up to `digits` significant digits."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    return math.ceil(value * scale) / scale


def continuous(
    req: Request, longest: int, block: float, low: int, evaluate: Evaluate
) -> str | None:
    """The flag that keeps every continuous-batching deployment from holding a `longest`-token
    request in its K/V cache (blocks of `block` tokens), or None. `low` is the smallest
    token budget the running-batch limits allow."""
    request = f"a {longest:,}-token request"
    if req.max_tokens:
        given = min(req.max_tokens)

        def fits(budgets: np.ndarray) -> np.ndarray:
            table = evaluate(tuple(int(b) for b in budgets), req.kv_fraction)
            by = table.groupby("max_num_batched_tokens")["fits"].any()
            return by.reindex(budgets, fill_value=False).to_numpy()

        most = largest_passing(fits, max(low, 1), given - 1)
        if most is not None:
            return (
                f"max-num-batched-tokens: {given:,} tokens per iteration leave no memory for the "
                f"K/V cache of {request} {_where(req)}; at most {most:,} do (allowed here: "
                f"{max(low, 1):,}..{most:,})"
            )
    if req.kv_fraction < 1:
        whole = evaluate(req.max_tokens, 1.0)
        need = math.ceil(longest / block) * block
        tokens = whole["kv_cache_tokens"].to_numpy(float)
        if (tokens >= need).any():
            # The cache grows in proportion to the share (whole blocks): need/most suffices.
            least = _round_up(need / tokens.max())
            return (
                f"kv-cache-fraction: {req.kv_fraction:g} of the free memory holds no K/V cache "
                f"for {request} {_where(req)}; at least {least:g} does (allowed: above 0, "
                "at most 1)"
            )
    return None


def static(req: Request, smallest: int, fits: Callable[[np.ndarray], np.ndarray]) -> str | None:
    """The flag that keeps every static batch out of memory (`--batch` sizes above what fits),
    or None when one sequence does not fit either. `smallest` is the least batch asked for;
    `fits` says which batch sizes fit on some split."""
    most = largest_passing(fits, 1, smallest - 1)
    if most is None:
        return None
    return (
        f"batch: {smallest:,} sequences of {req.input_len:,}+{req.output_len:,} tokens are "
        f"too many for memory {_where(req)}; at most {most:,} fit (allowed here: 1..{most:,})"
    )
