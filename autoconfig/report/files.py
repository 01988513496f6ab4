"""Search outputs on disk: results.csv (every evaluated candidate), best.json, report.html and,
after a measured search, trials.csv and measured.csv; each written whole or not at all."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from autoconfig.fileio import write_json, write_text
from autoconfig.measure.result import MeasuredSearch
from autoconfig.report import html
from autoconfig.training.result import SearchResult


def plain_row(row: pd.Series | None) -> dict | None:
    """A table row as JSON-friendly values (blanks left out)."""
    if row is None:
        return None
    return {
        k: (v.item() if hasattr(v, "item") else v)
        for k, v in row.items()
        if not (isinstance(v, float) and pd.isna(v))
    }


def write_search(
    result: SearchResult,
    out: Path,
    measured: MeasuredSearch | None = None,
    tokens: float | None = None,
    gpu_hour_usd: float | None = None,
) -> None:
    """results.csv, best.json and report.html; with `tokens` (and `gpu_hour_usd`) every
    feasible row carries days, GPU-hours (and cost), as the terminal shows them."""
    out.mkdir(parents=True, exist_ok=True)
    table = result.answers(tokens, gpu_hour_usd)
    write_text(out / "results.csv", table.to_csv(index=False))
    inputs = result.context() | {"tokens": tokens, "gpu_hour_usd": gpu_hour_usd}
    best = plain_row(table.iloc[0]) if result.feasible else None
    payload = {"inputs": inputs, "best": best, "advice": result.advice}
    write_json(out / "best.json", payload)
    page = html.render(result, measured=measured, tokens=tokens, gpu_hour_usd=gpu_hour_usd)
    write_text(out / "report.html", page)
    if measured is not None:
        write_measured(out, measured)


def write_measured(out: Path, measured: MeasuredSearch) -> None:
    write_text(out / "trials.csv", measured.trials.to_csv(index=False))
    write_text(out / "measured.csv", measured.ranking.to_csv(index=False))


def write_batch(result: pd.DataFrame, out: Path | None) -> None:
    """A batch estimate's table: to stdout, or whole to a file with a line on stderr."""
    bad = int((result["error"] != "").sum())
    if out is None:
        result.to_csv(sys.stdout, index=False)
    else:
        write_text(out, result.to_csv(index=False))
        print(f"wrote {len(result)} rows to {out} ({bad} with an error)", file=sys.stderr)
