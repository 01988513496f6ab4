"""The GPU counts a sizing question walks (`plan`, `infer` without --gpus), and the bisection to
the fewest that meets its goal: shared by training and serving, so it sits below both."""

from __future__ import annotations

import math
from collections.abc import Callable


def counts(node: int, max_gpus: int) -> list[int]:
    """The geometric grid: powers of two below a node, then 1, 2, 3, 4, 6, 8, ... nodes."""
    below = [2**i for i in range(int(math.log2(node)) + 1) if 2**i < node]
    nodes, j = [], 0
    while True:
        for m in (2**j, 3 * 2 ** (j - 1)) if j else (1,):
            nodes.append(m)
        if 2**j * node > max_gpus:
            break
        j += 1
    return [n for n in below + sorted({m * node for m in nodes}) if n <= max_gpus]


def fewest(
    meets: Callable[[int], bool],
    stalled: Callable[[list[int]], bool],
    grid: list[int],
    node: int,
) -> int | None:
    """The smallest count that meets the goal: the first grid point that does, then bisection
    over whole nodes between it and the grid point below."""
    tried: list[int] = []
    for i, n in enumerate(grid):
        tried.append(n)
        if meets(n):
            lo = grid[i - 1] if i else 0
            if lo < node or n % node:
                return n  # below a node the grid already holds every candidate count
            lo_m, hi_m = lo // node, n // node
            while hi_m - lo_m > 1:
                mid = (lo_m + hi_m) // 2
                if meets(mid * node):
                    hi_m = mid
                else:
                    lo_m = mid
            return hi_m * node
        if stalled(tried):
            return None
    return None
