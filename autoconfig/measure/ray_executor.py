"""The Ray executor of measured trials: a trial is one detached placement group of `world`
bundles (STRICT_PACK when one node holds them all, PACK otherwise) and one named, detached
actor per rank in its bundle, each its own process running this rank of the trainer. Names,
not object refs, are the job handle: a new driver cannot take over a dead driver's refs, but
it can look actors and placement groups up by name, so --resume finds trials still running.

Limits: ray is imported only here and only when the executor is chosen (`pip install
'autoconfig[ray]'`). The trial folders must be on a file system every node of the cluster
sees (config.json in, the ranks' results out, the rendezvous file), as with SLURM. A cluster
the search starts itself (no --ray-address, no RAY_ADDRESS) ends with the search, and its
trials with it, as local ones do; on a cluster started apart (`ray start --head`) trials
outlive the search. A trial's placement group is released by its last rank, or by the search
when it first sees the trial finished; one whose rank was killed while no search watched
keeps its resources until a --resume sees it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from autoconfig.base.errors import UserError

NAMESPACE = "autoconfig"  # the search's actors and placement groups, apart from other drivers'
INSTALL_HINT = "executor: ray is not installed; pip install 'autoconfig[ray]'"
# rank 0's address and port, read by the other ranks: one file per job id, so a trial
# submitted again into the same folder never reads an earlier attempt's address
RENDEZVOUS = "rendezvous-{job_id}.json"
RENDEZVOUS_WAIT_S = 600.0  # a rank 0 that never publishes: the trial limit usually ends it first
CONNECT_PROBE_S = 5.0  # ray.init retries an address that does not answer for many minutes
# Ray itself lets a worker see only its own GPU; NCCL's peer-to-peer paths need every GPU of
# the node in view, so ranks choose theirs by index, as under torchrun.
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
PENDING_STATES = {"PENDING", "PREPARED", "RESCHEDULING"}


def load_ray() -> ModuleType:
    """The ray module, or the one-line refusal naming the extra that installs it."""
    try:
        import ray  # optional: only the ray executor needs it, and it takes a second to import
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return ray


@dataclass
class RayOptions:
    address: str | None = None  # None: RAY_ADDRESS's cluster when set, else a local one


def resolve_address(address: str | None) -> str:
    """The address ray.init gets: the one given, 'auto' (RAY_ADDRESS) when that is set, else
    'local' (a cluster of this machine, started for the search)."""
    if address is not None and address.strip():
        return address.strip()
    return "auto" if os.environ.get("RAY_ADDRESS", "").strip() else "local"


def _probe(address: str) -> None:
    """A plain TCP connect to a host:port address first: ray.init keeps retrying one that
    does not answer for many minutes, where the user needs one line now."""
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    target = target.strip().removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        if address == "auto":
            return  # a cluster file or another form ray reads itself
        raise UserError(f"ray-address: expected host:port, 'auto' or 'local' (got '{address}')")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_PROBE_S):
            pass
    except OSError as exc:
        raise UserError(
            f"ray-address: no Ray cluster answers at {target} ({exc.strerror or exc})"
        ) from None


def connect(options: RayOptions, cpus: int) -> ModuleType:
    """ray, connected to the cluster (once per process). A local cluster gets at least `cpus`
    CPUs, so that any trial the local executor would run fits it."""
    ray = load_ray()
    if ray.is_initialized():
        return ray
    address = resolve_address(options.address)
    kwargs: dict[str, Any] = {
        "namespace": NAMESPACE,
        "log_to_driver": False,  # the ranks' output goes to their trial's log files
        "logging_level": logging.ERROR,
    }
    if address == "local":
        kwargs.update(num_cpus=max(os.cpu_count() or 1, cpus), include_dashboard=False)
    else:
        _probe(address)
    try:
        ray.init(address=address, **kwargs)
    except Exception as exc:  # a refused connection, a version mismatch, a bad address
        said = " ".join(str(exc).split())[:300]
        raise UserError(f"ray-address: cannot connect to Ray at {address} ({said})") from None
    return ray


def _bundle(device: str) -> dict[str, float]:
    return {"CPU": 1.0, "GPU": 1.0} if device == "cuda" else {"CPU": 1.0}


def capacity(ray: ModuleType, device: str) -> tuple[int, int]:
    """(ranks the whole cluster holds, ranks its largest node holds) for this device."""
    unit = "GPU" if device == "cuda" else "CPU"
    total = int(ray.cluster_resources().get(unit, 0))
    per_node = [
        int(n.get("Resources", {}).get(unit, 0)) for n in ray.nodes() if n.get("Alive", False)
    ]
    return total, max(per_node, default=0)


def check_fits(ray: ModuleType, device: str, world: int) -> int:
    """The cluster's rank capacity; a one-line refusal when the largest trial cannot fit,
    which would leave its placement group pending for ever."""
    total, _ = capacity(ray, device)
    if world > total:
        unit = "GPUs" if device == "cuda" else "CPUs"
        raise UserError(f"ray: the largest trial needs {world} {unit}; the Ray cluster has {total}")
    return total


def _rank_name(job_id: str, rank: int) -> str:
    return f"{job_id}-rank{rank}"


def submit(ray: ModuleType, config_path: Path, run_dir: Path, world: int, device: str) -> str:
    """Place the trial's ranks; returns its job id (the prefix of every name it holds).
    Nothing waits for the placement: the search's poll sees it pending until it is made."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    job_id = f"autoconfig-{run_dir.name}-{uuid.uuid4().hex[:8]}"
    _, per_node = capacity(ray, device)
    strategy = "STRICT_PACK" if world <= per_node else "PACK"
    bundle = _bundle(device)
    group = placement_group([bundle] * world, strategy=strategy, name=job_id, lifetime="detached")
    # What the ranks take from the search's environment (a serving trial's load, injected
    # faults): a Ray worker inherits its node's environment, not the driver's.
    env = {k: v for k, v in os.environ.items() if k.startswith("AUTOCONFIG_")}
    options: dict[str, Any] = {
        "num_cpus": bundle["CPU"],
        "num_gpus": bundle.get("GPU", 0),
        "lifetime": "detached",
        "namespace": NAMESPACE,
        "max_restarts": 0,
    }
    if device == "cuda":
        options["runtime_env"] = {"env_vars": {NOSET_CUDA: "1"}}
    remote = ray.remote(RankActor)
    try:
        for rank in range(world):
            remote.options(
                name=_rank_name(job_id, rank),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, rank),
                **options,
            ).remote(str(config_path), str(run_dir), rank, world, job_id, env)
    except Exception:
        cancel(ray, job_id)
        raise
    return job_id


