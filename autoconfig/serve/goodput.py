"""The continuous-batching search: every replica layout (tp, pp, ep), weight and K/V precision,
running-batch limit (max-num-seqs) and per-iteration token budget (max-num-batched-tokens, the
chunked-prefill size) on the GPUs, ranked by goodput: the highest request rate the deployment
serves with TTFT and TPOT (and latency) within their limits at the requested percentile
(Zhong et al. 2024, "DistServe", Sec. 2: goodput under SLO attainment).

Three passes keep thousands of candidates within seconds:
1. memory and a steady-state screen (cost/kv_cache.py, cost/max_load.py) for all: what fits,
   the most requests/s a replica can take, and whether one request alone already misses;
2. the scheduler simulation (cost/serving_sim.py) of the most promising candidates at a ladder
   of request rates up to that maximum, refined between the last rate that met and the first
   that missed;
3. disaggregated prefill (serve/disaggregate.py) built from the simulated layouts.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.columns.build import serving_inputs
from autoconfig.cost.inference import SERVING_ENGINES
from autoconfig.cost.kv_cache import kv_capacity
from autoconfig.cost.max_load import max_load
from autoconfig.cost.serving_sim import Limits, Simulated, Stop, simulate
from autoconfig.cost.serving_step import StepModel, step_model, take
from autoconfig.serve import no_fit
from autoconfig.serve.features import Features, features_of, steady_state
from autoconfig.serve.request import Request
from autoconfig.serve.search import min_gpus, tp_degrees
from autoconfig.serve.workload import MAX_REQUESTS, MIN_REQUESTS, Lengths, Workload, chat
from autoconfig.spec import catalog, engines
from autoconfig.spec.schema import ClusterSpec, GPUSpec, ModelSpec
from autoconfig.spec.vocab import GIB, KvPrecision, ServePrecision

MAX_SEQS = (16, 32, 64, 128, 256, 512)
MAX_TOKENS = (2048, 8192)
BLOCK_TOKENS = 16.0
# Rates tried, as fractions of a replica's steady-state maximum.
LADDER = (0.2, 0.4, 0.6, 0.8, 0.9)
WARMUP_SHARE = 0.1  # requests left out of the percentiles: the system is still filling


@dataclass(frozen=True)
class Deployments:
    """The replica candidates and their figures (one row each)."""

    table: pd.DataFrame
    step: StepModel
    kv_tokens: np.ndarray  # per replica, less the shared prefix blocks
    features: Features = field(default_factory=Features)


def weight_choices(req: Request, gpu: GPUSpec) -> list[str]:
    """Weights tried: those asked for, else 16-bit plus fp8 and nvfp4 where the GPU has
    them (int8 / int4 weight-only on request)."""
    if req.precisions:
        chosen = [ServePrecision.parse(p, "precision").value for p in req.precisions]
        for p in chosen:
            if p in ("fp8", "nvfp4") and not gpu.supports(p):
                raise UserError(f"precision: {gpu.name} has no {p} tensor cores (use int8/int4)")
            if gpu.chip != "cpu":
                engines.check_setting(req.engine, "weight_format", p)
        return list(dict.fromkeys(chosen))
    if gpu.chip == "cpu":
        return [ServePrecision.FP32.value]
    wanted = ["bf16", *(p for p in ("fp8", "nvfp4") if gpu.supports(p))]
    return [p for p in wanted if engines.supports(engines.engine(req.engine), "weight_format", p)]


def kv_choices(req: Request, gpu: GPUSpec) -> list[str]:
    """K/V formats tried: those asked for, else the weights' 16-bit type and fp8 where the GPU
    has fp8 tensor cores (fp8 attention)."""
    if req.kv_precisions:
        chosen = [KvPrecision.parse(k, "kv-precision").value for k in req.kv_precisions]
        for k in chosen:
            if gpu.chip != "cpu" and k != KvPrecision.AUTO.value:
                engines.check_setting(req.engine, "kv_format", k)
        return list(dict.fromkeys(chosen))
    if gpu.chip == "cpu":
        return [KvPrecision.AUTO.value]
    fp8 = gpu.supports("fp8") and engines.supports(engines.engine(req.engine), "kv_format", "fp8")
    return [KvPrecision.AUTO.value, *(["fp8"] if fp8 else [])]


def layouts(req: Request, spec: ModelSpec, node: int) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) of replicas that use all the GPUs: tp within a node unless allowed
    across, tp suited to the heads; ep = tp for MoE models as a second choice."""
    out = []
    for tp in tp_degrees(spec, req.gpus, node, req.allow_tp_across_nodes):
        if req.gpus % tp:
            continue
        for pp in range(1, min(req.gpus // tp, spec.layers) + 1):
            if (req.gpus // tp) % pp:
                continue
            out.append((tp, pp, 1))
            if spec.is_moe and tp > 1:
                out.append((tp, pp, tp))
    return out


def candidates(
    req: Request,
    spec: ModelSpec,
    hardware: tuple[GPUSpec, ClusterSpec],
    workload: Workload,
    splits: list[tuple[int, int, int]],
) -> Deployments:
    gpu = hardware[0]
    grid = pd.MultiIndex.from_product(
        [
            range(len(splits)),
            weight_choices(req, gpu),
            kv_choices(req, gpu),
            req.max_seqs or MAX_SEQS,
            req.max_tokens or MAX_TOKENS,
        ],
        names=["split", "precision", "kv", "max_seqs", "max_tokens"],
    ).to_frame(index=False)
    split = np.array(splits)[grid["split"].to_numpy()]
    # enum members, not a Series: pandas may store mapped str-enums as plain strings
    weights = [ServePrecision(p) for p in grid["precision"]]
    kv = [KvPrecision(k).resolve(w).value for k, w in zip(grid["kv"], weights, strict=True)]
    table = pd.DataFrame(
        {
            "tp": split[:, 0],
            "pp": split[:, 1],
            "ep": split[:, 2],
            "replicas": req.gpus // (split[:, 0] * split[:, 1]),
            "precision": [w.value for w in weights],
            "kv_precision": kv,
            "max_num_seqs": grid["max_seqs"].astype(int),
            "max_num_batched_tokens": grid["max_tokens"].astype(int),
        }
    ).drop_duplicates(ignore_index=True)
    table = table[table["max_num_batched_tokens"] >= table["max_num_seqs"]].reset_index(drop=True)
    if table.empty:
        raise UserError(_no_pairing(req))
    table["kv_fraction"] = req.kv_fraction
    frame = _deployment_frame(table, workload, req.kv_fraction)
    # A CPU trial runs the bundled generator: a library runtime, not an engine.
    cpu = hardware[0].chip == "cpu"
    frame["engine"] = 0.0 if cpu else float(SERVING_ENGINES.index(req.engine))
    inputs = serving_inputs(spec, hardware, frame)
    with np.errstate(all="ignore"):
        cap = kv_capacity(inputs)
        step = step_model(inputs)
        load = max_load(inputs, step, cap)
    features = request_features(req, spec, cpu)
    kv_tokens = cap.tokens
    if features.active:
        # The screen and the lone request with cached prompt tokens and speculative steps.
        steady = steady_state(
            step,
            cap.tokens,
            table["max_num_seqs"].to_numpy(float),
            table["max_num_batched_tokens"].to_numpy(float),
            workload,
            features,
            BLOCK_TOKENS,
        )
        load = replace(
            load,
            requests_per_s=steady.requests_per_s,
            output_tokens_per_s=steady.output_tokens_per_s,
            running=steady.running,
            tpot_s=steady.tpot_s,
        )
        kv_tokens = np.maximum(cap.tokens - features.shared_tokens(workload, BLOCK_TOKENS), 0.0)
    gpus = table["tp"] * table["pp"]
    table["kv_cache_gib"] = cap.cache / GIB
    table["kv_cache_tokens"] = cap.tokens
    table["weights_gib"] = cap.weights / GIB
    table["max_load_requests_per_s"] = load.requests_per_s * table["replicas"]
    table["max_load_tokens_per_s_per_gpu"] = load.output_tokens_per_s / gpus
    table["max_load_running"] = load.running
    table["max_load_tpot_ms"] = 1e3 * load.tpot_s
    # One request alone: the best first-token and per-token times this replica can give.
    prompt, out = workload.input.mean, workload.output.mean
    chunk = np.minimum(prompt, table["max_num_batched_tokens"].to_numpy(float))
    chunks = np.ceil(prompt / chunk)
    pp = table["pp"].to_numpy(float)
    prefill = step.stage(chunk / 1.0, chunk * (prompt + 1) / 2.0, chunk, 0.0, 1.0) + step.hop(chunk)
    decode = step.stage(1.0, 0.0, 0.0, prompt + out / 2.0, 1.0) + step.hop(1.0)
    table["alone_ttft_ms"] = 1e3 * chunks * pp * prefill
    table["alone_tpot_ms"] = 1e3 * pp * decode
    if features.active:
        table["alone_ttft_ms"] = 1e3 * steady.alone_ttft_s
        table["alone_tpot_ms"] = 1e3 * steady.alone_tpot_s
    table["fits"] = cap.tokens >= np.ceil(workload.longest / BLOCK_TOKENS) * BLOCK_TOKENS
    return Deployments(table, step, kv_tokens, features)


def request_features(req: Request, spec: ModelSpec, cpu: bool = False) -> Features:
    """The prefix-cache and speculative-decoding settings of `req`, checked."""
    return features_of(
        spec,
        req.engine,
        req.prefix_hit_rate,
        req.speculative_tokens,
        req.acceptance_rate,
        req.speculative_method,
        cpu,
    )


def _no_pairing(req: Request) -> str:
    """Every token budget below every running-batch limit: an iteration carries a token of
    each running sequence, so no (max-num-seqs, max-num-batched-tokens) pair is possible."""
    seqs, tokens = req.max_seqs or MAX_SEQS, req.max_tokens or MAX_TOKENS
    if req.max_seqs and not req.max_tokens:
        return (
            f"max-num-seqs: {min(seqs):,} running sequences need as many tokens per iteration, "
            f"more than the max-num-batched-tokens tried ({', '.join(f'{t:,}' for t in tokens)}); "
            f"give at most {max(tokens):,}, or a larger --max-num-batched-tokens"
        )
    return (
        f"max-num-batched-tokens: {max(tokens):,} tokens per iteration is below every "
        f"max-num-seqs tried (the least {min(seqs):,}); an iteration carries a token of each "
        f"running sequence: give at least {min(seqs):,}"
        + ("" if req.max_seqs else ", or a smaller --max-num-seqs")
    )


def _deployment_frame(table: pd.DataFrame, workload: Workload, kv_fraction: float) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "tp": table["tp"].astype(float),
            "pp": table["pp"].astype(float),
            "batch_size": 1.0,
            "input_len": workload.input.mean,
            "output_len": workload.output.mean,
            "replicas": table["replicas"].astype(float),
            "precision": table["precision"],
            "kv_precision": table["kv_precision"],
            "ep": table["ep"].astype(float),
            "max_seqs": table["max_num_seqs"].astype(float),
            "max_tokens": table["max_num_batched_tokens"].astype(float),
            "kv_fraction": kv_fraction,
            "block_tokens": BLOCK_TOKENS,
        }
    )


@dataclass(frozen=True)
class Slo:
    """Limits in seconds (inf where not set) at a percentile."""

    ttft_s: float
    tpot_s: float
    latency_s: float
    percentile: float

    @classmethod
    def of(cls, req: Request) -> Slo:
        b = req.budget

        def s(v: float | None) -> float:
            return np.inf if v is None else v / 1e3

        return cls(s(b.max_ttft_ms), s(b.max_tpot_ms), s(b.max_latency_ms), req.percentile)


@dataclass(frozen=True)
class Runs:
    """Simulated rows: which candidate, at which rate per replica, what came out."""

    candidate: np.ndarray
    rate: np.ndarray  # requests/s per replica
    sim: Simulated
    skip: int

    def at(self, slo: Slo) -> pd.DataFrame:
        p = slo.percentile
        s, k = self.sim, self.skip

        def pct(values: np.ndarray, q: float) -> np.ndarray:
            kept = values[:, k:]
            # A row whose requests all produced one token has no TPOT: nan, said once here.
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return np.nanpercentile(kept, q, axis=1)

        ttft = np.where(np.isnan(s.ttft), np.inf, s.ttft)
        latency = np.where(np.isnan(s.latency), np.inf, s.latency)
        frame = pd.DataFrame({"candidate": self.candidate, "rate": self.rate})
        for name, values in (("ttft", ttft), ("tpot", s.tpot), ("latency", latency)):
            for q in sorted({50.0, 90.0, 99.0, p}):
                frame[f"{name}_p{q:g}_ms"] = 1e3 * pct(values, q)
        frame["finished"] = s.finished
        frame["gave_up"] = s.gave_up
        tokens = np.nansum(np.where(np.isfinite(s.latency), 1.0, 0.0), axis=1)
        frame["completed"] = tokens
        frame["meets"] = (
            ~s.gave_up
            & (s.finished >= 1.0)
            & (frame[f"ttft_p{p:g}_ms"] <= 1e3 * slo.ttft_s)
            & (frame[f"tpot_p{p:g}_ms"].fillna(0.0) <= 1e3 * slo.tpot_s)
            & (frame[f"latency_p{p:g}_ms"] <= 1e3 * slo.latency_s)
        )
        return frame


def run_rates(
    deployments: Deployments,
    chosen: np.ndarray,
    rates: np.ndarray,
    workload: Workload,
    slo: Slo,
    role: dict[str, np.ndarray] | None = None,
) -> Runs:
    """Simulate candidate `chosen[i]` at `rates[i]` requests/s per replica."""
    table = deployments.table
    trace = workload.trace()
    features = deployments.features
    if features.prefix_hit_rate > 0:
        trace = replace(trace, cached_len=features.cached_tokens(trace.input_len))
    skip = int(WARMUP_SHARE * trace.requests)
    counted = trace.requests - skip
    n = len(chosen)
    role = role or {}
    zeros = np.zeros(n)
    limits = Limits(
        rate=rates,
        max_seqs=table["max_num_seqs"].to_numpy(float)[chosen],
        max_tokens=table["max_num_batched_tokens"].to_numpy(float)[chosen],
        kv_tokens=np.asarray(deployments.kv_tokens, float)[chosen],
        block_tokens=np.full(n, BLOCK_TOKENS),
        static=zeros,
        prefill_only=role.get("prefill_only", zeros),
        prompt_cached=role.get("prompt_cached", zeros),
    )
    if features.speculative_tokens > 0:
        limits = replace(
            limits,
            queries_per_step=np.full(n, features.queries_per_step),
            tokens_per_step=np.full(n, features.tokens_per_step),
            draft_share=np.full(n, features.draft_share),
        )
    allowed = int(np.floor((1.0 - slo.percentile / 100.0) * counted))
    stop = Stop(
        ttft_s=role.get("ttft_s", np.full(n, slo.ttft_s)),
        tpot_s=role.get("tpot_s", np.full(n, slo.tpot_s)),
        allowed=allowed,
        skip=skip,
    )
    sim = simulate(take(deployments.step, chosen), trace, limits, stop)
    return Runs(chosen, rates, sim, skip)


def best_rates(frame: pd.DataFrame) -> pd.DataFrame:
    """Per candidate: the highest rate that met, and the lowest above it that missed."""
    met = frame[frame["meets"]].groupby("candidate")["rate"].max()
    out = pd.DataFrame({"met": met})
    missed = frame.merge(out, left_on="candidate", right_index=True, how="left")
    above = missed[~missed["meets"] & (missed["rate"] > missed["met"].fillna(0.0))]
    out = out.join(above.groupby("candidate")["rate"].min().rename("missed"), how="outer")
    return out


def default_workload(req: Request) -> Workload:
    return req.workload or chat()


def gpu_and_cluster(req: Request) -> tuple[GPUSpec, ClusterSpec]:
    gpu = catalog.get_gpu(req.gpu)
    return gpu, catalog.cluster_for(gpu, req.gpus_per_node)


def _lengths_workload(req: Request) -> Workload:
    """The workload asked for: a file, fixed lengths, or the typical chat default."""
    if req.workload is not None:
        return req.workload
    if req.input_len and req.output_len:
        return Workload(
            Lengths(req.input_len, req.input_len),
            Lengths(req.output_len, req.output_len),
            source="fixed lengths",
        )
    return chat()


def _check(req: Request, spec: ModelSpec, workload: Workload) -> None:
    if req.gpus < 1:
        raise UserError(f"gpus: must be a positive integer (got {req.gpus})")
    req.budget.check()
    if not 0 < req.percentile < 100:
        raise UserError(f"percentile: must be between 0 and 100 (got {req.percentile:g})")
    if req.request_rate is not None:
        checks.number(req.request_rate, "request-rate")
    if not 0 < req.kv_fraction <= 1:
        raise UserError(f"kv-cache-fraction: must be in (0, 1] (got {req.kv_fraction:g})")
    for name, values in (
        ("max-num-seqs", req.max_seqs),
        ("max-num-batched-tokens", req.max_tokens),
    ):
        for value in values or ():
            checks.integer(value, name)
    if workload.times:  # a trace: every row is one request (workload.read_workload bounds it)
        checks.integer(len(workload.times), "workload", 1, MAX_REQUESTS)
    else:
        checks.integer(workload.requests, "requests", MIN_REQUESTS, MAX_REQUESTS)
    context = spec.max_seq_len or spec.seq_len
    if workload.longest > context:
        if workload.pairs:
            row = max(range(len(workload.pairs)), key=lambda i: sum(workload.pairs[i]))
            raise UserError(
                f"workload: row {row + 2} of {workload.source} holds {workload.longest:,} "
                f"tokens (input + output), more than {spec.name}'s context of {context:,}"
            )
        raise UserError(
            f"input-len: the longest request, {workload.longest} tokens (input + output), "
            f"exceeds {spec.name}'s context of {context} tokens"
        )


@dataclass
class Colocated:
    """The colocated deployments simulated for a request, and what the disaggregated pools
    (serve/disaggregate.py) build on."""

    spec: ModelSpec
    hardware: tuple
    workload: Workload
    slo: Slo
    deps: Deployments
    table: pd.DataFrame  # one row per deployment, the simulated ones with their goodput
    frames: list


def colocated(req: Request) -> Colocated:
    """Every continuous-batching candidate with its analytic figures; the most promising
    simulated at a ladder of rates (unranked: serve/continuous.py ranks them with the
    disaggregated pools)."""
    spec = catalog.get_model(req.model) if isinstance(req.model, str) else req.model
    workload = _lengths_workload(req).within(spec.max_seq_len or spec.seq_len, spec.name)
    _check(req, spec, workload)
    hardware = gpu_and_cluster(req)
    splits = layouts(req, spec, hardware[1].domain)
    if not splits:
        raise UserError(
            f"gpus: no tp*pp split of {req.gpus} GPUs suits {spec.name} "
            f"({spec.heads} heads, {spec.kv} K/V heads, {spec.layers} layers)"
        )
    deps = candidates(req, spec, hardware, workload, splits)
    table = deps.table
    slo = Slo.of(req)
    fits = table["fits"].to_numpy()
    if not fits.any():

        def evaluate(max_tokens: tuple[int, ...] | None, kv_fraction: float) -> pd.DataFrame:
            seqs = (min(req.max_seqs or MAX_SEQS),) if max_tokens else req.max_seqs
            asked = replace(req, max_tokens=max_tokens, max_seqs=seqs, kv_fraction=kv_fraction)
            return candidates(asked, spec, hardware, workload, splits).table

        low = min(req.max_seqs or MAX_SEQS)
        flag = no_fit.continuous(req, workload.longest, BLOCK_TOKENS, low, evaluate)
        raise UserError(flag or _no_fit(req, spec, workload, table))
    pruned = pd.Series("", index=table.index, dtype=object)
    pruned[~fits] = (
        "memory: K/V cache of "
        + table["kv_cache_tokens"].map("{:,.0f}".format).astype(object)
        + f" tokens holds no {workload.longest}-token request"
    )
    for col, limit, label in (
        ("alone_ttft_ms", slo.ttft_s, "TTFT"),
        ("alone_tpot_ms", slo.tpot_s, "TPOT"),
    ):
        over = (pruned == "") & (table[col] > 1e3 * limit)
        pruned[over] = (
            f"{label} "
            + table.loc[over, col].map("{:,.1f}".format).astype(object)
            + f" ms for one request alone > {1e3 * limit:,.0f} ms"
        )
    per_replica_max = table["max_load_requests_per_s"] / table["replicas"]
    if req.request_rate is not None:
        short = (pruned == "") & (table["max_load_requests_per_s"] < req.request_rate)
        pruned[short] = (
            "capacity: at most "
            + table.loc[short, "max_load_requests_per_s"].map("{:,.2f}".format).astype(object)
            + f" requests/s < {req.request_rate:g}"
        )
    eligible = (pruned == "").to_numpy()
    gpus_per_replica = (table["tp"] * table["pp"]).to_numpy(float)
    with np.errstate(all="ignore"):
        slack = np.minimum(1.0, 1e3 * slo.tpot_s / table["max_load_tpot_ms"].to_numpy())
    score = np.where(eligible, per_replica_max.to_numpy() / gpus_per_replica * slack, -np.inf)
    chosen = _pick(table, score, req.simulate_top)
    pruned[eligible & ~np.isin(np.arange(len(table)), chosen)] = (
        "not simulated: its steady-state estimate ranks below the simulated candidates"
    )
    frames = _simulate_ladder(deps, chosen, per_replica_max.to_numpy(), workload, slo, req)
    out = _summarise(table, frames, chosen, slo, req, workload)
    out["pruned"] = np.where(out["pruned"] == "", pruned, out["pruned"])
    out["goodput_status"] = _goodput_status(out)
    out["mode"] = "colocated"
    return Colocated(spec, hardware, workload, slo, deps, out, frames)


def _goodput_status(out: pd.DataFrame) -> np.ndarray:
    """Where each goodput comes from, or why a candidate has none: a goodput column alone
    cannot tell a measured zero from a candidate never simulated, nor a bound from a value."""
    reason = out["pruned"].astype(str)
    not_simulated = np.where(
        reason.str.startswith("not simulated"), reason, "not simulated: " + reason
    )
    simulated = np.select(
        [out["goodput_at_ladder_top"].to_numpy(bool), out["goodput_rps"].to_numpy() > 0],
        [
            "lower bound: met the limits at the steady-state maximum, the highest rate tried",
            "simulated",
        ],
        "simulated: no rate tried met the limits",
    )
    return np.where(out["simulated"].to_numpy(bool), simulated, not_simulated)


def _pick(table: pd.DataFrame, score: np.ndarray, top: int) -> np.ndarray:
    """The best `top` by score, two thirds of them the best of each layout (tp, pp, ep) so
    that no layout goes unsimulated because one setting of another dominates the estimate."""
    order = [i for i in np.argsort(-score, kind="stable") if np.isfinite(score[i])]
    keys = table[["tp", "pp", "ep"]].astype(str).agg(" ".join, axis=1).to_numpy()
    best: list[int] = []
    seen: set[str] = set()
    for i in order:
        if len(best) >= (2 * top) // 3:
            break
        if keys[i] not in seen:
            seen.add(keys[i])
            best.append(i)
    for i in order:
        if len(best) >= top:
            break
        if i not in best:
            best.append(i)
    return np.array(sorted(best), dtype=int)


def _simulate_ladder(
    deps: Deployments,
    chosen: np.ndarray,
    max_rate: np.ndarray,
    workload: Workload,
    slo: Slo,
    req: Request,
) -> pd.DataFrame:
    """Round 1: each chosen candidate at the ladder of rates (and the requested rate), then at
    its steady-state maximum where every rate of the ladder met the limits; round 2: two rates
    between the last that met and the first that missed."""
    if len(chosen) == 0:
        empty = {"candidate": pd.Series(dtype=int), "rate": pd.Series(dtype=float)}
        for name in ("ttft", "tpot", "latency"):
            for q in sorted({50.0, 90.0, 99.0, slo.percentile}):
                empty[f"{name}_p{q:g}_ms"] = pd.Series(dtype=float)
        return pd.DataFrame({**empty, "meets": pd.Series(dtype=bool)})
    table = deps.table
    fractions = np.array(LADDER)
    cand = np.repeat(chosen, len(fractions))
    rates = np.repeat(max_rate[chosen], len(fractions)) * np.tile(fractions, len(chosen))
    if req.request_rate is not None:
        cand = np.concatenate([cand, chosen])
        rates = np.concatenate([rates, req.request_rate / table["replicas"].to_numpy()[chosen]])
    first = run_rates(deps, cand, rates, workload, slo).at(slo)
    bounds = best_rates(first)
    # Every rate met: the ladder's top is no goodput, only a bound under it. The steady-state
    # maximum is the most the deployment sustains; a miss there is refined below like any.
    unbounded = bounds.index[bounds["met"].notna() & bounds["missed"].isna()].to_numpy(dtype=int)
    if len(unbounded):
        top = run_rates(deps, unbounded, max_rate[unbounded], workload, slo).at(slo)
        first = pd.concat([first, top], ignore_index=True)
        bounds = best_rates(first)
    lo = bounds["met"].fillna(0.0)
    hi = bounds["missed"]
    refine = bounds.index[hi.notna()].to_numpy(dtype=int)
    if len(refine):
        lo_r, hi_r = lo[refine].to_numpy(), hi[refine].to_numpy()
        cand2 = np.repeat(refine, 2)
        rates2 = np.stack([lo_r + (hi_r - lo_r) / 3.0, lo_r + 2.0 * (hi_r - lo_r) / 3.0], 1).ravel()
        second = run_rates(deps, cand2, rates2, workload, slo).at(slo)
        first = pd.concat([first, second], ignore_index=True)
    return first


def _summarise(
    table: pd.DataFrame,
    frames: pd.DataFrame,
    chosen: np.ndarray,
    slo: Slo,
    req: Request,
    workload: Workload,
) -> pd.DataFrame:
    """Per candidate: goodput (the highest rate that met, whole deployment), and the
    percentiles at the operating rate (the requested one, else the goodput)."""
    out = table.copy()
    out["simulated"] = np.isin(np.arange(len(out)), chosen)
    replicas = out["replicas"].to_numpy(float)
    gpus = float(req.gpus)
    met = frames[frames["meets"]].groupby("candidate")["rate"].max()
    # Never simulated: no goodput (NaN, an empty cell), not a zero that reads as measured.
    goodput = np.where(out["simulated"].to_numpy(), 0.0, np.nan)
    goodput[met.index.to_numpy(dtype=int)] = met.to_numpy()
    out["goodput_rps"] = goodput * replicas
    out["goodput_rps_per_gpu"] = out["goodput_rps"] / gpus
    # Met at the steady-state maximum, the highest rate tried: the goodput is a lower bound.
    per_replica_max = (out["max_load_requests_per_s"] / out["replicas"]).to_numpy(float)
    with np.errstate(invalid="ignore"):
        at_top = (goodput > 0) & (goodput >= per_replica_max * (1.0 - 1e-9))
    out["goodput_at_ladder_top"] = at_top
    if req.request_rate is not None:
        target = req.request_rate / replicas
    else:
        lowest = frames.groupby("candidate")["rate"].min()
        target = np.full(len(out), np.nan)
        target[lowest.index.to_numpy(dtype=int)] = lowest.to_numpy()
        target = np.where(goodput > 0, goodput, target)
    key = pd.Series(target, index=out.index)
    picked = frames.assign(want=frames["candidate"].map(key))
    picked = picked[np.isclose(picked["rate"], picked["want"], rtol=1e-9)]
    picked = picked.drop_duplicates("candidate").set_index("candidate")
    metrics = [c for c in frames.columns if c.endswith("_ms")]
    for col in metrics:
        out[col] = np.nan
        out.loc[picked.index, col] = picked[col].to_numpy()
    p = f"p{slo.percentile:g}"
    out["rate_rps"] = np.where(out["simulated"], key * replicas, np.nan)
    out["pred_ttft_ms"] = out[f"ttft_{p}_ms"]
    out["pred_tpot_ms"] = out[f"tpot_{p}_ms"]
    out["pred_latency_ms"] = out[f"latency_{p}_ms"]
    out["pred_output_tokens_per_s"] = out["rate_rps"] * workload.output.mean
    out["pred_output_tokens_per_s_per_gpu"] = out["pred_output_tokens_per_s"] / gpus
    if req.request_rate is not None:
        meets = picked["meets"].reindex(out.index).fillna(False).astype(bool)
    else:
        meets = pd.Series(goodput > 0, index=out.index)
    if req.budget.min_throughput is not None:
        meets &= out["pred_output_tokens_per_s"].fillna(0.0) >= req.budget.min_throughput
    out["meets"] = meets.to_numpy() & out["simulated"].to_numpy()
    out["pruned"] = ""
    missed = out["simulated"] & ~out["meets"]
    out.loc[missed, "pruned"] = [_miss_text(row, slo, req) for _, row in out[missed].iterrows()]
    out["miss"] = [_miss_ratio(row, slo, req) for _, row in out.iterrows()]
    return out


def _misses(row: pd.Series, slo: Slo, req: Request) -> list[tuple[str, float, float]]:
    p = f"p{slo.percentile:g}"
    found = []
    for name, limit in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("latency", slo.latency_s)):
        value = row.get(f"{name}_{p}_ms", np.nan)
        if np.isfinite(limit) and not value <= 1e3 * limit:
            found.append(
                (f"{name.upper() if name != 'latency' else 'latency'} {p}", value, 1e3 * limit)
            )
    if req.budget.min_throughput is not None:
        tput = row.get("pred_output_tokens_per_s", np.nan)
        if not tput >= req.budget.min_throughput:
            found.append(("throughput", tput, req.budget.min_throughput))
    return found


