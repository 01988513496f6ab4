"""One rank of a measured continuous-batching trial: the bundled model serves a request trace
arriving in real time, with the scheduler the serving model simulates (cost/serving_sim.py):
first come first served admission up to max-num-seqs, decodes first, then prompt chunks in
what is left of max-num-batched-tokens, every running sequence one token per iteration.

K/V is kept per sequence slot (max-num-seqs slots of the longest request), so admission is
bounded by the slots. Tensor parallel ranks run the same schedule: rank 0's clock is broadcast
each iteration and every decision follows from it. The first tenth of the requests is left out
of the percentiles (the batch is still filling), as in the simulation.

The trial's load (the trace, the rate and token budget per layout) comes in the environment
variable LOAD_ENV as JSON, written by autoconfig.measure.serving.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from autoconfig.trainer import ops
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.model import Attention, Block, Transformer, apply_rope

LOAD_ENV = "AUTOCONFIG_SERVE_LOAD"
WARMUP_SHARE = 0.1


@dataclass(frozen=True)
class ServeLoad:
    """A trace at rate 1 (scaled by `rate`), and this layout's engine limits."""

    arrivals: tuple[float, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    rate: float
    max_tokens: int

    @staticmethod
    def key(tp: int, max_seqs: int) -> str:
        return f"tp{tp}-seqs{max_seqs}"


def load_for(cfg: TrainConfig) -> ServeLoad | None:
    """This trial's load from the environment, or None (a static-batch trial)."""
    text = os.environ.get(LOAD_ENV)
    if not text:
        return None
    data = json.loads(text)
    layout = data["layouts"].get(ServeLoad.key(cfg.tp, cfg.mbs))
    if layout is None:
        return None
    return ServeLoad(
        tuple(data["arrivals"]),
        tuple(data["inputs"]),
        tuple(data["outputs"]),
        float(layout["rate"]),
        int(layout["max_tokens"]),
    )


class SlotCache:
    """K and V of every slot for one layer: (slots, local kv heads, longest request, head dim)."""

    def __init__(self, shape: tuple[int, int, int, int], dtype, device) -> None:
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens of one sequence from position `start`."""

    slot: int
    start: int
    tokens: torch.Tensor  # (1, s)


def _attend(
    attn: Attention,
    x: torch.Tensor,
    rope,
    cache: SlotCache,
    chunks: list[Chunk],
    slots: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Attention of one iteration's flat token batch (prompt chunks first, then one token per
    decoding sequence): the projections run once over all tokens, the attention core per
    chunk (causal after its cached prefix) and once for the decodes (each over its own
    context)."""
    _, n, _ = x.shape
    d = attn.head_dim
    q = attn.wq(x).view(1, n, -1, d)
    k = attn.wk(x).view(1, n, -1, d)
    v = attn.wv(x).view(1, n, -1, d)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
    gqa = q.shape[0] != k.shape[0]
    outs = []
    at = 0
    for c in chunks:
        s = c.tokens.shape[1]
        span = slice(at, at + s)
        cache.k[c.slot, :, c.start : c.start + s] = k[:, span]
        cache.v[c.slot, :, c.start : c.start + s] = v[:, span]
        keys = cache.k[c.slot, :, : c.start + s]
        values = cache.v[c.slot, :, : c.start + s]
        mask = torch.ones(s, c.start + s, dtype=torch.bool, device=x.device).tril(c.start)
        out = F.scaled_dot_product_attention(
            q[None, :, span], keys[None], values[None], attn_mask=mask, enable_gqa=gqa
        )
        outs.append(out[0])
        at += s
    b = len(slots)
    if b:
        span = slice(at, at + b)
        cache.k[slots, :, positions] = k[:, span].transpose(0, 1)
        cache.v[slots, :, positions] = v[:, span].transpose(0, 1)
        longest = int(positions.max()) + 1
        keys, values = cache.k[slots, :, :longest], cache.v[slots, :, :longest]
        # Grouped queries against their K/V head without repeating K/V (b, kv, group, d).
        kv_heads = keys.shape[1]
        query = q[:, span].transpose(0, 1).reshape(b, kv_heads, -1, d)
        scores = torch.matmul(query, keys.transpose(-1, -2)) / d**0.5
        mask = torch.arange(longest, device=x.device)[None, :] <= positions[:, None]
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), values)  # (b, kv, group, d)
        outs.append(out.reshape(b, -1, d).transpose(0, 1))
    merged = torch.cat(outs, dim=1).transpose(0, 1).reshape(1, n, -1)
    return attn.wo(merged)


