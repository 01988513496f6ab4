"""Distil AMD's measured GEMM times (the tuned-GEMM tables AMD's aiter library ships) into the
small file autoconfig carries for AMD Instinct GPUs: autoconfig/profiles/gemm_rates/amd_aiter/.

Data provenance only: autoconfig never imports aiter. This script reads the configuration CSVs
of an amd-aiter wheel (or an unpacked copy) and writes a plain CSV and a provenance.yaml:

    pip download --no-deps amd-aiter      # a wheel of about 40 MB; not a dependency
    python scripts/distill_amd_gemm.py --wheel amd_aiter-*.whl

aiter (AMD, MIT licence) tunes its Composable Kernel GEMMs per shape and compute-unit count and
keeps the fastest kernel of each shape with its measured time in microseconds
(aiter/configs/*_tuned_gemm.csv: cu_num, M, N, K, the kernel, us, tflops). cu_num tells the chip:
304 compute units are CDNA3's MI300X and MI325X, 256 are CDNA4's MI350X and MI355X, 80 the
MI308X (not kept). The files do not say which of the two parts of a CU count was measured.

Kept: shapes the size of a training step's GEMMs (M >= 4096 rows, N and K >= 1024), in the two
formats these parts train in:
- bf16: bf16_tuned_batched_gemm.csv (16 GEMMs per call; the only bf16 rows at 304 or 256 CUs).
  These are Composable Kernel GEMMs; PyTorch's bf16 linear on ROCm mostly calls hipBLASLt, so
  they stand in for it;
- fp8 (per-tensor or per-row scales, what Transformer Engine's delayed-scaling recipe on ROCm
  runs): a8w8_tuned_gemm.csv, a8w8_tuned_batched_gemm.csv and a8w8_bpreshuffle_tuned_gemm.csv
  (the same scaling with the weight laid out ahead of time).
Not kept: the block-scaled kernels (a8w8_blockscale*): CDNA3 runs no block-scaled training
format (no MXFP8), and CDNA4 scales MX blocks in hardware, which these software-scaled
kernels do not measure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import zipfile
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "autoconfig" / "profiles" / "gemm_rates" / "amd_aiter"

# file in aiter/configs -> (format, family, compute-unit counts kept)
FAMILIES = {
    "bf16_tuned_batched_gemm.csv": ("bf16", "ck bf16 batched", (304, 256)),
    "a8w8_tuned_gemm.csv": ("fp8", "ck fp8 rowwise", (304, 256)),
    "a8w8_tuned_batched_gemm.csv": ("fp8", "ck fp8 rowwise batched", (304, 256)),
    "a8w8_bpreshuffle_tuned_gemm.csv": ("fp8", "ck fp8 rowwise bpreshuffle", (304, 256)),
}
MIN_ROWS, MIN_FEATURES = 4096, 1024


def read_configs(source: Path) -> tuple[dict[str, pd.DataFrame], str]:
    """The tuned-GEMM CSVs by file name, from a wheel or an unpacked aiter folder, with the
    package version (from the wheel's name, or 'unpacked')."""
    frames: dict[str, pd.DataFrame] = {}
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            for name in FAMILIES:
                frames[name] = pd.read_csv(io.BytesIO(wheel.read(f"aiter/configs/{name}")))
        return frames, source.name.split("-")[1]
    for name in FAMILIES:
        frames[name] = pd.read_csv(source / "aiter" / "configs" / name)
    return frames, "unpacked"


def distill(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The kept rows: cu_num, format, family, batch, m, n, k, us (as measured)."""
    kept = []
    for name, frame in frames.items():
        fmt, family, cus = FAMILIES[name]
        rows = frame[
            frame["cu_num"].isin(cus)
            & (frame["M"] >= MIN_ROWS)
            & (frame["N"] >= MIN_FEATURES)
            & (frame["K"] >= MIN_FEATURES)
        ]
        kept.append(
            pd.DataFrame(
                {
                    "cu_num": rows["cu_num"].astype(int),
                    "format": fmt,
                    "family": family,
                    "batch": rows["B"].astype(int) if "B" in rows else 1,
                    "m": rows["M"].astype(int),
                    "n": rows["N"].astype(int),
                    "k": rows["K"].astype(int),
                    "us": rows["us"].astype(float),
                }
            )
        )
    out = pd.concat(kept, ignore_index=True)
    return out.sort_values(["cu_num", "format", "family", "n", "k", "m", "batch"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="amd-aiter wheel or folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    frames, version = read_configs(args.wheel)
    rows = distill(frames)
    args.out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(args.out / "gemm.csv", index=False)
    counts = rows.groupby(["cu_num", "format"]).size()
    provenance = {
        "summary": f"amd-aiter {version} (MIT) tuned Composable Kernel GEMM times, "
        "the fastest kernel per shape, at 304 (CDNA3) and 256 (CDNA4) compute units",
        "source": {
            "package": "amd-aiter",
            "version": version,
            "license": "MIT",
            "copyright": "Copyright (c) Advanced Micro Devices, Inc. All rights reserved.",
            "files": {name: f"aiter/configs/{name}" for name in FAMILIES},
            "units": "us: microseconds per call, as the tuner measured (a batched call runs "
            "`batch` GEMMs of m x k by k x n)",
        },
        "distilled": dt.date.today().isoformat(),
        "script": "scripts/distill_amd_gemm.py",
        "kept": f"M >= {MIN_ROWS}, N and K >= {MIN_FEATURES}; bf16 and per-tensor/per-row fp8",
        "rows": {f"{cu} CUs {fmt}": int(n) for (cu, fmt), n in counts.items()},
        "not_said": "which part of a compute-unit count (MI300X or MI325X; MI350X or MI355X) "
        "was measured",
    }
    (args.out / "provenance.yaml").write_text(
        "# Distilled from AMD aiter's tuned-GEMM tables (MIT).\n"
        + yaml.safe_dump(provenance, sort_keys=False, width=100)
    )
    print(f"wrote {len(rows)} rows to {args.out}: " + ", ".join(provenance["rows"]))


if __name__ == "__main__":
    main()