def _miss_text(row: pd.Series, slo: Slo, req: Request) -> str:
    rate = row["rate_rps"]
    where = f"at {rate:,.2f} requests/s in total: " if np.isfinite(rate) else ""
    parts = []
    for label, value, limit in _misses(row, slo, req):
        unit = "tokens/s total" if label == "throughput" else "ms"
        shown = "never" if not np.isfinite(value) else f"{value:,.1f} {unit}"
        parts.append(f"{label} {shown} vs {limit:,.1f} {unit}")
    return where + ("; ".join(parts) or "requests left unfinished")


def _miss_ratio(row: pd.Series, slo: Slo, req: Request) -> float:
    if not row["simulated"]:
        return np.inf
    worst = 0.0
    for label, value, limit in _misses(row, slo, req):
        ratio = limit / value if label == "throughput" else value / limit
        worst = max(worst, ratio - 1.0 if np.isfinite(ratio) else np.inf)
    return worst


def rank(out: pd.DataFrame, req: Request, more_first: tuple[str, ...] = ()) -> pd.DataFrame:
    """Deployments that meet the limits first, by goodput per GPU, then by the columns of
    `more_first` (larger first), the latency percentile, tp and pp; ranks numbered."""
    p = f"latency_p{req.percentile:g}_ms"
    out = out.sort_values(
        ["meets", "goodput_rps_per_gpu", *more_first, p, "tp", "pp"],
        ascending=[False, False, *([False] * len(more_first)), True, True, True],
        kind="stable",
        na_position="last",
    ).reset_index(drop=True)
    n = int(out["meets"].sum())
    out["rank"] = pd.array([*range(1, n + 1), *([pd.NA] * (len(out) - n))], dtype="Int64")
    out["pareto"] = False
    return out


