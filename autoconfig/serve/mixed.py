"""Mixed pools: a disaggregated deployment whose prefill pool runs on one GPU type and whose
decode pool runs on another (Patel et al. 2024, "Splitwise": compute-dense GPUs for the
prompt, memory-rich ones for the tokens).

Each type gets the colocated search the single-type one runs (serve/goodput.py) on its own GPUs:
its deployments table (kernel tables, memory for the K/V cache, serving constants) and the
simulation of its most promising layouts. Those pick each role's layouts; the prefill role is
then simulated on the prefill type's deployments, the decode role on the decode type's
(serve/disaggregate.py: mixed). Only disaggregated deployments are ranked: a colocated replica
runs on one type. The best colocated deployment of each type alone, at its own GPU count, is
reported beside them for comparison (`ServingResult.comparison`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import numpy as np
import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.serve import goodput
from autoconfig.serve.disaggregate import mixed
from autoconfig.serve.request import Request
from autoconfig.serve.result import ServingResult
from autoconfig.spec import catalog
from autoconfig.spec.schema import GPUSpec

T = TypeVar("T")


def check(req: Request) -> GPUSpec:
    """One UserError line naming the field for a request mixed pools cannot serve; the decode
    GPU's profile otherwise."""
    if req.decode_gpu is None and req.decode_gpus is None:
        raise UserError(
            "gpu-hour-usd: prices the pools of a mixed deployment (--decode-gpu) or the types "
            "of the fewest-GPU search (--gpus left out)"
        )
    if req.decode_gpu is None:
        raise UserError("decode-gpu: required with --decode-gpus (the decode pool's GPU type)")
    if req.decode_gpus is None:
        raise UserError("decode-gpus: required with --decode-gpu (the decode pool's GPUs)")
    if req.batching != "continuous":
        raise UserError(
            "decode-gpu: a decode pool on its own GPU type is a disaggregated deployment, which "
            "static batching has none of (use --batching continuous)"
        )
    if not req.disaggregation:
        raise UserError(
            "decode-gpu: a decode pool on its own GPU type is a disaggregated deployment; "
            "leave out --no-disaggregation"
        )
    checks.integer(req.decode_gpus, "decode-gpus")
    for price in req.gpu_hour_usd:
        checks.number(price, "gpu-hour-usd")
    if len(req.gpu_hour_usd) > 2:
        raise UserError(
            "gpu-hour-usd: give one price for both pools, or two (the prefill type's, then the "
            f"decode type's), not {len(req.gpu_hour_usd)}"
        )
    return _decode_side(lambda: catalog.get_gpu(str(req.decode_gpu)))


def _decode_side(call: Callable[[], T]) -> T:
    """`call()` for the decode side; a refusal naming --gpu or --gpus (the prefill side's
    flags, as the single-type search words it) names --decode-gpu or --decode-gpus."""
    try:
        return call()
    except UserError as exc:
        text = str(exc)
        for field in ("gpus", "gpu"):
            if text.startswith(f"{field}:"):
                raise UserError(f"decode-{text}") from None
        raise


