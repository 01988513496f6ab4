"""The bundled trainer on this machine's GPU beside the cost model: step time, tokens/s, peak
memory and the bytes one layer saves, measured and predicted, for a set of one-GPU runs
(whole small models, truncated larger ones, and slice mode's per-rank shapes of a TP layout).

    python scripts/bench_trainer_gpu.py --out runs/gpu-bench           # on a GPU machine
    python scripts/bench_trainer_gpu.py --device cpu --quick --out /tmp/b   # the script itself

Each case is one `autoconfig train` process (a crash or a timeout is recorded, not raised);
the table printed last and summary.json hold the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

# (name, flags): one GPU each. Truncated models (--layers) keep the embedding and head.
CASES = [
    ("gpt3-1.3b mbs4", "--model gpt3-1.3b --mbs 4 --gbs 16"),
    ("gpt3-1.3b mbs8 full", "--model gpt3-1.3b --mbs 8 --gbs 16 --recompute full"),
    ("gpt3-2.7b mbs4 selective", "--model gpt3-2.7b --mbs 4 --gbs 8 --recompute selective"),
    ("llama3-8b 4 layers", "--model llama3-8b --layers 4 --mbs 1 --gbs 4"),
    ("llama3-8b 4 layers mbs2", "--model llama3-8b --layers 4 --mbs 2 --gbs 4"),
    ("llama3-70b slice tp8", "--model llama3-70b --slice --tp 8 --layers 2 --mbs 1 --gbs 2"),
    ("llama3-70b slice tp4", "--model llama3-70b --slice --tp 4 --layers 2 --mbs 1 --gbs 2"),
    ("gpt3-1.3b mbs4 compiled", "--model gpt3-1.3b --mbs 4 --gbs 16 --compile"),
]
QUICK_CASES = [
    ("tiny-gpt", "--model tiny-gpt --mbs 2 --gbs 4"),
    ("tiny-llama slice tp2", "--model tiny-llama --slice --tp 2 --layers 2 --mbs 1 --gbs 2"),
]


def run_case(name: str, flags: str, folder: Path, args: argparse.Namespace) -> dict:
    out = folder / name.replace(" ", "_")
    cmd = [sys.executable, "-m", "autoconfig.cli", "train", *flags.split()]
    cmd += ["--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--out", str(out)]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        log = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"timed out after {args.timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    row: dict = {"case": name, "flags": flags, "wall_s": time.perf_counter() - start}
    (folder / f"{out.name}.log").write_text(log if isinstance(log, str) else str(log))
    metrics = out / "metrics.json"
    if not metrics.exists():
        return row | {"status": "no metrics", "message": log.strip().splitlines()[-1:]}
    m = json.loads(metrics.read_text())
    pred = m.get("predicted") or {}
    mem = m.get("memory") or [{}]
    sl = m.get("slice_layer") or {}
    return row | {
        "status": m["status"],
        "message": m.get("message", ""),
        "step_s": m.get("median_step_time_s"),
        "pred_step_s": pred.get("pred_step_time_s"),
        "tokens_s": m.get("tokens_per_s_per_gpu"),
        "pred_tokens_s": pred.get("pred_tokens_per_s_per_gpu"),
        "mfu": m.get("mfu"),
        "peak_gb": mem[0].get("peak_allocated_gb"),
        "pred_peak_gb": pred.get("pred_peak_mem_gb"),
        "act_mb": (mem[0].get("saved_activation_bytes_per_layer") or 0) / 1e6,
        "pred_act_mb": (pred.get("act_bytes_per_layer") or 0) / 1e6,
        "layer_fwd_ms": sl.get("forward_ms"),
        "pred_layer_fwd_ms": (pred.get("layer_forward_s") or 0) * 1e3 if sl else None,
        "layer_bwd_ms": sl.get("backward_ms"),
        "pred_layer_bwd_ms": (pred.get("layer_backward_s") or 0) * 1e3 if sl else None,
        "predicted": pred,
        "environment": m.get("environment"),
    }


def _cell(measured: float | None, predicted: float | None) -> str:
    if measured is None or predicted is None:
        return "-"
    return f"{measured:.4g} / {predicted:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gpu-bench")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny models (a CPU check)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per case")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    args = parser.parse_args()
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    cases = QUICK_CASES if args.quick else CASES
    rows = []
    for name, flags in cases:
        if args.only and name not in args.only:
            continue
        rows.append(run_case(name, flags, folder, args))
        (folder / "summary.json").write_text(json.dumps(rows, indent=1))  # kept as it goes
        r = rows[-1]
        print(f"{name}: {r['status']} in {r['wall_s']:.0f} s", flush=True)
    print("measured / predicted")
    head = ("case", "step s", "tokens/s/GPU", "peak GB", "act MB/layer", "layer fwd ms", "bwd ms")
    print(" | ".join(head))
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['case']} | {r['status']}: {r.get('message')}")
            continue
        cells = [
            _cell(r["step_s"], r["pred_step_s"]),
            _cell(r["tokens_s"], r["pred_tokens_s"]),
            _cell(r["peak_gb"], r["pred_peak_gb"]),
            _cell(r["act_mb"], r["pred_act_mb"]),
            _cell(r["layer_fwd_ms"], r["pred_layer_fwd_ms"]),
            _cell(r["layer_bwd_ms"], r["pred_layer_bwd_ms"]),
        ]
        print(" | ".join([r["case"], *cells]))


if __name__ == "__main__":
    main()
