"""autoconfig's serving answers beside NVIDIA aiconfigurator's on five SLO questions.

    python scripts/compare_aiconfigurator.py            # about 30 s; writes the table below
    python scripts/compare_aiconfigurator.py --only q2 --requests 1000

Each question asks for the most output tokens/s per GPU of a model on N GPUs within a TTFT and
a TPOT limit. aiconfigurator (NVIDIA, Apache-2.0) is not a dependency and is never imported:
its answers are data, recorded in docs/measured/aiconfigurator_questions.csv by running it in a
virtual environment of its own (`aiconfigurator cli default`, or `cli exp` where a quantisation
had to be named; its default backend, TensorRT-LLM). This script runs `autoconfig infer` on the
same questions with TensorRT-LLM's engine profile, colocated only (`--no-disaggregation`, beside
aiconfigurator's "agg") and with disaggregation (its best disaggregated row, beside "disagg"),
and writes a markdown table to docs/aiconfigurator_comparison.md: both figures, the ratio
autoconfig / aiconfigurator, and both chosen deployments. The section after the table (the
tracing of each gap, written by hand) is kept when the file is rewritten.

aiconfigurator's TTFT and TPOT are single estimates of one steady batch (per-step averages), not
percentiles of a request distribution, so autoconfig runs at `--percentile 50` by default.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "docs" / "measured" / "aiconfigurator_questions.csv"
OUT = ROOT / "docs" / "aiconfigurator_comparison.md"
END = "<!-- end of the generated table: what follows is kept when the file is rewritten -->"
BAND = (0.8, 1.25)
MODES = ("agg", "disagg")


@dataclass(frozen=True)
class Question:
    """One SLO question in autoconfig's terms (catalog model, GPU profile, weight format)."""

    model: str
    gpu: str
    gpus: int
    input_len: int
    output_len: int
    ttft_ms: float
    tpot_ms: float
    precision: str
    kv_precision: str


QUESTIONS: dict[str, Question] = {
    "q1": Question("llama3-70b", "h200-sxm-141gb", 8, 1024, 256, 1000, 50, "bf16", "bf16"),
    "q2": Question("llama3-70b", "h100-sxm-80gb", 8, 4096, 512, 2000, 30, "fp8", "fp8"),
    "q3": Question("llama3-8b", "h100-sxm-80gb", 8, 1024, 1024, 300, 10, "fp8", "fp8"),
    "q4": Question("qwen3-30b-a3b", "h200-sxm-141gb", 8, 2048, 512, 1000, 40, "fp8", "fp8"),
    "q5": Question("llama3-70b", "h100-sxm-80gb", 64, 4096, 512, 500, 40, "fp8", "fp8"),
}


@dataclass
class Answer:
    """One tool's best deployment for a question and mode."""

    tokens_per_s_per_gpu: float | None
    deployment: str
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    note: str = ""


