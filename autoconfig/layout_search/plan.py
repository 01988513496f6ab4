"""Capacity planning: the fewest GPUs (and, of several GPU types, the cheapest) that train a
model on a number of tokens within a deadline and/or a budget. Each GPU count is one search
(layout_search/run.py); counts are tried in geometric steps (below a node: 1, 2, 4, ...; then
1, 2, 3, 4, 6, 8, 12, ... nodes), then the gap below the first count that meets the goal is
bisected over whole nodes."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from autoconfig.base.count_grid import counts, fewest
from autoconfig.base.errors import UserError
from autoconfig.layout_search import run as search_run
from autoconfig.spec import catalog, defaults, layout
from autoconfig.spec.schema import ModelSpec

SECONDS_PER_DAY = 86400.0
STALL = 4  # grid steps without a faster plan (or without any layout) before giving up
# A count is shown only when someone might run it: its best layout is not slower than a count
# with no more GPUs of the same type (dominated), nor under this share of the median MFU of
# the type's counts (a bisection point that only an odd pipeline split can use: 2,016 H100s
# for llama3-70b run pp63 at 3% MFU).
MFU_FLOOR_OF_MEDIAN = 0.5


@dataclass(frozen=True)
class Goal:
    tokens: float
    max_days: float | None = None
    budget_usd: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (
            ("tokens", self.tokens),
            ("max-days", self.max_days),
            ("budget-usd", self.budget_usd),
        ):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise UserError(f"{flag}: must be a positive number (got {value:g})")
        if self.max_days is None and self.budget_usd is None:
            raise UserError("plan: give --max-days, --budget-usd or both")


@dataclass(frozen=True)
class Point:
    """The best layout of one GPU type at one GPU count, and what training takes with it."""

    gpu: str
    gpus: int
    price: float | None  # USD per GPU-hour
    tdp_w: float | None  # board power per GPU
    best: pd.Series | None  # the search's #1 (None: nothing fits or no layout)
    reason: str = ""  # why there is no plan at this count
    tokens: float = 0.0

    @property
    def ok(self) -> bool:
        return self.best is not None

    @property
    def tokens_per_s(self) -> float:
        return float(self.best["pred_tokens_per_s_per_gpu"]) * self.gpus if self.ok else 0.0

    @property
    def days(self) -> float:
        return self.tokens / self.tokens_per_s / SECONDS_PER_DAY if self.ok else math.inf

    @property
    def gpu_hours(self) -> float:
        return self.days * 24 * self.gpus

    @property
    def cost_usd(self) -> float | None:
        return self.gpu_hours * self.price if self.price is not None else None

    @property
    def energy_kwh(self) -> float | None:
        """Board power (TDP) x GPUs x hours: no CPUs, network, cooling or PUE."""
        return self.tdp_w * self.gpu_hours / 1000 if self.tdp_w is not None else None

    @property
    def label(self) -> str:
        if not self.ok:
            return ""
        b = self.best
        return (
            f"{layout.label(b)} mbs {b['mbs']} recompute {layout.recompute_label(b)} "
            f"zero {b['zero']}"
        )

    def misses(self, goal: Goal) -> dict[str, float]:
        """By how much (a fraction over) each limit is missed; empty when it meets the goal."""
        out = {}
        if goal.max_days is not None and self.days > goal.max_days:
            out["days"] = self.days / goal.max_days - 1
        cost = self.cost_usd
        if goal.budget_usd is not None and (cost is None or cost > goal.budget_usd):
            out["budget"] = math.inf if cost is None else cost / goal.budget_usd - 1
        return out

    def meets(self, goal: Goal) -> bool:
        return self.ok and not self.misses(goal)


# Told of each GPU count: (GPU type, count, None) before its search, (..., its Point) after.
Progress = Callable[[str, int, "Point | None"], None]


@dataclass
class Plan:
    goal: Goal
    model: str
    gbs: int
    gbs_rule: str
    points: list[Point] = field(default_factory=list)  # every count tried, every GPU type
    answers: dict[str, Point | None] = field(default_factory=dict)  # per GPU type
    chosen: Point | None = None  # the fewest GPUs of the cheapest type that meets the goal
    closest: Point | None = None  # when nothing meets: the plan that misses by least


def shown(plan: Plan) -> tuple[list[Point], dict[str, list[Point]]]:
    """The counts worth a row (or a point on the plot), and those left out by reason: a count
    whose best layout is slower than the best at no more GPUs of the same type ('dominated'),
    one whose MFU is under MFU_FLOOR_OF_MEDIAN of the median over the type's counts ('low
    MFU'), and a count no layout uses. Each type's answer and the plan's answer stay."""
    keep: list[Point] = []
    left: dict[str, list[Point]] = {"dominated": [], "low MFU": [], "no layout": []}
    answers = {id(p) for p in (*plan.answers.values(), plan.chosen, plan.closest) if p}
    for gpu in dict.fromkeys(p.gpu for p in plan.points):
        pts = [p for p in plan.points if p.gpu == gpu]
        ok = [p for p in pts if p.ok]
        mfu = sorted(float(p.best["pred_mfu"]) for p in ok)
        floor = MFU_FLOOR_OF_MEDIAN * mfu[len(mfu) // 2] if mfu else 0.0
        for p in pts:
            if id(p) in answers:
                reason = ""
            elif not p.ok:
                reason = "no layout" if p.reason.startswith("no layout uses") else ""
            elif any(q.days < p.days and q.gpus <= p.gpus for q in ok if q is not p):
                reason = "dominated"
            elif float(p.best["pred_mfu"]) < floor:
                reason = "low MFU"
            else:
                reason = ""
            if reason:
                left[reason].append(p)
            else:
                keep.append(p)
    return keep, {k: v for k, v in left.items() if v}


def check(goal: Goal, gpus: tuple[str, ...], prices: tuple[float, ...], max_gpus: int) -> None:
    """One UserError line for prices, GPU types or a count limit that cannot make a plan."""
    if not gpus:
        raise UserError("gpu: give at least one GPU type")
    for p in prices:
        if not (p > 0 and math.isfinite(p)):
            raise UserError(f"gpu-hour-usd: must be a positive number (got {p:g})")
    if len(prices) not in (0, 1, len(gpus)):
        raise UserError(
            f"gpu-hour-usd: give one price, or one per --gpu ({len(gpus)}), not {len(prices)}"
        )
    if goal.budget_usd is not None and not prices:
        raise UserError("budget-usd: needs --gpu-hour-usd (the price of one GPU-hour)")
    if max_gpus < 1:
        raise UserError(f"max-gpus: must be a positive integer (got {max_gpus})")


def plan(
    model: str,
    goal: Goal,
    gpus: tuple[str, ...] = (defaults.GPU,),
    prices: tuple[float, ...] = (),
    *,
    max_gpus: int = 65536,
    gpus_per_node: int | None = None,
    progress: Progress | None = None,
    **search: object,
) -> Plan:
    """The plan for `goal`: per GPU type the fewest GPUs that meet it, and the cheapest of those
    (by cost when priced, else by GPU-hours). `search` goes to every search (seq_len,
    gbs, precision, framework, max_memory_gib, memory_headroom, ...). `progress`, when given,
    hears of each count before its search and of its point after."""
    check(goal, gpus, prices, max_gpus)
    spec = catalog.get_model(model)
    price_of = dict(zip(gpus, prices * len(gpus) if len(prices) == 1 else prices, strict=False))
    out = Plan(goal, spec.name, 0, "")
    for gpu in gpus:
        answer, tried = _sweep(
            spec, gpu, price_of.get(gpu), out, max_gpus, gpus_per_node, search, progress
        )
        out.answers[gpu] = answer
        out.points.extend(tried)
    met = [p for p in out.answers.values() if p is not None]
    if met:
        out.chosen = min(met, key=lambda p: (p.cost_usd or p.gpu_hours, p.gpus))
    else:
        ok = [p for p in out.points if p.ok]
        if ok:
            out.closest = min(ok, key=lambda p: (max(p.misses(goal).values()), p.gpus))
    return out


def _sweep(
    spec: ModelSpec,
    gpu: str,
    price: float | None,
    out: Plan,
    max_gpus: int,
    gpus_per_node: int | None,
    search: dict[str, object],
    progress: Progress | None = None,
) -> tuple[Point | None, list[Point]]:
    """One GPU type: the fewest GPUs that meet the goal (or None) and every count tried."""
    gpu_spec = catalog.get_gpu(gpu)
    node = catalog.cluster_for(gpu_spec, gpus_per_node).gpus_per_node
    seen: dict[int, Point] = {}

    def point(n: int) -> Point:
        if n not in seen:
            if progress is not None:
                progress(gpu, n, None)
            seen[n] = _point(spec, gpu, n, price, gpu_spec.tdp_w, out, gpus_per_node, search)
            if progress is not None:
                progress(gpu, n, seen[n])
        return seen[n]

    def stalled(tried: list[int]) -> bool:
        """No faster plan for STALL grid steps (or no layout since the last one): stop."""
        pts = [seen[n] for n in tried]
        ok = [i for i, p in enumerate(pts) if p.ok]
        if not ok:
            return False
        fastest = max(ok, key=lambda i: pts[i].tokens_per_s)
        return len(pts) - 1 - fastest >= STALL

    found = fewest(lambda n: point(n).meets(out.goal), stalled, counts(node, max_gpus), node)
    return (seen[found] if found is not None else None), [seen[n] for n in sorted(seen)]


def _point(
    spec: ModelSpec,
    gpu: str,
    n: int,
    price: float | None,
    tdp: float | None,
    out: Plan,
    gpus_per_node: int | None,
    search: dict[str, object],
) -> Point:
    """The search's best at `n` GPUs (None with the reason when there is none)."""
    tokens = out.goal.tokens
    try:
        request = search_run.make_request(spec, n, gpu, gpus_per_node=gpus_per_node, **search)  # type: ignore[arg-type]
        result = search_run.run(request)
    except UserError as exc:
        if "no layout" not in str(exc):
            raise
        return Point(gpu, n, price, tdp, None, "no layout uses this many GPUs", tokens)
    if not out.gbs_rule:
        out.gbs, out.gbs_rule = result.request.gbs, result.request.gbs_rule
    if not result.feasible:
        return Point(gpu, n, price, tdp, None, "no layout fits in memory", tokens)
    return Point(gpu, n, price, tdp, result.best, "", tokens)