def label_of(row: pd.Series) -> str:
    if row.get("mode") == "disaggregated":
        return str(row["label"])
    ep = f" ep{int(row['ep'])}" if int(row.get("ep", 1)) > 1 else ""
    return (
        f"tp{int(row['tp'])} pp{int(row['pp'])}{ep} x{int(row['replicas'])} "
        f"{row['precision']}/{row['kv_precision']} seqs {int(row['max_num_seqs'])} "
        f"tokens {int(row['max_num_batched_tokens'])}"
    )


def closest(out: pd.DataFrame, slo: Slo, req: Request) -> str:
    """The simulated deployment that misses least; when none was simulated, of those that fit,
    the one taking the most requests/s if capacity ruled them out, else the one whose lone
    request comes nearest the TTFT and TPOT limits."""
    sim = out[out["simulated"]]
    if not sim.empty:
        row = sim.loc[sim["miss"].idxmin()]
        return f"{label_of(row)}: {_miss_text(row, slo, req)}"
    fit = out[out["fits"].fillna(False).astype(bool)]
    if fit.empty:
        first = out.iloc[0]
        return f"{label_of(first)}: {first['pruned']}"
    short = fit[fit["pruned"].astype(str).str.startswith("capacity")]
    if len(short):
        row = short.loc[short["max_load_requests_per_s"].idxmax()]
    else:
        over = np.maximum(
            fit["alone_ttft_ms"] / (1e3 * slo.ttft_s), fit["alone_tpot_ms"] / (1e3 * slo.tpot_s)
        )
        row = fit.loc[over.idxmin()]
    return f"{label_of(row)}: {row['pruned']}"


def _no_fit(req: Request, spec: ModelSpec, workload: Workload, table: pd.DataFrame) -> str:
    weights = float(table["weights_gib"].min())
    node = gpu_and_cluster(req)[1].domain
    static = Request(
        model=spec,
        gpu=req.gpu,
        gpus=req.gpus,
        input_len=int(workload.input.largest),
        output_len=int(workload.output.largest),
        precision=str(table.loc[table["weights_gib"].idxmin(), "precision"]),
        gpus_per_node=req.gpus_per_node,
    )
    need = min_gpus(static, spec, node)
    where = f"{req.gpus} {req.gpu} GPU{'s' if req.gpus > 1 else ''}"
    head = (
        f"gpus: {spec.name} does not fit on {where} at any tp/pp split "
        f"(weights alone {weights:.1f} GiB per GPU at best)"
    )
    if need is None:
        return head + "; no split up to 4 nodes holds it"
    n, split = need
    if n <= req.gpus:
        return f"{head}; {n} GPUs ({split}) would hold it: use a GPU count tp*pp divides"
    return f"{head}; it needs at least {n} GPUs ({split}) for one request"
