"""Whether a CPU run fits this machine's memory, by the cost model's predicted peak: a run that
cannot fit is refused in one line (with the slice that would fit) before the ranks allocate
and the kernel's out-of-memory killer picks a victim."""

from __future__ import annotations

from pathlib import Path

from autoconfig.base.errors import UserError
from autoconfig.base.intmath import divisors
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.prediction import predicted

PROFILE = "cpu-gloo"  # the CPU ranks' memory constants


def available_gib() -> float | None:
    """MemAvailable of /proc/meminfo in GiB (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None
    return None


def need_gib(cfg: TrainConfig) -> float | None:
    """Predicted memory of the whole run on this machine: every rank's peak."""
    pred = predicted(cfg, PROFILE) or {}
    peak = pred.get("pred_peak_mem_gib")
    return None if peak is None else float(peak) * cfg.world


def check_fits(cfg: TrainConfig, available: float | None = None) -> None:
    """Refuse a CPU run predicted to need more memory than this machine has available."""
    available = available_gib() if available is None else available
    need = need_gib(cfg)
    if available is None or need is None or need <= available:
        return
    spec = cfg.spec()
    hint = "fewer --layers"
    if not cfg.slice and cfg.trains:
        for tp in divisors(spec.heads):
            try:
                trial = cfg.model_copy(update={"slice": True, "tp": tp, "dp": 1, "sp": False})
                trial = trial.checked()
            except UserError:
                continue
            fits = need_gib(trial)
            if fits is not None and fits <= available:
                hint = (
                    f"--slice --tp {tp} (one rank's shapes, about {fits:.1f} GiB) or fewer --layers"
                )
                break
    raise UserError(
        f"model: {spec.name} with {spec.layers} layers needs about {need:.1f} GiB here (cost "
        f"model, {PROFILE}) but this machine has {available:.1f} GiB available; use {hint}"
    )
