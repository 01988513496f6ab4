"""A measured RL post-training loop on CPU, phase by phase, beside the RL planner's prediction
of the same phases, before and after fitting the CPU profile's constants to the measurements.

One process, colocated placement, tp 1: a policy (the bundled trainer's Transformer), a copy
of it that generates (the "engine") and a frozen reference. Each step:
- rollout: `prompts x samples` responses sampled (seeded) from the engine with the bundled
  generator's K/V-cache forward (trainer/generate.py). Response lengths are fixed, or the
  planner's stratified draw of its length distribution (rl/lengths.py); a sequence leaves the
  running batch when its response is done, as the planner's rollout simulation has it;
- log-probs: forward-only passes of the policy (the old log-probs) and of the reference over
  every sequence, one sequence per micro-batch as the planner's trainer layout has it (mbs 1);
- update: one AdamW step over the same micro-batches with a GRPO loss (clipped ratio times the
  group-normalised reward, plus a k3 KL penalty to the reference);
- sync: the trained weights copied into the engine's copy (state_dict copy, what a colocated
  engine's refit does).
The reward is deterministic and trivial: the share of response tokens in the lowest eighth of
the vocabulary, so a working loss visibly raises it within a few steps.

Predictions come from the planner's own phase functions (rl/rollout.py `rollouts`,
rl/update.py `updates`, rl/sync.py `sync`) on the cpu-gloo profile, the one autoconfig's CPU
trials are predicted with. Calibration fits a few of its physical constants (CONSTANTS, each
bounded by a stated physical range) on the phases of some configurations and predicts the
others. The switch phase (offload and engine wake-up) has nothing to measure in one process
and is left out.
"""

from __future__ import annotations

import copy
import functools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from scipy.optimize import least_squares

from autoconfig.base.errors import UserError
from autoconfig.rl.job import Algorithm, Job, Placement, Plan, TrainLayout
from autoconfig.rl.lengths import ResponseLengths
from autoconfig.rl.rollout import rollouts
from autoconfig.rl.sync import SYNC_FIXED_S, sync
from autoconfig.rl.update import updates
from autoconfig.spec import catalog
from autoconfig.spec.defaults import CPU_TRIAL_GPU
from autoconfig.spec.schema import GPUSpec, ModelSpec
from autoconfig.trainer.generate import KVCache, forward
from autoconfig.trainer.model import Transformer

PHASES = ("rollout_s", "logprob_s", "update_s", "sync_s")
REWARD_SHARE = 8  # the rewarded tokens: ids below vocab / REWARD_SHARE
FP32_BYTES = 4.0  # the loop's weights on CPU

# The constants calibration fits: (what it is, unit, lower, upper bound, why that range).
CONSTANTS: dict[str, tuple[str, str, float, float, str]] = {
    "peak_tflops": (
        "the core's fp32 FMA peak the profile scales GEMMs by (profile peak_tflops.bf16)",
        "TFLOP/s",
        0.02,
        0.4,
        "one x86 core at 2-4 GHz with 1-2 FMA units of 8-16 fp32 lanes: 0.03-0.26",
    ),
    "memory_gb_s": (
        "memory bandwidth one core streams (profile memory_tb_s x 1000)",
        "GB/s",
        2.0,
        200.0,
        "one core streams 5-30 GB/s from DRAM and up to ~200 GB/s from its L2/L3, where the "
        "tiny models' weights (8-25 MB) and activations sit",
    ),
    "kernel_us": (
        "fixed cost per training kernel (profile efficiency.kernel_us)",
        "us",
        1.0,
        500.0,
        "PyTorch's eager dispatch of one CPU op is 2-20 us; the model's kernel stands for a few",
    ),
    "step_overhead_ms": (
        "fixed cost per training step (profile efficiency.step_overhead_ms)",
        "ms",
        0.0,
        500.0,
        "optimizer launch and bookkeeping of a step; up to half a second",
    ),
    "serve_kernel_us": (
        "fixed cost per decode kernel (profile inference.kernel_us)",
        "us",
        1.0,
        500.0,
        "as kernel_us, for the generator's ops",
    ),
    "sync_fixed_s": (
        "fixed cost per weight sync (rl/sync.py SYNC_FIXED_S, an assumption for vLLM engines)",
        "s",
        0.0,
        5.0,
        "the planner's own range tops at 5 s; nothing to rebuild in one process, so down to 0",
    ),
}


