"""Activation offload: the activations each layer saves for backward copied to host memory
during the forward and back during the backward, on a copy stream beside compute. The bytes
the GPU keeps and the host holds, and the seconds the copies add where they outlast the
compute they hide behind.

What the frameworks do:
- Megatron-Core 0.16.1 (`cpu_offloading`, `cpu_offloading_num_layers`,
  `cpu_offloading_activations`): Transformer Engine's CPU offload context copies the saved
  tensors of the first N < layers layers out asynchronously and prefetches them back for the
  backward; TransformerConfig raises with pipelining or with recompute. The export offloads
  every layer but the last.
- torchtune 0.6.1 (`enable_activation_offloading`; training/_activation_offloading.py
  OffloadActivations): saved-tensor hooks copy every saved tensor over 1,024 bytes to pinned
  CPU memory on a second stream, keeping up to max_fwd_stash_size = 5 alive in forward for
  overlap; the recipes refuse it without activation checkpointing, so what moves is each
  checkpointed layer's input.

The model, per rank (pp 1, so one stage of `layers`; R = the profile's
`activation_offload_resident_layers`):
- GPU: the saved bytes of min(layers, R) layers; host: the rest (cost.memory, `host`);
- each micro-batch copies every offloaded layer's saved bytes down in its forward and up in
  its backward over the host link (cost.host; both directions at the one-way rate, an
  assumption), each copy hidden behind that layer's forward or backward, what exceeds it
  exposed: m x offloaded x (max(copy - forward, 0) + max(copy - backward, 0)).
"""

from __future__ import annotations

import numpy as np

from autoconfig.cost.inputs import Col, CostInputs


def any_offload(x: CostInputs) -> bool:
    """Whether any row offloads activations (the model skips this module otherwise)."""
    return bool(np.any(np.asarray(x.activation_offload) > 0))


def offloaded_layers(x: CostInputs, layers: Col) -> Col:
    """Layers of a rank whose saved activations go to the host."""
    on = np.asarray(x.activation_offload) > 0
    return np.where(on, np.maximum(layers - x.act_offload_resident, 0.0), 0.0)


def gpu_and_host(x: CostInputs, saved: Col, layers: Col) -> tuple[Col, Col]:
    """(bytes left on the GPU, bytes the host holds) of a rank's `saved` activation bytes of
    one micro-batch over its `layers` layers."""
    moved = saved * offloaded_layers(x, layers) / np.maximum(layers, 1.0)
    return saved - moved, moved


def step_seconds(
    x: CostInputs, saved_per_layer: Col, layers: Col, m: Col, forward: Col, backward: Col
) -> Col:
    """Seconds a step's activation copies add beyond the layers' own `forward` and `backward`
    (one layer, one micro-batch), over `m` micro-batches."""
    copy = saved_per_layer / x.host_link_bytes_s
    exposed = np.maximum(copy - forward, 0.0) + np.maximum(copy - backward, 0.0)
    return m * offloaded_layers(x, layers) * exposed
