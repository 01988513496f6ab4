"""The bundled trainer on this machine's GPU beside the cost model: step time, tokens/s, peak
memory, the bytes one layer saves and (slice mode) one layer's forward and backward, measured
and predicted, for a set of one-GPU runs (whole small models, truncated larger ones, and slice
mode's per-rank shapes of a TP layout).

    python scripts/bench_trainer_gpu.py --out runs/gpu-bench           # on a GPU machine
    python scripts/bench_trainer_gpu.py --cases fixed-cost --out runs/fixed-cost
    python scripts/bench_trainer_gpu.py --device cpu --quick --out /tmp/b   # the script itself
    python scripts/bench_trainer_gpu.py --recorded docs/measured/h200_*runs*.json  # no GPU

Each case is one `autoconfig train` process (a crash or a timeout is recorded, not raised).
runs.json holds what each run measured and its configuration, in the form docs/measured/
keeps (tests/test_gpu_measurements.py reads it); the table printed last sets the cost model's
figures for the same configurations beside them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from autoconfig.calibrate.micro_batches import step_line
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.prediction import predicted

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
# One model at one global batch cut into 1 to 16 micro-batches: the same tokens each step, so
# what a step gains per micro-batch is what a micro-batch costs whatever its size (the
# gradients' cast and accumulation, launches). A family is the name before " mbs".
MICRO_BATCH_CASES = [
    *(
        (f"gpt3-1.3b seq1024 mbs{m}", f"--model gpt3-1.3b --seq-len 1024 --mbs {m} --gbs 16")
        for m in (1, 2, 4, 8, 16)
    ),
    *(
        (
            f"llama3-8b 4 layers seq2048 mbs{m}",
            f"--model llama3-8b --layers 4 --seq-len 2048 --mbs {m} --gbs 8",
        )
        for m in (1, 2, 4, 8)
    ),
]
# One model at one micro-batch size, 1 to 8 micro-batches a step: the step grows by a
# micro-batch's forward and backward each time, so the line's intercept is what a step costs
# whatever its size (the optimizer, zeroing the gradients, the loop's own overhead), the fixed
# cost the cost model splits into the optimizer's passes over memory and step_overhead_ms.
# A family is the name before " gbs".
FIXED_COST_CASES = [
    *(
        (
            f"llama3-70b slice tp8 gbs{g}",
            f"--model llama3-70b --slice --tp 8 --layers 2 --mbs 1 --gbs {g}",
        )
        for g in (1, 2, 4, 8)
    ),
    *(
        (f"gpt3-1.3b seq1024 mbs4 gbs{g}", f"--model gpt3-1.3b --seq-len 1024 --mbs 4 --gbs {g}")
        for g in (4, 8, 16, 32)
    ),
]
QUICK_FIXED_COST_CASES = [
    (f"tiny-gpt gbs{g}", f"--model tiny-gpt --mbs 1 --gbs {g}") for g in (1, 2, 4)
]
QUICK_MICRO_BATCH_CASES = [
    (f"tiny-gpt mbs{m}", f"--model tiny-gpt --mbs {m} --gbs 4") for m in (1, 2, 4)
]
QUICK_CASES = [
    ("tiny-gpt", "--model tiny-gpt --mbs 2 --gbs 4"),
    ("tiny-llama slice tp2", "--model tiny-llama --slice --tp 2 --layers 2 --mbs 1 --gbs 2"),
]


def run_case(name: str, flags: str, folder: Path, args: argparse.Namespace) -> dict:
    """One `autoconfig train` run, as a record of what it measured."""
    out = folder / name.replace(" ", "_")
    cmd = [sys.executable, "-m", "autoconfig.cli", "train", *flags.split()]
    cmd += ["--device", args.device, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--out", str(out)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        log = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        log = f"timed out after {args.timeout} s"
    (folder / f"{out.name}.log").write_text(log)
    metrics = out / "metrics.json"
    if not metrics.exists():
        return {"case": name, "status": "no metrics", "message": log.strip()[-300:]}
    m = json.loads(metrics.read_text())
    mem = (m.get("memory") or [{}])[0]
    sl = m.get("slice_layer") or {}
    return {
        "case": name,
        "status": m["status"],
        "message": m.get("message", "")[:300],
        "config": m["config"],
        "environment": m.get("environment"),
        "gpu_profile": m.get("gpu_profile"),
        "median_step_time_s": m.get("median_step_time_s"),
        "step_times_s": m.get("step_times_s"),
        "tokens_per_s_per_gpu": m.get("tokens_per_s_per_gpu"),
        "peak_allocated_gib": mem.get("peak_allocated_gib"),
        "peak_reserved_gib": mem.get("peak_reserved_gib"),
        "saved_activation_bytes_per_layer": mem.get("saved_activation_bytes_per_layer"),
        "slice_forward_ms": sl.get("forward_ms"),
        "slice_backward_ms": sl.get("backward_ms"),
    }


def _cell(measured: float | None, model: float | None, scale: float = 1.0) -> str:
    if measured is None or model is None:
        return "-"
    return f"{measured:.4g} / {model * scale:.4g}"


def table_row(run: dict, device: str) -> str:
    """One run's figures, measured / predicted by the cost model as it stands."""
    if run["status"] != "ok":
        return f"{run['case']} | {run['status']}: {run.get('message')}"
    cfg = TrainConfig.model_validate(run["config"])
    pred = predicted(cfg, run.get("gpu_profile"), device) or {}
    # records from older versions of this script may lack the later fields
    saved = run.get("saved_activation_bytes_per_layer")
    cells = [
        _cell(run.get("median_step_time_s"), pred.get("pred_step_time_s")),
        _cell(run.get("tokens_per_s_per_gpu"), pred.get("pred_tokens_per_s_per_gpu")),
        _cell(run.get("peak_allocated_gib"), pred.get("pred_peak_mem_gib")),
        _cell(saved / 1e6 if saved else None, pred.get("act_bytes_per_layer"), 1e-6),
        _cell(run.get("slice_forward_ms"), pred.get("layer_forward_s"), 1e3),
        _cell(run.get("slice_backward_ms"), pred.get("layer_backward_s"), 1e3),
    ]
    return " | ".join([run["case"], *cells])


