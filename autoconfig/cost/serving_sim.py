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
of the trace and prefill progress is one counter of prompt tokens per row; decode and finish
bookkeeping read only each row's requests in flight (from its oldest unfinished request to
its prefill head), so a step costs the requests in flight, not the whole trace, and the
simulation grows linearly with the requests. Iteration time comes from cost/serving_step.py;
with pp stages an iteration is a round of pp micro-batches, each a pp-th of the batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
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
    # Prompt tokens already in the prefix cache, per request (None: none): not computed, but
    # read by attention, and held in blocks shared across requests (the caller reserves them).
    cached_len: np.ndarray | None = None

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
    # Speculative decoding (None: off): query tokens each decoding sequence puts through the
    # target model per step (K drafts + 1), the tokens it emits per step on average, and the
    # draft's time as a share of the iteration's.
    queries_per_step: Col | None = None
    tokens_per_step: Col | None = None
    draft_share: Col | None = None


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
    max_steps: int | None = None,
    jumps: bool = True,
) -> Simulated:
    """Runs every row until its requests finish, it is stopped, or `max_steps` loop steps
    (default: 100,000, or 20 per request for longer traces; a request takes about 5).
    A step is one iteration, or a run of identical iterations in which nothing arrives,
    finishes or completes its prompt (their time is exact: only the context and the prefill
    position grow, linearly); `jumps=False` steps them one by one (for checks)."""
    n, r = len(limits.rate), trace.requests
    if max_steps is None:
        max_steps = max(100_000, 20 * r)
    rows = np.arange(n)
    pp = np.asarray(step.pp, dtype=float)
    prompt = trace.input_len.astype(float)  # what decoding attention reads
    cached_len = np.zeros(r) if trace.cached_len is None else trace.cached_len.astype(float)
    inp = prompt - cached_len  # what prefill computes
    out = np.where(limits.prefill_only[:, None] > 0, 1.0, trace.output_len[None, :].astype(float))
    queries = np.ones(n) if limits.queries_per_step is None else limits.queries_per_step
    emitted = np.ones(n) if limits.tokens_per_step is None else limits.tokens_per_step
    slower = 1.0 + (np.zeros(n) if limits.draft_share is None else limits.draft_share)
    # Decode iterations a request takes: its first token, then (out - 1) tokens at `emitted` a
    # step (the mean; the last step emits the rest). Without speculation: out.
    steps_out = np.where(out > 1, 1.0 + np.ceil((out - 1.0) / emitted[:, None] - 1e-9), out)
    # Verifying k queries reads each sequence's K/V once but multiplies the attention FLOPs:
    # the stage prices decode context at max(pair, kv read), so scale the context to match.
    per_pair, per_read = np.asarray(step.pair_s, float), np.asarray(step.kv_read_s, float)
    with np.errstate(all="ignore"):
        attend = np.maximum(queries * per_pair, per_read) / np.maximum(per_pair, per_read)
    attend = np.where(np.isfinite(attend), attend, 1.0)
    rate = np.maximum(limits.rate, 1e-12)
    arrival = trace.arrival[None, :] / rate[:, None]
    cum_prompt = np.concatenate([[0.0], np.cumsum(inp)])
    need = (
        np.ceil((inp[None, :] + out) / limits.block_tokens[:, None]) * limits.block_tokens[:, None]
    )
    cum_need = np.concatenate([np.zeros((n, 1)), np.cumsum(need, axis=1)], axis=1)
    shared_need = bool(np.all(cum_need == cum_need[:1]))  # one K/V profile for every row
    # Causal (query, key) pairs of the first g prompt tokens of the trace, by request (each
    # computed token also attends to its request's cached prefix).
    pairs_before = np.concatenate([[0.0], np.cumsum(inp * (inp + 1.0) / 2.0 + inp * cached_len)])

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
    # Requests before `low` have all finished: every per-request update and check below
    # reads only the window [low, new_head) of each row, so a step costs the requests in
    # flight, not the whole trace (which made the simulation quadratic in the requests).
    low = np.zeros(n, dtype=np.int64)
    settled = np.zeros(n)  # requests before `low` (after the warm-up) over a limit
    iteration = np.zeros(n)
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
            late = settled + _pending_violations(
                stop, arrival, first_time, finish_time, clock, out, low, prefill_head, active
            )
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
            fits = _within(cum_need, reach) - 1 - head
        admit = np.maximum(np.minimum(np.minimum(arrived - head, room), fits), 0)
        admit = np.where(active, admit, 0).astype(np.int64)
        kv_used += cum_need[rows, head + admit] - cum_need[rows, head]
        batch_open = np.where(static & (admit > 0), admit, batch_open)
        head = head + admit
        running = head - finished

        context = decode_prompt + emitted * (decodes * iteration - decode_first)

        # Prefill: the oldest unfinished prompts take the rest of the budget.
        waiting_prompt = cum_prompt[head] - prefilled
        chunk = np.maximum(np.minimum(budget - decodes * queries, waiting_prompt), 0.0)
        chunk = np.where(cached, waiting_prompt, chunk)
        new_prefilled = prefilled + chunk
        new_head = np.minimum(np.searchsorted(cum_prompt, new_prefilled, side="right") - 1, head)
        pairs = _pairs(pairs_before, cum_prompt, inp, new_prefilled, cached_len) - _pairs(
            pairs_before, cum_prompt, inp, prefilled, cached_len
        )
        completing = (new_head - prefill_head).astype(float)
        work_tokens = np.where(cached, 0.0, chunk)
        work_pairs = np.where(cached, 0.0, pairs)
        batch = np.where(static, np.maximum(batch_open - completing, decodes), decodes)
        # Each decoding sequence verifies its drafts: `queries` tokens and as many logits.
        tokens = batch * queries + work_tokens
        sequences = batch * queries + completing
        busy = active & ((tokens > 0) | (completing > 0))

        spec = (attend, slower)
        now = np.where(
            busy, _timed(step, pp, tokens, work_pairs, work_tokens, context, sequences, spec), 0.0
        )
        # The requests in flight: [low, new_head) of each row (idx clipped, `valid` marks them).
        idx, valid = _window(low, np.where(active, new_head, low), r)
        at = (rows[:, None], idx)
        last_w = np.where(valid, last_iter[at], np.inf)
        # Runs of identical iterations (the same decodes and prefill chunk size; only the
        # context and the chunk's position in its prompt advance, both linearly) are jumped
        # whole up to the next finish, first token or (decode-only) arrival: their time is
        # exactly the mean of the first and last iteration's, times their count.
        until_finish = last_w.min(axis=1) - iteration
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
            extra = np.maximum(runs - 1.0, 0.0) * batch * emitted
            pairs_k = _chunk_pairs(
                pairs_before, cum_prompt, inp, prefilled, chunk, runs, cached, cached_len
            )
            later = np.where(
                runs >= 2,
                _timed(step, pp, tokens, pairs_k, work_tokens, context + extra, sequences, spec),
                now,
            )
            runs = np.minimum(runs, np.floor(gap / np.maximum(later, 1e-12)))
            jump = same & (runs >= 2)
            runs = np.where(jump, runs, 1.0)
            pairs_k = _chunk_pairs(
                pairs_before, cum_prompt, inp, prefilled, chunk, runs, cached, cached_len
            )
            grown = context + (runs - 1.0) * batch * emitted
            last = np.where(
                jump, _timed(step, pp, tokens, pairs_k, work_tokens, grown, sequences, spec), now
            )
            elapsed = np.where(jump, runs * (now + last) / 2.0, now)
        else:
            jump = np.zeros(n, dtype=bool)
            runs = np.ones(n)
            elapsed = now
        end = clock + elapsed
        step_now = busy & ~jump

        # Prompts that finished this iteration emit their first token; their last token
        # comes out - 1 iterations later (at once for one-token outputs). Only these and
        # the finishing requests are touched, as (row, request) lists.
        new_rows, new_reqs = _spans(rows, prefill_head, np.where(step_now, new_head, prefill_head))
        first_time[new_rows, new_reqs] = end[new_rows]
        new_last = iteration[new_rows] + steps_out[new_rows, new_reqs] - 1.0
        last_w[new_rows, new_reqs - low[new_rows]] = new_last
        finishing = (last_w == iteration[:, None]) & step_now[:, None]
        fin_rows, fin_cols = np.nonzero(finishing)
        fin_reqs = idx[fin_rows, fin_cols]
        last_iter[new_rows, new_reqs] = new_last
        finish_time[fin_rows, fin_reqs] = end[fin_rows]
        last_iter[fin_rows, fin_reqs] = np.inf
        last_w[fin_rows, fin_cols] = np.inf
        # Decodes that join (a first token but not their last) and leave (their last token
        # after earlier ones); every sum is of whole numbers, exact in any order.
        joins = new_last > iteration[new_rows]
        leaves = fin_reqs < prefill_head[fin_rows]
        j_rows, j_reqs = new_rows[joins], new_reqs[joins]
        l_rows, l_reqs = fin_rows[leaves], fin_reqs[leaves]
        decodes += np.bincount(j_rows, minlength=n) - np.bincount(l_rows, minlength=n)
        decode_prompt += np.bincount(j_rows, prompt[j_reqs], n) - np.bincount(
            l_rows, prompt[l_reqs], n
        )
        # A leaving request's first token came out - 1 - (its decodes) iterations ago.
        first_of_leaving = iteration[l_rows] - steps_out[l_rows, l_reqs] + 1.0
        decode_first += np.bincount(j_rows, iteration[j_rows], n) - np.bincount(
            l_rows, first_of_leaving, n
        )
        count = np.bincount(fin_rows, minlength=n)
        kv_used -= np.bincount(fin_rows, need[fin_rows, fin_reqs], n)
        finished += count
        done = np.where(done >= r, done, finished)
        batch_open = np.where(static & (finished >= head), 0.0, batch_open)
        # The window's finished prefix leaves it (and, with a stop rule, is counted once).
        if count.any():
            reached = np.where(step_now, new_head, prefill_head)
            pending = ~((last_w == np.inf) & (idx < reached[:, None]) & valid)
            passed = np.where(pending.any(axis=1), pending.argmax(axis=1), pending.shape[1])
            passed = np.where(count > 0, passed, 0)
            if stop is not None and passed.any():
                k = int(passed.max())
                part = (rows[:, None], idx[:, :k])
                gone = (np.arange(k)[None, :] < passed[:, None]) & (idx[:, :k] >= stop.skip)
                late = _late(
                    stop, arrival[part], first_time[part], finish_time[part], end, out[part]
                )
                settled += (gone & late).sum(axis=1)
            low = low + passed

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


