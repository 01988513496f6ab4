"""Event-level simulation of a serving engine's scheduler, one iteration at a time, vectorized
over deployments (N rows, each at its own clock, request rate and limits) sharing one request
trace of R requests.

The scheduler is vLLM's (v1) with chunked prefill, first come first served (Kwon et al. 2023;
Agrawal et al. 2024, "Sarathi-Serve"): every iteration each running decode gets one token, the
oldest unfinished prompts take what is left of the token budget (max-num-batched-tokens), and
waiting requests are admitted in arrival order while the running batch is below max-num-seqs
and the K/V cache has blocks for their whole length (no preemption: TensorRT-LLM's
GUARANTEED_NO_EVICT). A static row instead admits a batch only when the previous one has
finished and prefills it whole. A row may also be one pool of a disaggregated deployment
(Zhong et al. 2024, "DistServe"; Patel et al. 2024, "Splitwise"): a prefill instance that hands
each request off after its first token, or a decode instance whose requests arrive with their
prompt already cached.

Because admission and prefill are first come first served, the admitted requests are a prefix
of the trace and prefill progress is one counter of prompt tokens per row; only decode and
finish bookkeeping touch the [N, R] arrays. Iteration time comes from cost/serving_step.py;
with pp stages an iteration is a round of pp micro-batches, each a pp-th of the batch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from autoconfig.cost.inputs import Col
from autoconfig.cost.serving_step import StepModel

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class Trace:
    """R requests in arrival order: arrival times at rate 1 (scaled by each row's rate; all
    zero for a burst) or in seconds (a given trace, rate 1), prompt and output lengths."""

    arrival: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray

    @property
    def requests(self) -> int:
        return len(self.input_len)


@dataclass(frozen=True)
class Limits:
    """Per-row scheduler limits and role."""

    rate: Col  # requests/s offered to one replica (1 for a trace in seconds)
    max_seqs: Col
    max_tokens: Col  # token budget of one micro-batch iteration
    kv_tokens: Col  # K/V-cache capacity in tokens
    block_tokens: Col
    static: Col  # 1: static batches
    prefill_only: Col  # 1: a disaggregated prefill instance (requests leave after prefill)
    prompt_cached: Col  # 1: a disaggregated decode instance (prompts arrive cached)


@dataclass(frozen=True)
class Simulated:
    """Per row and request: times in seconds (inf where the request never finished)."""

    ttft: np.ndarray  # [N, R]
    tpot: np.ndarray  # [N, R] (nan for one-token outputs)
    latency: np.ndarray  # [N, R]
    makespan: Col  # first arrival to last finish
    iterations: Col
    finished: Col  # share of requests that finished
    gave_up: np.ndarray  # rows stopped early: they cannot meet the objectives
    steps: int = 0  # loop steps the simulation took (its cost)

    def percentiles(self, values: np.ndarray, skip: int = 0) -> np.ndarray:
        """[N, 3] p50/p90/p99 of `values` over the requests after the first `skip`."""
        kept = values[:, skip:]
        kept = np.where(np.isnan(kept), np.inf, kept) if values is not self.tpot else kept
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # rows without any TPOT: nan
            return np.nanpercentile(kept, PERCENTILES, axis=1).T


@dataclass(frozen=True)
class Stop:
    """Stop a row once it cannot meet its objectives: more than `allowed` of its requests
    over the first-token or per-token limit (seconds) settles the percentile."""

    ttft_s: Col
    tpot_s: Col
    allowed: int
    skip: int = 0  # requests not counted (warm-up)


def simulate(
    step: StepModel,
    trace: Trace,
    limits: Limits,
    stop: Stop | None = None,
    max_steps: int = 100_000,
    jumps: bool = True,
) -> Simulated:
    """Runs every row until its requests finish, it is stopped, or `max_steps` loop steps.
    A step is one iteration, or a run of identical iterations in which nothing arrives,
    finishes or completes its prompt (their time is exact: only the context and the prefill
    position grow, linearly); `jumps=False` steps them one by one (for checks)."""
    n, r = len(limits.rate), trace.requests
    rows = np.arange(n)
    pp = np.asarray(step.pp, dtype=float)
    inp = trace.input_len.astype(float)
    out = np.where(limits.prefill_only[:, None] > 0, 1.0, trace.output_len[None, :].astype(float))
    rate = np.maximum(limits.rate, 1e-12)
    arrival = trace.arrival[None, :] / rate[:, None]
    cum_prompt = np.concatenate([[0.0], np.cumsum(inp)])
    need = (
        np.ceil((inp[None, :] + out) / limits.block_tokens[:, None]) * limits.block_tokens[:, None]
    )
    cum_need = np.concatenate([np.zeros((n, 1)), np.cumsum(need, axis=1)], axis=1)
    shared_need = bool(np.all(cum_need == cum_need[:1]))  # one K/V profile for every row
    # Causal (query, key) pairs of the first g prompt tokens of the trace, by request.
    pairs_before = np.concatenate([[0.0], np.cumsum(inp * (inp + 1.0) / 2.0)])

    clock = np.zeros(n)
    head = np.zeros(n, dtype=np.int64)  # requests admitted
    prefilled = np.zeros(n)  # prompt tokens processed, in trace order
    prefill_head = np.zeros(n, dtype=np.int64)  # requests whose prefill finished
    done = np.zeros(n, dtype=np.int64)  # requests finished (all, for a row that stopped)
    finished = np.zeros(n, dtype=np.int64)
    kv_used = np.zeros(n)
    batch_open = np.zeros(n)  # static rows: sequences of the running batch
    # Decoding requests, kept as sums: count, prompt tokens, and first-token iterations.
    decodes = np.zeros(n)
    decode_prompt = np.zeros(n)
    decode_first = np.zeros(n)
    last_iter = np.full((n, r), np.inf)  # the iteration that emits a request's last token
    first_time = np.full((n, r), np.inf)
    finish_time = np.full((n, r), np.inf)
    iteration = np.zeros(n)
    index = np.arange(r)[None, :]
    static = limits.static > 0
    cached = limits.prompt_cached > 0
    budget = np.where(static, np.inf, limits.max_tokens * pp)
    gave_up = np.zeros(n, dtype=bool)
    loop = 0

    for loop in range(max_steps):
        active = done < r
        if not active.any():
            break
        if stop is not None and loop % 16 == 15:
            late = _violations(stop, arrival, first_time, finish_time, clock, out)
            quit_now = active & (late > stop.allowed)
            gave_up |= quit_now
            done = np.where(quit_now, r, done)
            active = done < r
        running = head - finished
        # Idle rows jump to their next arrival.
        idle = active & (running == 0) & (head < r)
        next_arrival = arrival[rows, np.minimum(head, r - 1)]
        clock = np.where(idle, np.maximum(clock, next_arrival), clock)

        # Admission in arrival order (a row that jumped to an arrival must see it).
        arrived = np.searchsorted(trace.arrival, clock * rate * (1 + 1e-9) + 1e-12, side="right")
        room = np.where(static & (running > 0), 0, limits.max_seqs - running).astype(np.int64)
        reach = cum_need[rows, head] + limits.kv_tokens - kv_used
        if shared_need:
            fits = np.searchsorted(cum_need[0], reach, side="right") - 1 - head
        else:
            fits = (cum_need <= reach[:, None]).sum(axis=1) - 1 - head
        admit = np.maximum(np.minimum(np.minimum(arrived - head, room), fits), 0)
        admit = np.where(active, admit, 0).astype(np.int64)
        kv_used += cum_need[rows, head + admit] - cum_need[rows, head]
        batch_open = np.where(static & (admit > 0), admit, batch_open)
        head = head + admit
        running = head - finished

        context = decode_prompt + decodes * iteration - decode_first

        # Prefill: the oldest unfinished prompts take the rest of the budget.
        waiting_prompt = cum_prompt[head] - prefilled
        chunk = np.maximum(np.minimum(budget - decodes, waiting_prompt), 0.0)
        chunk = np.where(cached, waiting_prompt, chunk)
        new_prefilled = prefilled + chunk
        new_head = np.minimum(np.searchsorted(cum_prompt, new_prefilled, side="right") - 1, head)
        pairs = _pairs(pairs_before, cum_prompt, inp, new_prefilled) - _pairs(
            pairs_before, cum_prompt, inp, prefilled
        )
        completing = (new_head - prefill_head).astype(float)
        work_tokens = np.where(cached, 0.0, chunk)
        work_pairs = np.where(cached, 0.0, pairs)
        batch = np.where(static, np.maximum(batch_open - completing, decodes), decodes)
        tokens = batch + work_tokens
        sequences = batch + completing
        busy = active & ((tokens > 0) | (completing > 0))

        now = np.where(
            busy, _round(step, pp, tokens, work_pairs, work_tokens, context, sequences), 0.0
        )
        # Runs of identical iterations (the same decodes and prefill chunk size; only the
        # context and the chunk's position in its prompt advance, both linearly) are jumped
        # whole up to the next finish, first token or (decode-only) arrival: their time is
        # exactly the mean of the first and last iteration's, times their count.
        until_finish = last_iter.min(axis=1) - iteration
        next_done = cum_prompt[np.minimum(prefill_head + 1, r)]
        until_prompt = np.where(
            chunk > 0, np.ceil((next_done - prefilled) / np.maximum(chunk, 1e-9)) - 1.0, np.inf
        )
        same = busy & (completing == 0) & ~((cached | static) & (chunk > 0))
        runs = np.minimum(until_finish, until_prompt)
        runs = np.where(same & np.isfinite(runs), runs, 0.0)
        waits = (chunk == 0) & (head < r) & (running < limits.max_seqs)
        gap = np.where(waits, arrival[rows, np.minimum(head, r - 1)] - clock, np.inf)

        if jumps and (runs >= 2).any():
            extra = np.maximum(runs - 1.0, 0.0) * batch
            pairs_k = _chunk_pairs(pairs_before, cum_prompt, inp, prefilled, chunk, runs, cached)
            later = np.where(
                runs >= 2,
                _round(step, pp, tokens, pairs_k, work_tokens, context + extra, sequences),
                now,
            )
            runs = np.minimum(runs, np.floor(gap / np.maximum(later, 1e-12)))
            jump = same & (runs >= 2)
            runs = np.where(jump, runs, 1.0)
            pairs_k = _chunk_pairs(pairs_before, cum_prompt, inp, prefilled, chunk, runs, cached)
            grown = context + (runs - 1.0) * batch
            last = np.where(
                jump, _round(step, pp, tokens, pairs_k, work_tokens, grown, sequences), now
            )
            elapsed = np.where(jump, runs * (now + last) / 2.0, now)
        else:
            jump = np.zeros(n, dtype=bool)
            runs = np.ones(n)
            elapsed = now
        end = clock + elapsed
        step_now = busy & ~jump

        # Prompts that finished this iteration emit their first token; their last token
        # comes out - 1 iterations later (at once for one-token outputs).
        newly = (index >= prefill_head[:, None]) & (index < new_head[:, None]) & step_now[:, None]
        first_time = np.where(newly, end[:, None], first_time)
        last_iter = np.where(newly, iteration[:, None] + out - 1.0, last_iter)
        finishing = (last_iter == iteration[:, None]) & step_now[:, None]
        finish_time = np.where(finishing, end[:, None], finish_time)
        last_iter = np.where(finishing, np.inf, last_iter)
        joining = newly & ~finishing
        leaving = finishing & ~newly  # decodes that emitted their last token
        start_iter = iteration[:, None]
        decodes += joining.sum(axis=1) - leaving.sum(axis=1)
        decode_prompt += (joining * inp).sum(axis=1) - (leaving * inp).sum(axis=1)
        # A leaving request's first token came out - 1 - (its decodes) iterations ago.
        first_of_leaving = (leaving * (start_iter - out + 1.0)).sum(axis=1)
        decode_first += (joining * start_iter).sum(axis=1) - first_of_leaving
        count = finishing.sum(axis=1)
        kv_used -= (finishing * need).sum(axis=1)
        finished += count
        done = np.where(done >= r, done, finished)
        batch_open = np.where(static & (finished >= head), 0.0, batch_open)

        prefilled = np.where(
            step_now, new_prefilled, np.where(jump, prefilled + runs * chunk, prefilled)
        )
        prefill_head = np.where(step_now, new_head, prefill_head)
        iteration = iteration + np.where(busy, runs, 0.0)
        # A row that can do nothing (a request larger than the whole cache) stops: its
        # remaining requests never finish.
        stuck = active & ~busy & (running == 0) & (admit == 0) & (arrived > head)
        done = np.where(stuck, r, done)
        clock = np.where(busy, end, clock)

    arrival_all = np.broadcast_to(arrival, (n, r))
    ttft = first_time - arrival_all
    latency = finish_time - arrival_all
    with np.errstate(all="ignore"):
        spread = np.where(np.isfinite(finish_time), finish_time - first_time, np.inf)
        tpot = np.where(out > 1, spread / (out - 1.0), np.nan)
    finite = np.isfinite(finish_time)
    last_finish = np.where(finite, finish_time, -np.inf).max(axis=1)
    makespan = last_finish - arrival_all[:, 0]
    return Simulated(
        ttft, tpot, latency, makespan, iteration, finite.mean(axis=1), gave_up, loop + 1
    )


def _violations(
    stop: Stop,
    arrival: np.ndarray,
    first_time: np.ndarray,
    finish_time: np.ndarray,
    clock: Col,
    out: np.ndarray,
) -> Col:
    """Requests (after the warm-up) already known to miss: no first token within the limit
    (out or not), or finished slower than the per-token limit."""
    waited = np.where(np.isfinite(first_time), first_time, clock[:, None]) - arrival
    slow_first = waited > stop.ttft_s[:, None]
    with np.errstate(all="ignore"):
        per_token = (finish_time - first_time) / np.maximum(out - 1.0, 1.0)
    slow_tokens = np.isfinite(finish_time) & (out > 1) & (per_token > stop.tpot_s[:, None])
    return (slow_first | slow_tokens)[:, stop.skip :].sum(axis=1)


def _round(
    step: StepModel,
    pp: Col,
    tokens: Col,
    prefill_pairs: Col,
    prefill_tokens: Col,
    context: Col,
    sequences: Col,
) -> Col:
    """One iteration's time: pp micro-batches, each a pp-th of the batch, through the
    slowest stage and its hand-off."""
    slot = step.stage(
        tokens / pp, prefill_pairs / pp, prefill_tokens / pp, context / pp, sequences / pp
    )
    return pp * (slot + step.hop(tokens / pp))


def _chunk_pairs(
    pairs_before: np.ndarray,
    cum_prompt: np.ndarray,
    inp: np.ndarray,
    prefilled: Col,
    chunk: Col,
    k: Col,
    cached: np.ndarray,
) -> Col:
    """Attention pairs of the k-th chunk from `prefilled` on (none for cached prompts)."""
    reach = prefilled + np.maximum(k, 1.0) * chunk
    pairs = _pairs(pairs_before, cum_prompt, inp, reach) - _pairs(
        pairs_before, cum_prompt, inp, reach - chunk
    )
    return np.where(cached, 0.0, pairs)


def _pairs(pairs_before: np.ndarray, cum_prompt: np.ndarray, inp: np.ndarray, g: Col) -> Col:
    """Causal attention pairs of the first `g` prompt tokens of the trace."""
    i = np.minimum(np.searchsorted(cum_prompt, g, side="right") - 1, len(inp) - 1)
    into = np.minimum(np.maximum(g - cum_prompt[i], 0.0), inp[i])
    return pairs_before[i] + into * (into + 1.0) / 2.0


def poisson_arrivals(requests: int, seed: int) -> np.ndarray:
    """Arrival times of a Poisson process at rate 1 (exponential gaps), one draw shared by
    every row so that deployments are compared on the same requests."""
    gaps = np.random.default_rng(seed).exponential(1.0, requests)
    return np.cumsum(gaps) - gaps[0]