def step_families(
    runs: list[dict], device: str, marker: str
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The completed runs grouped by family (the case name before `marker`), each as
    (micro-batches per step, measured step seconds, the cost model's), families of two or
    more runs the model predicted."""
    families: dict[str, list[tuple[float, float, float]]] = {}
    for run in runs:
        if run["status"] != "ok" or marker not in run["case"]:
            continue
        cfg = TrainConfig.model_validate(run["config"])
        pred = predicted(cfg, run.get("gpu_profile"), device) or {}
        point = (cfg.micro_batches, run["median_step_time_s"], pred.get("pred_step_time_s"))
        families.setdefault(run["case"].rsplit(marker, 1)[0], []).append(point)
    out = {}
    for family, points in families.items():
        if len(points) >= 2 and all(p[2] is not None for p in points):
            micro, measured, model = (np.asarray(v, dtype=float) for v in zip(*points, strict=True))
            out[family] = (micro, measured, model)
    return out


def micro_batch_slopes(runs: list[dict], device: str) -> list[str]:
    """Per family of runs (the case name before " mbs"), seconds a step gains per micro-batch:
    a least-squares line through step time against micro-batches per step, measured and as the
    cost model predicts it."""
    lines = []
    for family, (micro, measured, model) in step_families(runs, device, " mbs").items():
        slope, _ = step_line(micro, measured)
        model_slope, _ = step_line(micro, model)
        lines.append(f"{family} | {slope * 1e3:.1f} / {model_slope * 1e3:.1f}")
    return lines


def fixed_costs(runs: list[dict], device: str) -> list[str]:
    """Per family of runs (the case name before " gbs"), the same line's intercept (what a
    step costs whatever its size) and slope (one micro-batch), measured and as the cost model
    predicts them, in ms."""
    lines = []
    for family, (micro, measured, model) in step_families(runs, device, " gbs").items():
        slope, intercept = np.polyfit(micro, measured, 1)
        model_slope, model_intercept = np.polyfit(micro, model, 1)
        lines.append(
            f"{family} | {intercept * 1e3:.1f} / {model_intercept * 1e3:.1f}"
            f" | {slope * 1e3:.1f} / {model_slope * 1e3:.1f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/gpu-bench")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny models (a CPU check)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per case")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument(
        "--recorded",
        nargs="+",
        metavar="RUNS_JSON",
        help="tabulate runs recorded earlier (runs.json, docs/measured/) against the cost model"
        " as it stands, running nothing; predicted as run on --device",
    )
    parser.add_argument(
        "--cases",
        default="runs",
        choices=["runs", "micro-batches", "fixed-cost"],
        help="runs: the set of one-GPU runs; micro-batches: one global batch cut 1 to 16 ways;"
        " fixed-cost: 1 to 8 micro-batches a step, for what a step costs whatever its size",
    )
    args = parser.parse_args()
    folder = Path(args.out)
    if not args.recorded:
        folder.mkdir(parents=True, exist_ok=True)
    sets = {
        ("runs", False): CASES,
        ("runs", True): QUICK_CASES,
        ("micro-batches", False): MICRO_BATCH_CASES,
        ("micro-batches", True): QUICK_MICRO_BATCH_CASES,
        ("fixed-cost", False): FIXED_COST_CASES,
        ("fixed-cost", True): QUICK_FIXED_COST_CASES,
    }
    cases = [] if args.recorded else sets[(args.cases, args.quick)]
    runs = [r for name in args.recorded or [] for r in json.loads(Path(name).read_text())["runs"]]
    for name, flags in cases:
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        runs.append(run_case(name, flags, folder, args))
        record = {"source": f"scripts/bench_trainer_gpu.py --device {args.device}", "runs": runs}
        (folder / "runs.json").write_text(json.dumps(record, indent=1))  # kept as it goes
        print(f"{name}: {runs[-1]['status']} in {time.perf_counter() - start:.0f} s", flush=True)
    print("measured / predicted")
    print("case | step s | tokens/s/GPU | peak GB | saved MB/layer | layer fwd ms | bwd ms")
    for run in runs:
        print(table_row(run, args.device))
    # only where one batch is cut several ways: the other cases' names share prefixes
    slopes = micro_batch_slopes(runs, args.device) if args.cases == "micro-batches" else []
    fixed = fixed_costs(runs, args.device) if args.cases == "fixed-cost" or args.recorded else []
    if slopes:
        print("ms a step gains per micro-batch, measured / predicted")
        print("\n".join(slopes))
    if fixed:
        print("family | ms a step costs whatever its size | ms a micro-batch, measured / predicted")
        print("\n".join(fixed))


if __name__ == "__main__":
    main()
