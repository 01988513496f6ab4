"""Fits the serving-engine constants (profiles/gpus/*.yaml `inference:`) of each GPU chip on a
fixed third of that chip's published inference points.

    python scripts/fit_inference.py            # fit and write the profiles
    python scripts/fit_inference.py --dry-run  # print the constants only
    python scripts/fit_inference.py --cpu      # measure this machine, fit cpu-gloo

--cpu measures the bundled generator's continuous-batching loop on this machine (tiny-llama,
one and two ranks, a fit workload of its own: other lengths and seeds than the goodput check in
docs/inference.md) and fits cpu-gloo's constants to the time of every iteration it ran.

Fitted rows: those whose sha256(run_id) % 3 == 0 (autoconfig.calibrate.serving_validation), of
engines with fused kernels; scripts/validate_inference.py reports the other rows apart. Static
rows are fitted on their end-to-end latency, continuous (in-flight) rows on their max-load output
tokens/s per GPU. The constants are shared by every GPU of the chip; a chip with no rows of
its own borrows a fitted chip of its generation (CARRY), else catalog.serving_constants' rule.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from autoconfig.base import resources
from autoconfig.calibrate.serving_fit import COLUMN, PARAMS, fit
from autoconfig.calibrate.serving_validation import load_inference_runs
from autoconfig.spec import catalog

# Chips without published serving rows that take a fitted chip's constants: Blackwell Ultra
# (B300, GB300) runs the B200's kernels on the same memory system generation.
CARRY = {"b300": "b200"}


def _write(chip: str, block: dict) -> None:
    """Replace (or add after `efficiency:`) the `inference:` block of every profile of the
    chip, leaving the rest of each file as it was written."""
    text_block = yaml.safe_dump({"inference": block}, sort_keys=False, width=100)
    for path in sorted(Path(str(resources.profiles() / "gpus")).glob("*.yaml")):
        text = path.read_text()
        if yaml.safe_load(text)["chip"] != chip:
            continue
        lines = text.splitlines(keepends=True)
        kept, skipping, at = [], False, None
        for line in lines:
            top = line[:1] not in (" ", "\n", "#") and line.strip() != ""
            if top:
                skipping = line.startswith("inference:")
                if line.startswith("cluster:") and at is None:
                    at = len(kept)
            if not skipping:
                kept.append(line)
        kept.insert(at if at is not None else len(kept), text_block)
        path.write_text("".join(kept))
        print("wrote", path)


# The CPU fit's measurements: (tp, max-num-seqs, requests/s) on a workload of its own.
CPU_RUNS = ((1, 8, 15.0), (1, 32, 40.0), (1, 32, 80.0), (2, 8, 2.0), (2, 32, 4.0))
CPU_MODEL = "tiny-llama"


def measure_cpu(folder: Path) -> list[dict]:
    """Runs the continuous-batching loop for CPU_RUNS; returns each run's iterations."""
    import json
    import os

    import torch

    from autoconfig.serve.workload import Lengths, Workload
    from autoconfig.trainer.config import make_config
    from autoconfig.trainer.launch import launch_local
    from autoconfig.trainer.serve_loop import LOAD_ENV, ServeLoad

    trace = Workload(Lengths(8, 160), Lengths(4, 64), requests=60, seed=101).trace()
    # One thread per rank, as the measured search's trials run (measure/task.py).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    out = []
    for tp, seqs, rate in CPU_RUNS:
        os.environ[LOAD_ENV] = json.dumps(
            {
                "arrivals": trace.arrival.tolist(),
                "inputs": trace.input_len.astype(int).tolist(),
                "outputs": trace.output_len.astype(int).tolist(),
                "layouts": {ServeLoad.key(tp, seqs): {"rate": rate, "max_tokens": 256}},
            }
        )
        cfg = make_config(
            model=CPU_MODEL, task="generate", tp=tp, mbs=seqs, device="cpu", gpu="cpu-gloo",
            input_len=int(trace.input_len.max()), output_len=int(trace.output_len.max()),
            seq_len=int(trace.input_len.max() + trace.output_len.max()), steps=2, warmup=1,
        )  # fmt: skip
        run = folder / f"tp{tp}-seqs{seqs}-rate{rate:g}"
        code, metrics = launch_local(cfg, run)
        if code != 0:
            raise SystemExit(f"{run}: {metrics.message}")
        records = json.loads((run / "rank0.json").read_text())["iterations"]
        print(f"measured {run.name}: {len(records)} iterations")
        out.append({"tp": tp, "records": records})
    os.environ.pop(LOAD_ENV, None)
    return out