def alive_ranks(ray: ModuleType, job_id: str) -> list[str]:
    """The names of the trial's rank actors still alive (a dead named actor loses its name)."""
    prefix = f"{job_id}-rank"
    return [n for n in ray.util.list_named_actors() if str(n).startswith(prefix)]


def _group(ray: ModuleType, job_id: str) -> Any:
    try:
        return ray.util.get_placement_group(job_id)
    except ValueError:  # removed, or never made
        return None


def pending(ray: ModuleType, job_id: str) -> bool:
    """Whether the trial still waits for its resources (its time limit does not run yet)."""
    from ray.util.placement_group import placement_group_table

    group = _group(ray, job_id)
    return group is not None and placement_group_table(group).get("state") in PENDING_STATES


def release(ray: ModuleType, job_id: str) -> None:
    """Give the trial's placement group back (it is detached: nothing else removes it)."""
    group = _group(ray, job_id)
    if group is not None:
        with contextlib.suppress(Exception):  # removed meanwhile by its last rank
            ray.util.remove_placement_group(group)


def cancel(ray: ModuleType, job_id: str) -> None:
    """Kill every rank at once (ray.kill ends the process, a hung one too) and release the
    group, which would end any rank that was still being placed."""
    for name in alive_ranks(ray, job_id):
        with contextlib.suppress(ValueError):  # it ended meanwhile
            ray.kill(ray.get_actor(name), no_restart=True)
    release(ray, job_id)


class RankActor:
    """One rank of a trial, in a Ray worker process of its own. Its constructor queues its own
    run: a call the driver queued would be lost if the driver died before the actor started,
    leaving an idle actor holding its bundle."""

    def __init__(
        self, config_path: str, out: str, rank: int, world: int, job_id: str, env: dict[str, str]
    ) -> None:
        import ray

        self.args = (config_path, out, rank, world, job_id, env)
        self.pending = ray.get_runtime_context().current_actor.run.remote()

    def run(self) -> None:
        import ray

        run_rank(*self.args)
        ray.actor.exit_actor()


