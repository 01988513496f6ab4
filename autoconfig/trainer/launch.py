"""Starting a run on this machine: local ranks through torchrun's launcher API
(`elastic_launch`); metrics.json is then assembled from the ranks' own result files
(trainer/assemble.py), so a run that fails on any rank, or is stopped by Ctrl-C, still ends
with one that says how (and keeps the steps finished)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from autoconfig.base.fileio import write_json
from autoconfig.trainer.assemble import assemble
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OOM,
    RunMetrics,
)
from autoconfig.trainer.run import train

# The signals torch's launcher turns into its own exception while it runs.
LAUNCHER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
EXIT_CODES = {"ok": EXIT_OK, "oom": EXIT_OOM, "interrupted": EXIT_INTERRUPTED}


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
        return code, assemble(cfg, out, 1, interrupted=code == EXIT_INTERRUPTED)
    if quiet:  # torch's elastic loggers each carry their own level (LOGLEVEL, else WARNING)
        for name in [*logging.root.manager.loggerDict, "torch.distributed.elastic"]:
            if name.startswith("torch.distributed.elastic"):
                logging.getLogger(name).setLevel(logging.ERROR)
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
    interrupted = False
    # The launcher turns SIGINT, SIGTERM, SIGHUP and SIGQUIT into its own exception for as
    # long as this process lives; after the launch they mean what they meant before.
    handlers = {s: signal.getsignal(s) for s in LAUNCHER_SIGNALS}
    try:
        elastic_launch(launch, sys.executable)(*args)
    except ChildFailedError as exc:
        failure = _failure_line(exc)
    except (SignalException, KeyboardInterrupt):
        # Ctrl-C: the launcher has passed it on to the ranks and waited for them; each wrote
        # the steps it finished
        interrupted = True
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    metrics = assemble(cfg, out, cfg.world, failure, interrupted=interrupted)
    return EXIT_CODES.get(metrics.status, EXIT_ERROR), metrics


def _failure_line(exc: Exception) -> str:
    failures = getattr(exc, "failures", {})
    parts = []
    for local_rank, failure in sorted(failures.items()):
        parts.append(f"rank {local_rank} exited with code {failure.exitcode}")
    return "; ".join(parts) or str(exc).splitlines()[0]
