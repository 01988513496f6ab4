"""Fits the GPU profiles' efficiency constants on the calibration third of the reference runs.

    python scripts/fit_profiles.py            # fit and write profiles/gpus/*.yaml
    python scripts/fit_profiles.py --dry-run  # print the constants only

The calibration subset is fixed: rows whose sha256(run_id) % 3 == 0 (autoconfig.validation.
in_fit_set); scripts/validate_published.py reports errors on the other two thirds separately.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from autoconfig import catalog, resources
from autoconfig.fit import fit_memory, fit_time
from autoconfig.frame import read_training_rows
from autoconfig.validation import load_training_runs, measured_throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    runs = load_training_runs()
    fit_all = runs[runs["fit_set"]].reset_index(drop=True)  # failed runs inform memory only
    fit = fit_all[fit_all["status"] == "ok"].reset_index(drop=True)
    measured = measured_throughput(fit)
    start = {g.chip: g.efficiency for g in catalog.gpus().values()}
    rows = read_training_rows(fit)
    chips = np.array(
        ["" if e else h.gpu.chip for h, e in zip(rows.hardware, rows.errors, strict=True)]
    )
    constants, cost = fit_time(rows.inputs(), chips, measured.to_numpy(float), start)
    mem_gb = pd.to_numeric(fit_all["measured_peak_mem_gb"], errors="coerce")
    all_rows = read_training_rows(fit_all)
    overhead, reserved = fit_memory(
        all_rows.inputs(), (all_rows.errors == "").to_numpy(), fit_all, mem_gb
    )
    n_time = int(measured.notna().sum())
    n_mem = int(mem_gb.notna().sum())
    groups = ", ".join(sorted(fit.loc[measured.notna(), "source_group"].unique()))
    print(
        f"fitted on {n_time} throughput rows ({groups}); {n_mem} peak-memory rows; "
        f"robust cost {cost:.3f}"
    )
    for chip, values in constants.items():
        print(chip, {k: round(v, 4) for k, v in values.items()})
    print(f"memory_overhead={overhead:.4f} memory_reserved_gb={reserved:.3f}")
    if args.dry_run:
        return

    for path in sorted(Path(str(resources.profiles() / "gpus")).glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        chip = data["chip"]
        source_chip = chip if chip in constants else "h100"
        eff = data["efficiency"]
        eff.update({k: round(v, 5) for k, v in constants[source_chip].items()})
        eff["memory_overhead"] = round(overhead, 5)
        eff["memory_reserved_gb"] = round(reserved, 4)
        rows = int(
            (
                fit.loc[measured.notna(), "gpu"].map(
                    lambda n: (
                        catalog.gpus().get(n.strip().lower())
                        and catalog.gpus()[n.strip().lower()].chip
                    )
                )
                == source_chip
            ).sum()
        )
        how = (
            f"fitted by scripts/fit_profiles.py on {rows} published {source_chip} runs "
            "(the sha256(run_id) % 3 == 0 third of ../shared/reference/training_runs.csv)"
        )
        if source_chip != chip:
            how = f"copied from the {source_chip} fit: no published {chip} runs to fit on; " + how
        eff["provenance"] = how + (
            f"; memory constants from {n_mem} measured peaks and the fits/does-not-fit status "
            f"of {len(fit_all)} runs"
        )
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
        print("wrote", path)


if __name__ == "__main__":
    main()
