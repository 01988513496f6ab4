"""Search outputs on disk: results.csv (every evaluated candidate), best.json, report.html and,
after a measured search, trials.csv and measured.csv; written as one set (fileio.write_set)
under the folder's lock, so a killed run leaves the old set or the new one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from autoconfig.base.fileio import csv_text, write_set, write_text
from autoconfig.base.folderlock import folder_lock
from autoconfig.layout_search.result import SearchResult
from autoconfig.measure.result import MeasuredSearch
from autoconfig.report import html


def plain_row(row: pd.Series | None) -> dict | None:
    """A table row as JSON-friendly values (blanks left out)."""
    if row is None:
        return None
    return {
        k: (v.item() if hasattr(v, "item") else v)
        for k, v in row.items()
        if not (isinstance(v, float) and pd.isna(v))
    }


def json_text(data: object) -> str:
    return json.dumps(data, indent=2, default=str)


def write_report(out: Path, files: dict[str, str]) -> None:
    """A report set (file name -> text) into `out`, whole, under the folder's lock."""
    with folder_lock(out):
        write_set(out, files)


def measured_files(measured: MeasuredSearch) -> dict[str, str]:
    """trials.csv (every trial) and measured.csv (measured where measured, else predicted)."""
    return {"trials.csv": csv_text(measured.trials), "measured.csv": csv_text(measured.ranking)}


def write_search(
    result: SearchResult,
    out: Path,
    measured: MeasuredSearch | None = None,
    tokens: float | None = None,
    gpu_hour_usd: float | None = None,
) -> None:
    """results.csv, best.json and report.html as one set; with `tokens` (and `gpu_hour_usd`)
    every feasible row carries days, GPU-hours (and cost), as the terminal shows them."""
    table = result.answers(tokens, gpu_hour_usd)
    inputs = result.context() | {"tokens": tokens, "gpu_hour_usd": gpu_hour_usd}
    best = plain_row(table.iloc[0]) if result.feasible else None
    payload = {"inputs": inputs, "best": best, "advice": result.advice}
    if measured is not None:
        payload["measured"] = measured.summary()
    files = {
        "results.csv": csv_text(table),
        "best.json": json_text(payload),
        "report.html": html.render(
            result, measured=measured, tokens=tokens, gpu_hour_usd=gpu_hour_usd
        ),
    }
    if measured is not None:
        files.update(measured_files(measured))
    write_report(out, files)


def write_batch(result: pd.DataFrame, out: Path | None) -> None:
    """A batch estimate's table: to stdout, or whole to a file with a line on stderr."""
    bad = int((result["error"] != "").sum())
    if out is None:
        sys.stdout.write(csv_text(result))
    else:
        write_text(out, csv_text(result))
        print(f"wrote {len(result)} rows to {out} ({bad} with an error)", file=sys.stderr)
