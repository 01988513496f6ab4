"""CPU offload (vocab.Offload): the bytes that leave GPU memory for host memory, and the seconds
per step the host link and the CPU's Adam step add. Every constant has its unit and source.

What moves (per GPU, the rank's own shard: offload needs ZeRO >= 1, parameter offload ZeRO 3):
- optimizer: the fp32 main parameters and Adam moments (the optimizer bytes of cost.memory) go
  to host memory, which also holds an fp32 copy of the gradients the CPU step reads
  (Megatron-Core 0.16.1 optimizer/cpu_offloading/hybrid_optimizer.py: pinned `cpu_copy_map_grad`
  in the fp32 parameters' dtype; DeepSpeed 0.19.8 stage_1_and_2.py: the fp32 gradient partition
  `single_partition_of_fp32_groups[i].grad` in pinned memory). The GPU keeps its working
  weights and gradients.
- optimizer+params: the sharded working weights and gradients leave too (FSDP2 CPUOffloadPolicy:
  torch/distributed/fsdp/_fully_shard/_fsdp_param.py keeps the sharded parameter and its
  gradient on the CPU; DeepSpeed ZeRO-3 offload_param). What a layer gathers for its forward
  and backward stays on the GPU (cost.memory's ZeRO-3 transient).

Seconds per step (P: the parameters of the rank's optimizer shard; W: of its weight shard):
- gradients down: GRAD_DOWN_BYTES x P over the host link, once a step, or once a micro-batch
  where the framework reduces them in every backward (FSDP2, DeepSpeed ZeRO-2 and -3).
  Megatron's main_grad is fp32 (decoupled_grad copied into an fp32 pinned buffer); DeepSpeed
  casts each gradient to its fp32 master dtype on the GPU before the copy
  (async_inplace_copy_grad_to_fp32_buffer_from_gpu); FSDP2 reduce-scatters torchtitan's
  gradients in fp32 and copies the shard down.
- the CPU Adam step: ADAM_HOST_BYTES x P through host DRAM at the GPU's share of it
  (cost.host). Adam over fp32 state is memory-bound on a CPU: parameter, first and second
  moment each read and written (24 bytes) and the fp32 gradient read (4). Its arithmetic, ~15
  flops a parameter, is under what a socket's vector units do per byte streamed, so a fused,
  vectorised CPU Adam (DeepSpeed's CPU-Adam: Ren et al. 2021, "ZeRO-Offload", Sec. 5.1;
  torch's fused CPU AdamW, which Megatron-Core and torchtune ask for) is taken to run at
  memory speed: an assumption, an unfused Adam making several passes is slower.
- updated weights up (optimizer offload): `offload_upload_bytes` x P: Megatron's
  HybridDeviceOptimizer copies the fp32 CPU parameters into the GPU's bf16 copy (4 bytes a
  parameter cross the link: ATen copies in the source dtype and converts on arrival);
  DeepSpeed copies the 16-bit partition its CPU-Adam writes (2).
- parameter offload: every forward and every backward of a micro-batch copies the rank's
  weight shard up before the all-gather (FSDP2 `sharded_param.to(device)`: the fp32 shard, 4
  bytes; DeepSpeed ZeRO-3 the 16-bit partition, 2): 2 m x upload bytes x W. The updated
  weights stay on the host: nothing goes up after the step.
Overlap (the framework's `offload_overlap`):
- none: every copy and the CPU step on the critical path, one after the other;
- with_step (Megatron-Core --overlap-cpu-optimizer-d2h-h2d): one CPU optimizer per tensor, the
  copies down and up on their own CUDA streams, each tensor's step waiting only for its own
  gradient: the longest of the three, max(down, CPU step, up);
- with_backward (DeepSpeed overlap_comm; FSDP2's copies on its all-gather and reduce-scatter
  streams): the gradients go down during the last micro-batch's backward (what exceeds it is
  exposed), each weight copy up hides behind the forward or backward it feeds (what exceeds
  it is exposed); the CPU step and the copy of the updated weights up follow the backward
  unhidden (ZeRO-Offload's one-step delayed update is off by default).
Assumed: the host link runs both directions at its one-way rate each; the copies do not slow
the GPU's collectives; the ranks of a node step their CPU Adam at the same time, each at its
share of the node's DRAM bandwidth (cost.host).
"""

