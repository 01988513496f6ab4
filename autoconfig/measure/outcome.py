"""What a finished trial came to: its failure class (vocab.FailureClass), the reason in one
line, the measured figures, and the time the search itself spent around the trainer."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from autoconfig.measure.launcher import Job
from autoconfig.spec.vocab import FailureClass
from autoconfig.trainer.assemble import assemble
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import LOST, RunMetrics, is_collateral, read_metrics


@dataclass
class Outcome:
    kind: FailureClass
    reason: str = ""
    metrics: RunMetrics | None = None
    attrs: dict[str, object] = field(default_factory=dict)


def collect(cfg: TrainConfig, job: Job, run_dir: Path, timed_out: bool, limit_s: float) -> Outcome:
    """metrics.json from the ranks' files, classified."""
    metrics = _metrics(cfg, run_dir)
    attrs: dict[str, object] = {}
    timing = _timing(run_dir)
    wall = time.time() - job.submitted
    attrs["wall_s"] = round(wall, 3)
    if timing:
        trainer = max(t["ended"] for t in timing) - min(t["started"] for t in timing)
        attrs["trainer_s"] = round(trainer, 3)
        attrs["overhead_s"] = round(wall - trainer, 3)
    # The cost model's figures for the run as the trainer launched it (its own precision mode,
    # autocast on GPU): the like-for-like check of the model, beside the search's figures for
    # the framework it ranks for.
    own = metrics.predicted or {}
    for name in ("pred_tokens_per_s_per_gpu", "pred_peak_mem_gib"):
        if isinstance(own.get(name), int | float):
            attrs[f"run_{name}"] = float(own[name])
    if metrics.status == "ok" and not timed_out:
        attrs.update(
            measured_tokens_per_s_per_gpu=metrics.tokens_per_s_per_gpu,
            measured_step_time_s=metrics.median_step_time_s,
            measured_peak_mem_gib=max((m.peak_allocated_gib or 0.0) for m in metrics.memory)
            or None,
        )
        if metrics.ttft_ms is not None:  # a generation trial
            attrs.update(measured_ttft_ms=metrics.ttft_ms, measured_tpot_ms=metrics.tpot_ms)
        return Outcome(FailureClass.OK, "", metrics, attrs)
    if metrics.status == "oom":
        return Outcome(FailureClass.OOM, _first(metrics.message), metrics, attrs)
    if timed_out:
        reason = f"killed at the {limit_s:.0f} s trial limit"
        return Outcome(FailureClass.TIMEOUT, reason, metrics, attrs)
    tail = job.log_tail()
    reason = _first(metrics.message) or "the job ended without a result"
    reason = f"{reason}{' | log: ' + tail if tail else ''}"[:1500]
    return Outcome(FailureClass.CRASH, reason, metrics, attrs)


def _metrics(cfg: TrainConfig, run_dir: Path) -> RunMetrics:
    """Rank 0 assembles metrics.json itself after a successful run; otherwise (a failure, a
    killed job) it is assembled here from whatever the ranks left."""
    done = run_dir / "metrics.json"
    ranks = [run_dir / f"rank{r}.json" for r in range(cfg.world)]
    if done.exists() and all(
        r.exists() and r.stat().st_mtime <= done.stat().st_mtime for r in ranks
    ):
        return read_metrics(done)
    return assemble(cfg, run_dir, cfg.world)


def message_parts(message: str) -> list[str]:
    """A run's message split into its ranks' parts."""
    return [p.strip() for p in message.split("; ") if p.strip()]


def _first(message: str) -> str:
    """The root cause first: ranks' own failures before their peers' lost connections."""
    parts = message_parts(message)
    parts.sort(key=is_collateral)
    return "; ".join(parts).splitlines()[0] if parts else ""


def only_collateral(outcome: Outcome) -> bool:
    """Whether every rank's failure is a lost peer or an interrupt: nothing the layout did."""
    parts = message_parts(outcome.metrics.message if outcome.metrics else "")
    return bool(parts) and all(is_collateral(p) for p in parts)


def lost_a_rank(outcome: Outcome) -> bool:
    """Whether a crash is only a rank lost from outside: some rank left no result, and every
    rank that did only lost its peers (a job in which no rank wrote anything, a broken setup
    say, is not one)."""
    if outcome.kind is not FailureClass.CRASH or not only_collateral(outcome):
        return False
    parts = message_parts(outcome.metrics.message)  # only_collateral: there is a message
    return any(LOST in p for p in parts) and any(p.startswith("rank ") for p in parts)


def _timing(run_dir: Path) -> list[dict]:
    out = []
    for path in run_dir.glob("timing*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def finished_on_disk(run_dir: Path, world: int) -> bool:
    """Every rank left its result: the job ended while nobody was watching."""
    return all((run_dir / f"rank{r}.json").exists() for r in range(world))


def all_ranks_done(run_dir: Path, world: int) -> bool:
    """Every rank's task function returned (it writes timing{r}.json last)."""
    return all((run_dir / f"timing{r}.json").exists() for r in range(world))