def _window(low: np.ndarray, end: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row the request indices low..end-1, as [N, W] (W the widest row's span, indices
    clipped into the trace) and which of them are in the row's span."""
    width = max(int((end - low).max(initial=0)), 1)
    idx = low[:, None] + np.arange(width)[None, :]
    valid = idx < end[:, None]
    return np.minimum(idx, r - 1), valid


def _spans(rows: np.ndarray, start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, request) of every request in start..stop-1 of each row."""
    counts = np.maximum(stop - start, 0)
    which = np.repeat(rows, counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return which, start[which] + offsets


def _leading(holds: Callable[[np.ndarray], np.ndarray], n: int, size: int) -> np.ndarray:
    """Per row, how many of the indices 0..size-1 pass `holds` (a test of one index per row)
    when those that pass are a prefix: a bisection, log2(size) tests of N cells each."""
    lo = np.zeros(n, dtype=np.int64)
    hi = np.full(n, size, dtype=np.int64)
    while (open_ := lo < hi).any():
        mid = (lo + hi) // 2
        ok = holds(np.minimum(mid, size - 1))
        lo = np.where(open_ & ok, mid + 1, lo)
        hi = np.where(open_ & ~ok, mid, hi)
    return lo


def _within(cum_need: np.ndarray, reach: Col) -> np.ndarray:
    """Per row, how many of its cumulative K/V needs (each row grows) are within `reach`."""
    n = len(reach)
    rows = np.arange(n)
    return _leading(lambda i: cum_need[rows, i] <= reach, n, cum_need.shape[1])


def _late(
    stop: Stop,
    arrival: np.ndarray,
    first_time: np.ndarray,
    finish_time: np.ndarray,
    clock: Col,
    out: np.ndarray,
) -> np.ndarray:
    """Requests already known to miss: no first token within the limit (out or not), or
    finished slower than the per-token limit."""
    waited = np.where(np.isfinite(first_time), first_time, clock[:, None]) - arrival
    slow_first = waited > stop.ttft_s[:, None]
    with np.errstate(all="ignore"):
        per_token = (finish_time - first_time) / np.maximum(out - 1.0, 1.0)
    slow_tokens = np.isfinite(finish_time) & (out > 1) & (per_token > stop.tpot_s[:, None])
    return slow_first | slow_tokens


def _pending_violations(
    stop: Stop,
    arrival: np.ndarray,
    first_time: np.ndarray,
    finish_time: np.ndarray,
    clock: Col,
    out: np.ndarray,
    low: np.ndarray,
    prefill_head: np.ndarray,
    active: np.ndarray,
) -> Col:
    """Requests from `low` on (after the warm-up) already known to miss: those with a first
    token, read one by one, and those still waiting for it, a prefix of the rest (arrival
    times grow along the trace, so the longest waits come first)."""
    n, r = arrival.shape
    rows = np.arange(n)
    idx, valid = _window(low, np.where(active, prefill_head, low), r)
    at = (rows[:, None], idx)
    late = _late(stop, arrival[at], first_time[at], finish_time[at], clock, out[at])
    seen = (late & valid & (idx >= stop.skip)).sum(axis=1)
    overdue = _leading(lambda i: clock - arrival[rows, i] > stop.ttft_s, n, r)
    return seen + np.maximum(overdue - np.maximum(prefill_head, stop.skip), 0)


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


def _timed(
    step: StepModel,
    pp: Col,
    tokens: Col,
    prefill_pairs: Col,
    prefill_tokens: Col,
    context: Col,
    sequences: Col,
    spec: tuple[Col, Col],
) -> Col:
    """One iteration's time with speculative decoding's terms: `spec` is (the decode context's
    attention scale for the verified queries, 1 + the draft's share of the iteration)."""
    attend, slower = spec
    took = _round(step, pp, tokens, prefill_pairs, prefill_tokens, context * attend, sequences)
    return took * slower


def _chunk_pairs(
    pairs_before: np.ndarray,
    cum_prompt: np.ndarray,
    inp: np.ndarray,
    prefilled: Col,
    chunk: Col,
    k: Col,
    cached: np.ndarray,
    cached_len: np.ndarray | None = None,
) -> Col:
    """Attention pairs of the k-th chunk from `prefilled` on (none for cached prompts)."""
    reach = prefilled + np.maximum(k, 1.0) * chunk
    pairs = _pairs(pairs_before, cum_prompt, inp, reach, cached_len) - _pairs(
        pairs_before, cum_prompt, inp, reach - chunk, cached_len
    )
    return np.where(cached, 0.0, pairs)


def _pairs(
    pairs_before: np.ndarray,
    cum_prompt: np.ndarray,
    inp: np.ndarray,
    g: Col,
    cached_len: np.ndarray | None = None,
) -> Col:
    """Causal attention pairs of the first `g` computed prompt tokens of the trace (each also
    attends to its request's `cached_len` prefix tokens)."""
    i = np.minimum(np.searchsorted(cum_prompt, g, side="right") - 1, len(inp) - 1)
    into = np.minimum(np.maximum(g - cum_prompt[i], 0.0), inp[i])
    prefix = 0.0 if cached_len is None else into * cached_len[i]
    return pairs_before[i] + into * (into + 1.0) / 2.0 + prefix


def poisson_arrivals(requests: int, seed: int) -> np.ndarray:
    """Arrival times of a Poisson process at rate 1 (exponential gaps), one draw shared by
    every row so that deployments are compared on the same requests."""
    gaps = np.random.default_rng(seed).exponential(1.0, requests)
    return np.cumsum(gaps) - gaps[0]
