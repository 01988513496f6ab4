"""The response-length distribution of a rollout: a maximum and a mean, read as an exponential
density truncated at the maximum, or measured lengths (a CSV, `read_response_lengths`), and
the stratified lengths a simulation draws from it.

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
from pathlib import Path

import numpy as np

from autoconfig.spec.documents import read_length_table

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
    """Responses of at most `max_tokens` tokens averaging `mean_tokens`: the truncated
    exponential above, or, with `lengths` and `counts` (measured responses: each distinct
    length and how often it occurred), their own distribution."""

    max_tokens: float
    mean_tokens: float
    lengths: tuple[int, ...] = ()
    counts: tuple[float, ...] = ()
    source: str = ""  # where measured lengths came from

    @classmethod
    def measured(
        cls, lengths: tuple[int, ...], counts: tuple[float, ...], source: str
    ) -> ResponseLengths:
        """The distribution of measured response lengths."""
        values, weights = np.asarray(lengths, float), np.asarray(counts, float)
        mean = float((values * weights).sum() / weights.sum())
        return cls(float(values.max()), mean, tuple(lengths), tuple(counts), source)

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
        if self.lengths:
            # the measured step function: the length whose cumulative share first reaches u
            cumulative = np.cumsum(self.counts) / np.sum(self.counts)
            at = np.searchsorted(cumulative, u, side="left").clip(0, len(self.lengths) - 1)
            return np.asarray(self.lengths, float)[at]
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
        if self.lengths:
            return (
                f"{int(sum(self.counts)):,} measured lengths from {self.source} (mean "
                f"{self.mean_tokens:,.0f}, longest {self.max_tokens:,.0f} tokens)"
            )
        return (
            f"exponential truncated at {self.max_tokens:,.0f} tokens with mean "
            f"{self.mean_tokens:,.0f} (rate x max = {self.scaled_rate:+.2f})"
        )


def read_response_lengths(path: Path) -> ResponseLengths:
    """Measured response lengths from a CSV: an `output_len` column (the format of `infer
    --workload`, whose outputs are the responses) or a `length` column. Bad input is one
    UserError line naming `lengths`, the file and the first bad line."""
    lengths, counts = read_length_table(path, "lengths", (("output_len",), ("length",)))
    return ResponseLengths.measured(lengths, counts, Path(path).name)
