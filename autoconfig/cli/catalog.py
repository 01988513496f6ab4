"""`autoconfig models`, `gpus` and `calibrate`: the catalog, and refitting a GPU profile to a
measured search."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
import yaml

from autoconfig.base import checks
from autoconfig.base.fileio import write_text
from autoconfig.cli.app import app
from autoconfig.cli.options import OUT_FILE, checked
from autoconfig.report import terminal
from autoconfig.spec import catalog as models_and_gpus


@app.command()
def models() -> None:
    """List the catalog models with their parameter counts."""
    unique = {id(m): m for m in models_and_gpus.models().values()}
    terminal.print_view(terminal.models_table(sorted(unique.values(), key=lambda m: m.name)))


@app.command()
def gpus() -> None:
    """List the GPU profiles: datasheet figures and calibrated efficiency."""
    terminal.print_view(terminal.gpus_table(list(models_and_gpus.gpus().values())))


@app.command()
def calibrate(
    run: Path = typer.Argument(
        ..., help="a measured search's --out folder", callback=checked(checks.path_name)
    ),
    write: Path = typer.Option(
        None, help="where to write the calibrated profile YAML", callback=OUT_FILE
    ),
    storage: str = typer.Option(None, help="the study's Optuna storage URL, if not in RUN"),
) -> None:
    """Fit the GPU profile's efficiency constants to a measured search's trials."""
    # optuna and scipy take over a second to import: only calibration pays for them.
    from autoconfig.measure.calibrate import calibrate as fit
    from autoconfig.report.measured import calibration_view

    calibration = fit(run, storage)
    terminal.print_view(calibration_view(calibration))
    if write is not None:
        write_text(write, yaml.safe_dump(calibration.profile(run), sort_keys=False), "write")
        print(f"wrote {write}; use it with --profile {write}", file=sys.stderr)
