"""Integer helpers whose cost grows with a number's divisors, not with the number: loops over
GPU counts must not walk every count up to N."""

from __future__ import annotations

import math


def divisors(n: int, limit: int | None = None) -> list[int]:
    """The divisors of n in ascending order (those <= limit, when given), in O(sqrt(n))."""
    if n < 1:
        return []
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    out = small + large[::-1]
    return out if limit is None else [d for d in out if d <= limit]