def run_rank(
    config_path: str, out: str, rank: int, world: int, job_id: str, env: dict[str, str]
) -> int:
    """This rank of the trainer, with torch.distributed's variables set from the placement
    and rank 0's published address; records where it ran (placement{rank}.json) and its
    timing, as task.run_rank does."""
    started = time.time()
    import ray

    run_dir = Path(out)
    _log_to_files(run_dir / "submitit", job_id, rank)
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = ray.get_runtime_context()
    # Where this rank runs, before anything can fail: which process, node and placement group
    # (a killed rank leaves no timing file, and the tests check these processes are gone).
    placed = {
        "rank": rank,
        "pid": os.getpid(),
        "node": context.get_node_id(),
        "placement_group": context.get_placement_group_id(),
    }
    _write(run_dir / f"placement{rank}.json", placed)
    code = 1
    try:
        local_rank, local_world = _local_rank(ray, rank)
        addr, port = _rendezvous(ray, run_dir, rank, job_id)
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_world),
            MASTER_ADDR=addr,
            MASTER_PORT=str(port),
        )
        # torch loads here, in the rank's process: its import counts as the trainer's time.
        from autoconfig.trainer.config import load_config
        from autoconfig.trainer.run import train

        code = train(load_config(Path(config_path)), run_dir)
    except BaseException:  # the rank's own failure goes to its log, as under srun
        traceback.print_exc()
    finally:
        timing = {"rank": rank, "started": started, "ended": time.time(), "exit": code}
        sys.stdout.flush()
        sys.stderr.flush()
        _write(run_dir / f"timing{rank}.json", timing)
        if all((run_dir / f"timing{r}.json").exists() for r in range(world)):
            release(ray, job_id)  # the last rank out: nothing of the trial is left to run
    return code


def _log_to_files(folder: Path, job_id: str, rank: int) -> None:
    """This process's stdout and stderr into the trial's log files, named as submitit names
    them, so crash reports read them alike."""
    folder.mkdir(parents=True, exist_ok=True)
    for fd, suffix in ((1, "out"), (2, "err")):
        target = os.open(folder / f"{job_id}_{rank}_log.{suffix}", os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _local_rank(ray: ModuleType, rank: int) -> tuple[int, int]:
    """(this rank's device index on its node, ranks on its node). On GPU the index is that of
    the GPU Ray gave it among the node's visible ones."""
    from ray.util.placement_group import get_current_placement_group, placement_group_table

    group = get_current_placement_group()
    nodes = placement_group_table(group).get("bundles_to_node_id", {}) if group else {}
    mine = nodes.get(rank)
    local_world = sum(1 for n in nodes.values() if n == mine) or 1
    local = sum(1 for b, n in nodes.items() if n == mine and b < rank)
    gpus = [str(g) for g in ray.get_gpu_ids()]
    if gpus:
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        local = visible.index(gpus[0]) if gpus[0] in visible else int(gpus[0])
    return local, local_world


def _rendezvous(ray: ModuleType, run_dir: Path, rank: int, job_id: str) -> tuple[str, int]:
    """Rank 0 takes a free port on its node and publishes it with its address; the others
    wait for it (and give up at once when rank 0 is gone)."""
    path = run_dir / RENDEZVOUS.format(job_id=job_id)
    if rank == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = int(probe.getsockname()[1])
        addr = ray.util.get_node_ip_address()
        _write(path, {"addr": addr, "port": port})
        return addr, port
    deadline = time.time() + RENDEZVOUS_WAIT_S
    while not path.exists():
        if time.time() > deadline:
            raise RuntimeError(f"rank 0 published no address in {RENDEZVOUS_WAIT_S:.0f} s")
        try:
            ray.get_actor(_rank_name(job_id, 0))
        except ValueError:
            if not path.exists():
                raise RuntimeError("rank 0 ended before publishing its address") from None
        time.sleep(0.05)
    said = json.loads(path.read_text())
    return str(said["addr"]), int(said["port"])


def _write(path: Path, value: Mapping[str, object]) -> None:
    """Whole or not at all: a reader polling for the file never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
