"""Live progress of a measured search: a rich table redrawn in place on a terminal (queued,
running, done, failed, best so far, predicted vs measured per finished trial); one plain line
per event when the output is a file or a pipe."""

from __future__ import annotations

from typing import TYPE_CHECKING

from optuna.trial import TrialState
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from autoconfig.measure.outcome import Outcome
    from autoconfig.measure.runner import Runner


class Progress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live: Live | None = None
        self.rows: list[tuple[str, ...]] = []

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def started(self, number: int, label: str) -> None:
        if self.live is None:
            self.console.print(f"trial {number}: started {escape(label)}", highlight=False)

    def finished(self, number: int, label: str, outcome: Outcome) -> None:
        pred = outcome.metrics.predicted if outcome.metrics and outcome.metrics.predicted else {}
        measured = outcome.attrs.get("measured_tokens_per_s_per_gpu")
        cells = (
            "-" if number < 0 else str(number),
            label,
            outcome.kind,
            f"{pred.get('pred_tokens_per_s_per_gpu', 0):,.0f}" if pred else "-",
            f"{measured:,.0f}" if measured else "-",
            (outcome.reason or "")[:80],
        )
        self.rows.append(cells)
        if self.live is None:
            tail = f" {cells[4]} tokens/s/GPU" if measured else f": {cells[5]}"
            self.console.print(
                f"trial {cells[0]}: {outcome.kind} {escape(label)}{escape(tail)}", highlight=False
            )

    def refresh(self, runner: Runner) -> None:
        if self.live is None:
            return
        trials = runner.study.get_trials(deepcopy=False)
        counts = {
            "queued": sum(t.state == TrialState.WAITING for t in trials),
            "running": len(runner.flights),
            "done": sum(t.state == TrialState.COMPLETE for t in trials),
            "failed": sum(t.state == TrialState.FAIL for t in trials),
            "invalid": sum(t.state == TrialState.PRUNED for t in trials),
        }
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        best = max(done, key=lambda t: t.value or 0, default=None)
        head = " · ".join(f"{k} {v}" for k, v in counts.items())
        if best is not None:
            head += f" · best {best.value:,.0f} tokens/s/GPU ({best.user_attrs.get('label', '')})"
        table = Table(show_header=True, header_style="bold")
        for col in ("trial", "layout", "result", "predicted tok/s/GPU", "measured", "reason"):
            table.add_column(col)
        for row in self.rows[-15:]:
            table.add_row(*(escape(c) for c in row))
        running = Table(show_header=False, box=None)
        for number, flight in sorted(runner.flights.items()):
            running.add_row(f"running {number}", escape(flight.trial.user_attrs.get("label", "")))
        self.live.update(Group(head, table, running))
