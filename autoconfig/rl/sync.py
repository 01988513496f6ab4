"""Moving the trained weights into the rollout engines (weight sync, "refit") and, when the two
roles share GPUs, switching a GPU between them. Each figure is in seconds and names its source
or says it is an assumption.

Weight sync (every placement): the weights travel in bf16 (2 bytes a parameter; fp8 engines
quantise on arrival), W bytes in all.
- Gather: each trainer rank assembles whole tensors from its model-parallel group of
  M = tp*pp*ep ranks (an all-gather: every rank receives W (M-1)/M bytes; NeMo-RL's Megatron
  refit, verl's and OpenRLHF's gather full tensors bucket by bucket). Over NVLink when the
  group sits inside one NVLink domain, else over the network, each at the GPU profile's
  bandwidth times its fitted bus efficiency (autoconfig/profiles/gpus).
- Send (separate pools only): every engine replica needs a whole copy, each of its GPUs its
  W/tp shard. Sent in parallel, each engine GPU receives W/tp bytes and each trainer GPU
  sends W x replicas / trainer GPUs, so the transfer takes the larger of the two over the
  bandwidth: the bound a sharded, parallel transfer reaches (a single sender broadcasting
  whole tensors, W / bandwidth, is slower by up to the trainer's GPU count). Over NVLink when
  both pools fit in one NVLink domain (an NVL72 rack), else the network.
  Colocated engines read the gathered tensors from the same GPU through CUDA IPC handles
  (NeMo-RL, verl): no broadcast.
- A fixed cost per sync for the engines to load the new tensors and rebuild their caches'
  bookkeeping: SYNC_FIXED_S, an assumption (range 0.5-5 s).

Switching (colocated only), twice a step (generate -> train -> generate):
- the trainer's gradients and optimizer state go to host memory before generation and come
  back after (NeMo-RL's and verl's colocated defaults offload them): 2 x state bytes over the
  host link;
- the engine sleeps and wakes (vLLM's sleep mode: the K/V cache is freed and re-allocated, the
  weights dropped and refilled by the sync above): ENGINE_WAKE_S, an assumption.
Host links (per GPU, one direction, what pinned copies reach): cost.host, the figures shared
with CPU offloading (cost.offload).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoconfig.cost import host
from autoconfig.rl.job import Job, Placement, Plan
from autoconfig.spec.vocab import GIB

SYNC_BYTES_PER_PARAM = 2.0  # bf16
SYNC_FIXED_S = 1.0  # assumption: engine-side load and bookkeeping per sync (0.5-5 s)
ENGINE_WAKE_S = 2.0  # assumption: vLLM wake-up, K/V cache re-allocation (0.5-5 s)


@dataclass(frozen=True)
class Sync:
    """Seconds of weight sync and role switching per step."""

    gather_s: float
    broadcast_s: float  # separate pools: trainer -> engines
    fixed_s: float
    offload_s: float  # colocated: trainer state out and back
    wake_s: float  # colocated: engine sleep/wake
    gather_link: str
    broadcast_link: str

    @property
    def sync_s(self) -> float:
        return self.gather_s + self.broadcast_s + self.fixed_s

    @property
    def switch_s(self) -> float:
        return self.offload_s + self.wake_s


def host_link_gb_s(job: Job) -> float:
    """Host-to-GPU bandwidth of the job's GPU (GB/s, one direction)."""
    return host.host_link_gb_s(job.gpu.name, job.gpu.chip)


def _bandwidth_gb_s(job: Job, ranks: int) -> tuple[float, str]:
    """Per-GPU bandwidth of a group of `ranks` GPUs: NVLink inside one domain, else network."""
    eff = job.gpu.efficiency
    if ranks <= job.cluster.domain:
        return job.cluster.intra_node_gb_s * eff.intra_node_bus, "nvlink"
    return job.cluster.inter_node_gb_s * eff.inter_node_bus, "network"


def sync(job: Job, plan: Plan, state_gib: float) -> Sync:
    """Weight sync and switching of `plan`; `state_gib` is the trainer's gradients and
    optimizer state per GPU (from the training model)."""
    weights = float(job.model.param_count()) * SYNC_BYTES_PER_PARAM
    lay = plan.train
    group = lay.tp * lay.pp * (lay.ep if job.model.is_moe else 1)
    gather_gb_s, gather_link = _bandwidth_gb_s(job, group)
    gather_s = weights * (group - 1) / group / (gather_gb_s * 1e9)
    broadcast_s, broadcast_link = 0.0, "none"
    offload_s = wake_s = 0.0
    if plan.placement is Placement.COLOCATED:
        offload_s = 2.0 * state_gib * GIB / (host_link_gb_s(job) * 1e9)
        wake_s = ENGINE_WAKE_S
    else:
        bw, broadcast_link = _bandwidth_gb_s(job, plan.rollout_gpus + plan.train_gpus)
        received = weights / plan.rollout_tp
        sent = weights * plan.replicas / plan.train_gpus
        broadcast_s = max(received, sent) / (bw * 1e9)
    return Sync(gather_s, broadcast_s, SYNC_FIXED_S, offload_s, wake_s, gather_link, broadcast_link)
