"""Fixed costs of a serving step, shared by the static and the in-flight models: what each
kernel costs beyond its work, the host's launches outside CUDA graphs, and which steps replay
a graph.

Where the measured tables time a chip's GEMMs (serving_gemm.applies), every other kernel of a
layer (norms, activation, rope, attention, residuals) takes at least the chip's smallest
kernel's measured time (kernel_time.kernel_floor); elsewhere each kernel costs the fitted
`kernel_us`. An engine (vLLM, SGLang, TensorRT-LLM) launches its kernels from Python: outside a
CUDA graph the host needs kernel_time.eager_launch per kernel, measured on the chip's host, and
the GPU waits for it when its own work is shorter. Its profile says which steps replay a graph
(spec/engines.py: the largest captured batch; decode only, or prefill too). A library runtime
(FasterTransformer's C++) launches back to back: no host term.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autoconfig.cost import kernel_time, serving_gemm
from autoconfig.cost.inputs import Col
from autoconfig.cost.layer import Op
from autoconfig.cost.timing import kernel_count

if TYPE_CHECKING:  # inference.py imports this module
    from autoconfig.cost.inference import ServeInputs


def kernel_costs(s: ServeInputs, ops: list[Op], n: int) -> tuple[Col, Col]:
    """Per deployment, (seconds of a layer's kernels beyond their work, of the LM head's two).
    Measured floors where the tables time the GEMMs, the fitted kernel_us elsewhere."""
    x = s.x
    tp_on = x.tp > 1
    fitted = (kernel_count(ops) + np.where(tp_on, 2.0, 0.0)) * s.kernel_s
    layer = np.broadcast_to(fitted, (n,)).astype(float)
    head = np.broadcast_to(2.0 * s.kernel_s, (n,)).astype(float)
    floor = kernel_time.kernel_floor(x.kernels, x.kernel_chip) if x.kernels else None
    if floor is None:
        return layer, head
    floor = np.broadcast_to(floor, (n,))
    timed = np.broadcast_to(serving_gemm.applies(x, s.weight_bytes, s.act_bytes), (n,))
    by_floor = timed & np.isfinite(floor)
    floor = np.where(by_floor, floor, 0.0)
    others = kernel_count([op for op in ops if op.kind != "gemm"])
    return np.where(by_floor, others * floor, layer), np.where(by_floor, 2.0 * floor, head)


def launch_seconds(s: ServeInputs, ops: list[Op], layers: Col, n: int) -> Col:
    """Per deployment, the host's seconds to launch one step's kernels one by one (`layers`
    layers and the LM head); 0 for a library runtime or where the tables hold no launch."""
    x = s.x
    launch = kernel_time.eager_launch(x.kernels, x.kernel_chip) if x.kernels else None
    if launch is None:
        return np.zeros(n)
    launch = np.broadcast_to(launch, (n,))
    engine = np.broadcast_to(s.engine, (n,)) > 0
    timed = np.broadcast_to(serving_gemm.applies(x, s.weight_bytes, s.act_bytes), (n,))
    kernels = kernel_count(ops) + np.where(x.tp > 1, 2.0, 0.0)
    launched = np.broadcast_to(layers * kernels + 2.0, (n,))
    return np.where(engine & timed & np.isfinite(launch), launch * launched, 0.0)


def replayed(s: ServeInputs, tokens: Col, prefilling: Col | bool) -> np.ndarray:
    """Whether a step of `tokens` tokens (with prefill tokens where `prefilling`) replays a
    CUDA graph under its engine's defaults."""
    captured = np.asarray(tokens) <= s.graph_tokens
    return captured & (~np.asarray(prefilling, bool) | (np.asarray(s.graph_prefill) > 0))