from __future__ import annotations

import numpy as np

from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.spec.vocab import Offload

NO_OFFLOAD, OPTIMIZER_OFFLOAD, PARAMS_OFFLOAD = (o.code for o in Offload)
WITH_STEP, WITH_BACKWARD = 1.0, 2.0  # schema.OFFLOAD_OVERLAPS indices
GRAD_DOWN_BYTES = 4.0  # fp32 gradients copied down, bytes a parameter
ADAM_HOST_BYTES = 28.0  # CPU Adam over fp32 state: 3 x (read + write) x 4 + gradient read 4


def any_offload(x: CostInputs) -> bool:
    """Whether any row offloads (the rest of the model skips this module otherwise)."""
    return bool(np.any(np.asarray(x.offload) > NO_OFFLOAD))


def gpu_and_host(x: CostInputs, weights: Col, grads: Col, optim: Col) -> tuple[Col, Col, Col, Col]:
    """(weights, gradients, optimizer) bytes left on the GPU and the bytes the host holds for
    it, from a rank's state bytes (cost.memory.state_bytes): optimizer offload moves the
    optimizer and adds the host's fp32 gradient copy (GRAD_DOWN_BYTES of every optimizer
    parameter: the optimizer bytes over `optim_bytes` per parameter), parameter offload moves
    all three."""
    optimizer_off = x.offload >= OPTIMIZER_OFFLOAD
    params_off = x.offload >= PARAMS_OFFLOAD
    grad_copy = np.where(params_off, 0.0, optim * GRAD_DOWN_BYTES / x.optim_bytes)
    host = np.where(optimizer_off, optim + grad_copy, 0.0)
    host = host + np.where(params_off, weights + grads, 0.0)
    return (
        np.where(params_off, 0.0, weights),
        np.where(params_off, 0.0, grads),
        np.where(optimizer_off, 0.0, optim),
        host,
    )


def step_seconds(
    x: CostInputs,
    optimizer_params: Col,
    weight_params: Col,
    m: Col,
    forward: Col,
    backward: Col,
    downs: Col | float = 1.0,
) -> Col:
    """Seconds a step spends on offload beyond the GPU's own work: `optimizer_params` the
    parameters of the rank's optimizer shard, `weight_params` of its weight shard, `m`
    micro-batches, `forward` and `backward` one micro-batch's stage compute (what the copies
    hide behind), `downs` the times a step copies the gradients down (m where they are reduced
    in every micro-batch's backward, each copy behind its own backward; 1 otherwise)."""
    link, dram = x.host_link_bytes_s, x.host_dram_bytes_s
    params_off = x.offload >= PARAMS_OFFLOAD
    down = GRAD_DOWN_BYTES * optimizer_params / link
    cpu = ADAM_HOST_BYTES * optimizer_params / dram
    up = np.where(params_off, 0.0, x.offload_upload_bytes * optimizer_params / link)
    gather = np.where(params_off, x.offload_upload_bytes * weight_params / link, 0.0)
    serial = downs * down + cpu + up + 2.0 * m * gather
    pipelined = np.maximum(np.maximum(downs * down, cpu), up) + 2.0 * m * gather
    hidden = (
        downs * np.maximum(down - backward, 0.0)
        + cpu
        + up
        + m * (np.maximum(gather - forward, 0.0) + np.maximum(gather - backward, 0.0))
    )
    total = np.select(
        [x.offload_overlap == WITH_STEP, x.offload_overlap == WITH_BACKWARD],
        [pipelined, hidden],
        serial,
    )
    return np.where(x.offload > NO_OFFLOAD, total, 0.0)
