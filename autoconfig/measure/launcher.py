"""Executors of trials: through submitit, `local` (submitit's local controller starts one
process per rank on this machine) and `slurm` (one sbatch job per trial, ranks started by
srun); `ray` (a placement group and one actor per rank on a Ray cluster, ray_executor.py). A
job handle can be rebuilt from what the study recorded, so --resume finds jobs that outlived
the search process."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import submitit

from autoconfig.base.errors import UserError
from autoconfig.measure import ray_executor
from autoconfig.measure.ray_executor import RayOptions
from autoconfig.measure.task import run_rank
from autoconfig.spec.vocab import Executor
from autoconfig.trainer.config import TrainConfig

SLURM_ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}


class LaunchError(Exception):
    """The scheduler (or the local controller) refused to start a trial."""


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int = 0
    ranks_per_node: int = 8
    options: dict[str, str] = field(default_factory=dict)  # extra sbatch options


@dataclass
class Job:
    """A submitted trial: enough to poll, cancel and read the logs of it."""

    kind: str
    job_id: str
    folder: Path
    submitted: float
    handle: submitit.Job[int] | None = None  # submitit's job, when this process submitted it
    started: float | None = None  # when it was first seen running (timeouts count from here)

    def running(self) -> bool:
        if self.kind == "ray":
            ray = _ray()
            if ray_executor.alive_ranks(ray, self.job_id):
                return True
            ray_executor.release(ray, self.job_id)  # finished: give its resources back
            return False
        if self.kind == "local":
            if self.handle is not None:
                return not self.handle.done()
            # Reattached after a restart: no handle, only the controller's pid.
            return _pid_is_submitit(int(self.job_id))
        return _slurm_state(self.job_id) in SLURM_ALIVE

    def pending(self) -> bool:
        if self.kind == "ray":
            return ray_executor.pending(_ray(), self.job_id)
        return self.kind == "slurm" and _slurm_state(self.job_id) in ("PENDING", "CONFIGURING")

    def cancel(self, hard: bool = False) -> None:
        """Stop the job. Local ranks get SIGKILL at once: submitit's tasks treat SIGTERM as a
        preemption notice and carry on, and a hung rank would ignore it anyway. Ray ranks are
        killed at once too (ray.kill), for the same reason."""
        if self.kind == "ray":
            ray_executor.cancel(_ray(), self.job_id)
            return
        if self.kind == "local":
            pid = int(self.job_id)
            victims = [*_children(pid), pid]  # before the controller dies and they are orphaned
            for victim in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            if self.handle is not None:
                self.handle.done()  # a local job's done() polls its process, which reaps it
            return
        flag = "--signal=KILL" if hard else "--full"
        subprocess.run(["scancel", flag, self.job_id], check=False, capture_output=True)

    def log_tail(self, lines: int = 12) -> str:
        """The last lines the ranks wrote to stderr (rank 0 first), for crash reports."""
        tails = []
        for path in sorted(self.folder.glob(f"{self.job_id}_*_log.err")):
            text = path.read_text(errors="replace").strip().splitlines()
            useful = [t for t in text if t.strip() and "submitit" not in t]
            if useful:
                tails.append(f"[{path.name}] " + " | ".join(useful[-lines:]))
        return "\n".join(tails[:2])


class Launcher:
    """Submits trials with one executor kind; knows how many ranks may run at once."""

    def __init__(
        self,
        kind: str,
        timeout_s: float,
        device: str,
        slurm: SlurmOptions | None = None,
        max_ranks: int | None = None,
        ray: RayOptions | None = None,
    ) -> None:
        self.kind = kind
        self.ray = ray or RayOptions()
        self.timeout_s = timeout_s
        self.device = device
        self.slurm = slurm or SlurmOptions()
        self.max_ranks = max_ranks or (os.cpu_count() or 1)
        logging.getLogger("submitit").setLevel(logging.ERROR)  # sacct-less clusters warn a lot
        if device == "cpu":  # ranks share the cores: one thread each, as torchrun does
            os.environ.setdefault("OMP_NUM_THREADS", "1")

    # -- checks before anything is submitted --------------------------------------------------
    def preflight(self, worlds: list[int]) -> None:
        """With slurm: sbatch --test-only for the largest trial, so options the cluster rejects
        are one line at the start, not a failed trial each. With ray: connect, and refuse a
        trial larger than the cluster (its placement group would wait for ever)."""
        if self.kind == "ray":
            ray = self._connect(max(worlds))
            self.max_ranks = ray_executor.check_fits(ray, self.device, max(worlds))
            return
        if self.kind != "slurm":
            return
        if shutil.which("sbatch") is None:
            raise UserError("executor: slurm needs sbatch on PATH (or use --executor local)")
        world = max(worlds)
        argv = ["sbatch", "--test-only", *self._sbatch_args(world), "--wrap", "true"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise UserError(f"slurm: the cluster refused the job options ({' '.join(said)[:300]})")

    def _connect(self, world: int = 1) -> ModuleType:
        return ray_executor.connect(self.ray, world)

    def _nodes(self, world: int) -> tuple[int, int]:
        per = max(1, min(self.slurm.ranks_per_node, world))
        if world % per:
            raise LaunchError(f"{world} ranks do not split into nodes of {per}")
        return world // per, per

    def _sbatch_args(self, world: int) -> list[str]:
        nodes, per = self._nodes(world)
        args = [f"--nodes={nodes}", f"--ntasks-per-node={per}", f"--time={self._minutes()}"]
        if self.slurm.partition:
            args.append(f"--partition={self.slurm.partition}")
        if self.slurm.account:
            args.append(f"--account={self.slurm.account}")
        if self.slurm.gpus_per_node:
            args.append(f"--gpus-per-node={self.slurm.gpus_per_node}")
        args += [f"--{k}={v}" for k, v in self.slurm.options.items()]
        return args

    def _minutes(self) -> int:
        # The scheduler's limit is a backstop a little past the search's own timeout.
        return int(self.timeout_s / 60) + 2

    # -- submission ---------------------------------------------------------------------------
    def submit(self, cfg: TrainConfig, run_dir: Path) -> Job:
        folder = run_dir / "submitit"
        config_path = run_dir / "config.json"
        if self.kind == "ray":
            return self._submit_ray(cfg, run_dir.absolute(), folder)
        executor: submitit.Executor
        try:
            if self.kind == "local":
                executor = submitit.LocalExecutor(folder=folder)
                executor.update_parameters(
                    tasks_per_node=cfg.world,
                    timeout_min=self._minutes(),
                    gpus_per_node=cfg.world if self.device == "cuda" else 0,
                )
            else:
                nodes, per = self._nodes(cfg.world)
                executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
                extra = dict(self.slurm.options)
                params: dict[str, object] = {
                    "nodes": nodes,
                    "tasks_per_node": per,
                    "timeout_min": self._minutes(),
                    "slurm_additional_parameters": extra,
                    "name": f"autoconfig-{run_dir.name}",
                }
                if self.slurm.partition:
                    params["slurm_partition"] = self.slurm.partition
                if self.slurm.account:
                    params["slurm_account"] = self.slurm.account
                if self.slurm.gpus_per_node:
                    params["gpus_per_node"] = self.slurm.gpus_per_node
                executor.update_parameters(**params)
            handle = executor.submit(run_rank, str(config_path), str(run_dir))
        except Exception as exc:  # sbatch refused, or the controller could not start
            raise LaunchError(" ".join(str(exc).split())[:500]) from None
        now = time.time()
        return Job(
            self.kind,
            str(handle.job_id),
            folder,
            now,
            handle,
            now if self.kind == "local" else None,
        )

    def _submit_ray(self, cfg: TrainConfig, run_dir: Path, folder: Path) -> Job:
        """The trial's placement group and rank actors; the ranks get absolute paths (a Ray
        worker does not run in the search's directory)."""
        ray = self._connect(cfg.world)
        try:
            job_id = ray_executor.submit(
                ray, run_dir / "config.json", run_dir, cfg.world, self.device
            )
        except Exception as exc:  # the cluster refused the group or an actor
            raise LaunchError(" ".join(str(exc).split())[:500]) from None
        return Job(self.kind, job_id, folder, time.time())

    def reattach(self, attrs: dict) -> Job | None:
        """The job a trial recorded, if it is still alive (after the search was killed)."""
        if "job_id" not in attrs or attrs.get("executor") not in Executor.values():
            return None
        if attrs["executor"] == "ray":
            if self.kind != "ray":  # another executor's search cannot reach the cluster
                return None
            self._connect()
        job = Job(
            attrs["executor"],
            str(attrs["job_id"]),
            Path(attrs["run_dir"]) / "submitit",
            float(attrs.get("submitted", time.time())),
        )
        job.started = attrs.get("started")
        return job if job.running() else None


def _ray() -> ModuleType:
    """ray, connected: a job of kind ray exists only after its launcher connected."""
    return ray_executor.load_ray()


def _pid_is_submitit(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return b"submitit" in cmdline and "State:\tZ" not in status


def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(proc.name))
    return out


def _slurm_state(job_id: str) -> str:
    done = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, check=False
    )
    state = done.stdout.strip().splitlines()
    return state[0] if done.returncode == 0 and state else "GONE"
