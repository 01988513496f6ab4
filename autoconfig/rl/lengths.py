"""The response-length distribution of a rollout: a maximum and a mean, read as an exponential
density truncated at the maximum, and the stratified lengths a simulation draws from it.

Assumption (not a measured distribution): the density of a response of x tokens is
proportional to exp(-rate * x) on [0, max]. One parameter is fixed by the mean:
- rate > 0 when the mean is under half the maximum: most responses short, a thin tail to the
  limit (chat-like answers);
- rate = 0 at exactly half: uniform;
- rate < 0 above half: lengths pile up against the limit, as reasoning models' responses do
  when the limit truncates them (NeMo-RL's Qwen3 runs average 70-78% of their limit).
The tail (how close the longest of n responses gets to the maximum) is what sets the rollout's
wall time, since a step waits for its longest response.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# |rate * max| beyond this is a point mass at one end for every practical purpose, and keeps
# exp() finite.
_LIMIT = 600.0


def _mean_share(scaled_rate: float) -> float:
    """Mean over max of the truncated exponential with rate * max = `scaled_rate`."""
    a = scaled_rate
    if abs(a) < 1e-6:
        return 0.5 - a / 12.0  # the series at 0: the uniform's half, less a/12
    if a > _LIMIT:
        return 1.0 / a
    return 1.0 / a - 1.0 / np.expm1(a)


@dataclass(frozen=True)
class ResponseLengths:
    """Responses of at most `max_tokens` tokens averaging `mean_tokens`."""

    max_tokens: float
    mean_tokens: float

    @property
    def scaled_rate(self) -> float:
        """rate * max of the density that has this mean (bisection: the mean falls as the
        rate grows)."""
        share = self.mean_tokens / self.max_tokens
        low, high = -_LIMIT, _LIMIT
        for _ in range(100):
            mid = 0.5 * (low + high)
            if _mean_share(mid) > share:
                low = mid
            else:
                high = mid
        return 0.5 * (low + high)

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Lengths at cumulative probabilities `u` (the inverse CDF), at least one token."""
        u = np.asarray(u, dtype=float)
        a = self.scaled_rate
        if abs(a) < 1e-9:
            x = u * self.max_tokens
        else:
            x = -self.max_tokens / a * np.log1p(u * np.expm1(-a))
        return np.clip(x, 1.0, self.max_tokens)

    def stratified(self, count: int) -> np.ndarray:
        """`count` lengths at the midpoints of equal-probability strata, longest last: a draw
        of `count` responses without sampling noise, whose longest sits at the quantile
        1 - 1/(2 count), where the longest of `count` draws falls on average."""
        u = (np.arange(count) + 0.5) / count
        return self.quantile(u)

    def describe(self) -> str:
        return (
            f"exponential truncated at {self.max_tokens:,.0f} tokens with mean "
            f"{self.mean_tokens:,.0f} (rate x max = {self.scaled_rate:+.2f})"
        )
