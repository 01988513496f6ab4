"""Benchmark: how fast the vectorized cost model estimates N configurations (default 1,000,000).

    python scripts/bench_estimate.py [--n 1000000] [--model gpt3-175b] [--gpu h100-sxm-80gb]

Builds N layouts of one model (random dp/tp/pp/vp/cp/mbs/recompute/zero, 1,024-GPU scale) as
cost-model columns (autoconfig.columns.build) and times `autoconfig.cost.evaluate` over all of
them at once, best of 3.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import pandas as pd

from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import evaluate
from autoconfig.spec import catalog


def layouts(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    pick = lambda values: rng.choice(np.array(values, dtype=float), n)  # noqa: E731
    tp, pp, cp = pick([1, 2, 4, 8]), pick([1, 2, 4, 8, 16]), pick([1, 2])
    dp = 1024 / (tp * pp * cp)
    mbs = pick([1, 2, 4])
    return pd.DataFrame(
        {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "vp": np.where(pp > 1, pick([1, 2, 3]), 1.0),
            "cp": cp,
            "ep": np.ones(n),
            "etp": np.ones(n),
            "sp": (tp > 1).astype(float),
            "mbs": mbs,
            "recompute": np.array(["none", "selective", "full"])[rng.integers(0, 3, n)],
            "recompute_layers": pick([1, 96]),
            "zero": pick([0, 1, 2, 3]),
            "optimizer_state": np.full(n, "fp32"),
            "offload": np.full(n, "none"),
            "hybrid_cp": np.zeros(n, bool),
            "activation_offload": np.zeros(n, bool),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--model", default="gpt3-175b")
    parser.add_argument("--gpu", default="h100-sxm-80gb")
    args = parser.parse_args()
    gpu = catalog.get_gpu(args.gpu)
    table = layouts(args.n)
    table["recompute_layers"] = table["recompute_layers"].where(table["recompute"] == "full", 0)
    gbs = (table["dp"] * table["mbs"] * 8).to_numpy()
    x = training_inputs(catalog.get_model(args.model), Hardware(gpu, gpu.cluster), table, gbs, 2048)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        out = evaluate(x)
        best = min(best, time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fits = int(out["pred_fits"].sum())
    print(
        f"{args.n:,} configurations of {args.model} on {args.gpu}: {best:.3f} s "
        f"({args.n / best:,.0f} configs/s), {fits:,} fit; peak RSS {peak_mb:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
