"""The command line: parse flags, call the layer that computes, render and write. One module
per command; importing them registers them on the app."""

from __future__ import annotations

from autoconfig.cli import catalog, estimate, infer, plan, search, train  # noqa: F401  (registers)
from autoconfig.cli.app import app, run


def main() -> None:
    """Entry point of the `autoconfig` command."""
    run()


__all__ = ["app", "main"]
