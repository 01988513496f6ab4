"""The continuous-batching search: the colocated deployments (goodput.py) and the
disaggregated prefill/decode pools built on their simulations (disaggregate.py), ranked
together by goodput per GPU."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from autoconfig.serve import goodput, mixed
from autoconfig.serve.disaggregate import disaggregated
from autoconfig.serve.request import Request
from autoconfig.serve.result import ServingResult
from autoconfig.spec import catalog


def search(req: Request) -> ServingResult:
    """Every continuous-batching candidate with its analytic figures; the most promising
    simulated at a ladder of rates; ranked by goodput per GPU (or, with a request rate, those
    that meet the SLOs at it first). With a decode GPU type, the mixed pools (serve/mixed.py)."""
    if req.decode_gpu is not None or req.decode_gpus is not None or req.gpu_hour_usd:
        return mixed.search(req)
    part = goodput.colocated(req)
    # The workload simulated (the typical chat turn may have been cut to the model's context):
    # the result, its report and a measured search see that one.
    load = part.workload
    req = replace(
        req, workload=load, input_len=round(load.input.mean), output_len=round(load.output.mean)
    )
    out = part.table
    if req.disaggregation and req.gpus >= 2:
        extra = disaggregated(
            req, part.spec, part.hardware, part.workload, part.slo, part.deps, out, part.frames
        )
        if len(extra):
            out = pd.concat([out, extra], ignore_index=True)
    out = goodput.rank(out, req)
    feasible = int(out["meets"].sum())
    gpu = part.hardware[0]
    _, provenance = catalog.serving_constants(gpu)
    return ServingResult(
        request=req,
        model=part.spec,
        gpu=gpu,
        table=out,
        feasible=feasible,
        constants=provenance,
        closest=goodput.closest(out, part.slo, req) if feasible == 0 else "",
        workload=part.workload.describe(),
        features=part.deps.features.describe(),
    )
