"""Measures the CPU RL loop (autoconfig/measure/rl_loop.py) on its default configurations and
prints every phase measured against the RL planner's prediction, before and after fitting the
cpu-gloo profile's constants on the fitted configurations, with the median error per phase in
and out of sample (the figures docs/rl.md quotes).

Run from the repository root: python scripts/measure_rl_cpu.py [--steps 3] [--threads 1]
[--csv rl_phases.csv]. Takes about a minute on one core.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import replace

import pandas as pd
import torch

from autoconfig.measure import rl_loop


def _load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the loop")
    parser.add_argument("--csv", default=None, help="write every row here too")
    args = parser.parse_args()
    fit_on, held_out = (
        [replace(c, steps=args.steps, warmup=args.warmup, threads=args.threads) for c in group]
        for group in (rl_loop.DEFAULT_FIT, rl_loop.DEFAULT_HELD_OUT)
    )
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {args.threads} thread(s), {args.steps} measured steps after "
        f"{args.warmup} warmup; load average {_load()} before"
    )
    result = rl_loop.compare(fit_on, held_out, progress=lambda m: print(f"# {m}", file=sys.stderr))
    table = result.table.assign(
        config=lambda t: t["config"] + t["held_out"].map({True: " (held out)", False: ""})
    )
    shown = table[
        [
            "config",
            "phase",
            "measured_s",
            "predicted_before_s",
            "predicted_after_s",
            "error_before_pct",
            "error_after_pct",
        ]
    ]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print("\nmedian |error| % per phase (fitted configurations; held-out configurations)")
    print(result.summary().to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"# load average {_load()} after (other processes on the cores slow the loop)")
    worst = table.loc[table["held_out"], "error_after_pct"].abs().max()
    print(f"worst held-out phase after the fit: {worst:.1f}%")
    print("\nconstants:")
    for line in result.fitted.lines():
        print(f"  {line}")
    if args.csv:
        result.table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
