"""Starting a run on this machine: local ranks through torchrun's launcher API
(`elastic_launch`); metrics.json is then assembled from the ranks' own result files
(trainer/assemble.py), so a run that fails on any rank still ends with one that says how."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from autoconfig.base.fileio import write_json
from autoconfig.trainer.assemble import assemble
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import EXIT_ERROR, EXIT_OK, EXIT_OOM, RunMetrics
from autoconfig.trainer.run import train


def launch_local(cfg: TrainConfig, out: Path, quiet: bool = True) -> tuple[int, RunMetrics]:
    """Run `cfg` on this machine with cfg.world local ranks; returns (exit code, metrics)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    config_path = out / "config.json"
    write_json(config_path, cfg.model_dump(mode="json"))
    if cfg.world == 1 and cfg.memory_limit_gib is None and not cfg.fault:
        # In this process; a memory cap or an injected fault needs a process of its own.
        os.environ.pop("RANK", None)
        os.environ.pop("WORLD_SIZE", None)
        code = train(cfg, out)
        return code, assemble(cfg, out, 1)
    if quiet:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.world,
        run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.2,
        logs_specs=DefaultLogsSpecs(log_dir=str(out / "logs")),
        start_method="spawn",
    )
    # Ranks share this machine's cores: one thread each, as torchrun does by default.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = ["-m", "autoconfig.trainer", "--config", str(config_path), "--out", str(out)]
    failure = ""
    try:
        elastic_launch(launch, sys.executable)(*args)
    except ChildFailedError as exc:
        failure = _failure_line(exc)
    metrics = assemble(cfg, out, cfg.world, failure)
    codes = {"ok": EXIT_OK, "oom": EXIT_OOM}
    return codes.get(metrics.status, EXIT_ERROR), metrics


def _failure_line(exc: Exception) -> str:
    failures = getattr(exc, "failures", {})
    parts = []
    for local_rank, failure in sorted(failures.items()):
        parts.append(f"rank {local_rank} exited with code {failure.exitcode}")
    return "; ".join(parts) or str(exc).splitlines()[0]