@torch.no_grad()
def iteration(
    model: Transformer,
    caches: list[SlotCache],
    chunks: list[Chunk],
    slots: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """One engine iteration over prompt `chunks` and one `tokens` (b,) per decoding sequence
    in `slots` at `positions`; returns the logits of each chunk's last token and of every
    decode, in that order."""
    ids = [c.tokens[0] for c in chunks] + [tokens]
    where = [torch.arange(c.start, c.start + c.tokens.shape[1]) for c in chunks] + [positions]
    flat = torch.cat(ids)[None, :]
    pos = torch.cat(where).to(flat.device)
    x = model.tok_embeddings(flat)
    if model.pos_embeddings is not None:
        x = x + model.pos_embeddings(pos[None, :])
    rope = None if model.rope_cos is None else (model.rope_cos[pos], model.rope_sin[pos])
    block: Block
    for block, cache in zip(model.layers.values(), caches, strict=True):
        x = x + _attend(block.attn, block.attn_norm(x), rope, cache, chunks, slots, positions)
        x = x + block.mlp(block.mlp_norm(x))
    lasts = list(torch.tensor([c.tokens.shape[1] for c in chunks]).cumsum(0) - 1)
    offset = sum(c.tokens.shape[1] for c in chunks)
    rows = torch.tensor([int(i) for i in lasts] + list(range(offset, offset + len(slots))))
    picked = model.norm(x[:, rows])
    logits = model.head(picked)
    return ops.local_tensor(logits)[0]


@dataclass
class Sequence:
    request: int
    slot: int
    prompt: torch.Tensor  # (1, input tokens)
    output_len: int
    prefilled: int = 0
    generated: int = 0
    token: int = 0
    first_s: float | None = None
    done_s: float | None = None
    tokens: list[int] = field(default_factory=list)


class Clock:
    """Seconds since the trace started, rank 0's, shared by every rank each iteration."""

    def __init__(self, world: int, device: torch.device) -> None:
        self.world = world
        self.start = time.perf_counter()
        self.cell = torch.zeros(1, dtype=torch.float64, device=device)

    def now(self) -> float:
        self.cell[0] = time.perf_counter() - self.start
        if self.world > 1:
            dist.broadcast(self.cell, src=0)
        return float(self.cell[0])

    def wait_until(self, at: float) -> None:
        """Idle until `at` (rank 0 sleeps; the others wait on its next broadcast)."""
        left = at - (time.perf_counter() - self.start)
        if left > 0:
            time.sleep(left)


def serve_rank(
    model: Transformer,
    load: ServeLoad,
    cfg: TrainConfig,
    world: int,
    device: torch.device,
    dtype: torch.dtype,
    vocab: int,
    kv_local: int,
    head_dim: int,
) -> dict:
    """Serves the trace; returns this rank's result fields."""
    count = len(load.inputs)
    longest = max(i + o for i, o in zip(load.inputs, load.outputs, strict=True))
    slots_n = cfg.mbs
    caches = [
        SlotCache((slots_n, kv_local, longest, head_dim), dtype, device) for _ in model.layers
    ]
    gen = torch.Generator().manual_seed(cfg.seed)
    prompts = [torch.randint(0, vocab, (1, n), generator=gen).to(device) for n in load.inputs]
    arrivals = np.asarray(load.arrivals, dtype=float) / load.rate
    # One warm-up iteration, so the first request does not pay for lazy set-up.
    iteration(
        model,
        caches,
        [Chunk(0, 0, prompts[0][:, :2])],
        torch.tensor([1], device=device),
        prompts[0][0, :1],
        torch.tensor([0], device=device),
    )

    clock = Clock(world, device)
    free = list(range(slots_n))
    running: list[Sequence] = []
    done: list[Sequence] = []
    records: list[tuple[float, ...]] = []
    nxt = 0
    while len(done) < count:
        now = clock.now()
        while nxt < count and arrivals[nxt] <= now and free:
            running.append(Sequence(nxt, free.pop(0), prompts[nxt], load.outputs[nxt]))
            nxt += 1
        if not running:
            clock.wait_until(arrivals[nxt])
            continue
        decodes = [s for s in running if s.generated >= 1]
        budget = load.max_tokens - len(decodes)
        chunks: list[tuple[Sequence, int]] = []
        for s in running:
            if budget <= 0:
                break
            if s.prefilled < s.prompt.shape[1]:
                take = min(budget, s.prompt.shape[1] - s.prefilled)
                chunks.append((s, take))
                budget -= take
        slots = torch.tensor([s.slot for s in decodes], dtype=torch.long, device=device)
        positions = torch.tensor(
            [s.prompt.shape[1] + s.generated - 1 for s in decodes], dtype=torch.long, device=device
        )
        tokens = torch.tensor([s.token for s in decodes], dtype=torch.long, device=device)
        logits = iteration(
            model,
            caches,
            [
                Chunk(s.slot, s.prefilled, s.prompt[:, s.prefilled : s.prefilled + t])
                for s, t in chunks
            ],
            slots,
            tokens,
            positions,
        )
        nexts = logits.argmax(-1).tolist()
        if device.type == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter() - clock.start
        records.append(_record(chunks, decodes, end - now))
        emitted: list[tuple[Sequence, int]] = []
        for (s, take), token in zip(chunks, nexts, strict=False):
            s.prefilled += take
            if s.prefilled == s.prompt.shape[1]:
                emitted.append((s, token))
        emitted += list(zip(decodes, nexts[len(chunks) :], strict=True))
        for s, token in emitted:
            s.token = token
            s.tokens.append(token)
            s.generated += 1
            if s.first_s is None:
                s.first_s = end
            if s.generated >= s.output_len:
                s.done_s = end
                running.remove(s)
                free.append(s.slot)
                done.append(s)
    out = _summary(done, arrivals, load, cfg, world, len(records))
    out["iterations"] = records
    return out


def _record(chunks: list, decodes: list, seconds: float) -> tuple[float, ...]:
    """(prompt tokens, causal pairs, cached tokens the chunks read, decodes, their summed
    context, sequences emitting, seconds) of one iteration: what the serving model's
    iteration time takes, for fitting its constants (scripts/fit_inference.py --cpu)."""
    prompt = sum(t for _, t in chunks)
    pairs = sum(t * s.prefilled + t * (t + 1) / 2 for s, t in chunks)
    context = sum(s.prompt.shape[1] + s.generated for s in decodes)
    emitting = len(decodes) + sum(1 for s, t in chunks if s.prefilled + t == s.prompt.shape[1])
    return (prompt, pairs, prompt, len(decodes), context, emitting, seconds)


def _summary(
    done: list[Sequence],
    arrivals: np.ndarray,
    load: ServeLoad,
    cfg: TrainConfig,
    world: int,
    iterations: int,
) -> dict:
    done = sorted(done, key=lambda s: s.request)
    skip = int(WARMUP_SHARE * len(done))
    kept = done[skip:]
    ttft = np.array([s.first_s - arrivals[s.request] for s in kept])
    latency = np.array([s.done_s - arrivals[s.request] for s in kept])
    tpot = np.array([(s.done_s - s.first_s) / (s.output_len - 1) for s in kept if s.output_len > 1])
    makespan = max(s.done_s for s in done) - float(arrivals[0])
    output_tokens = sum(s.output_len for s in done)
    fields: dict[str, float] = {}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("latency", latency)):
        for q in (50, 90, 99):
            fields[f"{name}_p{q}_ms"] = (
                float(1e3 * np.percentile(values, q)) if len(values) else 0.0
            )
    # metrics.json counts mbs*output_len tokens per step time: the step time that makes its
    # tokens/s per GPU the trace's output tokens over its makespan.
    per_step = cfg.mbs * (cfg.output_len or 1) * makespan / output_tokens
    return {
        "step_times_s": [per_step],
        "ttft_ms": fields["ttft_p90_ms"],
        "tpot_ms": fields["tpot_p90_ms"],
        "serve": {
            **fields,
            "rate": load.rate,
            "requests": len(done),
            "counted": len(kept),
            "iterations": iterations,
            "makespan_s": makespan,
            "output_tokens_per_s_per_gpu": output_tokens / makespan / world,
        },
        "generated": done[0].tokens,
    }
