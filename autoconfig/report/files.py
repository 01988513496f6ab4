"""Search outputs on disk: results.csv (every evaluated candidate) and best.json, each written
to a temporary file and renamed, so an interrupted run never leaves a half-written file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_search(ranked: pd.DataFrame, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(out / "results.csv", ranked.to_csv(index=False))
    best = None
    if ranked.attrs.get("feasible"):
        row = ranked.iloc[0]
        best = {
            k: (v.item() if hasattr(v, "item") else v)
            for k, v in row.items()
            if not (isinstance(v, float) and pd.isna(v))
        }
    context = {k: v for k, v in ranked.attrs.items() if k != "advice"}
    payload = {"inputs": context, "best": best, "advice": ranked.attrs.get("advice", [])}
    _atomic_write(out / "best.json", json.dumps(payload, indent=2, default=str))
