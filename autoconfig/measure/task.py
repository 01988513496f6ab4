"""What each task of a trial's job runs (under submitit's local controller or srun): set up
torch.distributed's environment from the job's, run this rank of the trainer, and record when it
started and ended, so the search can tell its own overhead from the trainer's time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def run_rank(config_path: str, out: str) -> int:
    """One rank of a trial. torch is imported here, not at module level, so unpickling the job
    stays cheap and the import counts as the trainer's time."""
    started = time.time()
    import submitit

    env = submitit.JobEnvironment()
    dist_env = submitit.helpers.TorchDistributedEnvironment()
    dist_env.export(set_cuda_visible_devices=False, overwrite=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from autoconfig.trainer.config import load_config
    from autoconfig.trainer.run import train

    code = train(load_config(Path(config_path)), Path(out))
    timing = {"rank": env.global_rank, "started": started, "ended": time.time(), "exit": code}
    Path(out, f"timing{env.global_rank}.json").write_text(json.dumps(timing))
    return code
