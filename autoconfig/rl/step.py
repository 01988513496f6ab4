"""One RL step's time for a plan, from its phases: rollout (autoconfig.rl.rollout), training
(autoconfig.rl.update), weight sync and switching (autoconfig.rl.sync), composed by placement:
- colocated (time-sharing): rollout + log-probs + update + critic + sync + switch, in turn on
  every GPU;
- disaggregated, lock-step: rollout + log-probs + update + critic + sync. On-policy, each pool
  waits for the other: the trainer for the rollouts, the engines for the new weights (separate
  pools save the switch, not the wait);
- async with k >= 1 steps of staleness: the engines generate the next step's rollouts while
  the trainer trains on the last, so step = max(rollout, training) + sync (the sync pauses
  both pools).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoconfig.rl.job import Job, Placement, Plan, TrainLayout
from autoconfig.rl.rollout import Rollout, rollouts
from autoconfig.rl.sync import Sync, sync
from autoconfig.rl.update import Update, updates


@dataclass(frozen=True)
class StepEstimate:
    """A plan's step, phase by phase (seconds)."""

    job: Job
    plan: Plan
    rollout: Rollout
    update: Update
    sync: Sync

    @property
    def training_s(self) -> float:
        return self.update.seconds

    @property
    def step_s(self) -> float:
        r, t, s = self.rollout.seconds, self.training_s, self.sync
        if self.plan.placement is Placement.COLOCATED:
            return r + t + s.sync_s + s.switch_s
        if self.plan.placement is Placement.DISAGGREGATED:
            return r + t + s.sync_s
        return max(r, t) + s.sync_s

    @property
    def fits(self) -> bool:
        return self.rollout.fits and self.update.fits

    @property
    def samples_per_s(self) -> float:
        return self.job.sequences / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Tokens processed (prompt + response) per second per GPU of the plan."""
        return self.job.tokens / (self.step_s * self.plan.total_gpus())

    def phases(self) -> dict[str, float]:
        return {
            "rollout_s": self.rollout.seconds,
            "logprob_s": self.update.logprob_s,
            "update_s": self.update.update_s,
            "critic_s": self.update.critic_s,
            "sync_s": self.sync.sync_s,
            "switch_s": self.sync.switch_s,
        }

    def bottleneck(self) -> str:
        """What sets the step, in one line."""
        step = self.step_s
        if not self.fits:
            return self.rollout.reason or (
                f"the trainer's peak {self.update.peak_mem_gib:.0f} GiB exceeds the "
                f"{self.job.gpu.memory_gib:.0f} GiB per GPU"
            )
        r, t = self.rollout.seconds, self.training_s
        if self.plan.placement is Placement.ASYNC:
            busy, idle = ("rollout", "trainer") if r >= t else ("training", "engines")
            slack = abs(r - t) / max(r, t)
            return (
                f"{busy} ({max(r, t):.1f} s of {step:.1f} s); the {idle} idle {slack:.0%} "
                "of the step"
            )
        name, value = max(
            (
                ("rollout", r),
                ("training", t),
                ("weight sync", self.sync.sync_s),
                ("switching", self.sync.switch_s),
            ),
            key=lambda item: item[1],
        )
        detail = ""
        if name == "rollout":
            detail = (
                f": {self.rollout.per_replica} sequences per replica wait for the longest "
                f"response ({self.job.lengths.max_tokens:,.0f} tokens at most)"
            )
        return f"{name} ({value / step:.0%} of {step:.1f} s){detail}"


def estimate_steps(job: Job, plans: list[Plan]) -> list[StepEstimate]:
    """Every plan's step, sharing the rollout simulations and training evaluations that plans
    have in common."""
    keys = list(dict.fromkeys((p.rollout_tp, p.rollout_gpus, p.staleness) for p in plans))
    rolled = dict(
        zip(
            keys,
            rollouts(job, [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]),
            strict=True,
        )
    )
    by_gpus: dict[int, list[TrainLayout]] = {}
    for p in plans:
        wanted = by_gpus.setdefault(p.train_gpus, [])
        if p.train not in wanted:
            wanted.append(p.train)
    trained = {}
    for gpus, lays in by_gpus.items():
        for lay, update in zip(lays, updates(job, lays, gpus), strict=True):
            trained[(gpus, lay)] = update
    out = []
    for p in plans:
        update = trained[(p.train_gpus, p.train)]
        out.append(
            StepEstimate(
                job,
                p,
                rolled[(p.rollout_tp, p.rollout_gpus, p.staleness)],
                update,
                sync(job, p, update.state_gib),
            )
        )
    return out
