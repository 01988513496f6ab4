"""The command line: parse flags, call the layer that computes, render and write. One module
per command; importing one registers its commands on the app, and a run imports only the one it
names (`register`)."""

from __future__ import annotations

from autoconfig.cli.app import app, register, run


def main() -> None:
    """Entry point of the `autoconfig` command."""
    run()


__all__ = ["app", "main", "register"]
