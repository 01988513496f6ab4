"""The RL planner: every placement (colocated; disaggregated and async on a quarter, half or
three quarters of the GPUs for rollouts, in whole nodes), rollout engine tp and trainer layout
from a small candidate set, ranked by time per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.rl.job import Job, Placement, Plan, TrainLayout
from autoconfig.rl.step import StepEstimate, estimate_steps
from autoconfig.serve.search import tp_degrees
from autoconfig.spec import layout

SPLITS = (0.25, 0.5, 0.75)  # shares of the GPUs that generate, when the pools are separate
TRAIN_TP = (1, 2, 4, 8)
TRAIN_PP = (1, 2, 4, 8, 16)
TRAIN_EP = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class RLPlans:
    """Ranked plans (fastest fitting first) and the job they answer."""

    job: Job
    steps: list[StepEstimate]
    table: pd.DataFrame


def trainer_layouts(job: Job, gpus: int) -> list[TrainLayout]:
    """Trainer layouts for `gpus` GPUs the layout rules allow: tp within a node, pp up to 16,
    for MoE models ep over the data-parallel ranks; no context parallelism (rollouts of a few
    thousand tokens do not need it)."""
    spec, node = job.model, job.cluster.gpus_per_node
    rows = []
    for tp in TRAIN_TP:
        for pp in TRAIN_PP:
            if tp > node or tp * pp > gpus or gpus % (tp * pp) or pp > spec.layers:
                continue
            dp = gpus // (tp * pp)
            for ep in TRAIN_EP if spec.is_moe else (1,):
                if ep > dp or dp % ep or (spec.is_moe and spec.num_experts % ep):
                    continue
                rows.append({"dp": dp, "tp": tp, "pp": pp, "ep": ep, "sp": tp > 1})
    if not rows:
        return []
    frame = layout.frame_of([{**_defaults(), **r} for r in rows])
    codes = {
        **layout.columns(frame),
        "heads": spec.heads,
        "kv_heads": spec.kv,
        "layers": spec.layers,
        "experts": spec.num_experts,
        "num_gpus": gpus,
        "gbs": np.ceil(job.sequences / frame["dp"].to_numpy(float)) * frame["dp"].to_numpy(float),
        "seq": job.prompt_tokens + job.lengths.mean_tokens,
    }
    broken = np.zeros(len(frame), bool)
    for _, _, bad in layout.rules(codes):
        broken |= np.broadcast_to(np.asarray(bad, bool), broken.shape)
    return [
        TrainLayout(tp=r["tp"], pp=r["pp"], ep=r["ep"])
        for r, b in zip(rows, broken, strict=True)
        if not b
    ]


def _defaults() -> dict[str, object]:
    return {d.name: d.plain(d.default) for d in layout.DIMENSIONS}


def _splits(job: Job) -> list[int]:
    """Rollout GPU counts of separate pools: whole nodes when there are several."""
    node = job.cluster.gpus_per_node
    unit = node if job.gpus >= 2 * node else 1
    out = []
    for share in SPLITS:
        count = round(job.gpus * share / unit) * unit
        if 0 < count < job.gpus:
            out.append(count)
    return sorted(set(out))


def candidates(
    job: Job,
    staleness: int = 1,
    placement: Placement | None = None,
    rollout_gpus: int | None = None,
) -> list[Plan]:
    """Every plan tried for the job: of one `placement` when given, and with `rollout_gpus`
    generating when the pools are separate."""
    node = job.cluster.gpus_per_node
    if rollout_gpus is not None:
        if placement is Placement.COLOCATED:
            raise UserError("rollout-gpus: colocated plans generate on every GPU; drop it")
        # the refusal names the role left without GPUs (Plan.checked)
        Plan(
            Placement.DISAGGREGATED, rollout_gpus, job.gpus - rollout_gpus, 1, TrainLayout()
        ).checked(job)
    pools: list[tuple[Placement, int, int, int]] = [(Placement.COLOCATED, job.gpus, job.gpus, 0)]
    for rollout in [rollout_gpus] if rollout_gpus is not None else _splits(job):
        pools.append((Placement.DISAGGREGATED, rollout, job.gpus - rollout, 0))
        pools.append((Placement.ASYNC, rollout, job.gpus - rollout, staleness))
    if rollout_gpus is not None:
        pools = [p for p in pools if p[0] is not Placement.COLOCATED]
    if placement is not None:
        pools = [p for p in pools if p[0] is placement]
    layouts = {n: trainer_layouts(job, n) for n in {p[2] for p in pools}}
    plans = []
    for placement, rollout, train, k in pools:
        for tp in tp_degrees(job.model, rollout, node, False):
            if rollout % tp:
                continue
            for lay in layouts[train]:
                plans.append(Plan(placement, rollout, train, tp, lay, k))
    return plans


def plan(
    job: Job,
    staleness: int = 1,
    top: int | None = None,
    placement: Placement | None = None,
    rollout_gpus: int | None = None,
) -> RLPlans:
    """The job's plans, fastest first (those that fit before those that do not)."""
    if staleness < 1:
        raise UserError(f"staleness: at least 1 step for async plans (got {staleness})")
    plans = candidates(job.checked(), staleness, placement, rollout_gpus)
    if not plans:
        raise UserError(f"gpus: no rollout tp or trainer layout suits {job.gpus} GPUs")
    steps = estimate_steps(job, plans)
    order = sorted(range(len(steps)), key=lambda i: (not steps[i].fits, steps[i].step_s))
    ranked = [steps[i] for i in order][: top or None]
    return RLPlans(job, ranked, table(ranked))


def table(steps: list[StepEstimate]) -> pd.DataFrame:
    """One row per plan: what it is, its phases, throughput and bottleneck."""
    rows = []
    for rank, s in enumerate(steps, start=1):
        p = s.plan
        rows.append(
            {
                "rank": rank,
                "placement": p.placement.value,
                "staleness": p.staleness,
                "rollout_gpus": p.rollout_gpus,
                "train_gpus": p.train_gpus,
                "rollout_tp": p.rollout_tp,
                "rollout_replicas": p.replicas,
                "train_tp": p.train.tp,
                "train_pp": p.train.pp,
                "train_ep": p.train.ep,
                "train_recompute": s.update.recompute,
                "step_s": s.step_s,
                **s.phases(),
                "samples_per_s": s.samples_per_s,
                "tokens_per_s_per_gpu": s.tokens_per_s_per_gpu,
                "gpu_hours_per_1000_steps": s.step_s * p.total_gpus() * 1000.0 / 3600.0,
                "fits": s.fits,
                "bottleneck": s.bottleneck(),
                "plan": p.label(),
            }
        )
    return pd.DataFrame(rows)
