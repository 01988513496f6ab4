"""Fits the serving-engine constants (profiles/gpus/*.yaml `inference:`) on a fixed third of the
published inference points.

    python scripts/fit_inference.py            # fit and write the a100 profiles
    python scripts/fit_inference.py --dry-run  # print the constants only

Fitted rows: FasterTransformer points whose sha256(run_id) % 3 == 0 (autoconfig.serve.
validation); scripts/validate_inference.py reports the other rows apart. The constants are
shared by every GPU of the fitted chip; other chips borrow them (catalog.serving_constants).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from autoconfig import catalog, resources
from autoconfig.cost.inference import evaluate_serving
from autoconfig.serve.frame import read_serving_rows
from autoconfig.serve.validation import load_inference_runs

# name: (start, lower, upper, scale to the ServeInputs column)
PARAMS = {
    "memory": (0.75, 0.3, 1.0, 1.0),
    "gemm": (0.65, 0.2, 1.0, 1.0),
    "kernel_us": (4.0, 0.0, 50.0, 1e-6),
    "allreduce_base_us": (15.0, 0.0, 200.0, 1e-6),
    "allreduce_step_us": (10.0, 0.0, 200.0, 1e-6),
}
COLUMN = {
    "memory": "eff_memory",
    "gemm": "eff_gemm",
    "kernel_us": "kernel_s",
    "allreduce_base_us": "ar_base_s",
    "allreduce_step_us": "ar_step_s",
}


def fit(runs: pd.DataFrame) -> tuple[dict[str, float], float]:
    rows = read_serving_rows(runs)
    inputs, errors = rows.inputs(), rows.errors
    if (errors != "").any():
        raise SystemExit(f"fit rows with errors: {errors[errors != ''].tolist()}")
    measured = pd.to_numeric(runs["measured_latency_ms"], errors="coerce").to_numpy()

    def residuals(theta: np.ndarray) -> np.ndarray:
        cols = {COLUMN[n]: v * PARAMS[n][3] for n, v in zip(PARAMS, theta, strict=True)}
        pred = evaluate_serving(dataclasses.replace(inputs, **cols))["pred_latency_ms"]
        return np.log(pred / measured)

    start = np.array([p[0] for p in PARAMS.values()])
    lower = np.array([p[1] for p in PARAMS.values()])
    upper = np.array([p[2] for p in PARAMS.values()])
    result = least_squares(
        residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.1, diff_step=1e-3
    )
    return dict(zip(PARAMS, result.x.tolist(), strict=True)), float(result.cost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    runs = load_inference_runs()
    fit_rows = runs[runs["fit_set"]].reset_index(drop=True)
    chips = {catalog.get_gpu(g).chip for g in fit_rows["gpu"].unique()}
    if len(chips) != 1:
        raise SystemExit(f"expected one chip among the fitted rows, got {sorted(chips)}")
    chip = chips.pop()
    constants, cost = fit(fit_rows)
    models = ", ".join(sorted(fit_rows["model"].unique()))
    print(f"fitted on {len(fit_rows)} {chip} points ({models}); robust cost {cost:.4f}")
    print({k: round(v, 4) for k, v in constants.items()})
    if args.dry_run:
        return
    provenance = (
        f"fitted by scripts/fit_inference.py on {len(fit_rows)} FasterTransformer points "
        f"({models}; the sha256(run_id) % 3 == 0 third of ../shared/reference/"
        "inference_runs.csv)"
    )
    block = {k: round(v, 5) for k, v in constants.items()} | {"provenance": provenance}
    for path in sorted(Path(str(resources.profiles() / "gpus")).glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data["chip"] != chip:
            continue
        ordered = {}
        for key, value in data.items():
            if key == "inference":
                continue
            ordered[key] = value
            if key == "efficiency":
                ordered["inference"] = block
        Path(path).write_text(yaml.safe_dump(ordered, sort_keys=False))
        print("wrote", path)


if __name__ == "__main__":
    main()
