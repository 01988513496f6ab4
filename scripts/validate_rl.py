"""Writes docs/rl_validation.md: the published RL runs (../shared/reference/rl_runs.csv, or
$AUTOCONFIG_REFERENCE/rl_runs.csv) predicted by `autoconfig rl --runs`: the median absolute
percentage error of the step time per source group and per GPU, every row's prediction or the
reason it has none, and whether, for each colocated / async pair on the same model, GPUs and
precision, the faster of the two is predicted faster.

Run from the repository root: python scripts/validate_rl.py
"""

from __future__ import annotations

import os
import sys
from itertools import product
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig import api

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "rl_validation.md"


def reference() -> Path:
    base = Path(os.environ.get("AUTOCONFIG_REFERENCE", ROOT.parent / "shared" / "reference"))
    return base / "rl_runs.csv"


def _precision(layout_text: str) -> str:
    return "fp8" if "fp8 training" in str(layout_text).lower() else "bf16"


def pairs(result: pd.DataFrame) -> pd.DataFrame:
    """Every (colocated, async) pair of predicted rows on the same model, GPU and precision."""
    done = result[result["error"] == ""].copy()
    done["precision"] = done["train_layout"].map(_precision)
    done["kind"] = done["placement"].str.lower().str.split(" ").str[0]
    rows = []
    for _, group in done.groupby(["model", "gpu", "precision"]):
        together = group[group["kind"] == "colocated"]
        apart = group[group["kind"] == "async"]
        for (_, a), (_, b) in product(together.iterrows(), apart.iterrows()):
            measured_a, measured_b = (
                float(a["measured_step_time_s"]),
                float(b["measured_step_time_s"]),
            )
            faster = "async" if measured_b < measured_a else "colocated"
            predicted = "async" if b["pred_step_time_s"] < a["pred_step_time_s"] else "colocated"
            rows.append(
                {
                    "colocated": a["run_id"],
                    "async": b["run_id"],
                    "measured_s": f"{measured_a:.1f} / {measured_b:.1f}",
                    "predicted_s": f"{a['pred_step_time_s']:.1f} / {b['pred_step_time_s']:.1f}",
                    "faster": faster,
                    "predicted_faster": predicted,
                    "right": faster == predicted,
                }
            )
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def main() -> int:
    path = reference()
    if not path.exists():
        print(f"no {path}: nothing to validate", file=sys.stderr)
        return 1
    runs = pd.read_csv(path, dtype=str, keep_default_na=False)
    result = api.rl_frame(runs)
    result["measured_step_time_s"] = pd.to_numeric(result["measured_step_time_s"], errors="coerce")
    done = result[result["error"] == ""]
    groups = []
    for name, group in result.groupby("source_group", sort=False):
        predicted = group[group["error"] == ""]
        groups.append(
            {
                "source group": name,
                "rows": len(group),
                "predicted": len(predicted),
                "median APE of step time": (
                    f"{predicted['ape_step_time'].median():.1%}" if len(predicted) else "-"
                ),
            }
        )
    by_gpu = [
        {
            "gpu": gpu,
            "predicted": len(g),
            "median APE": f"{g['ape_step_time'].median():.1%}",
            "median predicted / measured": (
                f"{(g['pred_step_time_s'] / g['measured_step_time_s']).median():.2f}"
            ),
        }
        for gpu, g in done.groupby("gpu")
    ]
    matched = pairs(result)
    right = int(matched["right"].sum()) if len(matched) else 0
    rows = pd.DataFrame(
        {
            "run": result["run_id"],
            "measured s": result["measured_step_time_s"].map(
                lambda v: f"{v:.1f}" if np.isfinite(v) else "-"
            ),
            "predicted s": result["pred_step_time_s"].map(
                lambda v: f"{v:.1f}" if np.isfinite(v) else "-"
            ),
            "rollout / training / sync / switch s": [
                "-"
                if r["error"]
                else f"{r['pred_rollout_s']:.1f} / "
                f"{r['pred_logprob_s'] + r['pred_update_s'] + r['pred_critic_s']:.1f} / "
                f"{r['pred_sync_s']:.1f} / {r['pred_switch_s']:.1f}"
                for _, r in result.iterrows()
            ],
            "APE": result["ape_step_time"].map(lambda v: f"{v:.0%}" if np.isfinite(v) else "-"),
            "not predicted because": result["error"].str.replace("|", "/"),
        }
    )
    missing_models = sorted(
        {e.split(";")[0].removeprefix("model: ") for e in result["error"] if e.startswith("model:")}
    )
    missing_gpus = sorted(
        {
            part.strip().removeprefix("gpu: ").split(" ")[0]
            for e in result["error"]
            for part in e.split(";")
            if part.strip().startswith("gpu:")
        }
    )
    text = f"""# RL step time against published runs

Written by `python scripts/validate_rl.py` from `rl_runs.csv` ({len(result)} rows): each row's
step predicted from its stated placement, GPU counts, rollout tp, trainer layout, batch and
lengths (`autoconfig rl --runs`, docs/rl.md). Nothing here is fitted to these rows: the
serving and training constants are the shipped ones, and the RL overheads are stated
assumptions.

## Median absolute percentage error of the step time, per source group

{markdown(pd.DataFrame(groups))}

Per GPU (predicted rows):

{markdown(pd.DataFrame(by_gpu))}

## Colocated against async on the same model, GPUs and precision

Measured and predicted step time (colocated / async); the faster one predicted faster in
**{right} of {len(matched)}** pairs.

{markdown(matched) if len(matched) else "(no pairs)"}

## Every row

{markdown(rows)}

Not predicted: models the catalog lacks: {", ".join(missing_models) or "none"}; GPUs the
catalog lacks: {", ".join(missing_gpus) or "none"}; rows that leave out the prompts, samples
or GPU split are named with the missing column.
"""
    OUT.write_text(text)
    print(f"wrote {OUT}: {len(done)} of {len(result)} rows predicted; pairs {right}/{len(matched)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
