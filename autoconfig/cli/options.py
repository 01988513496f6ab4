"""What several commands share: the measured-trial options (`search` and `infer` name them
alike), CSV input, key=value lists, and whether a GPU is here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from autoconfig import machine
from autoconfig.errors import UserError
from autoconfig.vocab import Device

if TYPE_CHECKING:  # optuna and submitit load only when a measured search runs
    from autoconfig.measure.session import MeasureOptions

MEASURE = "measured search (--measure)"
SERVE = "budget"


def read_csv(runs: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(runs, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"runs: no such file '{runs}'") from None
    except IsADirectoryError:
        raise UserError(f"runs: '{runs}' is a folder, not a CSV file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"runs: '{runs}' is not a readable CSV ({str(exc).strip()})") from None


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
        trial_memory_gb=f["trial_memory_gb"],
        capacity_factor=f.get("capacity_factor"),  # training trials only
        seed=f["seed"],
        slurm=SlurmOptions(
            partition=f["slurm_partition"],
            account=f["slurm_account"],
            gpus_per_node=(node or 8) if not cpu else 0,
            ranks_per_node=node or 8,
            options=pairs(f["slurm_option"], "slurm-option"),
        ),
    )
