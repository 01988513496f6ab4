"""Disaggregated prefill as a serving candidate: a pool of prefill instances hands each request's
K/V cache over the link to a pool of decode instances, so long prompts never stall decodes and
each pool takes its own layout and size (Zhong et al. 2024, "DistServe"; Patel et al. 2024,
"Splitwise").

Each simulated colocated layout is simulated again in the two roles: as a prefill instance
(requests leave after their first token; its TTFT limit is the SLO less the K/V transfer) and as
a decode instance (requests arrive with their prompt cached; the TPOT limit). A deployment of x
prefill and y decode instances on the GPUs then serves min(x * prefill goodput, y * decode
goodput). The transfer moves each rank's K/V shard of the prompt over NVLink when both pools sit
in one NVLink domain, else over the GPUs' network links in parallel.

Mixed pools (`mixed`, Splitwise's case): the prefill pool on one GPU type and the decode pool on
another, each role simulated with its own type's step model and memory, each pool within its own
GPU budget, the K/V over the network between the two kinds of node.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from autoconfig.serve.goodput import (
    LADDER,
    Colocated,
    Deployments,
    Slo,
    best_rates,
    run_rates,
)
from autoconfig.serve.request import Request
from autoconfig.serve.workload import Workload
from autoconfig.spec.schema import ClusterSpec, GPUSpec, ModelSpec
from autoconfig.spec.vocab import GIB

POOL_CANDIDATES = 6  # layouts tried in each role


def disaggregated(
    req: Request,
    spec: ModelSpec,
    hardware: tuple[GPUSpec, ClusterSpec],
    workload: Workload,
    slo: Slo,
    deps: Deployments,
    colocated: pd.DataFrame,
    frames: pd.DataFrame,
) -> pd.DataFrame:
    """Disaggregated candidates (one row per prefill/decode pairing), or an empty frame."""
    chosen = pool_layouts(colocated)
    if len(chosen) == 0:
        return pd.DataFrame()
    table = deps.table
    cluster = hardware[1]
    prompt = float(np.percentile(workload.trace().input_len, slo.percentile))
    token_bytes = _token_bytes(table)
    # Each rank sends its shard; inside one NVLink domain over NVLink, else over its NIC.
    gpus = (table["tp"] * table["pp"]).to_numpy(float)
    link = (
        np.where(2 * gpus <= cluster.domain, cluster.intra_node_gb_s, cluster.inter_node_gb_s) * 1e9
    )
    transfer = prompt * token_bytes / link
    max_rate = (table["max_load_requests_per_s"] / table["replicas"]).to_numpy()

    n = len(chosen)
    ttft_left = np.maximum(slo.ttft_s - transfer[chosen], 1e-6)
    ladder = np.array(LADDER) * 2.0  # a prefill-only or decode-only instance takes more
    cand = np.repeat(chosen, len(ladder))
    rates = np.repeat(max_rate[chosen], len(ladder)) * np.tile(ladder, n)
    ones, zeros = np.ones(len(cand)), np.zeros(len(cand))
    # Both roles in one simulation: the prefill rows first, then the decode rows.
    both = np.concatenate([cand, cand])
    m = len(cand)
    role = {
        "prefill_only": np.concatenate([ones, zeros]),
        "prompt_cached": np.concatenate([zeros, ones]),
        "ttft_s": np.concatenate([np.repeat(ttft_left, len(ladder)), np.full(m, np.inf)]),
        "tpot_s": np.concatenate([np.full(m, np.inf), np.full(m, slo.tpot_s)]),
    }
    loose = Slo(np.inf, np.inf, np.inf, slo.percentile)
    frame = run_rates(deps, both, np.concatenate([rates, rates]), workload, loose, role).at(loose)
    pre, dec = frame.iloc[:m].copy(), frame.iloc[m:].copy()
    p = f"p{slo.percentile:g}"
    pre_limit = pd.Series(ttft_left, index=chosen)
    pre["meets"] &= pre[f"ttft_{p}_ms"] <= 1e3 * pre["candidate"].map(pre_limit)
    dec["meets"] &= dec[f"tpot_{p}_ms"] <= 1e3 * slo.tpot_s
    pre_best, dec_best = best_rates(pre)["met"].dropna(), best_rates(dec)["met"].dropna()

    # A pool whose every rate met its limit: its goodput is only a bound under what it takes.
    top = max_rate * ladder[-1]
    rows = []
    for i, g_p in pre_best.items():
        for j, g_d in dec_best.items():
            plan = _split(req.gpus, gpus[i], gpus[j], g_p, g_d)
            if plan is None:
                continue
            x, y, goodput = plan
            at_p = pre[(pre["candidate"] == i) & np.isclose(pre["rate"], g_p)].iloc[0]
            at_d = dec[(dec["candidate"] == j) & np.isclose(dec["rate"], g_d)].iloc[0]
            # The deployment's goodput is a bound when the pool that limits it met at its top.
            prefill_limits, decode_limits = x * g_p <= y * g_d, y * g_d <= x * g_p
            at_top = bool(
                (prefill_limits and g_p >= top[i] * (1 - 1e-9))
                or (decode_limits and g_d >= top[j] * (1 - 1e-9))
            )
            pre_row, dec_row = table.loc[i], table.loc[j]
            row = _row(pre_row, dec_row, x, y, goodput, at_p, at_d, transfer[i], slo, req, workload)
            row["goodput_at_ladder_top"] = at_top
            row["goodput_status"] = (
                "lower bound: the pool that limits it met the limits at the highest rate tried"
                if at_top
                else "simulated"
            )
            rows.append(row)
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows)
    return out.sort_values("goodput_rps_per_gpu", ascending=False).head(POOL_CANDIDATES)


def mixed(req: Request, prefill: Colocated, decode: Colocated) -> pd.DataFrame:
    """Disaggregated candidates with each pool on its own GPU type (one row per pairing), or an
    empty frame: the prefill role simulated on the prefill type's deployments (its kernel
    tables, memory and serving constants), the decode role on the decode type's; x prefill
    instances within req.gpus and y decode instances within req.decode_gpus.

    The two types sit on different nodes, so the K/V goes over the network at the slower of the
    two clusters' per-GPU links. Each prefill rank sends its shard of the prompt's K/V in the
    prefill instance's format over its own link; the decode instance reads the cache as sent,
    so only pairings with one K/V format are deployments."""
    assert req.decode_gpus is not None  # serve/mixed.py checked the request
    slo, workload = prefill.slo, prefill.workload
    chosen_p, chosen_d = pool_layouts(prefill.table), pool_layouts(decode.table)
    if len(chosen_p) == 0 or len(chosen_d) == 0:
        return pd.DataFrame()
    pre_table, dec_table = prefill.deps.table, decode.deps.table
    prompt = float(np.percentile(workload.trace().input_len, slo.percentile))
    # Two node types share no NVLink domain: the slower of their networks carries the K/V.
    link_gb_s = float(min(prefill.hardware[1].inter_node_gb_s, decode.hardware[1].inter_node_gb_s))
    transfer = prompt * _token_bytes(pre_table) / (link_gb_s * 1e9)
    ttft_left = np.maximum(slo.ttft_s - transfer[chosen_p], 1e-6)
    pre, pre_top = _role(prefill.deps, chosen_p, workload, slo, ttft_left)
    dec, dec_top = _role(decode.deps, chosen_d, workload, slo, None)
    pre_best, dec_best = best_rates(pre)["met"].dropna(), best_rates(dec)["met"].dropna()
    gpus_p = (pre_table["tp"] * pre_table["pp"]).to_numpy(float)
    gpus_d = (dec_table["tp"] * dec_table["pp"]).to_numpy(float)
    budget = req.gpus + req.decode_gpus
    price_p, price_d = _prices(req)
    names = prefill.hardware[0].name, decode.hardware[0].name
    rows = []
    for i, g_p in pre_best.items():
        for j, g_d in dec_best.items():
            pre_row, dec_row = pre_table.loc[i], dec_table.loc[j]
            if pre_row["kv_precision"] != dec_row["kv_precision"]:
                continue
            plan = mixed_split(req.gpus, req.decode_gpus, gpus_p[i], gpus_d[j], g_p, g_d)
            if plan is None:
                continue
            x, y, goodput = plan
            at_p = pre[(pre["candidate"] == i) & np.isclose(pre["rate"], g_p)].iloc[0]
            at_d = dec[(dec["candidate"] == j) & np.isclose(dec["rate"], g_d)].iloc[0]
            # The pool whose instances run at the goodput limits it (both, when they tie).
            prefill_limits = x * g_p <= goodput * (1 + 1e-9)
            decode_limits = y * g_d <= goodput * (1 + 1e-9)
            at_top = bool(
                (prefill_limits and g_p >= pre_top[i] * (1 - 1e-9))
                or (decode_limits and g_d >= dec_top[j] * (1 - 1e-9))
            )
            row = _row(
                pre_row, dec_row, x, y, goodput, at_p, at_d, transfer[i], slo, req, workload, budget
            )
            row["goodput_at_ladder_top"] = at_top
            row["goodput_status"] = (
                "lower bound: the pool that limits it met the limits at the highest rate tried"
                if at_top
                else "simulated"
            )
            used_p, used_d = int(x * gpus_p[i]), int(y * gpus_d[j])
            usd_per_hour = price_p * used_p + price_d * used_d
            row.update(
                {
                    "prefill_gpu": names[0],
                    "decode_gpu": names[1],
                    "prefill_kv_precision": pre_row["kv_precision"],
                    # what one instance of each pool takes within its role's limit
                    "prefill_instance_goodput_rps": g_p,
                    "decode_instance_goodput_rps": g_d,
                    "prefill_gpus_used": used_p,
                    "decode_gpus_used": used_d,
                    "spare_prefill_gpus": req.gpus - used_p,
                    "spare_decode_gpus": req.decode_gpus - used_d,
                    "gpus_used": used_p + used_d,
                    "goodput_rps_per_gpu_used": goodput / (used_p + used_d),
                    "kv_link_gb_s": link_gb_s,
                    "usd_per_hour": usd_per_hour,
                    # requests served within the limits per USD of the GPUs used (NaN unpriced)
                    "goodput_requests_per_usd": 3600.0 * goodput / usd_per_hour,
                    "label": f"prefill {names[0]} {_pool(pre_row)} x{x} + decode {names[1]} "
                    f"{_pool(dec_row)} x{y}",
                }
            )
            rows.append(row)
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).sort_values("goodput_rps_per_gpu", ascending=False)


def _prices(req: Request) -> tuple[float, float]:
    """USD per GPU-hour of the prefill and the decode type (NaN where none was given)."""
    given = tuple(float(p) for p in req.gpu_hour_usd)
    if not given:
        return np.nan, np.nan
    return (given[0], given[0]) if len(given) == 1 else (given[0], given[1])


def _role(
    deps: Deployments,
    chosen: np.ndarray,
    workload: Workload,
    slo: Slo,
    ttft_left: np.ndarray | None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Layouts `chosen` simulated in one role at the role's ladder: prefill instances (with
    `ttft_left`, each one's TTFT limit less its K/V transfer) or decode instances; the frame
    with `meets` against the role's limit, and each candidate's highest rate tried."""
    table = deps.table
    max_rate = (table["max_load_requests_per_s"] / table["replicas"]).to_numpy()
    ladder = np.array(LADDER) * 2.0  # a prefill-only or decode-only instance takes more
    cand = np.repeat(chosen, len(ladder))
    rates = np.repeat(max_rate[chosen], len(ladder)) * np.tile(ladder, len(chosen))
    m = len(cand)
    ones, zeros, unlimited = np.ones(m), np.zeros(m), np.full(m, np.inf)
    prefill = ttft_left is not None
    role = {
        "prefill_only": ones if prefill else zeros,
        "prompt_cached": zeros if prefill else ones,
        "ttft_s": unlimited if ttft_left is None else np.repeat(ttft_left, len(ladder)),
        "tpot_s": unlimited if prefill else np.full(m, slo.tpot_s),
    }
    loose = Slo(np.inf, np.inf, np.inf, slo.percentile)
    frame = run_rates(deps, cand, rates, workload, loose, role).at(loose)
    p = f"p{slo.percentile:g}"
    if ttft_left is not None:
        limit = pd.Series(ttft_left, index=chosen)
        frame["meets"] &= frame[f"ttft_{p}_ms"] <= 1e3 * frame["candidate"].map(limit)
    else:
        frame["meets"] &= frame[f"tpot_{p}_ms"] <= 1e3 * slo.tpot_s
    return frame, max_rate * ladder[-1]


