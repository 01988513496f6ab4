"""The fewest GPUs (and, of several GPU types, the cheapest) that serve a target request rate
within the SLOs: one continuous-batching search (serve/continuous.py) per GPU count, on the
grid `autoconfig plan` walks (base/count_grid.py: powers of two below a node, then 1, 2, 3,
4, 6, 8, ... nodes, up to a limit), and a bisection over whole nodes between the first count
whose best deployment meets the limits at the rate and the grid point below it.

Prices: neither the GPU profiles nor `autoconfig plan` hold any (plan takes them as
--gpu-hour-usd), so the cheapest type is the one with the lowest GPUs x USD per GPU-hour when
prices are given, else the one needing the fewest GPUs (ties: the order given).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.serve.result import ServingResult
from autoconfig.spec import catalog

DEFAULT_MAX_GPUS = 128
UNPRICED = (
    "no prices: the GPU profiles hold none; ranked by GPU count (give --gpu-hour-usd to rank "
    "by cost per hour)"
)


@dataclass(frozen=True)
class Count:
    """One GPU count tried: its search (None where the model fits no split of it)."""

    gpu: str
    gpus: int
    price_usd_per_gpu_hour: float | None
    result: ServingResult | None
    reason: str = ""  # why there is no search result

    @property
    def meets(self) -> bool:
        return self.result is not None and self.result.feasible > 0

    @property
    def usd_per_hour(self) -> float | None:
        p = self.price_usd_per_gpu_hour
        return None if p is None else p * self.gpus


@dataclass
class Fewest:
    request_rate: float
    tried: list[Count] = field(default_factory=list)  # every count searched, by type and count
    answers: dict[str, Count | None] = field(default_factory=dict)  # per type: the fewest
    chosen: Count | None = None  # the cheapest answer
    priced: bool = False

    @property
    def feasible(self) -> bool:
        return self.chosen is not None


def check(
    gpus: tuple[str, ...], prices: tuple[float, ...], max_gpus: int, request_rate: float
) -> None:
    """One UserError line for GPU types, prices or a limit that cannot make a search."""
    if not gpus:
        raise UserError("gpu: give at least one GPU type")
    for name in gpus:
        catalog.get_gpu(name)  # an unknown name is one line with the closest names
    for price in prices:
        checks.number(price, "gpu-hour-usd")
    if len(prices) not in (0, 1, len(gpus)):
        raise UserError(
            f"gpu-hour-usd: give one price, or one per --gpu ({len(gpus)}), not {len(prices)}"
        )
    checks.integer(max_gpus, "max-gpus")
    checks.number(request_rate, "request-rate")


def fewest_gpus(
    search: Callable[[str, int], ServingResult],
    gpus: tuple[str, ...],
    request_rate: float,
    prices: tuple[float, ...] = (),
    max_gpus: int = DEFAULT_MAX_GPUS,
    gpus_per_node: int | None = None,
) -> Fewest:
    """Per GPU type the fewest GPUs whose best deployment meets the limits at `request_rate`
    (`search(gpu, count)` runs the serving search at that rate), and the cheapest type."""
    # the training planner's grid and bisection, loaded only when this search runs
    from autoconfig.base.count_grid import counts, fewest

    check(gpus, prices, max_gpus, request_rate)
    price_of = dict(zip(gpus, prices * len(gpus) if len(prices) == 1 else prices, strict=False))
    out = Fewest(request_rate, priced=bool(prices))
    for gpu in gpus:
        node = catalog.cluster_for(catalog.get_gpu(gpu), gpus_per_node).gpus_per_node
        seen: dict[int, Count] = {}

        def tried(n: int, gpu: str = gpu, seen: dict[int, Count] = seen) -> Count:
            if n not in seen:
                seen[n] = _count(search, gpu, n, price_of.get(gpu))
            return seen[n]

        # More GPUs only add replicas: a count that misses never stalls the walk up the grid.
        found = fewest(lambda n: tried(n).meets, lambda _: False, counts(node, max_gpus), node)
        out.answers[gpu] = seen[found] if found is not None else None
        out.tried.extend(seen[n] for n in sorted(seen))
    met = [(i, c) for i, c in enumerate(out.answers.values()) if c is not None]
    if met:
        # Cheapest per hour when priced, else the fewest GPUs; ties go to the order given.
        out.chosen = min(met, key=lambda ic: (ic[1].usd_per_hour or ic[1].gpus, ic[0]))[1]
    return out


def _count(
    search: Callable[[str, int], ServingResult], gpu: str, n: int, price: float | None
) -> Count:
    try:
        return Count(gpu, n, price, search(gpu, n))
    except UserError as exc:
        # A count the model fits on no split of (or no split suits) is a point of the table,
        # not a failure; any other refusal (a bad flag) is the user's to fix.
        text = str(exc)
        if not text.startswith("gpus:"):
            raise
        return Count(gpu, n, price, None, text.removeprefix("gpus: ").split(";")[0])


def table(found: Fewest) -> pd.DataFrame:
    """The counts tried, one row each: whether the best deployment meets the limits at the rate,
    which, its goodput and percentiles, and the cost per hour where priced."""
    from autoconfig.serve.goodput import label_of

    rows = []
    for c in found.tried:
        row: dict[str, object] = {"gpu": c.gpu, "gpus": c.gpus, "meets": c.meets}
        r = c.result
        if r is not None and r.feasible:
            best = r.table.iloc[0]
            p = f"p{r.request.percentile:g}"
            row.update(
                deployment=label_of(best),
                goodput_rps=float(best["goodput_rps"]),
                goodput_at_ladder_top=bool(best.get("goodput_at_ladder_top", False)),
                ttft_ms=float(best[f"ttft_{p}_ms"]),
                tpot_ms=float(best[f"tpot_{p}_ms"]),
                why="",
            )
        else:
            row.update(
                deployment="",
                goodput_rps=math.nan,
                goodput_at_ladder_top=False,
                ttft_ms=math.nan,
                tpot_ms=math.nan,
                why=c.reason if r is None else f"closest: {r.closest}",
            )
        row["usd_per_gpu_hour"] = c.price_usd_per_gpu_hour
        row["usd_per_hour"] = c.usd_per_hour
        row["chosen"] = c is found.chosen
        rows.append(row)
    return pd.DataFrame(rows)