def search(req: Request) -> ServingResult:
    """Every pairing of a prefill layout on `req.gpu` with a decode layout on `req.decode_gpu`,
    ranked by goodput per GPU of both budgets (or, with a request rate, those that meet the
    limits at it first)."""
    decode_gpu = check(req)
    assert req.decode_gpus is not None  # check() refuses a request without
    decode_count = req.decode_gpus
    # Each type's colocated search only picks its pools' layouts: at the goodput, since a rate
    # meant for the whole deployment would prune what one type alone cannot take.
    alone = replace(req, decode_gpu=None, decode_gpus=None, gpu_hour_usd=(), request_rate=None)
    prefill = goodput.colocated(alone)
    decode = _decode_side(
        lambda: goodput.colocated(replace(alone, gpu=decode_gpu.name, gpus=decode_count))
    )
    load = prefill.workload
    req = replace(
        req, workload=load, input_len=round(load.input.mean), output_len=round(load.output.mean)
    )
    out = mixed(req, prefill, decode)
    if out.empty:
        raise UserError(_no_pairing(req, prefill, decode))
    # of equal goodput, the deployment using fewer GPUs first (the spare ones serve nothing)
    out = goodput.rank(out, req, ("goodput_rps_per_gpu_used",))
    feasible = int(out["meets"].sum())
    gpu = prefill.hardware[0]
    _, from_p = catalog.serving_constants(gpu)
    _, from_d = catalog.serving_constants(decode_gpu)
    return ServingResult(
        request=req,
        model=prefill.spec,
        gpu=gpu,
        table=out,
        feasible=feasible,
        constants=f"prefill {gpu.name}: {from_p}; decode {decode_gpu.name}: {from_d}",
        closest=goodput.closest(out, prefill.slo, req) if feasible == 0 else "",
        workload=load.describe(),
        features=prefill.deps.features.describe(),
        decode_gpu=decode_gpu,
        comparison=_comparison(req, out, prefill, decode),
    )


def _no_pairing(req: Request, prefill: goodput.Colocated, decode: goodput.Colocated) -> str:
    """Why no mixed deployment came out: a side with no layout meeting its role's limit, or
    no K/V format both sides have."""
    for field, part in (("gpus", prefill), ("decode-gpus", decode)):
        if not part.table["simulated"].any():
            why = goodput.closest(part.table, part.slo, req)
            return f"{field}: no layout on {part.hardware[0].name} was simulated; {why}"
    return (
        "decode-gpu: no prefill layout on "
        f"{prefill.hardware[0].name} pairs with a decode layout on {decode.hardware[0].name} "
        "within the limits (each pool's role missed its limit at every rate tried, or the two "
        "share no K/V format: give --kv-precision)"
    )


def _comparison(
    req: Request, out: pd.DataFrame, prefill: goodput.Colocated, decode: goodput.Colocated
) -> str:
    """One line: the best colocated deployment of each type alone at its own GPU count (from
    the searches that chose the pools), and the best mixed one, in goodput per GPU."""
    p = f"p{req.percentile:g}"

    def best(part: goodput.Colocated, count: int) -> str:
        table = part.table
        met = table[table["meets"].astype(bool) & (table["goodput_rps"] > 0)]
        name = f"{count} x {part.hardware[0].name}"
        if met.empty:
            return f"{name} alone: none meets the limits"
        row = met.sort_values("goodput_rps_per_gpu", ascending=False, kind="stable").iloc[0]
        bound = "≥ " if bool(row["goodput_at_ladder_top"]) else ""
        return (
            f"{name} alone (colocated {goodput.label_of(row)}) {bound}"
            f"{row['goodput_rps_per_gpu']:,.3f} req/s/GPU"
        )

    head = (
        f"each type alone vs mixed pools: {best(prefill, req.gpus)}; "
        f"{best(decode, int(req.decode_gpus or 0))}"
    )
    met = out[out["meets"].astype(bool)]
    if met.empty:
        return f"{head}; mixed: none meets the limits"
    row = met.iloc[0]
    bound = "≥ " if bool(row["goodput_at_ladder_top"]) else ""
    cost = ""
    if np.isfinite(row["goodput_requests_per_usd"]):
        cost = f", {row['goodput_requests_per_usd']:,.0f} requests per USD"
    return (
        f"{head}; mixed {bound}{row['goodput_rps_per_gpu']:,.3f} req/s/GPU over all "
        f"{req.gpus + int(req.decode_gpus or 0)} GPUs ({int(row['gpus_used'])} used{cost}; "
        f"TTFT {p} {row[f'ttft_{p}_ms']:,.0f} ms, TPOT {p} {row[f'tpot_{p}_ms']:,.1f} ms)"
    )