def read_aiconfigurator(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    """aiconfigurator's recorded answers by (question, mode)."""
    with path.open(newline="") as f:
        return {(row["question"], row["mode"]): row for row in csv.DictReader(f)}


def infer_args(q: Question, mode: str, percentile: float, requests: int, out: Path) -> list[str]:
    """`autoconfig infer` arguments for one question and mode."""
    args = [
        "infer",
        *("--model", q.model, "--gpus", str(q.gpus), "--gpu", q.gpu),
        *("--input-len", str(q.input_len), "--output-len", str(q.output_len)),
        *("--max-ttft-ms", str(q.ttft_ms), "--max-tpot-ms", str(q.tpot_ms)),
        *("--engine", "trtllm", "--precision", q.precision, "--kv-precision", q.kv_precision),
        *("--percentile", str(percentile), "--requests", str(requests), "--out", str(out)),
    ]
    return [*args, "--no-disaggregation"] if mode == "agg" else args


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _int(value: str | None) -> int:
    number = _float(value)
    return int(number) if number is not None else 0


def describe(row: dict[str, str]) -> str:
    """A results.csv row's deployment: tp/pp/ep, replicas and max-num-seqs per pool."""

    def pool(prefix: str) -> str:
        ep = _int(row.get(f"{prefix}ep"))
        parallel = f"tp{_int(row.get(f'{prefix}tp'))} pp{_int(row.get(f'{prefix}pp'))}"
        parallel += f" ep{ep}" if ep > 1 else ""
        seqs = _int(row.get(f"{prefix}max_num_seqs"))
        return f"{_int(row.get(f'{prefix}replicas'))} x {parallel} max seqs {seqs}"

    if row.get("mode") == "disaggregated":
        return f"P {pool('prefill_')} + D {pool('')}"
    return pool("")


def run_autoconfig(q: Question, mode: str, percentile: float, requests: int) -> Answer:
    """autoconfig's best row for the mode (colocated, or the best disaggregated one)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [
            sys.executable,
            "-c",
            "import sys; from autoconfig.cli import main; sys.exit(main())",
            *infer_args(q, mode, percentile, requests, out),
        ]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        results = out / "results.csv"
        if not results.exists():
            lines = (done.stderr or done.stdout).strip().splitlines()
            return Answer(None, "", note=f"exit {done.returncode}: {lines[-1] if lines else ''}")
        with results.open(newline="") as f:
            rows = list(csv.DictReader(f))
    wanted = "colocated" if mode == "agg" else "disaggregated"
    scored = [
        (value, row)
        for row in rows
        if row.get("mode") == wanted
        and (value := _float(row.get("pred_output_tokens_per_s_per_gpu"))) is not None
        and row.get("meets", "True") == "True"
    ]
    if not scored:
        return Answer(None, "", note=f"no {wanted} deployment meets the limits")
    value, best = max(scored, key=lambda pair: pair[0])
    lower_bound = best.get("goodput_at_ladder_top") == "True"
    return Answer(
        value,
        describe(best),
        _float(best.get("pred_ttft_ms")),
        _float(best.get("pred_tpot_ms")),
        "lower bound (limits held at the ladder's top)" if lower_bound else "",
    )


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(
    recorded: dict[tuple[str, str], dict[str, str]],
    answers: dict[tuple[str, str], Answer],
) -> list[str]:
    """The markdown table, one line per question and mode."""
    lines = [
        "| question | mode | aiconfigurator tok/s/GPU | autoconfig tok/s/GPU | ratio "
        "| aiconfigurator deployment (TTFT / TPOT ms) | autoconfig deployment (TTFT / TPOT ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (qid, mode), ours in answers.items():
        theirs = recorded[(qid, mode)]
        their_value = _float(theirs["tokens_per_s_per_gpu"])
        ratio = (
            ours.tokens_per_s_per_gpu / their_value
            if ours.tokens_per_s_per_gpu is not None and their_value
            else None
        )
        flag = "" if ratio is None or BAND[0] <= ratio <= BAND[1] else " **(outside)**"
        their_times = f"{_num(_float(theirs['ttft_ms']))} / {_num(_float(theirs['tpot_ms']), 1)}"
        our_times = f"{_num(ours.ttft_ms)} / {_num(ours.tpot_ms, 1)}"
        ours_text = f"{ours.deployment} ({our_times})" if ours.deployment else ""
        if ours.note:
            ours_text = f"{ours_text}; {ours.note}" if ours_text else ours.note
        our_value = ("≥ " if "lower bound" in ours.note else "") + _num(ours.tokens_per_s_per_gpu)
        lines.append(
            f"| {qid}: {theirs['description']} | {mode} | {_num(their_value)} | {our_value} "
            f"| {_num(ratio, 2)}{flag} | {theirs['deployment']} ({their_times}) | {ours_text} |"
        )
    return lines


def header(recorded: dict[tuple[str, str], dict[str, str]], percentile: float) -> list[str]:
    first = next(iter(recorded.values()))
    return [
        "# autoconfig beside aiconfigurator: five SLO questions",
        "",
        "Generated by `scripts/compare_aiconfigurator.py` (the table; the tracing below it is "
        "kept when the file is rewritten). aiconfigurator "
        f"{first['version']} (NVIDIA, Apache-2.0; backend {first['backend']}, performance "
        f"database {first['backend_version']}, run {first['date']}) from "
        "`docs/measured/aiconfigurator_questions.csv`; autoconfig `infer --engine trtllm` at "
        f"p{percentile:g}, colocated only (`--no-disaggregation`) beside aiconfigurator's agg and "
        "its best disaggregated row beside disagg. Output tokens/s per GPU of the whole "
        "deployment at the best operating point; the ratio is autoconfig / aiconfigurator, "
        f"flagged outside {BAND[0]}-{BAND[1]}. aiconfigurator's batch is the requests in flight "
        "per worker; autoconfig's max seqs is the running-batch limit (the batch at its goodput "
        "can be lower). autoconfig's TTFT / TPOT are the simulated "
        f"p{percentile:g} at its goodput; aiconfigurator's are its single estimates.",
        "",
    ]


def kept_section(path: Path) -> list[str]:
    """What follows the generated table in the existing file (the hand-written tracing)."""
    if not path.exists():
        return ["## Tracing the gaps", "", "(not traced yet)"]
    text = path.read_text()
    return text.split(END, 1)[1].strip("\n").split("\n") if END in text else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV, help="aiconfigurator's recorded answers")
    ap.add_argument("--out", type=Path, default=OUT, help="markdown file to write")
    ap.add_argument("--percentile", type=float, default=50.0)
    ap.add_argument("--requests", type=int, default=200, help="requests simulated per point")
    ap.add_argument("--only", default="", help="comma-separated question ids (default: all)")
    args = ap.parse_args()
    recorded = read_aiconfigurator(args.csv)
    chosen = [q for q in args.only.split(",") if q] or list(QUESTIONS)
    answers: dict[tuple[str, str], Answer] = {}
    for qid in chosen:
        for mode in MODES:
            if (qid, mode) in recorded:
                answers[(qid, mode)] = run_autoconfig(
                    QUESTIONS[qid], mode, args.percentile, args.requests
                )
                print(f"{qid} {mode}: done", file=sys.stderr)
    lines = table(recorded, answers)
    print("\n".join(lines))
    if args.only:
        return  # a partial run prints its rows and leaves the file as it is
    text = [*header(recorded, args.percentile), *lines, "", END, "", *kept_section(args.out)]
    args.out.write_text("\n".join(text) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
