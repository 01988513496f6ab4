"""Engine features that change what one request costs: a prefix-cache hit rate and speculative
decoding with an acceptance rate, as inputs of the continuous-batching search.

Prefix caching (vLLM's automatic prefix caching, SGLang's RadixAttention): a share F of each
prompt's tokens is already cached, rounded down to whole tokens and leaving at least the last
token to compute (engines recompute it to get the first token's logits). Those tokens cost no
prefill GEMMs, but the computed tokens still attend to them (their K/V is read) and decoding
attention reads the whole prompt. Their blocks are shared across requests: assumed to be one
set of blocks (a common system prompt or shared history) held once, as large as the longest
cached prefix, reserved off every replica's cache; a request reserves blocks only for its
computed prompt tokens and its output. A disaggregated deployment still moves the whole
prompt's K/V from prefill to decode (the decode pool is not assumed to hold the prefix).

Speculative decoding (Leviathan et al. 2023, Sec. 3.1): each decode step verifies K draft
tokens; with acceptance rate a (each draft token accepted independently with probability a),
a step emits (1 - a^(K+1)) / (1 - a) tokens on average (K + 1 at a = 1). The target model
runs K + 1 query tokens per sequence per step (K + 1 tokens of the iteration's budget and of
its GEMMs, K + 1 logits, K + 1 times the attention FLOPs over the same K/V read once). Each
step emits exactly that mean (a mean-field model: no spread between requests). The draft:
EAGLE / EAGLE-3 / MTP heads are one decoder layer of the target's width run K times a step, so
an iteration takes K / layers longer (applied to the whole iteration, prefill included: an
upper bound, as the head runs once over prompt tokens); n-gram lookup costs no GPU time. A
separate draft model is not modelled (refused with a one-line error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.cost.inputs import Col
from autoconfig.cost.serving_step import StepModel
from autoconfig.serve.workload import Workload
from autoconfig.spec import engines
from autoconfig.spec.schema import ModelSpec

MAX_SPECULATIVE_TOKENS = 16
# Methods whose draft cost is modelled: a one-layer head run K times, or a lookup.
HEAD_METHODS = ("eagle", "eagle3", "mtp")
FREE_METHODS = ("ngram",)
MODELLED_METHODS = HEAD_METHODS + FREE_METHODS


def tokens_per_step(draft_tokens: int, acceptance_rate: float) -> float:
    """Tokens one speculative step emits on average: (1 - a^(K+1)) / (1 - a), K + 1 at a = 1
    (Leviathan et al. 2023, Eq. 1); 1 without drafts."""
    if draft_tokens <= 0:
        return 1.0
    if acceptance_rate >= 1.0:
        return float(draft_tokens + 1)
    return (1.0 - acceptance_rate ** (draft_tokens + 1)) / (1.0 - acceptance_rate)


@dataclass(frozen=True)
class Features:
    prefix_hit_rate: float = 0.0  # share of each prompt's tokens already cached
    speculative_tokens: int = 0  # K draft tokens verified per step (0: off)
    acceptance_rate: float = 0.0
    draft_share: float = 0.0  # the draft's time as a share of a target iteration's

    @property
    def active(self) -> bool:
        return self.prefix_hit_rate > 0 or self.speculative_tokens > 0

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.speculative_tokens, self.acceptance_rate)

    @property
    def queries_per_step(self) -> float:
        return float(self.speculative_tokens + 1)

    def cached_tokens(self, prompt: np.ndarray | float) -> np.ndarray:
        """Prompt tokens served from the prefix cache: F of the prompt, rounded down, at
        least one token left to compute."""
        prompt = np.asarray(prompt, dtype=float)
        return np.clip(np.floor(self.prefix_hit_rate * prompt), 0.0, np.maximum(prompt - 1.0, 0.0))

    def shared_tokens(self, workload: Workload, block_tokens: float) -> float:
        """Cache tokens the shared prefix blocks hold: the longest cached prefix, whole blocks."""
        if self.prefix_hit_rate <= 0:
            return 0.0
        longest = float(self.cached_tokens(float(workload.input.largest)))
        return math.ceil(longest / block_tokens) * block_tokens

    def describe(self) -> str:
        parts = []
        if self.prefix_hit_rate > 0:
            parts.append(f"prefix cache: {self.prefix_hit_rate:.0%} of each prompt cached")
        if self.speculative_tokens > 0:
            parts.append(
                f"speculative decoding: {self.speculative_tokens} draft tokens a step at "
                f"acceptance {self.acceptance_rate:g}, {self.tokens_per_step:.2f} tokens a step, "
                f"the draft {self.draft_share:.1%} of an iteration"
            )
        return "; ".join(parts)


def checked(
    prefix_hit_rate: float | None,
    speculative_tokens: int | None,
    acceptance_rate: float | None,
    speculative_method: str | None,
) -> tuple[float, int, float, str]:
    """(hit rate, draft tokens, acceptance rate, method) checked before any work: one
    UserError line naming the flag for a value out of range, a rate without drafts (or drafts
    without a rate), or a method whose cost is not modelled."""
    hit = 0.0 if prefix_hit_rate is None else checks.fraction(prefix_hit_rate, "prefix-hit-rate")
    drafts = 0
    if speculative_tokens is not None:
        drafts = checks.integer(
            speculative_tokens, "speculative-tokens", low=0, high=MAX_SPECULATIVE_TOKENS
        )
    rate = 0.0
    if acceptance_rate is not None:
        rate = checks.number(acceptance_rate, "acceptance-rate", 0.0, 1.0, low_inclusive=True)
        if drafts == 0:
            raise UserError("acceptance-rate: needs --speculative-tokens K (1..16)")
    elif drafts > 0:
        raise UserError(
            "speculative-tokens: needs --acceptance-rate a (0 <= a <= 1, the chance a draft "
            "token is accepted)"
        )
    if speculative_method is not None and drafts == 0:
        raise UserError("speculative-method: needs --speculative-tokens K (1..16)")
    method = method_name(speculative_method)
    if drafts > 0 and method not in MODELLED_METHODS:
        raise UserError(
            f"speculative-method: {checks.shown(speculative_method)} is not modelled "
            f"(allowed: {', '.join(MODELLED_METHODS)})"
        )
    return hit, drafts, rate, method


def method_name(speculative_method: str | None) -> str:
    """The drafter as the model names it: case and dashes ignored, EAGLE when none is given."""
    return (speculative_method or HEAD_METHODS[0]).strip().lower().replace("-", "_")


def features_of(
    spec: ModelSpec,
    engine: str,
    prefix_hit_rate: float | None,
    speculative_tokens: int | None,
    acceptance_rate: float | None,
    speculative_method: str | None,
    cpu: bool = False,
) -> Features:
    """The features asked for (checked), and the draft's cost on this model; a method the
    engine does not run is one line naming the engine (spec/engines.py)."""
    hit, drafts, rate, method = checked(
        prefix_hit_rate, speculative_tokens, acceptance_rate, speculative_method
    )
    share = 0.0
    if drafts > 0:
        if not cpu:
            engines.check_setting(engine, "speculative_method", method)
        share = drafts / max(spec.layers, 1) if method in HEAD_METHODS else 0.0
    return Features(hit, drafts, rate, share)


def attention_scale(step: StepModel, features: Features) -> np.ndarray:
    """Decode context's attention cost with K + 1 queries per sequence, relative to one: the
    step prices context at max(pair FLOPs, K/V read); the K/V is read once, FLOPs K + 1 times."""
    pair, read = np.asarray(step.pair_s, float), np.asarray(step.kv_read_s, float)
    with np.errstate(all="ignore"):
        scale = np.maximum(features.queries_per_step * pair, read) / np.maximum(pair, read)
    return np.where(np.isfinite(scale), scale, 1.0)


@dataclass(frozen=True)
class Steady:
    """Per replica: the screen's figures with the features (cost/max_load.py's steady state)."""

    requests_per_s: Col
    output_tokens_per_s: Col
    running: Col
    tpot_s: Col
    alone_ttft_s: Col
    alone_tpot_s: Col


def steady_state(
    step: StepModel,
    kv_tokens: Col,
    max_seqs: Col,
    max_tokens: Col,
    workload: Workload,
    features: Features,
    block_tokens: float,
) -> Steady:
    """cost/max_load.py's steady state at maximum load, and one request alone, with a prefix
    hit rate and speculative decoding: x requests finish per iteration; each decodes O / E
    steps (E tokens a step), so the batch holds x O / E decoding sequences and the iteration
    carries x (I - cached) prompt tokens and K + 1 tokens per decoding sequence."""
    prompt, out = workload.input.mean, max(workload.output.mean, 1.0)
    cached = float(features.cached_tokens(prompt))
    computed = prompt - cached
    emitted, queries = features.tokens_per_step, features.queries_per_step
    slower = 1.0 + features.draft_share
    pp = np.asarray(step.pp, float)
    attend = attention_scale(step, features)
    room = np.maximum(
        np.asarray(kv_tokens, float) - features.shared_tokens(workload, block_tokens), 0
    )
    own = math.ceil((computed + out) / block_tokens) * block_tokens
    running = np.minimum(np.asarray(max_seqs, float), np.floor(room / own))
    steps = out / emitted
    finish = np.minimum(
        running / pp / steps, np.asarray(max_tokens, float) / (computed + queries * steps)
    )
    decodes = finish * steps
    prefill = finish * computed
    pairs = prefill * (cached + (computed + 1.0) / 2.0)
    context = decodes * (prompt + out / 2.0) * attend
    tokens = decodes * queries + prefill
    slot = (
        step.stage(tokens, pairs, prefill, context, decodes * queries + finish) + step.hop(tokens)
    ) * slower
    # One request alone: its computed prompt in chunks, then steps of K + 1 queries.
    chunk = np.minimum(computed, np.asarray(max_tokens, float))
    chunks = np.ceil(computed / chunk)
    zero, one, verified = np.zeros_like(pp), np.ones_like(pp), np.full_like(pp, queries)
    first = step.stage(chunk, chunk * (cached + (computed + 1.0) / 2.0), chunk, zero, one)
    alone_step = step.stage(verified, zero, zero, (prompt + out / 2.0) * attend, verified)
    with np.errstate(all="ignore"):
        return Steady(
            requests_per_s=np.where(slot > 0, finish / slot, 0.0),
            output_tokens_per_s=np.where(slot > 0, finish * out / slot, 0.0),
            running=running,
            tpot_s=pp * slot / emitted,
            alone_ttft_s=chunks * pp * (first + step.hop(chunk)) * slower,
            alone_tpot_s=pp * (alone_step + step.hop(verified)) * slower / emitted,
        )
