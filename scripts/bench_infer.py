"""Times the serving search (a benchmark, not a test).

    python scripts/bench_infer.py

Prints the time of a full search for gpt3-175b on 64 A100-80GB (every tp, pp, batch and
replica count, input 60 / output 20 tokens): the first call in a fresh process (catalog
loading included), the median of 5 warm calls, and `autoconfig infer` end to end as a
command (interpreter start, imports and the report files included).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

ARGS = dict(model="gpt3-175b", gpu="a100-sxm-80gb", gpus=64, input_len=60, output_len=20)


def main() -> None:
    start = time.perf_counter()
    from autoconfig import api

    imported = time.perf_counter() - start
    start = time.perf_counter()
    out = api.infer(**ARGS)
    first = time.perf_counter() - start
    warm = []
    for _ in range(5):
        start = time.perf_counter()
        api.infer(**ARGS)
        warm.append(time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as folder:
        cmd = [
            sys.executable, "-m", "autoconfig.cli", "infer", "--model", "gpt3-175b",
            "--gpu", "a100-sxm-80gb", "--gpus", "64", "--input-len", "60", "--output-len",
            "20", "--out", folder,
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        command = time.perf_counter() - start
    print(f"candidates: {len(out)} ({out.attrs['feasible']} fit and meet the (empty) budget)")
    print(f"import autoconfig.api: {imported:.3f} s")
    print(f"search, first call: {first:.3f} s; warm median of 5: {statistics.median(warm):.3f} s")
    print(f"`autoconfig infer` command end to end (with report files): {command:.2f} s")


if __name__ == "__main__":
    main()
