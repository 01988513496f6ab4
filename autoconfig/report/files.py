"""Search outputs on disk: results.csv (every evaluated candidate), best.json and report.html,
each written to a temporary file and renamed, so an interrupted run leaves no half-written file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from autoconfig.report import html


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:  # interrupted (Ctrl-C) or failed: leave neither a partial file nor the temporary
        tmp.unlink(missing_ok=True)


def write_search(ranked: pd.DataFrame, out: Path, measured: pd.DataFrame | None = None) -> None:
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
    _atomic_write(out / "report.html", html.render(ranked, measured=measured))