def fit_cpu(runs: list[dict]) -> tuple[dict[str, float], float, int]:
    """cpu-gloo's constants from the measured iterations (time of each, log error)."""
    from autoconfig.columns.build import serving_inputs
    from autoconfig.cost.serving_sim import _round
    from autoconfig.cost.serving_step import step_model

    gpu = catalog.get_gpu("cpu-gloo")
    spec = catalog.get_model(CPU_MODEL)
    rows = [(run["tp"], *rec) for run in runs for rec in run["records"]]
    data = np.array(rows, dtype=float)
    tp, prompt, pairs, cached, decodes, context, emitting, seconds = data.T
    frame = pd.DataFrame(
        {
            "tp": tp,
            "pp": 1.0,
            "batch_size": 1.0,
            "input_len": 64.0,
            "output_len": 32.0,
            "replicas": 1.0,
            "precision": "fp32",
            "kv_precision": "fp32",
        }
    )
    inputs = serving_inputs(spec, (gpu, gpu.cluster), frame)

    # First the one-rank iterations (compute, streaming and launch costs), then the two-rank
    # ones for the all-reduce alone. Two ranks are the only group size measured, so the
    # tree's per-level latency is not told apart from its fixed cost: it is set to 0.
    def residuals(theta: np.ndarray, names: tuple[str, ...], fixed: dict, rows) -> np.ndarray:
        cols = {COLUMN[n]: np.float64(v * PARAMS[n][3]) for n, v in fixed.items()}
        cols |= {COLUMN[n]: np.float64(v * PARAMS[n][3]) for n, v in zip(names, theta, strict=True)}
        step = step_model(dataclasses.replace(inputs, **cols))
        pred = _round(step, 1.0, prompt + decodes, pairs, cached, context, emitting)
        return np.log(pred / seconds)[rows]

    one = tp == 1
    first = ("memory", "gemm", "kernel_us")
    solo = least_squares(
        residuals,
        np.array([0.5, 0.3, 40.0]),
        bounds=(np.array([0.02, 0.02, 0.0]), np.array([1.0, 1.0, 5000.0])),
        loss="soft_l1",
        f_scale=0.2,
        x_scale="jac",
        args=(first, {"allreduce_base_us": 0.0, "allreduce_step_us": 0.0}, one),
    )
    fitted = dict(zip(first, solo.x.tolist(), strict=True)) | {"allreduce_step_us": 0.0}
    pair = least_squares(
        residuals,
        np.array([3000.0]),
        bounds=(np.array([0.0]), np.array([100000.0])),
        loss="soft_l1",
        f_scale=0.2,
        args=(("allreduce_base_us",), fitted, ~one),
    )
    fitted["allreduce_base_us"] = float(pair.x[0])
    return fitted, float(solo.cost + pair.cost), len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="measure this machine, fit cpu-gloo")
    args = parser.parse_args()
    if args.cpu:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            runs = measure_cpu(Path(folder))
        constants, cost, count = fit_cpu(runs)
        print(f"cpu: fitted on {count} iterations; robust cost {cost:.4f}")
        print("  ", {k: round(v, 4) for k, v in constants.items()})
        if not args.dry_run:
            _write(
                "cpu",
                {k: round(v, 5) for k, v in constants.items()}
                | {
                    "provenance": f"fitted by scripts/fit_inference.py --cpu on {count} "
                    f"iterations of the bundled generator's continuous-batching loop "
                    f"({CPU_MODEL}, one and two gloo ranks, its own fit workload)"
                },
            )
        return
    runs = load_inference_runs()
    fit_rows = runs[runs["fit_set"]].reset_index(drop=True)
    chip_of = {g: catalog.get_gpu(g).chip for g in fit_rows["gpu"].unique()}
    fitted: dict[str, dict] = {}
    for chip in sorted(set(chip_of.values())):
        rows = fit_rows[fit_rows["gpu"].map(chip_of) == chip].reset_index(drop=True)
        profile = catalog.get_gpu(str(rows["gpu"].iloc[0])).inference
        current = profile.model_dump() if profile is not None else {}
        constants, cost = fit(rows, current)
        gpus = ", ".join(sorted(rows["gpu"].unique()))
        engines = ", ".join(sorted(rows["framework"].unique()))
        models = ", ".join(sorted(rows["model"].unique()))
        print(f"{chip}: fitted on {len(rows)} points ({gpus}; {engines}); robust cost {cost:.4f}")
        print("  ", {k: round(v, 4) for k, v in constants.items()})
        provenance = (
            f"fitted by scripts/fit_inference.py on {len(rows)} {engines} points ({gpus}; "
            f"{models}; the sha256(run_id) % 3 == 0 third of ../shared/reference/"
            "inference_runs.csv)"
        )
        fitted[chip] = {k: round(v, 5) for k, v in constants.items()} | {"provenance": provenance}
    for chip, donor in CARRY.items():
        if donor in fitted:
            fitted[chip] = fitted[donor] | {
                "provenance": f"the {donor} fit carried over (no {chip} serving points): "
                + fitted[donor]["provenance"]
            }
    if args.dry_run:
        return
    for chip, block in fitted.items():
        _write(chip, block)


if __name__ == "__main__":
    main()
