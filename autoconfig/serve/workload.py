"""A serving workload: how requests arrive (Poisson at a rate, all at once, or a given trace) and
how long their prompts and outputs are (fixed, uniform, or the lengths of a CSV sample such as
a ShareGPT-like export). It draws the request trace the scheduler simulation replays.

Without lengths the default is a typical chat turn, printed with every answer so it can be
changed: prompts uniform in 128-2048 tokens (a user message with some conversation history and
a system prompt) and replies uniform in 64-512 tokens. This is autoconfig's stated assumption,
not a measured distribution; give --workload with real lengths when you have them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.base.errors import UserError
from autoconfig.cost.serving_sim import Trace, poisson_arrivals
from autoconfig.spec.vocab import Arrival

CHAT_INPUT = (128, 2048)
CHAT_OUTPUT = (64, 512)
DEFAULT_REQUESTS = 200


@dataclass(frozen=True)
class Lengths:
    """Token counts: `low` == `high` is fixed, else uniform in [low, high]; or `samples`."""

    low: int
    high: int
    samples: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str | int, field: str) -> Lengths:
        """'512' (fixed) or '128:2048' (uniform)."""
        parts = str(text).strip().split(":")
        try:
            low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
        except ValueError:
            low, high = 0, -1
        if len(parts) > 2 or low < 1 or high < low:
            raise UserError(
                f"{field}: must be a positive integer or LOW:HIGH (uniform), got '{text}'"
            )
        return cls(low, high)

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples)) if self.samples else (self.low + self.high) / 2.0

    @property
    def largest(self) -> int:
        return max(self.samples) if self.samples else self.high

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.samples:
            return rng.choice(np.asarray(self.samples), count)
        return rng.integers(self.low, self.high + 1, count)

    def describe(self) -> str:
        if self.samples:
            return f"sampled from {len(self.samples)} lengths (mean {self.mean:.0f})"
        if self.low == self.high:
            return str(self.low)
        return f"uniform {self.low}-{self.high} (mean {self.mean:.0f})"


@dataclass(frozen=True)
class Workload:
    input: Lengths
    output: Lengths
    arrival: Arrival = Arrival.POISSON
    requests: int = DEFAULT_REQUESTS
    seed: int = 0
    times: tuple[float, ...] = ()  # a trace's arrival times in seconds
    pairs: tuple[tuple[int, int], ...] = ()  # a file's (input, output) per request, in order
    source: str = "typical chat"

    def trace(self) -> Trace:
        """The requests the simulation replays (arrivals at rate 1 unless a trace)."""
        if self.pairs:
            count = len(self.pairs) if self.arrival is Arrival.TRACE else self.requests
            picked = np.random.default_rng(self.seed).integers(0, len(self.pairs), count)
            if self.arrival is Arrival.TRACE:
                picked = np.arange(count)
            inp = np.array([self.pairs[i][0] for i in picked], dtype=float)
            out = np.array([self.pairs[i][1] for i in picked], dtype=float)
        else:
            rng = np.random.default_rng(self.seed + 1)
            count = self.requests
            inp = self.input.draw(count, rng).astype(float)
            out = self.output.draw(count, rng).astype(float)
        if self.arrival is Arrival.TRACE:
            times = np.asarray(self.times, dtype=float)
            arrival = times - times.min()
        elif self.arrival is Arrival.BURST:
            arrival = np.zeros(count)
        else:
            arrival = poisson_arrivals(count, self.seed)
        return Trace(arrival, inp, out)

    def describe(self) -> str:
        how = {
            Arrival.POISSON: "Poisson arrivals",
            Arrival.BURST: "all requests at once",
            Arrival.TRACE: "the trace's arrival times",
        }[self.arrival]
        return (
            f"{self.source}: input {self.input.describe()}, output {self.output.describe()} "
            f"tokens; {how}; {self.requests if not self.times else len(self.times)} requests"
        )


def chat() -> Workload:
    return Workload(Lengths(*CHAT_INPUT), Lengths(*CHAT_OUTPUT))


def read_workload(path: Path, seed: int = 0, requests: int = DEFAULT_REQUESTS) -> Workload:
    """A CSV with input_len and output_len per request and optionally arrival_s (seconds from
    the start: the trace is replayed as is). A bad cell is a one-line error naming its row."""
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"workload: no such file '{path}'") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"workload: '{path}' is not a readable CSV ({exc})") from None
    for col in ("input_len", "output_len"):
        if col not in table:
            raise UserError(
                f"workload: missing column '{col}' (columns: input_len, output_len[, arrival_s])"
            )
    if table.empty:
        raise UserError(f"workload: '{path}' has no rows")
    values = {}
    for col in ("input_len", "output_len", *(["arrival_s"] if "arrival_s" in table else [])):
        number = pd.to_numeric(table[col].str.strip(), errors="coerce")
        if col == "arrival_s":
            bad = number.isna() | (number < 0)
            rule = "a number of seconds >= 0"
        else:
            bad = number.isna() | (number < 1) | (number != number.round())
            rule = "a positive integer"
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(
                f"workload: row {row + 2} {col} must be {rule} (got '{table[col].iloc[row]}')"
            )
        values[col] = number.to_numpy()
    pairs = tuple(
        zip(values["input_len"].astype(int), values["output_len"].astype(int), strict=True)
    )
    times = tuple(values["arrival_s"].tolist()) if "arrival_s" in values else ()
    if times and np.any(np.diff(values["arrival_s"]) < 0):
        raise UserError("workload: arrival_s must not decrease from one row to the next")
    inputs = Lengths(1, 1, tuple(int(p[0]) for p in pairs))
    outputs = Lengths(1, 1, tuple(int(p[1]) for p in pairs))
    return Workload(
        inputs,
        outputs,
        Arrival.TRACE if times else Arrival.POISSON,
        requests if not times else len(times),
        seed,
        times,
        pairs,
        source=Path(path).name,
    )