def mixed_split(
    prefill_budget: int,
    decode_budget: int,
    prefill_gpus: float,
    decode_gpus: float,
    g_p: float,
    g_d: float,
) -> tuple[int, int, float] | None:
    """Instance counts x, y and the goodput min(x g_p, y g_d) with x instances of
    `prefill_gpus` GPUs within `prefill_budget` and y of `decode_gpus` within `decode_budget`.
    With separate budgets the most of each maximises the minimum; the side that could serve
    more is then trimmed to the fewest instances that still reach the goodput (what the other
    side can feed or drain), its other GPUs spare. None when a budget holds no instance."""
    x, y = int(prefill_budget // prefill_gpus), int(decode_budget // decode_gpus)
    if x < 1 or y < 1 or g_p <= 0 or g_d <= 0:
        return None
    goodput = min(x * g_p, y * g_d)
    return min(x, _fewest(goodput, g_p)), min(y, _fewest(goodput, g_d)), goodput


def _fewest(goodput: float, per_instance: float) -> int:
    """The fewest instances taking `per_instance` requests/s each that reach `goodput`; a
    ratio a rounding away from a whole number is that number."""
    ratio = goodput / per_instance
    whole = round(ratio)
    return int(whole) if abs(ratio - whole) <= 1e-9 * ratio else math.ceil(ratio)


def pool_layouts(colocated: pd.DataFrame) -> np.ndarray:
    """The layouts tried in each role: the simulated colocated ones with the best goodput per
    GPU, one per (tp, pp, ep, weights, K/V format)."""
    sim = colocated[colocated["simulated"]]
    if sim.empty:
        return np.array([], dtype=int)
    pool = (
        sim.sort_values("goodput_rps_per_gpu", ascending=False)
        .drop_duplicates(["tp", "pp", "ep", "precision", "kv_precision"])
        .head(POOL_CANDIDATES)
    )
    return pool.index.to_numpy(dtype=int)


def _token_bytes(table: pd.DataFrame) -> np.ndarray:
    """K/V bytes one GPU holds per cached token (its shard), in the candidate's format."""
    return (table["kv_cache_gib"] * GIB / table["kv_cache_tokens"].clip(lower=1)).to_numpy()


def _split(
    total: int, prefill_gpus: float, decode_gpus: float, g_p: float, g_d: float
) -> tuple[int, int, float] | None:
    """Instance counts x, y on at most `total` GPUs that maximise min(x g_p, y g_d), the
    smallest such x. x g_p grows with x and y(x) g_d (y the decode instances the rest of the
    GPUs hold) never does, so the best x sits where they cross: found by bisection, in
    O(log total) steps on a cluster of any size."""

    def decode_instances(x: int) -> int:
        return int((total - x * prefill_gpus) // decode_gpus)

    def last(ok: Callable[[int], bool], lo: int, hi: int) -> int:
        """The largest x in [lo, hi] with ok(x) (ok holds up to a point), or lo - 1."""
        while lo <= hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if ok(mid) else (lo, mid - 1)
        return hi

    x_max = last(lambda x: decode_instances(x) >= 1, 1, int(total // prefill_gpus))
    if x_max < 1:
        return None
    cross = last(lambda x: x * g_p <= decode_instances(x) * g_d, 1, x_max)
    best = None
    for x in (cross, cross + 1):
        if 1 <= x <= x_max:
            y = decode_instances(x)
            goodput = min(x * g_p, y * g_d)
            if best is None or goodput > best[2]:
                best = (x, y, goodput)
    return best


def _row(
    pre: pd.Series,
    dec: pd.Series,
    x: int,
    y: int,
    goodput: float,
    at_p: pd.Series,
    at_d: pd.Series,
    transfer_s: float,
    slo: Slo,
    req: Request,
    workload: Workload,
    gpus: float | None = None,
) -> dict:
    """One deployment's row: the decode pool's settings unprefixed, the prefill pool's as
    prefill_*; per-GPU figures over `gpus` (default: the request's)."""
    p = f"p{slo.percentile:g}"
    gpus = req.gpus if gpus is None else gpus
    rate = goodput if req.request_rate is None else req.request_rate
    out_len = workload.output.mean
    ttft = {q: at_p[f"ttft_p{q}_ms"] + 1e3 * transfer_s for q in ("50", "90", "99")}
    tpot = {q: at_d[f"tpot_p{q}_ms"] for q in ("50", "90", "99")}
    row = {
        "mode": "disaggregated",
        "tp": int(dec["tp"]),
        "pp": int(dec["pp"]),
        "ep": int(dec["ep"]),
        "replicas": y,
        "precision": dec["precision"],
        "kv_precision": dec["kv_precision"],
        "max_num_seqs": int(dec["max_num_seqs"]),
        "max_num_batched_tokens": int(dec["max_num_batched_tokens"]),
        "prefill_tp": int(pre["tp"]),
        "prefill_pp": int(pre["pp"]),
        "prefill_replicas": x,
        "prefill_ep": int(pre["ep"]),
        "prefill_precision": pre["precision"],
        # the prefill instances were simulated with their own running-batch limit and cache
        "prefill_max_num_seqs": int(pre["max_num_seqs"]),
        "prefill_max_num_batched_tokens": int(pre["max_num_batched_tokens"]),
        "prefill_kv_cache_gib": pre["kv_cache_gib"],
        "kv_transfer_ms": 1e3 * transfer_s,
        "simulated": True,
        "goodput_rps": goodput,
        "goodput_rps_per_gpu": goodput / gpus,
        "rate_rps": rate,
        "kv_cache_gib": dec["kv_cache_gib"],
        "kv_cache_tokens": dec["kv_cache_tokens"],
        "kv_fraction": req.kv_fraction,
        "weights_gib": max(pre["weights_gib"], dec["weights_gib"]),
        "fits": True,
    }
    for q in ("50", "90", "99"):
        row[f"ttft_p{q}_ms"] = ttft[q]
        row[f"tpot_p{q}_ms"] = tpot[q]
        row[f"latency_p{q}_ms"] = ttft[q] + tpot[q] * max(out_len - 1.0, 0.0)
    key = f"{slo.percentile:g}"
    if key not in ("50", "90", "99"):
        row[f"ttft_{p}_ms"] = at_p[f"ttft_{p}_ms"] + 1e3 * transfer_s
        row[f"tpot_{p}_ms"] = at_d[f"tpot_{p}_ms"]
        row[f"latency_{p}_ms"] = row[f"ttft_{p}_ms"] + row[f"tpot_{p}_ms"] * max(out_len - 1.0, 0)
    row["pred_ttft_ms"] = row[f"ttft_{p}_ms"]
    row["pred_tpot_ms"] = row[f"tpot_{p}_ms"]
    row["pred_latency_ms"] = row[f"latency_{p}_ms"]
    row["pred_output_tokens_per_s"] = rate * out_len
    row["pred_output_tokens_per_s_per_gpu"] = rate * out_len / gpus
    latency_ok = row["pred_latency_ms"] <= 1e3 * slo.latency_s
    rate_ok = req.request_rate is None or goodput >= req.request_rate
    floor = req.budget.min_throughput
    throughput_ok = floor is None or row["pred_output_tokens_per_s"] >= floor
    row["meets"] = bool(latency_ok and rate_ok and throughput_ok and goodput > 0)
    misses = []
    if not rate_ok:
        misses.append(f"at most {goodput:,.2f} requests/s within the SLOs")
    if not latency_ok:
        misses.append(
            f"latency p{slo.percentile:g} {row['pred_latency_ms']:,.1f} ms vs "
            f"{1e3 * slo.latency_s:,.1f} ms"
        )
    if not throughput_ok:
        misses.append(
            f"throughput {row['pred_output_tokens_per_s']:,.0f} tokens/s total vs {floor:,.0f}"
        )
    if goodput <= 0:
        misses.append("no rate tried met the SLOs")
    row["pruned"] = "; ".join(misses) if not row["meets"] else ""
    row["miss"] = 0.0 if row["meets"] else 1.0
    row["label"] = f"prefill {_pool(pre)} x{x} + decode {_pool(dec)} x{y}"
    return row


def _pool(row: pd.Series) -> str:
    ep = f" ep{int(row['ep'])}" if int(row["ep"]) > 1 else ""
    return (
        f"tp{int(row['tp'])} pp{int(row['pp'])}{ep} {row['precision']}/{row['kv_precision']} "
        f"seqs {int(row['max_num_seqs'])} tokens {int(row['max_num_batched_tokens'])}"
    )
