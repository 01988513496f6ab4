"""Fits the GPU profiles' efficiency constants on the calibration third of the reference runs.

    python scripts/fit_profiles.py            # fit and write profiles/gpus/*.yaml
    python scripts/fit_profiles.py --dry-run  # print the constants only
    python scripts/fit_profiles.py --save fit.json         # also keep what was fitted
    python scripts/fit_profiles.py --apply fit.json        # write a kept fit, no refit

The calibration subset is fixed: rows whose sha256(run_id) % 3 == 0
(autoconfig.calibrate.validation.in_fit_set); scripts/validate_published.py reports errors on
the other two thirds separately.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd
import yaml

from autoconfig.base import resources
from autoconfig.calibrate.fit import fit_memory
from autoconfig.calibrate.leave_out import (
    FALLBACK_CHIP,
    SHARED_CONSTANTS,
    fit_time_constants,
    neutral_start,
)
from autoconfig.calibrate.validation import (
    THROUGHPUT_APART,
    load_training_runs,
    measured_throughput,
)
from autoconfig.rows.training import read_training_rows


def fitted() -> dict:
    """The fitted constants by chip, the memory allowance and the counts their provenance
    names."""
    runs = load_training_runs()
    fit_all = runs[runs["fit_set"]].reset_index(drop=True)  # failed runs inform memory only
    fit = fit_all[fit_all["status"] == "ok"].reset_index(drop=True)
    measured = measured_throughput(fit)
    # Each source group counts once, whatever its size; the Playbook sweep, whose own repeats
    # disagree by more than 1.5x, is left to the memory fit and the ranking checks.
    # From the middle of every range, as each left-out refit starts (validate_left_out.py), so
    # the shipped constants are the ones that procedure gives with every group in.
    constants, cost, rows_by_chip = fit_time_constants(fit, neutral_start())
    mem_gib = pd.to_numeric(fit_all["measured_peak_mem_gib"], errors="coerce")
    all_rows = read_training_rows(fit_all)
    overhead, reserved = fit_memory(
        all_rows.inputs(), (all_rows.errors == "").to_numpy(), fit_all, mem_gib
    )
    weighed = measured.notna() & ~fit["source_group"].isin(THROUGHPUT_APART)
    groups = ", ".join(sorted(fit.loc[weighed, "source_group"].unique()))
    print(
        f"fitted on {int(weighed.sum())} throughput rows ({groups}); "
        f"{int(mem_gib.notna().sum())} peak-memory rows; robust cost {cost:.3f}"
    )
    return {
        "constants": constants,
        "memory_overhead": overhead,
        "memory_reserved_gib": reserved,
        "rows_by_chip": rows_by_chip,
        "peak_rows": int(mem_gib.notna().sum()),
        "status_rows": len(fit_all),
    }


def set_efficiency(text: str, values: dict[str, float], where: str = "profile") -> str:
    """`text` (a profile's YAML) with each of `values` rewritten where it stands in the
    `efficiency:` block, a comment after it kept: the rest of the file, its comments and
    hand-written sources included, stays as it was (a YAML dump would drop the comments)."""
    head, block, tail = text.partition("\nefficiency:\n")
    if not block:
        raise ValueError(f"{where}: no efficiency block")
    end = re.search(r"^\S", tail, flags=re.MULTILINE)
    body, rest = (tail[: end.start()], tail[end.start() :]) if end else (tail, "")
    for key, value in values.items():
        body, found = re.subn(
            rf"^(  {key}:)[ \t]*[^#\n]*?([ \t]+#.*)?$",
            lambda m, v=value: f"{m.group(1)} {v}{m.group(2) or ''}",
            body,
            count=1,
            flags=re.MULTILINE,
        )
        if not found:
            raise ValueError(f"{where}: {key} is not in its efficiency block")
    return head + block + body + rest


def _provenance_counts(fit: dict) -> str:
    rows = sum(fit["rows_by_chip"].values())
    return f"{rows} published runs of {', '.join(sorted(fit['rows_by_chip']))}"


def write_profiles(fit: dict) -> None:
    """Writes the fitted constants into every GPU profile (a family without published runs
    takes the h100 fit; the CPU profile is calibrate's), value by value in place, every file
    worked out before any is written. A profile whose provenance does not name this fit's run
    counts is named: its text is people's to update."""
    constants = fit["constants"]
    counts = _provenance_counts(fit)
    updated = []
    for path in sorted(Path(str(resources.profiles() / "gpus")).glob("*.yaml")):
        text = path.read_text()
        data = yaml.safe_load(text)
        chip = data["chip"]
        if chip == "cpu":  # the trainer's CPU profile is refitted from its own runs by calibrate
            continue
        source_chip = chip if chip in constants else FALLBACK_CHIP
        # Only the shared constants: a profile's GEMM and attention efficiencies time its GPU
        # only where it names no kernel tables, and stay as they were fitted for that.
        shared = constants[source_chip]
        values = {k: round(v, 5) for k, v in shared.items() if k in SHARED_CONSTANTS}
        values["memory_overhead"] = round(fit["memory_overhead"], 5)
        values["memory_reserved_gib"] = round(fit["memory_reserved_gib"], 4)
        provenance = " ".join(str(data["efficiency"].get("provenance", "")).split())
        updated.append((path, set_efficiency(text, values, str(path)), counts in provenance))
    for path, text, current in updated:
        path.write_text(text)
        print("wrote", path, "" if current else f"(its provenance does not say {counts})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--save", type=Path, help="keep the fit as JSON")
    parser.add_argument("--apply", type=Path, help="write a kept fit without refitting")
    args = parser.parse_args()
    fit = json.loads(args.apply.read_text()) if args.apply else fitted()
    for chip, values in fit["constants"].items():
        print(chip, {k: round(v, 4) for k, v in values.items()})
    print(
        f"memory_overhead={fit['memory_overhead']:.4f} "
        f"memory_reserved_gib={fit['memory_reserved_gib']:.3f}"
    )
    if args.save:
        args.save.write_text(json.dumps(fit, indent=1))
    if not args.dry_run:
        write_profiles(fit)


if __name__ == "__main__":
    main()
