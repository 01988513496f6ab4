"""What several commands share: flag checks (typer callbacks over autoconfig.base.checks), the
output folder's lock, the measured-trial options (`search` and `infer` name them alike), CSV
input, key=value lists, and whether a GPU is here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import typer

from autoconfig.base import checks, fileio
from autoconfig.base.errors import UserError
from autoconfig.base.folderlock import folder_lock
from autoconfig.spec import catalog, machine
from autoconfig.spec.vocab import Device, Framework

if TYPE_CHECKING:  # optuna and submitit load only when a measured search runs
    from autoconfig.measure.session import MeasureOptions

MEASURE = "measured search (--measure)"
SERVE = "budget"


def flag_name(param: typer.CallbackParam) -> str:
    """The flag a callback checks, as errors name it ('gpus' for --gpus)."""
    return param.opts[0].lstrip("-") if param.opts else str(param.name)


def checked(check: Callable[..., Any], **limits: Any) -> Callable[..., Any]:
    """A typer callback that runs a flag's value through `check` (autoconfig.base.checks), so a bad
    value is one line naming the flag, before the command does anything."""

    def callback(param: typer.CallbackParam, value: Any) -> Any:
        if value is None:
            return None
        flag = flag_name(param)
        if isinstance(value, list | tuple):
            return [check(v, flag, **limits) for v in value]
        return check(value, flag, **limits)

    return callback


def framework_named(param: typer.CallbackParam, value: str | None) -> Framework | None:
    """A typer callback for a flag that names a framework (`--framework`, `--emit`): its name
    or an alias its profile lists (the spellings batch rows use too), as its Framework. An
    unknown name is one line naming the flag and the closest names. The flag reads plain text
    (`parser=str`), so that aliases reach this callback."""
    if value is None:
        return None
    return Framework(catalog.get_framework(str(value), field=flag_name(param)).name)


COUNT = checked(checks.integer)  # a positive integer up to checks.MAX_COUNT
COUNT0 = checked(checks.integer, low=0)
AMOUNT = checked(checks.number)  # a finite positive number
FRACTION = checked(checks.fraction)
OUT_FOLDER = checked(checks.output_folder)
OUT_FILE = checked(checks.output_file)
SEED = checked(checks.integer, low=0, high=2**32 - 1)


@contextmanager
def claimed(out: Path | None) -> Iterator[None]:
    """The command's output folder, locked for the whole command (folderlock): a second
    command on the same folder is one line and exit code 2. Nothing without --out."""
    if out is None:
        yield
        return
    with folder_lock(out):
        yield


def read_csv(runs: Path) -> pd.DataFrame:
    """A CSV of runs, every cell as text (checks.text_file: a text file, not a folder). A row
    with more cells than the header keeps its error in attrs[fileio.ROW_ERRORS] (the row
    readers report it as that row's error); the other rows are read as usual."""
    table = fileio.csv_rows(checks.text_file(runs, "runs"), "runs", f"'{runs}'")
    frame = pd.DataFrame(table.rows, columns=table.header, dtype=str)
    frame.attrs[fileio.ROW_ERRORS] = table.errors
    return frame


def pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"{flag}: expected key=value (got '{item}')")
        out[key.strip()] = value.strip()
    return out


def on_cpu(measure: bool, device: Device) -> bool:
    """Whether measured trials will run on CPU ranks."""
    return measure and machine.resolve(device) is Device.CPU


def measure_options(flags: dict[str, Any], cpu: bool) -> MeasureOptions:
    """The measured-trial options from a command's flags (`search` and `infer` name them alike,
    so both pass their locals())."""
    from autoconfig.measure.launcher import SlurmOptions
    from autoconfig.measure.ray_executor import RayOptions
    from autoconfig.measure.session import MeasureOptions

    f = flags
    node = f["gpus_per_node"]
    return MeasureOptions(
        out=f["out"],
        trials=f["trials"],
        sampler=f["sampler"].value,
        executor=f["executor"].value,
        device=f["device"].value,
        parallel=f["parallel"],
        steps=f["steps"],
        warmup=f["warmup"],
        timeout_min=f["trial_timeout_min"],
        budget_gpu_hours=f["budget_gpu_hours"],
        top_k=f["enqueue_top"],
        candidates=f["candidates"],
        storage=f["storage"],
        resume=f["resume"],
        trial_memory_gib=f["trial_memory_gib"],
        capacity_factor=f.get("capacity_factor"),  # training trials only
        seed=f["seed"],
        slurm=SlurmOptions(
            partition=f["slurm_partition"],
            account=f["slurm_account"],
            gpus_per_node=(node or 8) if not cpu else 0,
            ranks_per_node=node or 8,
            options=pairs(f["slurm_option"], "slurm-option"),
        ),
        ray=RayOptions(address=f.get("ray_address")),
    )
