"""Search efficiency of the measured search, replayed on a space measured exhaustively.

A measured search with `--sampler grid --trials <all>` over a small space gives every
candidate's measured throughput once (the ground truth; see docs/measured_search.md for the
command). This script replays each strategy against that table, with the same sampler code the
search uses, and prints how many trials each needed to reach the measured-best layout (and one
within 5% of it): analytical top-k first then TPE / GP / corrected-model order, versus plain
grid (nested-loop) order and uniform random order. It also prints the per-trial overhead of the
search (launch, polling, collection) from the ground-truth run and any other run folders.

    python scripts/bench_measured_search.py --truth runs/bench-truth [--overhead runs/local]
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

import optuna
import pandas as pd

from autoconfig import api
from autoconfig.measure.candidates import DIMS, build, key_of
from autoconfig.measure.sampler import CandidateSampler, distributions
from autoconfig.measure.study import enqueue_top

STRATEGIES = (
    # name, sampler kind, analytical top-k queued first, seeded
    ("analytical top-3 + tpe", "tpe", 3, True),
    ("analytical top-3 + gp", "gp", 3, True),
    ("analytical top-3 + model", "model", 3, False),
    ("grid order", "grid", 0, False),
    ("random order", "random", 0, True),
)


def truth_table(run: Path) -> tuple[dict[str, float | None], dict]:
    study = optuna.load_study(study_name="autoconfig", storage=f"sqlite:///{run / 'study.db'}")
    values: dict[str, float | None] = {}
    for t in study.get_trials():
        if not t.params:
            continue
        key = key_of({d: t.params[d] for d in DIMS})
        ok = t.state == optuna.trial.TrialState.COMPLETE
        values[key] = t.value if ok else None
    return values, study.user_attrs["fingerprint"]


def replay(candidates, truth: dict[str, float | None], kind: str, top_k: int, seed: int):
    """Trials until the best and until one within 5% of the best."""
    best = max(v for v in truth.values() if v is not None)
    sampler = CandidateSampler(candidates.table, kind, seed=seed, startup=max(top_k, 1))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    if top_k:
        enqueue_top(study, candidates, top_k)
    space = distributions(candidates.table)
    near = None
    for n in range(1, len(truth) + 1):
        trial = study.ask(space)
        value = truth[key_of({d: trial.params[d] for d in DIMS})]
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        trial.set_user_attr(
            "pred_tokens_per_s_per_gpu",
            float(candidates.by_key(key_of(trial.params))["pred_tokens_per_s_per_gpu"]),
        )
        study.tell(trial, value)
        if near is None and value >= 0.95 * best:
            near = n
        if value == best:
            return n, near
    return len(truth), near


def overhead(runs: list[Path]) -> None:
    for run in runs:
        trials = pd.read_csv(run / "trials.csv")
        ok = trials[trials["class"] == "ok"]
        if ok.empty or "overhead_s" not in ok:
            continue
        print(
            f"overhead per trial in {run}: median {ok['overhead_s'].median():.2f} s, "
            f"max {ok['overhead_s'].max():.2f} s over {len(ok)} trials "
            f"(median trial wall {ok['wall_s'].median():.1f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--truth", type=Path, required=True, help="exhaustive measured run")
    parser.add_argument("--space", default="search_spaces/bench_tiny.yaml")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--overhead", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    optuna.logging.set_verbosity(logging.ERROR)
    truth, fp = truth_table(args.truth)
    ranked = api.search(fp["model"], fp["gpus"], fp["gpu"], gbs=fp["gbs"], space=args.space)
    candidates = build(ranked, fp["model"], 10_000, {"device": fp["device"], "gpu": fp["gpu"]})
    missing = set(candidates.runnable()["key"]) - set(truth)
    if missing:
        raise SystemExit(f"the truth run lacks {len(missing)} candidates: measure all first")
    measured = {k: v for k, v in truth.items() if v is not None}
    best_key = max(measured, key=measured.__getitem__)
    label = candidates.by_key(best_key)["label"]
    rank = int(candidates.by_key(best_key)["analytical_rank"])
    print(
        f"{len(truth)} candidates measured ({len(measured)} ok); best {label} at "
        f"{measured[best_key]:,.0f} tokens/s/GPU, analytical rank {rank}"
    )
    grid_trials = None
    rows = []
    for name, kind, top_k, seeded in STRATEGIES:
        seeds = range(args.seeds) if seeded else range(1)
        results = [replay(candidates, truth, kind, top_k, s) for s in seeds]
        to_best = [r[0] for r in results]
        to_near = [r[1] for r in results]
        if kind == "grid":
            grid_trials = to_best[0]
        rows.append((name, to_best, to_near))
    print(f"{'strategy':28} {'to best: median':>16} {'mean':>6} {'worst':>6} {'% of grid':>10}"
          f" {'to within 5%: median':>21}")  # fmt: skip
    for name, to_best, to_near in rows:
        med = statistics.median(to_best)
        print(
            f"{name:28} {med:16.1f} {statistics.mean(to_best):6.1f} {max(to_best):6d} "
            f"{100 * med / grid_trials:9.0f}% {statistics.median(to_near):21.1f}"
        )
    overhead([args.truth, *args.overhead])


if __name__ == "__main__":
    main()
