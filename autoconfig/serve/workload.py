"""A serving workload: how requests arrive (Poisson at a rate, all at once, or a given trace) and
how long their prompts and outputs are (fixed, uniform, or the lengths of a CSV sample such as
a ShareGPT-like export). It draws the request trace the scheduler simulation replays.

Without lengths the default is a typical chat turn, printed with every answer so it can be
changed: prompts uniform in 128-2048 tokens (a user message with some conversation history and
a system prompt) and replies uniform in 64-512 tokens, scaled down to fit a model whose context
is shorter (and said so). This is autoconfig's stated assumption, not a measured distribution;
give --workload with real lengths when you have them.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.cost.serving_sim import Trace, poisson_arrivals
from autoconfig.spec.vocab import Arrival

CHAT_INPUT = (128, 2048)
CHAT_OUTPUT = (64, 512)
CHAT = "typical chat"
DEFAULT_REQUESTS = 200
# Requests simulated per point: the scheduler simulation holds a few [deployments x requests]
# arrays (about 100 rows: 8 MB each at this limit) and takes ~5 loop steps per request, each
# costing the requests in flight, so 10,000 requests take about a minute (llama3-70b on 8 GPUs
# with disaggregated pools: 58 s, 170 MB, on two cores).
MIN_REQUESTS = 20
MAX_REQUESTS = 10_000
# Rows of a --workload file without arrival times: a sample the requests are drawn from (a
# ShareGPT export holds ~90,000 conversations); a file with arrival times is replayed row by
# row, so it holds at most MAX_REQUESTS.
MAX_WORKLOAD_ROWS = 250_000


@dataclass(frozen=True)
class Lengths:
    """Token counts: `low` == `high` is fixed, else uniform in [low, high]; or `samples`.
    `assumed`: autoconfig's typical chat turn, not lengths the user gave (so it may be cut to
    a model's context)."""

    low: int
    high: int
    samples: tuple[int, ...] = ()
    assumed: bool = False

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

    def scaled(self, factor: float) -> Lengths:
        """Both ends times `factor` (< 1), rounded down, at least 1."""
        low = max(1, math.floor(self.low * factor))
        return replace(self, low=low, high=max(low, math.floor(self.high * factor)))

    def clipped(self, top: int) -> Lengths:
        """At most `top` tokens (>= 1)."""
        high = min(self.high, top)
        return replace(self, low=min(self.low, high), high=high)

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
    source: str = CHAT

    @property
    def longest(self) -> int:
        """The most tokens (prompt and output) one request may hold: of a file's rows, the
        longest row; else the longest prompt and the longest output together."""
        if self.pairs:
            return max(i + o for i, o in self.pairs)
        return self.input.largest + self.output.largest

    def within(self, context: int, model: str) -> Workload:
        """This workload with its assumed lengths (the typical chat turn, where no lengths were
        given) cut to fit `context` tokens: both scaled by one factor when both are assumed,
        else the assumed one clipped beside the given one; the source says so. Lengths the
        user gave are never changed (a request longer than the context is refused)."""
        inp, out = self.input, self.output
        if self.longest <= context or not (inp.assumed or out.assumed):
            return self
        fits = f"to fit {model}'s context of {context:,} tokens"
        if inp.assumed and out.assumed:
            factor = context / (inp.high + out.high)
            inp, out = inp.scaled(factor), out.scaled(factor)
            how = f"scaled by {factor:.2f} {fits}"
        elif inp.assumed:
            if context - out.largest < 1:
                return self
            inp = inp.clipped(context - out.largest)
            how = f"prompts cut to {inp.high:,} tokens {fits}"
        else:
            if context - inp.largest < 1:
                return self
            out = out.clipped(context - inp.largest)
            how = f"outputs cut to {out.high:,} tokens {fits}"
        return replace(self, input=inp, output=out, source=f"{self.source}, {how}")

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
    """The typical chat turn (assumed, not measured: see the module's docstring)."""
    return Workload(
        Lengths(*CHAT_INPUT, assumed=True), Lengths(*CHAT_OUTPUT, assumed=True), source=CHAT
    )


def read_workload(path: Path, seed: int = 0, requests: int = DEFAULT_REQUESTS) -> Workload:
    """A CSV with input_len and output_len per request and optionally arrival_s (seconds from
    the start: the trace is replayed as is). Only a regular text file of at most
    checks.MAX_TEXT_BYTES is read (not a folder, a pipe or a device). A bad cell is a one-line
    error naming its row; lengths are counts up to checks.MAX_COUNT (the model's context is
    checked against the model)."""
    text = checks.text_file(path, "workload")
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"workload: '{path}' is not a readable CSV ({reason})") from None
    for col in ("input_len", "output_len"):
        if col not in table:
            raise UserError(
                f"workload: missing column '{col}' (columns: input_len, output_len[, arrival_s])"
            )
    if table.empty:
        raise UserError(f"workload: '{path}' has no rows")
    timed = "arrival_s" in table
    most = MAX_REQUESTS if timed else MAX_WORKLOAD_ROWS
    if len(table) > most:
        kind = "requests replayed (rows with arrival_s)" if timed else "rows"
        raise UserError(
            f"workload: '{path}' has {len(table):,} rows; at most {most:,} {kind} are read"
        )
    values = {}
    for col in ("input_len", "output_len", *(["arrival_s"] if timed else [])):
        number = pd.to_numeric(table[col].str.strip(), errors="coerce")
        if col == "arrival_s":
            bad = number.isna() | ~(number >= 0) | ~(number <= checks.MAX_AMOUNT)
            rule = f"a number of seconds in 0..{checks.MAX_AMOUNT:g}"
        else:
            # Bounded before the cast to int: 1e20 would wrap to a negative length.
            bad = number.isna() | ~(number >= 1) | ~(number <= checks.MAX_COUNT)
            bad |= number.fillna(0) != number.fillna(0).round()
            rule = f"an integer in 1..{checks.MAX_COUNT:,}"
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(
                f"workload: row {row + 2} {col} must be {rule} "
                f"(got {checks.shown(table[col].iloc[row])})"
            )
        values[col] = number.to_numpy()
    pairs = tuple(
        zip(
            values["input_len"].astype(int).tolist(),
            values["output_len"].astype(int).tolist(),
            strict=True,
        )
    )
    times = tuple(values["arrival_s"].tolist()) if "arrival_s" in values else ()
    if times and np.any(np.diff(values["arrival_s"]) < 0):
        raise UserError("workload: arrival_s must not decrease from one row to the next")
    inputs = Lengths(1, 1, tuple(p[0] for p in pairs))
    outputs = Lengths(1, 1, tuple(p[1] for p in pairs))
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
