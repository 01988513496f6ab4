"""Times the serving search (a benchmark, not a test).

    python scripts/bench_infer.py

Continuous batching: llama3-70b on 64 H100 over every layout (tp, pp, replicas), weight and
K/V precision, max-num-seqs and max-num-batched-tokens, with the scheduler simulation of the
most promising ones and disaggregated prefill, for the default chat workload within TTFT 500 ms
and TPOT 50 ms at p90: the first call in a fresh process (catalog loading included), the median
of 3 warm calls, and `autoconfig infer` end to end as a command (interpreter start, imports and
the report files included). Static batching: gpt3-175b on 64 A100-80GB as before.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

CONTINUOUS = dict(model="llama3-70b", gpu="h100-sxm-80gb", gpus=64, max_ttft_ms=500, max_tpot_ms=50)
STATIC = dict(
    model="gpt3-175b", gpu="a100-sxm-80gb", gpus=64, input_len=60, output_len=20,
    batching="static",
)  # fmt: skip


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def main() -> None:
    imported, _ = timed(lambda: __import__("autoconfig.api"))
    from autoconfig import api

    first, result = timed(lambda: api.infer(**CONTINUOUS))
    warm = [timed(lambda: api.infer(**CONTINUOUS))[0] for _ in range(3)]
    table = result.table
    print(
        f"continuous: {len(table)} candidates, {int(table['fits'].sum())} fit, "
        f"{int(table['simulated'].sum())} simulated, {result.feasible} meet the limits; best "
        f"{table.iloc[0]['goodput_rps']:.2f} requests/s"
    )
    print(f"import autoconfig.api: {imported:.3f} s")
    print(f"search, first call: {first:.2f} s; warm median of 3: {statistics.median(warm):.2f} s")
    with tempfile.TemporaryDirectory() as folder:
        cmd = [
            sys.executable, "-m", "autoconfig.cli", "infer", "--model", "llama3-70b",
            "--gpu", "h100-sxm-80gb", "--gpus", "64", "--max-ttft-ms", "500",
            "--max-tpot-ms", "50", "--out", folder,
        ]  # fmt: skip
        command, _ = timed(lambda: subprocess.run(cmd, check=True, capture_output=True))
    print(f"`autoconfig infer` command end to end (with report files): {command:.2f} s")
    static_first, static = timed(lambda: api.infer(**STATIC))
    static_warm = statistics.median(timed(lambda: api.infer(**STATIC))[0] for _ in range(3))
    print(
        f"static: {len(static.table)} candidates; first call {static_first:.2f} s, "
        f"warm {static_warm:.2f} s"
    )


if __name__ == "__main__":
    main()