@dataclass(frozen=True)
class LoopConfig:
    """One measured loop: the model, the rollout batch and lengths, the steps and the optimizer."""

    model: str = "tiny-llama"  # catalog name or a config.json
    layers: int | None = None  # override the model's layer count
    prompts: int = 4
    samples: int = 4
    prompt_len: int = 32
    max_response_len: int = 64
    mean_response_len: float | None = None  # None: every response is max_response_len long
    steps: int = 3  # measured steps after the warmup
    warmup: int = 1  # steps run first and left out of the figures (allocation, first touches)
    lr: float = 3e-3
    kl_coef: float = 0.01
    clip: float = 0.2
    reference: bool = True  # a frozen reference policy for the KL penalty
    seed: int = 0
    threads: int = 1  # torch threads: one core, as the cpu-gloo profile reads a rank

    def spec(self) -> ModelSpec:
        spec = catalog.get_model(self.model)
        if self.layers is not None:
            spec = spec.model_copy(
                update={"layers": self.layers, "name": f"{spec.name}-{self.layers}l"}
            )
        return spec

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.max_response_len

    def label(self) -> str:
        mean = self.mean_response_len
        resp = f"{self.max_response_len}" if mean is None else f"{mean:g}/{self.max_response_len}"
        return (
            f"{self.spec().name} {self.prompts}x{self.samples} prompt {self.prompt_len} "
            f"response {resp}"
        )

    def checked(self) -> LoopConfig:
        """The configuration, or a UserError naming the first bad field."""
        for name in ("prompts", "samples", "prompt_len", "max_response_len", "steps", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UserError(f"{name.replace('_', '-')}: must be at least 1 (got {value})")
        if self.warmup < 0:
            raise UserError(f"warmup: must be at least 0 (got {self.warmup})")
        if self.layers is not None and self.layers < 1:
            raise UserError(f"layers: must be at least 1 (got {self.layers})")
        mean = self.mean_response_len
        if mean is not None and not 1 <= mean <= self.max_response_len:
            raise UserError(
                f"mean-response-len: must be between 1 and the maximum "
                f"{self.max_response_len} (got {mean:g})"
            )
        for name in ("lr", "kl_coef", "clip"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0 or (name == "lr" and value == 0):
                raise UserError(
                    f"{name.replace('_', '-')}: must be a positive number (got {value})"
                )
        spec = self.spec()
        if spec.is_moe:
            raise UserError(f"model: the measured RL loop runs dense models; {spec.name} is MoE")
        if spec.max_seq_len and self.total_len > spec.max_seq_len:
            raise UserError(
                f"max-response-len: a {self.prompt_len}-token prompt plus {self.max_response_len} "
                f"response tokens exceed {spec.name}'s context of {spec.max_seq_len:,}"
            )
        return self


# The fields a configuration string may set, and how each is read.
_FIELDS = {
    "model": str,
    "layers": int,
    "prompts": int,
    "samples": int,
    "prompt_len": int,
    "max_response_len": int,
    "mean_response_len": float,
}


def parse_config(text: str, field: str, **common: object) -> LoopConfig:
    """A configuration from 'key=value,key=value' (keys of _FIELDS; '-' or '_' alike), the
    `common` settings (steps, warmup, ...) applied; a UserError naming `field` otherwise."""
    given: dict[str, object] = {}
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not value.strip():
            raise UserError(f"{field}: expected key=value (got '{item}')")
        if key not in _FIELDS:
            allowed = ", ".join(k.replace("_", "-") for k in _FIELDS)
            raise UserError(f"{field}: unknown key '{key}'; allowed: {allowed}")
        try:
            given[key] = _FIELDS[key](value.strip())
        except ValueError:
            raise UserError(f"{field}: {key} must be a number (got '{value.strip()}')") from None
    if not given:
        raise UserError(f"{field}: give at least one key=value (got '{text}')")
    try:
        return replace(LoopConfig(), **{**common, **given}).checked()  # type: ignore[arg-type]
    except UserError as exc:
        raise UserError(f"{field}: {exc}") from None


def distribution(cfg: LoopConfig) -> ResponseLengths:
    """The response lengths as the planner reads them (fixed: the mean at the maximum)."""
    mean = cfg.mean_response_len if cfg.mean_response_len is not None else cfg.max_response_len
    return ResponseLengths(float(cfg.max_response_len), float(mean))


def response_lengths(cfg: LoopConfig) -> np.ndarray:
    """Each sequence's response length (whole tokens), in sequence order: fixed, or the
    planner's stratified draw (rl/lengths.py) dealt in a seeded order."""
    n = cfg.sequences
    if cfg.mean_response_len is None:
        return np.full(n, cfg.max_response_len, dtype=np.int64)
    drawn = np.ceil(distribution(cfg).stratified(n)).astype(np.int64)
    return drawn[np.random.default_rng(cfg.seed).permutation(n)]


def rewards_of(responses: list[torch.Tensor], vocab: int) -> torch.Tensor:
    """The share of each response's tokens in the lowest 1/REWARD_SHARE of the vocabulary."""
    cut = max(vocab // REWARD_SHARE, 1)
    return torch.stack([(r < cut).float().mean() for r in responses])


def advantages(rewards: torch.Tensor, samples: int) -> torch.Tensor:
    """GRPO's group-normalised reward: each sample against its prompt's group (0 for a group
    of one, or of equal rewards)."""
    groups = rewards.view(-1, samples)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=False) if samples > 1 else torch.ones_like(mean)
    return ((groups - mean) / (std + 1e-6)).reshape(-1)


def full_logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Every position's logits for a sequence of any length up to the model's: the blocks of
    Transformer.forward with the rotary (or learned) positions of the first `seq` positions,
    since its forward takes the tables whole (sequences of the trainer's one length)."""
    seq = tokens.shape[1]
    # a whole model (first and last stage): the embedding and the final norm are there
    assert model.tok_embeddings is not None and model.norm is not None
    x = model.tok_embeddings(tokens)
    if model.pos_embeddings is not None:
        x = x + model.pos_embeddings(torch.arange(seq, device=tokens.device))
    rope = None
    cos, sin = model.rope_cos, model.rope_sin
    if isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor):
        rope = (cos[:seq], sin[:seq])
    for block in model.layers.values():
        x = block(x, rope)
    x = model.norm(x)
    return model.head(x)


@dataclass
class StepRecord:
    """One step's phase times (s) and what it did."""

    step: int
    rollout_s: float
    logprob_s: float
    update_s: float
    sync_s: float
    reward: float  # mean reward of the step's responses
    loss: float
    grad_norm: float
    synced: bool  # the engine's weights equal the policy's bit for bit after the sync


@dataclass
class LoopResult:
    """A loop's steps and the medians of its measured ones."""

    config: LoopConfig
    records: list[StepRecord]
    response_tokens: int  # per step

    @property
    def measured(self) -> list[StepRecord]:
        return self.records[self.config.warmup :]

    def phases(self) -> dict[str, float]:
        """Median seconds per phase over the measured steps."""
        return {p: statistics.median(getattr(r, p) for r in self.measured) for p in PHASES}


class RLLoop:
    """The policy, the engine's copy, the reference and the optimizer of one loop."""

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg = cfg.checked()
        self.spec = cfg.spec()
        self.policy = Transformer(self.spec, cfg.total_len)
        self.policy.init_weights(cfg.seed)
        self.policy.float()
        self.engine = copy.deepcopy(self.policy).eval()
        self.engine.requires_grad_(False)
        self.reference = copy.deepcopy(self.policy).eval() if cfg.reference else None
        if self.reference is not None:
            self.reference.requires_grad_(False)
        # AdamW with the per-tensor loop, as the trainer's CPU ranks run it (parallel.py)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=False
        )
        self.lengths = response_lengths(cfg)

    # -- phases ---------------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(prompts repeated per sample, each sequence's response) sampled from the engine."""
        cfg, spec = self.cfg, self.spec
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + step)
        prompts = torch.randint(0, spec.vocab, (cfg.prompts, cfg.prompt_len), generator=gen)
        tokens = prompts.repeat_interleave(cfg.samples, dim=0)
        # Longest first, so the sequences still running are always the first `alive` rows and
        # the batch shrinks by slicing (views, no copy) as responses end.
        order = np.argsort(-self.lengths, kind="stable")
        lengths = self.lengths[order]
        n = cfg.sequences
        shape = (n, spec.kv, cfg.total_len, spec.dhead)
        caches = [KVCache(shape, torch.float32, torch.device("cpu")) for _ in self.engine.layers]
        out = torch.zeros(n, int(lengths[0]), dtype=torch.long)
        logits = forward(self.engine, tokens[torch.from_numpy(order)], caches, 0)
        out[:, 0] = self._sample(logits, gen)
        pos = cfg.prompt_len
        for t in range(1, int(lengths[0])):
            alive = int(np.count_nonzero(lengths > t))
            for cache in caches:
                cache.k, cache.v = cache.k[:alive], cache.v[:alive]
            logits = forward(self.engine, out[:alive, t - 1 : t], caches, pos)
            out[:alive, t] = self._sample(logits, gen)
            pos += 1
        responses: list[torch.Tensor] = [torch.empty(0, dtype=torch.long)] * n
        for row, seq in enumerate(order):
            responses[int(seq)] = out[row, : int(lengths[row])].clone()
        return tokens, responses

    @staticmethod
    def _sample(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        probs = torch.softmax(logits[:, -1].float(), dim=-1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(1)

    def _response_logprobs(self, model: Transformer, seq: torch.Tensor, start: int):
        """Log-probs of seq's tokens from position `start` on (the response)."""
        logits = full_logits(model, seq[None, :-1])[0, start - 1 :].float()
        return torch.log_softmax(logits, dim=-1).gather(1, seq[start:, None]).squeeze(1)

    def logprobs(self, seqs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The old policy's and the reference's log-probs of every response (forward only)."""
        start = self.cfg.prompt_len
        with torch.no_grad():
            self.policy.eval()
            old = [self._response_logprobs(self.policy, s, start) for s in seqs]
            ref = (
                [self._response_logprobs(self.reference, s, start) for s in seqs]
                if self.reference is not None
                else old
            )
        return old, ref

    def update(
        self,
        seqs: list[torch.Tensor],
        old: list[torch.Tensor],
        ref: list[torch.Tensor],
        adv: torch.Tensor,
    ) -> float:
        """One optimizer step of the GRPO loss over every sequence (one per micro-batch, the
        gradients accumulated); returns the loss."""
        cfg, start = self.cfg, self.cfg.prompt_len
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = float(sum(len(s) - start for s in seqs))
        total = 0.0
        for seq, old_lp, ref_lp, a in zip(seqs, old, ref, adv, strict=True):
            logp = self._response_logprobs(self.policy, seq, start)
            ratio = torch.exp(logp - old_lp)
            clipped = torch.clamp(ratio, 1.0 - cfg.clip, 1.0 + cfg.clip)
            policy_loss = -torch.minimum(ratio * a, clipped * a)
            # k3 estimator of KL(policy || reference): exp(r - p) - (r - p) - 1 >= 0
            gap = ref_lp - logp
            kl = torch.exp(gap) - gap - 1.0
            loss = (policy_loss + cfg.kl_coef * kl).sum() / tokens
            loss.backward()
            total += float(loss.detach())
        self.optimizer.step()
        return total

    def sync(self) -> None:
        """The trained weights into the engine's copy."""
        self.engine.load_state_dict(self.policy.state_dict())

    def synced(self) -> bool:
        engine = self.engine.state_dict()
        return all(torch.equal(v, engine[k]) for k, v in self.policy.state_dict().items())

    def grad_norm(self) -> float:
        grads = [p.grad.detach().norm() for p in self.policy.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0

    # -- a step -------------------------------------------------------------------------------
    def step(self, index: int) -> StepRecord:
        t0 = time.perf_counter()
        tokens, responses = self.rollout(index)
        t1 = time.perf_counter()
        seqs = [torch.cat([p, r]) for p, r in zip(tokens, responses, strict=True)]
        old, ref = self.logprobs(seqs)
        t2 = time.perf_counter()
        rewards = rewards_of(responses, self.spec.vocab)
        adv = advantages(rewards, self.cfg.samples)
        loss = self.update(seqs, old, ref, adv)
        t3 = time.perf_counter()
        self.sync()
        t4 = time.perf_counter()
        return StepRecord(
            index,
            t1 - t0,
            t2 - t1,
            t3 - t2,
            t4 - t3,
            float(rewards.mean()),
            loss,
            self.grad_norm(),
            self.synced(),
        )


def run_loop(cfg: LoopConfig) -> LoopResult:
    """Runs warmup + steps RL steps of `cfg` in this process and times each phase."""
    return run_loops([cfg])[0]


def run_loops(configs: Sequence[LoopConfig], progress=None) -> list[LoopResult]:
    """Runs every configuration's loop, interleaved step by step (step i of each, then step
    i + 1 of each), so that a slow spell of a shared machine falls on all of them alike rather
    than on whichever ran last. Each loop runs on its configuration's torch threads."""
    loops = [RLLoop(cfg) for cfg in configs]
    records: list[list[StepRecord]] = [[] for _ in loops]
    threads = torch.get_num_threads()
    try:
        for i in range(max(c.warmup + c.steps for c in configs)):
            if progress:
                progress(f"step {i + 1} of every configuration")
            for loop, done in zip(loops, records, strict=True):
                if i < loop.cfg.warmup + loop.cfg.steps:
                    torch.set_num_threads(loop.cfg.threads)
                    done.append(loop.step(i))
    finally:
        torch.set_num_threads(threads)
    return [
        LoopResult(loop.cfg, done, int(loop.lengths.sum()))
        for loop, done in zip(loops, records, strict=True)
    ]


# -- predictions ------------------------------------------------------------------------------
def base_constants(gpu: GPUSpec | None = None) -> dict[str, float]:
    """The CONSTANTS' values in a profile (the cpu-gloo profile's by default)."""
    gpu = gpu or catalog.get_gpu(CPU_TRIAL_GPU)
    inference = gpu.inference
    return {
        "peak_tflops": float(gpu.peak_tflops["bf16"]),
        "memory_gb_s": float(gpu.memory_tb_s) * 1e3,
        "kernel_us": float(gpu.efficiency.kernel_us),
        "step_overhead_ms": float(gpu.efficiency.step_overhead_ms),
        "serve_kernel_us": float(inference.kernel_us) if inference is not None else 0.0,
        "sync_fixed_s": SYNC_FIXED_S,
    }


def with_constants(gpu: GPUSpec, values: dict[str, float]) -> GPUSpec:
    """A copy of the profile with the CONSTANTS given replaced (sync_fixed_s is the sync's,
    not the profile's, and is applied by `predict`)."""
    eff = gpu.efficiency.model_copy(
        update={k: values[k] for k in ("kernel_us", "step_overhead_ms") if k in values}
    )
    update: dict[str, object] = {"efficiency": eff}
    if "peak_tflops" in values:
        update["peak_tflops"] = {**gpu.peak_tflops, "bf16": values["peak_tflops"]}
    if "memory_gb_s" in values:
        update["memory_tb_s"] = values["memory_gb_s"] / 1e3
    if "serve_kernel_us" in values and gpu.inference is not None:
        update["inference"] = gpu.inference.model_copy(
            update={"kernel_us": values["serve_kernel_us"]}
        )
    return gpu.model_copy(update=update)


def job_of(cfg: LoopConfig, gpu: GPUSpec) -> Job:
    """The planner's job for the loop: one GPU, GRPO, the same batch, prompt and lengths."""
    return Job(
        cfg.spec(),
        gpu,
        gpu.cluster,
        1,
        Algorithm.GRPO,
        cfg.prompts,
        cfg.samples,
        cfg.prompt_len,
        distribution(cfg),
        reference=cfg.reference,
    ).checked()


COLOCATED = Plan(Placement.COLOCATED, 1, 1, 1, TrainLayout())


@functools.cache
def weight_tensors(cfg: LoopConfig) -> int:
    """Tensors in the model's state dict (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        return len(Transformer(cfg.spec(), cfg.total_len).state_dict())


def copy_seconds(cfg: LoopConfig, values: dict[str, float], memory_eff: float) -> float:
    """The local weight copy of a one-process refit: one copy op per tensor (each a kernel of
    the profile's fixed cost) and every fp32 weight read and written once at the profile's
    memory bandwidth. rl/sync.py counts no copy for colocated engines (they read the
    trainer's tensors through CUDA IPC), so this term is added here."""
    moved = 2.0 * FP32_BYTES * float(cfg.spec().param_count())
    launches = weight_tensors(cfg) * values["kernel_us"] * 1e-6
    return launches + moved / (values["memory_gb_s"] * 1e9 * memory_eff)


def predict(cfg: LoopConfig, values: dict[str, float] | None = None) -> dict[str, float]:
    """The planner's seconds for each phase of the loop on the cpu-gloo profile, with
    `values` of CONSTANTS in place of the profile's (and of the sync's fixed cost)."""
    base = catalog.get_gpu(CPU_TRIAL_GPU)
    values = {**base_constants(base), **(values or {})}
    gpu = with_constants(base, values)
    job = job_of(cfg, gpu)
    roll = rollouts(job, [COLOCATED.rollout_tp], [COLOCATED.rollout_gpus], [0])[0]
    upd = updates(job, [COLOCATED.train], COLOCATED.train_gpus)[0]
    weights = replace(sync(job, COLOCATED, upd.state_gib), fixed_s=values["sync_fixed_s"])
    copy_s = copy_seconds(cfg, values, gpu.efficiency.memory)
    return {
        "rollout_s": roll.seconds,
        "logprob_s": upd.logprob_s,
        "update_s": upd.update_s,
        "sync_s": weights.sync_s + copy_s,
    }


# -- calibration --------------------------------------------------------------------------------
@dataclass
class Fit:
    """Fitted CONSTANTS and what they were fitted on."""

    values: dict[str, float]
    prior: dict[str, float]
    fitted_on: list[str]
    cost: float = float("nan")  # rms log residual over the fitted phases

    def lines(self) -> list[str]:
        out = []
        for name, value in self.values.items():
            _, unit, lo, hi, why = CONSTANTS[name]
            out.append(
                f"{name} {self.prior[name]:g} -> {value:.4g} {unit} (range {lo:g}-{hi:g}: {why})"
            )
        return out


def _log_residuals(
    names: Sequence[str], x: np.ndarray, configs: list[LoopConfig], measured: list[dict]
) -> np.ndarray:
    values = dict(zip(names, np.exp(x), strict=True))
    out = []
    for cfg, meas in zip(configs, measured, strict=True):
        pred = predict(cfg, values)
        out += [np.log(max(pred[p], 1e-12) / meas[p]) for p in PHASES]
    return np.array(out)


def fit(configs: list[LoopConfig], measured: list[dict[str, float]]) -> Fit:
    """CONSTANTS fitted to the measured phases of `configs` (least squares on log(predicted /
    measured), every phase alike), each within its range."""
    if not configs:
        raise UserError("fit: no configuration to fit the constants on")
    prior = base_constants()
    names = list(CONSTANTS)
    lo = np.array([CONSTANTS[k][2] for k in names])
    hi = np.array([CONSTANTS[k][3] for k in names])
    # fitted in log space (the constants span decades); a zero bound is a tiny positive one
    log_lo, log_hi = np.log(np.maximum(lo, 1e-6)), np.log(hi)
    start = np.clip(np.log(np.maximum([prior[k] for k in names], 1e-6)), log_lo, log_hi)
    start = np.clip(start, log_lo + 1e-9, log_hi - 1e-9)
    result = least_squares(
        lambda x: _log_residuals(names, x, configs, measured),
        start,
        bounds=(log_lo, log_hi),
        diff_step=1e-3,
        x_scale=1.0,
        max_nfev=200,
    )
    values = dict(zip(names, (float(v) for v in np.exp(result.x)), strict=True))
    rms = float(np.sqrt(np.mean(result.fun**2)))
    return Fit(values, prior, [c.label() for c in configs], rms)


# -- the comparison ----------------------------------------------------------------------------
# Fitted on four configurations (batch, lengths fixed and drawn, two depths), checked on
# four others: other batches, prompt and response lengths, another architecture (tiny-gpt:
# LayerNorm, GELU, learned positions, tied embeddings) and another depth.
DEFAULT_FIT = (
    LoopConfig(prompts=4, samples=4, prompt_len=32, max_response_len=32),
    LoopConfig(prompts=4, samples=4, prompt_len=32, max_response_len=96),
    LoopConfig(prompts=8, samples=4, prompt_len=32, max_response_len=48),
    LoopConfig(
        layers=4, prompts=4, samples=4, prompt_len=32, max_response_len=64, mean_response_len=32
    ),
)
DEFAULT_HELD_OUT = (
    LoopConfig(prompts=2, samples=8, prompt_len=48, max_response_len=128, mean_response_len=64),
    LoopConfig(prompts=8, samples=2, prompt_len=16, max_response_len=64),
    LoopConfig(model="tiny-gpt", prompts=4, samples=4, prompt_len=32, max_response_len=64),
    LoopConfig(
        layers=12, prompts=4, samples=8, prompt_len=32, max_response_len=64, mean_response_len=24
    ),
)


@dataclass
class Comparison:
    """Measured against predicted phases of every configuration, before and after the fit."""

    results: list[LoopResult]
    held_out: list[bool]
    fitted: Fit
    table: pd.DataFrame = field(default_factory=pd.DataFrame)

    def summary(self) -> pd.DataFrame:
        """Per phase, the median absolute error (%) before and after, in and out of sample."""
        t = self.table
        rows = []
        for phase in PHASES:
            part = t[t["phase"] == phase]
            row: dict[str, object] = {"phase": phase}
            for name, sel in (("fitted", ~part["held_out"]), ("held_out", part["held_out"])):
                for when in ("before", "after"):
                    col = f"error_{when}_pct"
                    vals = part.loc[sel, col].abs()
                    row[f"{name}_{when}_pct"] = float(vals.median()) if len(vals) else np.nan
            rows.append(row)
        return pd.DataFrame(rows)


def compare(
    fit_on: Sequence[LoopConfig] = DEFAULT_FIT,
    held_out: Sequence[LoopConfig] = DEFAULT_HELD_OUT,
    progress=None,
) -> Comparison:
    """Runs every configuration's loop, fits CONSTANTS on `fit_on`'s measured phases and
    predicts every phase of all of them before and after; `held_out` were not fitted on."""
    configs = [c.checked() for c in (*fit_on, *held_out)]
    if progress:
        progress(
            f"measuring {len(configs)} configurations: " + "; ".join(c.label() for c in configs)
        )
    results = run_loops(configs, progress)
    measured = [r.phases() for r in results]
    if progress:
        progress(f"fitting {len(CONSTANTS)} constants on {len(fit_on)} configurations")
    fitted = fit(configs[: len(fit_on)], measured[: len(fit_on)])
    flags = [False] * len(fit_on) + [True] * len(held_out)
    rows = []
    for cfg, result, meas, out in zip(configs, results, measured, flags, strict=True):
        before, after = predict(cfg), predict(cfg, fitted.values)
        for phase in PHASES:
            rows.append(
                {
                    "config": cfg.label(),
                    "held_out": out,
                    "phase": phase,
                    "measured_s": meas[phase],
                    "predicted_before_s": before[phase],
                    "predicted_after_s": after[phase],
                    "error_before_pct": 100.0 * (before[phase] / meas[phase] - 1.0),
                    "error_after_pct": 100.0 * (after[phase] / meas[phase] - 1.0),
                    "steps": cfg.steps,
                    "response_tokens": result.response_tokens,
                }
            )
    return Comparison(results, flags, fitted, pd.DataFrame(rows))


def report_json(comparison: Comparison) -> dict:
    """What `autoconfig rl-measure --out` writes beside the CSV: the fitted constants with
    their prior and range, what they were fitted on, and the per-phase summary."""
    fitted = comparison.fitted
    return {
        "profile": CPU_TRIAL_GPU,
        "constants": {
            name: {
                "prior": fitted.prior[name],
                "fitted": value,
                "unit": CONSTANTS[name][1],
                "range": [CONSTANTS[name][2], CONSTANTS[name][3]],
                "what": CONSTANTS[name][0],
                "why_this_range": CONSTANTS[name][4],
            }
            for name, value in fitted.values.items()
        },
        "fitted_on": fitted.fitted_on,
        "held_out": [
            r.config.label()
            for r, h in zip(comparison.results, comparison.held_out, strict=True)
            if h
        ],
        "rms_log_residual": fitted.cost,
        # the machine's load while it ran: the loop shares its cores with whatever else runs
        "load_average_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "summary_median_abs_error_pct": comparison.summary().to_dict(orient="records"),
        "steps": [
            {"config": r.config.label(), **vars(rec)}
            for r in comparison.results
            for rec in r.records
        ],
    }
