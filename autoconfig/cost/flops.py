"""Model FLOPs per token, the numerator of MFU and of model TFLOP/s.

Counted from the same op list as time and memory, forward x3 (forward + 2x backward), no
recomputation, attention over the full (non-causal) sequence: for a GPT layer this is
Narayanan et al. 2021's 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) per iteration, the convention
of Megatron-LM, torchtitan and the MFU figures in the reference table.
"""

from __future__ import annotations

from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.cost.layer import Op, head_ops, layer_ops, total


def model_flops_per_token(x: CostInputs, ops: list[Op] | None = None) -> Col:
    """Training FLOPs per token of the whole model (all TP ranks together)."""
    per_layer = total(ops if ops is not None else layer_ops(x), "flops") * x.tp
    head = total(head_ops(x), "flops") * x.tp
    return 3.0 * (x.layers * per_layer + head)
